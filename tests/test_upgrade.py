"""Upgrade and downgrade: each version reads the other's durable state (issue 21 item 5b).

The previous release's code (``061e962``, the main this round started from, taken from this
checkout's git history with ``git archive``) and this checkout's code write, in turn, what
a node holds in the middle of its life — a bind record of each holder, an interrupted bind
journal, and a DRA checkpoint with a prepared claim — and the OTHER version reads it back:
records with their drivers and holders, the journal to finish, the claim with its devices. Run
as separate processes (``PYTHONPATH`` = one version's tree), as the two DaemonSet images are.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.releases import archive

REPO = Path(__file__).resolve().parents[1]
PREVIOUS = "061e962"

WRITE = """
import sys
from vfio_dp.host.root import Root
from vfio_dp.host.state import OpDevice, OriginalDriver, StateStore
try:  # this release: the claim path's own room
    from vfio_dp.dra.claimpath.checkpoint import Checkpoint, ClaimRecord, DeviceRecord
except ImportError:  # the previous release: one flat dra/
    from vfio_dp.dra.checkpoint import Checkpoint, ClaimRecord, DeviceRecord
root = Root(sys.argv[1])
st = StateStore(root)
st.put(OriginalDriver("0000:65:00.0", "e1000e", None, "8086", "10d3", sys.argv[2]))
st.put(OriginalDriver("0000:3b:00.0", "nouveau", None, "10de", "1eb8", "claim:6f1c-uid"))
op = st.begin("bind", sys.argv[2], [OpDevice("0000:66:00.0", "vfio-pci", None)])
st.step(op, "0000:66:00.0", 1, "echo '0000:66:00.0' > /sys/bus/pci/drivers/e1000e/unbind")
cp = Checkpoint(root, "vfio.example.com")
cp.put(ClaimRecord("default", "vm-gpu", "6f1c-uid", state="prepared", boot_id=cp.boot_id,
    devices=(DeviceRecord(("gpu",), "node-a", "pci-0000-3b-00-0", 45,
             ("0000:3b:00.0", "0000:3b:00.1"), ("10de:1eb8", "10de:10f8")),)))
"""

READ = """
import json, sys
from vfio_dp.host.root import Root
from vfio_dp.host.state import StateStore
try:
    from vfio_dp.dra.claimpath.checkpoint import Checkpoint
except ImportError:  # the previous release
    from vfio_dp.dra.checkpoint import Checkpoint
root = Root(sys.argv[1])
st = StateStore(root)
ops, problems = st.operations()
cp = Checkpoint(root, "vfio.example.com")
claims = cp.load()
print(json.dumps({
    "records": {str(a): [r.driver, r.bound_by] for a, r in st.all().items()},
    "problems": problems + st.problems() + list(cp.problems),
    "ops": [[o.kind, getattr(o, "runner", None) or o.owner,  # the previous release: owner
             [[d.address, d.writes_done] for d in o.devices]] for o in ops],
    "claims": {u: [c.name, c.state, [list(d.addresses) for d in c.devices]] for u, c in claims.items()},
}))
"""


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return archive(PREVIOUS, tmp_path_factory.mktemp("previous"), ("vfio_dp",))


def _run(code: str, tree: Path, root: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    p = subprocess.run(
        [sys.executable, "-c", code, str(root), *args],
        capture_output=True, text=True, env=env, timeout=60, check=False, cwd=root,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


def _root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/sys/kernel/random/boot_id").write_text("b00t-1\n")
    return root


@pytest.mark.parametrize(
    ("writer", "reader", "front_end"),
    [("previous", "current", "daemon"), ("current", "previous", "device-plugin")],
    ids=["upgrade", "downgrade"],
)
def test_each_version_reads_the_others_state(
    previous: Path, tmp_path: Path, writer: str, reader: str, front_end: str
) -> None:
    trees = {"previous": previous, "current": REPO}
    root = _root(tmp_path)
    _run(WRITE, trees[writer], root, front_end)
    got = json.loads(_run(READ, trees[reader], root))
    assert got["problems"] == []
    assert got["records"] == {
        "0000:65:00.0": ["e1000e", front_end],
        "0000:3b:00.0": ["nouveau", "claim:6f1c-uid"],
    }
    assert got["ops"] == [["bind", front_end, [["0000:66:00.0", 1]]]]
    assert got["claims"] == {"6f1c-uid": ["vm-gpu", "prepared", [["0000:3b:00.0", "0000:3b:00.1"]]]}


def test_the_current_version_finishes_the_previous_ones_journal(
    previous: Path, tmp_path: Path
) -> None:
    """A journal the old daemon (runner ``daemon``) left is the new device plugin's to finish."""
    root = _root(tmp_path)
    _run(WRITE, previous, root, "daemon")
    code = (
        "import sys; from vfio_dp.host.bound_by import recovers; "
        "print(recovers('device-plugin', 'daemon'), recovers('dra-plugin', 'daemon'), "
        "recovers('device-plugin', 'operator'))"
    )
    assert _run(code, REPO, root).split() == ["True", "True", "False"]
