"""A bind or unbind killed after ANY sysfs write is recoverable (kernel simulator, temp tree).

The process death is modelled by :class:`Killed`, a ``BaseException`` raised by the
simulated kernel right after its k-th write took effect: nothing in vfio_dp catches it, so
no rollback and no clean-up runs (the locks are released, as the kernel releases a dead
process's ``flock``). The same kill points are made with a real SIGKILL (strace) on the
real kernel in tests/guest/test_crash_real_kernel.py.
"""

from __future__ import annotations

import errno
import json
import os

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.errors import CorruptRecordError, StateWriteError
from vfio_dp.host import Host
from vfio_dp.host import state as state_mod
from vfio_dp.model.address import PciAddress

GPU, AUDIO = "0000:3b:00.0", "0000:3b:00.1"  # one group: nvidia + snd_hda_intel
NIC_A, NIC_B = "0000:03:01.0", "0000:03:02.0"  # the shared e1000 group
ORIGINAL = {GPU: "nvidia", AUDIO: "snd_hda_intel", NIC_A: "e1000", NIC_B: "e1000"}


class Killed(BaseException):
    """The process died (SIGKILL): nothing catches this."""


class KilledAfter(SimulatedKernel):
    """The simulator, dying right after its ``k``-th write took effect."""

    def __init__(self, tree: SysfsTree, k: int) -> None:
        super().__init__(tree)
        self.k = k
        self.count = 0

    def write(self, path: str, data: str) -> None:
        super().write(path, data)
        self.count += 1
        if self.count == self.k:
            raise Killed(f"killed after write {self.k}: {data!r} > {path}")


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


def journals(tree: SysfsTree) -> list[dict[str, object]]:
    d = tree.root / "var/lib/vfio_dp/ops"
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []


def drivers(tree: SysfsTree, *addrs: str) -> dict[str, str | None]:
    return {a: tree.driver_of(a) for a in addrs}


def writes_of_a_clean_bind(tree: SysfsTree, addrs: list[str]) -> int:
    k = SimulatedKernel(tree)
    Host(tree.root, kernel=k).bind([A(a) for a in addrs], group=True)
    n = len(k.writes)
    Host(tree.root, kernel=SimulatedKernel(tree)).unbind([A(a) for a in addrs])
    return n


@pytest.mark.parametrize("pair", [(GPU, AUDIO), (NIC_A, NIC_B)], ids=["gpu-group", "e1000-group"])
def test_bind_killed_after_each_write_is_undone_by_unbind(
    tree: SysfsTree, pair: tuple[str, str]
) -> None:
    total = writes_of_a_clean_bind(tree, list(pair))
    assert total == 6  # override, unbind, drivers_probe for each of the two
    for k in range(1, total + 1):
        kernel = KilledAfter(tree, k)
        with pytest.raises(Killed):
            Host(tree.root, kernel=kernel).bind([A(pair[0])], group=True)
        # the journal says where it stopped; list (Host.interrupted) names it plainly
        (op,) = journals(tree)
        assert op["kind"] == "bind" and op["owner"] == "vfioctl"
        found, problems = Host(tree.root, kernel=SimulatedKernel(tree)).interrupted()
        assert problems == [] and len(found) == 1 and not found[0].in_progress
        msg = found[0].message()
        assert msg.startswith("INTERRUPTED bind by vfioctl") and "stopped at" in msg
        assert f"vfioctl unbind {pair[0]} {pair[1]}" in msg
        # the original drivers are on disk, intact, for every device touched
        for a in pair:
            rec = tree.root / f"var/lib/vfio_dp/original/{a}.json"
            assert json.loads(rec.read_text())["driver"] == ORIGINAL[a]
        # unbind of ONE device of the operation restores EVERY device of it
        res = Host(tree.root, kernel=SimulatedKernel(tree)).unbind([A(pair[0])])
        assert drivers(tree, *pair) == {a: ORIGINAL[a] for a in pair}, f"after write {k}"
        assert tree.override_of(pair[0]) is None and tree.override_of(pair[1]) is None
        assert journals(tree) == [] and not any((tree.root / "var/lib/vfio_dp/original").iterdir())
        assert any("undid the interrupted bind" in w for w in res.warnings)


