"""Hostile state files on the DRA path (issue 20 items 2, 4, 8): the checkpoint never leaves
``--root`` through a symlinked state directory, a FIFO (or a directory, a device, a link) at
its path is moved aside without blocking, and one malformed record is skipped and reported
while reconcile settles every other claim. Real FIFOs and symlinks on temp trees."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from tests.dra.test_prepare import CONFIG, DRIVER, Claims, _boot, _preparer, _spec, result, run
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath.checkpoint import PREPARED, Checkpoint, ClaimRecord, DeviceRecord
from vfio_dp.errors import PathEscapeError
from vfio_dp.host.root import Root
from vfio_dp.model.config import Config, load_config_text


@pytest.fixture
def config() -> Config:
    return load_config_text(CONFIG, "test")


@pytest.fixture
def claims() -> Claims:
    return Claims()


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[str, str]:
    return str(tmp_path / "cdi"), str(tmp_path / "plugins")


def _claim(uid: str = "u-1") -> ClaimRecord:
    dev = DeviceRecord(("nic",), "node-1", "pci-0000-03-01-0", 7, ("0000:03:01.0",), ("8086:100e",))
    return ClaimRecord("default", "vm-nic", uid, PREPARED, devices=(dev,))


def _files(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# -- item 4: never outside the root ----------------------------------------------------------
@pytest.mark.parametrize("how", ["absolute", "relative"])
def test_checkpoint_is_never_written_through_a_symlinked_state_dir(
    tmp_path: Path, how: str
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "var/lib").mkdir(parents=True)
    outside.mkdir()
    link = root / "var/lib/vfio_dp"
    link.symlink_to(outside if how == "absolute" else Path("../../../outside"))
    cp = Checkpoint(Root(root), DRIVER)
    with pytest.raises(PathEscapeError, match="outside the root"):
        cp.load()
    with pytest.raises(PathEscapeError, match="outside the root"):
        cp.put(_claim())
    assert _files(outside) == []
    assert cp.all() == {}


def test_prepare_through_a_symlinked_state_dir_writes_nothing_outside(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
    tmp_path: Path,
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tree.root / "var/lib").mkdir(parents=True, exist_ok=True)
    (tree.root / "var/lib/vfio_dp").symlink_to(outside)
    _boot(tree, "boot-1")
    preparer = _preparer(tree, kernel, config, claims, dirs)
    ref = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    with pytest.raises(PathEscapeError):
        run(preparer.prepare([ref]))
    assert _files(outside) == []


# -- item 2: never blocks on what is not a regular file --------------------------------------
def _load_within(cp: Checkpoint, seconds: float = 10.0) -> dict[str, ClaimRecord]:
    out: list[dict[str, ClaimRecord]] = []
    t = threading.Thread(target=lambda: out.append(cp.load()), daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():  # unblock the old code's open() so the thread ends
        fd = os.open(cp.path, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        t.join(5)
        pytest.fail("loading the checkpoint blocked")
    return out[0]


@pytest.mark.parametrize("kind", ["fifo", "directory", "symlink"])
def test_a_non_regular_checkpoint_is_moved_aside_without_blocking(
    tmp_path: Path, kind: str
) -> None:
    cp = Checkpoint(Root(tmp_path), DRIVER)
    state = Path(cp.path).parent
    state.mkdir(parents=True)
    if kind == "fifo":
        os.mkfifo(cp.path)
    elif kind == "directory":
        os.mkdir(cp.path)
    else:
        (tmp_path / "elsewhere.json").write_text('{"version": 1, "claims": {}}')
        os.symlink(tmp_path / "elsewhere.json", cp.path)
    assert _load_within(cp) == {}
    assert len(cp.problems) == 1, cp.problems
    assert "not a regular file" in cp.problems[0] and "moved to" in cp.problems[0]
    aside = [p for p in os.listdir(state) if ".corrupt-" in p]
    assert len(aside) == 1
    cp.put(_claim())  # and the plugin goes on with a fresh one
    assert Checkpoint(Root(tmp_path), DRIVER).load().keys() == {"u-1"}


# -- item 8: one bad record does not stop reconcile ------------------------------------------
def test_a_malformed_record_is_skipped_and_reported_and_the_rest_reconciled(
    tree: SysfsTree,
    kernel: SimulatedKernel,
    config: Config,
    claims: Claims,
    dirs: tuple[str, str],
) -> None:
    _boot(tree, "boot-1")
    preparer = _preparer(tree, kernel, config, claims, dirs)
    a = claims.add("vm-nic", "uid-nic", [result("pci-0000-03-01-0")])
    b = claims.add("vm-lone", "uid-lone", [result("pci-0000-65-00-0")])
    run(preparer.prepare([a, b]))
    path = Path(preparer.checkpoint.path)
    data = json.loads(path.read_text())
    data["claims"]["uid-lone"]["devices"][0]["addresses"] = ["not-an-address"]
    path.write_text(json.dumps(data))
    _boot(tree, "boot-2")  # from another boot: reconcile re-verifies it
    del claims.objects[("default", "vm-nic")]  # stale: its CDI spec must go
    restarted = _preparer(tree, kernel, config, claims, dirs)
    report = run(restarted.reconcile())
    assert _spec(dirs, "uid-nic") is None
    assert [u.split(":")[0] for u in report.unprepared] == ["default/vm-nic (uid uid-nic)"]
    assert any("uid-lone" in e and "not-an-address" in e for e in report.errors), report.errors
    # reported, not lost: the record is still on disk for the operator
    assert "uid-lone" in json.loads(path.read_text())["claims"]
    again = run(restarted.reconcile())  # and every later resync works too
    assert any("uid-lone" in e for e in again.errors)
