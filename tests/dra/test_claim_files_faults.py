"""A claim's files when the disk says no (issue 37 item 18): a Prepare that fails on a full or
read-only CDI or state directory leaves no metadata file behind; an Unprepare that finds a
directory where its CDI spec should be leaves that directory, logs it and forgets the claim.

The faults are real: ``strace -P <dir> -e inject=...`` makes the kernel's answer for that
directory alone EROFS or ENOSPC (no test hook in the code), around a Prepare run on a temp
tree with the kernel simulator in a child process."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dra.test_prepare import CONFIG, DRIVER, NODE, Claims, _boot, result
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath import cdi
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text

STRACE = shutil.which("strace")
REPO = Path(__file__).resolve().parents[2]

#: one Prepare of a claim whose group is on vfio-pci already (no bind), in a child process;
#: prints its error
PREPARE = """
import asyncio, json, sys
from pathlib import Path
from tests.dra.test_prepare import CONFIG, DRIVER, NODE, Claims, _boot, result
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import gpu_host
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text

base = Path(sys.argv[1])
tree = gpu_host(base / "root")
_boot(tree, "boot-1")
config = load_config_text(CONFIG, "test")
claims = Claims()
ref = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
prep = ClaimPreparer(
    host=Host(tree.root, kernel=SimulatedKernel(tree)), driver=DRIVER, node=NODE,
    cdi_dir=str(base / "cdi"), plugins_dir=str(base / "plugins"), read_claim=claims.read,
    config=lambda: config,
)
print(json.dumps(asyncio.run(prep.prepare([ref]))["uid-lone"].error))
"""


def _prepare_under(base: Path, *strace_args: str) -> dict[str, Any]:
    base.mkdir()
    proc = subprocess.run(
        [STRACE or "strace", "-f", "-qq", "-o", str(base.parent / "trace"), *strace_args,
         sys.executable, "-c", PREPARE, str(base)],
        capture_output=True, text=True, timeout=120, cwd=str(REPO),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "INJECTED" in (base.parent / "trace").read_text(), "the fault never happened"
    left = sorted(
        str(p.relative_to(base)) for d in ("cdi", "plugins") for p in (base / d).rglob("*")
    )  # every file and directory left under the CDI and metadata directories
    return {"error": json.loads(proc.stdout.splitlines()[-1]), "left": left}


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
def test_a_read_only_cdi_dir_fails_the_prepare_and_leaves_no_metadata(tmp_path: Path) -> None:
    base = tmp_path / "b"
    cdi_dir = base / "cdi"
    out = _prepare_under(
        base, "-P", str(cdi_dir), "-e", "trace=openat", "-e", "inject=openat:error=EROFS"
    )
    assert f"writing the CDI spec {cdi_dir}/{DRIVER}-uid-lone.json failed" in out["error"]
    assert "read-only filesystem: mount it read-write" in out["error"]
    # the metadata file was written before the spec: it is gone again, with its directories
    assert [p for p in out["left"] if "uid-lone" in p] == [], out["left"]


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
def test_a_full_state_dir_fails_the_prepare_and_leaves_no_claim_files(tmp_path: Path) -> None:
    """The checkpoint is written last (after the spec and metadata): ENOSPC there removes
    both files again."""
    base = tmp_path / "b"
    state = base / "root/var/lib/vfio_dp"
    out = _prepare_under(
        base, "-P", str(state), "-e", "trace=openat,renameat,renameat2",
        "-e", "inject=renameat,renameat2:error=ENOSPC",
    )  # fmt: skip
    assert f"{state}/dra-{DRIVER}.checkpoint.json" in out["error"], out["error"]
    assert "No space left on device" in out["error"]
    assert [p for p in out["left"] if "uid-lone" in p] == [], out["left"]


def test_unprepare_leaves_a_foreign_directory_at_the_spec_path_and_forgets_the_claim(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    _boot(tree, "boot-1")
    config = load_config_text(CONFIG, "test")
    claims = Claims()
    ref = claims.add("vm-gpu", "uid-gpu", [result("pci-0000-3b-00-0", request="gpu")])
    cdi_dir, plugins = tmp_path / "cdi", tmp_path / "plugins"
    prep = ClaimPreparer(
        host=Host(tree.root, kernel=kernel), driver=DRIVER, node=NODE, cdi_dir=str(cdi_dir),
        plugins_dir=str(plugins), read_claim=claims.read, config=lambda: config,
    )  # fmt: skip
    assert asyncio.run(prep.prepare([ref]))["uid-gpu"].error == ""
    assert tree.driver_of("0000:3b:00.0") == "vfio-pci"
    spec = Path(cdi.spec_path(str(cdi_dir), DRIVER, "uid-gpu"))
    spec.unlink()
    spec.mkdir()  # someone's directory, not empty, where our spec was
    (spec / "theirs").write_text("keep")
    with caplog.at_level(logging.WARNING, logger="vfio_dp.dra"):
        errors = asyncio.run(prep.unprepare([ref]))
    assert errors == {"uid-gpu": ""}
    assert (spec / "theirs").read_text() == "keep"  # left as it is
    assert f"{spec} is a directory this plugin did not make" in caplog.text
    assert prep.checkpoint.get("uid-gpu") is None  # forgotten: no retry fails forever
    assert tree.driver_of("0000:3b:00.0") != "vfio-pci"  # the group was given back
    assert not (plugins / DRIVER / "dra-device-metadata" / "uid-gpu").exists()
    assert asyncio.run(prep.unprepare([ref])) == {"uid-gpu": ""}  # a retry is a no-op