def test_unbind_killed_after_each_write_is_finished_by_unbind(tree: SysfsTree) -> None:
    pair = [A(NIC_A), A(NIC_B)]
    for k in range(1, 7):  # two devices x (override, vfio-pci/unbind, e1000/bind)
        Host(tree.root, kernel=SimulatedKernel(tree)).bind(pair, group=True)
        with pytest.raises(Killed):
            Host(tree.root, kernel=KilledAfter(tree, k)).unbind(pair)
        (op,) = journals(tree)
        assert op["kind"] == "unbind"
        Host(tree.root, kernel=SimulatedKernel(tree)).unbind([A(NIC_B)])
        assert drivers(tree, NIC_A, NIC_B) == {NIC_A: "e1000", NIC_B: "e1000"}, f"after {k}"
        assert journals(tree) == []


def test_daemon_recovers_only_what_it_bound(tree: SysfsTree) -> None:
    # the daemon's bind is killed after drivers_probe of the first NIC ...
    with pytest.raises(Killed):
        Host(tree.root, kernel=KilledAfter(tree, 3), runner="daemon").bind(
            [A(NIC_A)], group=True, probe=False
        )
    # ... and an operator's bind of the GPU after its unbind write
    with pytest.raises(Killed):
        Host(tree.root, kernel=KilledAfter(tree, 2)).bind([A(GPU)], group=True)
    assert tree.driver_of(GPU) is None  # the case of the issue: a device with no driver
    out = Host(tree.root, kernel=SimulatedKernel(tree), runner="daemon").recover(runner="daemon")
    assert drivers(tree, NIC_A, NIC_B) == {NIC_A: "e1000", NIC_B: "e1000"}
    assert len(out.recovered) == 1 and out.problems == []
    assert any("not started by daemon" in s for s in out.skipped)
    assert [j["owner"] for j in journals(tree)] == ["vfioctl"]  # the operator's is left
    # recover() without a runner undoes the rest: no device is left without a driver
    Host(tree.root, kernel=SimulatedKernel(tree)).recover()
    assert drivers(tree, *ORIGINAL) == ORIGINAL and journals(tree) == []


def test_live_operation_is_not_recovered(tree: SysfsTree) -> None:
    h = Host(tree.root, kernel=SimulatedKernel(tree))
    with pytest.raises(Killed):
        Host(tree.root, kernel=KilledAfter(tree, 2)).bind([A(NIC_A)], group=True)
    with h.state.locked([A(NIC_A)]):  # as if its process were still running
        found, _ = h.interrupted()
        assert found[0].in_progress and "in progress" in found[0].message()
        out = h.recover()
        assert out.recovered == [] and "still in progress" in out.skipped[0]
    assert h.recover().recovered != []
    assert drivers(tree, NIC_A, NIC_B) == {NIC_A: "e1000", NIC_B: "e1000"}


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EROFS])
def test_state_dir_full_or_read_only_refuses_before_the_first_write(
    tree: SysfsTree, monkeypatch: pytest.MonkeyPatch, err: int
) -> None:
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:  # the file system refuses the record's data
        raise OSError(err, os.strerror(err))

    kernel = SimulatedKernel(tree)
    monkeypatch.setattr(state_mod.os, "fsync", failing_fsync)
    with pytest.raises(StateWriteError) as e:
        Host(tree.root, kernel=kernel).bind([A(NIC_A)], group=True)
    monkeypatch.setattr(state_mod.os, "fsync", real_fsync)
    msg = str(e.value)
    assert "refused before the first sysfs write (nothing was changed)" in msg
    assert os.strerror(err) in msg and "var/lib/vfio_dp/ops" in msg
    assert kernel.writes == []
    assert drivers(tree, NIC_A, NIC_B) == {NIC_A: "e1000", NIC_B: "e1000"}
    leftovers = list((tree.root / "var/lib/vfio_dp").rglob("*.json*"))
    assert leftovers == []  # not even a temp file


def test_corrupt_record_is_reported_and_kept(tree: SysfsTree) -> None:
    h = Host(tree.root, kernel=SimulatedKernel(tree))
    h.bind([A(NIC_A)], group=True)
    rec = tree.root / f"var/lib/vfio_dp/original/{NIC_A}.json"
    rec.write_text('{"address": "0000:03:01.0", "driv')  # a disk error, a hand edit
    _, problems = h.interrupted()
    assert any(str(rec) in p and "unreadable record" in p for p in problems)
    with pytest.raises(CorruptRecordError, match=r"vfioctl unbind --driver NAME 0000:03:01\.0"):
        h.unbind([A(NIC_A)])
    assert rec.read_text() == '{"address": "0000:03:01.0", "driv'  # kept, not dropped
    assert tree.driver_of(NIC_A) == "vfio-pci"  # nothing touched


def test_corrupt_journal_is_reported_and_original_records_still_restore(tree: SysfsTree) -> None:
    with pytest.raises(Killed):
        Host(tree.root, kernel=KilledAfter(tree, 3)).bind([A(NIC_A)], group=True)
    (path,) = (tree.root / "var/lib/vfio_dp/ops").glob("*.json")
    path.write_bytes(b"\x00garbage")
    h = Host(tree.root, kernel=SimulatedKernel(tree))
    _, problems = h.interrupted()
    assert any(str(path) in p for p in problems)
    h.unbind([A(NIC_A)])  # from the per-device record, which the journal never replaces
    assert tree.driver_of(NIC_A) == "e1000" and path.exists()


def test_temp_files_of_a_torn_write_are_never_read_as_records(tree: SysfsTree) -> None:
    h = Host(tree.root, kernel=SimulatedKernel(tree))
    h.bind([A(NIC_A)], group=True)
    d = tree.root / "var/lib/vfio_dp"
    (d / f"original/.{NIC_B}.json.99.1.tmp").write_text('{"addr')  # a write cut short
    (d / "ops/.x.json.99.1.tmp").write_text("{")
    found, problems = h.interrupted()
    assert found == [] and problems == []
    assert set(map(str, h.state.all())) == {NIC_A, NIC_B}


def test_every_write_is_journaled_before_it_is_made(tree: SysfsTree) -> None:
    seen: list[str | None] = []

    class Watching(SimulatedKernel):
        def write(self, path: str, data: str) -> None:
            (op,) = journals(tree)
            devs = op["devices"]
            assert isinstance(devs, list)
            this = f"echo '{data}' > {path}"
            seen.extend(d["next"] for d in devs if d["next"] == this)
            super().write(path, data)

    Host(tree.root, kernel=Watching(tree)).bind([A(NIC_A)], group=True)
    assert len(seen) == 6 and all(s and s.startswith("echo ") for s in seen)
    assert journals(tree) == []  # removed once the bind completed


def test_list_shows_the_interrupted_operation(tree: SysfsTree) -> None:
    import subprocess
    import sys

    with pytest.raises(Killed):
        Host(tree.root, kernel=KilledAfter(tree, 3)).bind([A(NIC_A)], group=True)
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            "from cli.main import main; main()",
            "list",
            "--root",
            str(tree.root),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stderr
    assert "INTERRUPTED bind by vfioctl" in p.stderr
    assert "3 sysfs write(s) made" not in p.stderr  # stopped at the 3rd, made 2 before it
    assert f"{NIC_A}: 2 sysfs write(s) made, stopped at: echo '{NIC_A}'" in p.stderr
    assert f"vfioctl unbind {NIC_A} {NIC_B}" in p.stderr
    assert json.loads(p.stdout)  # stdout stays JSON


def test_bind_after_a_killed_bind_undoes_it_first_and_keeps_the_true_original(
    tree: SysfsTree,
) -> None:
    with pytest.raises(Killed):  # killed with the NIC unbound from e1000, on no driver
        Host(tree.root, kernel=KilledAfter(tree, 2)).bind([A(NIC_A)], group=True)
    assert tree.driver_of(NIC_A) is None
    res = Host(tree.root, kernel=SimulatedKernel(tree)).bind([A(NIC_A)], group=True)
    assert any("undid the interrupted bind by vfioctl" in w for w in res.warnings)
    assert drivers(tree, NIC_A, NIC_B) == {NIC_A: "vfio-pci", NIC_B: "vfio-pci"}
    assert journals(tree) == []
    rec = json.loads((tree.root / f"var/lib/vfio_dp/original/{NIC_A}.json").read_text())
    assert rec["driver"] == "e1000"  # not "no driver", the state the kill left


def test_bind_over_an_unreadable_record_is_refused_and_leaves_no_journal(tree: SysfsTree) -> None:
    kernel = SimulatedKernel(tree)
    rec = tree.root / f"var/lib/vfio_dp/original/{NIC_A}.json"
    rec.parent.mkdir(parents=True)
    rec.write_text("{")
    with pytest.raises(CorruptRecordError, match=str(rec)):
        Host(tree.root, kernel=kernel).bind([A(NIC_A)], group=True)
    assert kernel.writes == [] and journals(tree) == [] and rec.read_text() == "{"
