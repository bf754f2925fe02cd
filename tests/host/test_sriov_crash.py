"""An SR-IOV count change killed at any point, or failed, leaves nothing half-done (issue 37
items 1 and 2): the kernel simulator (tests/kernel_sim.py) on small temp trees.

Two kinds of kill point, each a SIGKILL as the code sees it (:class:`Killed`, a
``BaseException`` nothing in vfio_dp catches; locks are released, as the kernel releases a dead
process's ``flock``):

- right after each sysfs write took effect (the simulator dies after its k-th write): the
  count writes, then each write of the bind of the new VFs;
- just before each durable state commit (the rename or unlink, through a directory fd, that
  makes a journal step, a record or a removal real): every point where a record and the
  device can disagree.

After each one, ``sriov set PF 2`` again must end with both VFs on vfio-pci and no journal,
and the uninstall (``vfioctl unbind --all``: VF counts first, then every bind record) must
converge -- a second run finds nothing and fails on nothing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import BindError
from vfio_dp.host import Host
from vfio_dp.host import bind as bind_mod
from vfio_dp.host.sriov import Sriov
from vfio_dp.host.sriov_pf import read_pf
from vfio_dp.model.address import PciAddress

PF, VF1, VF2, VF3 = "0000:01:00.0", "0000:01:00.1", "0000:01:00.2", "0000:01:00.3"


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


def nvme_tree(base: Path) -> SysfsTree:
    """QEMU's SR-IOV NVMe (the guest rig's PF) alone under a root port; 4 VFs at most."""
    t = SysfsTree(base)
    t.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    t.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
              sriov_totalvfs=4, sriov_numvfs=0))  # fmt: skip
    return t


class Killed(BaseException):
    """The process died (SIGKILL): nothing catches this."""


class KilledAfter(SimulatedKernel):
    """The simulator, dying right after its ``k``-th write took effect (counted under a
    lock: the bind's worker threads write concurrently)."""

    def __init__(self, tree: SysfsTree, k: int) -> None:
        super().__init__(tree)
        self.k = k
        self.done = 0
        self.count_lock = threading.Lock()

    def write(self, path: str, data: str) -> None:
        super().write(path, data)
        with self.count_lock:
            self.done += 1
            this = self.done
        if this == self.k:
            raise Killed(f"killed after write {self.k}: {data!r} > {path}")


@contextlib.contextmanager
def killed_before_commit(monkeypatch: pytest.MonkeyPatch, k: int) -> Iterator[list[int]]:
    """Die just before the ``k``-th rename or unlink made through a directory fd (how every
    record and journal is committed or removed: :mod:`vfio_dp.host.atomic`); the simulator's
    own file changes use plain paths and are not counted. Yields the count made (counted
    under a lock: the bind's worker threads commit concurrently)."""
    seen = [0]
    lock = threading.Lock()

    def gated(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dir_fd") is not None or kwargs.get("src_dir_fd") is not None:
                with lock:
                    seen[0] += 1
                    this = seen[0]
                if this == k:
                    raise Killed(f"killed before state commit {k}: {real.__name__}{args}")
            return real(*args, **kwargs)

        return call

    with monkeypatch.context() as m:
        m.setattr(os, "replace", gated(os.replace))
        m.setattr(os, "unlink", gated(os.unlink))
        yield seen


def journals(tree: SysfsTree) -> list[str]:
    d = tree.root / "var/lib/vfio_dp"
    return sorted(str(p.relative_to(d)) for p in [*d.glob("ops/*.json"), *d.glob("sriov/ops/*")])


def records(tree: SysfsTree) -> list[str]:
    d = tree.root / "var/lib/vfio_dp"
    return sorted(str(p.relative_to(d)) for p in [*d.glob("original/*"), *d.glob("sriov/*.json")])


def fresh(tree: SysfsTree) -> Sriov:
    return Sriov(Host(tree.root, kernel=SimulatedKernel(tree)))


def kill_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every kill point of ``sriov set PF 2`` (with the bind of its VFs), from a clean run.
    The VFs' groups are bound one at a time for the rest of the test: concurrent groups
    share journal writes (group commit), so a run's commits would vary run to run."""
    monkeypatch.setattr(bind_mod, "GROUP_THREADS", 1)
    tree = nvme_tree(tmp_path / "clean")
    kernel = SimulatedKernel(tree)
    with killed_before_commit(monkeypatch, 0) as commits:
        res = Sriov(Host(tree.root, kernel=kernel)).set(A(PF), 2)
    assert res.bound == [A(VF1), A(VF2)]
    assert len(kernel.writes) == 6  # autoprobe, numvfs, then override + probe for each VF
    assert commits[0] >= 10  # journal begin and steps, records, the bind's journal and records
    return [("sysfs", k) for k in range(1, len(kernel.writes) + 1)] + [
        ("commit", k) for k in range(1, commits[0] + 1)
    ]


def kill(tree: SysfsTree, monkeypatch: pytest.MonkeyPatch, kind: str, k: int) -> None:
    with pytest.raises(Killed):
        if kind == "sysfs":
            Sriov(Host(tree.root, kernel=KilledAfter(tree, k))).set(A(PF), 2)
        else:
            with killed_before_commit(monkeypatch, k):
                fresh(tree).set(A(PF), 2)


def test_set_again_after_a_kill_at_any_point_binds_the_vfs_and_leaves_no_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for kind, k in kill_points(tmp_path, monkeypatch):
        tree = nvme_tree(tmp_path / f"{kind}{k}")
        kill(tree, monkeypatch, kind, k)
        s = fresh(tree)
        res = s.set(A(PF), 2)
        where = f"killed at {kind} point {k}: {res}"
        assert tree.driver_of(VF1) == tree.driver_of(VF2) == "vfio-pci", where
        assert journals(tree) == [], where
        for vf in (VF1, VF2):  # recorded as ours, to be given back to no driver
            rec = json.loads((tree.root / f"var/lib/vfio_dp/original/{vf}.json").read_text())
            assert (rec["driver"], rec["bound_by"]) == (None, "operator"), where
        assert s.host.interrupted() == ([], []), where
        assert [v.interrupted for v in s.view()] == [None], where


def test_uninstall_after_a_kill_at_any_point_converges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What ``vfioctl unbind --all`` runs, in its order: VF counts back, then every bind
    record; twice: the second run finds nothing and fails on nothing."""
    for kind, k in kill_points(tmp_path, monkeypatch):
        tree = nvme_tree(tmp_path / f"{kind}{k}")
        kill(tree, monkeypatch, kind, k)
        for run in (1, 2):
            s = fresh(tree)
            where = f"killed at {kind} point {k}, uninstall run {run}"
            results, _ = s.restore_all()
            assert s.host.unbind_all().restored == [], where  # the VFs' records went with them
            if run == 2:
                assert results == [], where
        pf = read_pf(s.host, A(PF))
        assert pf is not None and (pf.numvfs, pf.autoprobe, pf.vfs) == (0, 1, ()), where
        assert journals(tree) == [] and records(tree) == [], where
        assert s.host.interrupted() == ([], []), where


def test_a_journal_of_vfs_an_older_uninstall_destroyed_is_settled(tmp_path: Path) -> None:
    """The state the previous release's ``unbind --all`` left after a kill mid-bind: it
    destroyed the VFs (and dropped their bind records and the PF's record) with the bind's
    journal still naming them. Nothing is left to give back: the journal is settled, not
    reported as "gone from the host" by every later run (nor INTERRUPTED by ``list``)."""
    tree = nvme_tree(tmp_path / "root")
    with pytest.raises(Killed):
        Sriov(Host(tree.root, kernel=KilledAfter(tree, 3))).set(A(PF), 2)
    assert len(journals(tree)) == 1
    sim = SimulatedKernel(tree)
    base = f"{tree.root}/sys/bus/pci/devices/{PF}"
    sim.write(f"{base}/sriov_numvfs", "0\n")
    sim.write(f"{base}/sriov_drivers_autoprobe", "1\n")
    for name in records(tree):
        (tree.root / "var/lib/vfio_dp" / name).unlink()
    for _ in (1, 2):
        h = Host(tree.root, kernel=sim)
        assert h.unbind_all().restored == []
        assert journals(tree) == [] and h.interrupted() == ([], [])


def test_a_gone_device_with_a_record_is_still_reported(tmp_path: Path) -> None:
    """The journal of a device that is gone but still has its bind record is kept and named:
    its record says it is ours to give back once it returns."""
    tree = nvme_tree(tmp_path / "root")
    with pytest.raises(Killed):
        Sriov(Host(tree.root, kernel=KilledAfter(tree, 3))).set(A(PF), 2)
    sim = SimulatedKernel(tree)
    sim.write(f"{tree.root}/sys/bus/pci/devices/{PF}/sriov_numvfs", "0\n")  # by hand
    with pytest.raises(BindError, match=rf"{VF1} \(bind by .*\) is gone from the host"):
        Host(tree.root, kernel=sim).unbind_all()
    assert len(journals(tree)) == 1


def bound_twice(tree: SysfsTree, by: str = "operator") -> Sriov:
    s = Sriov(Host(tree.root, kernel=SimulatedKernel(tree)), by=by)
    assert s.set(A(PF), 2).bound == [A(VF1), A(VF2)]
    return s


def test_a_failed_change_puts_the_vfs_back_on_the_driver_they_had(tmp_path: Path) -> None:
    """2 -> 3 fails on the count write (ENOSPC): the PF is back at 2 VFs and the VFs that
    were on vfio-pci are on vfio-pci again, for the same holder."""
    tree = nvme_tree(tmp_path / "root")
    s = bound_twice(tree, by="device-plugin")
    kernel = s.host.kernel
    assert isinstance(kernel, SimulatedKernel)

    def no_space(path: str, data: str) -> OSError | None:
        if path.endswith("/sriov_numvfs") and data.strip() == "3":
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return None

    kernel.fail = no_space
    with pytest.raises(BindError, match="No space left on device") as e:
        s.set(A(PF), 3)
    assert f"put {PF} back to 2 VFs; {VF1}, {VF2} back on vfio-pci" in str(e.value)
    assert tree.driver_of(VF1) == tree.driver_of(VF2) == "vfio-pci"
    for vf in (VF1, VF2):
        rec = json.loads((tree.root / f"var/lib/vfio_dp/original/{vf}.json").read_text())
        assert rec["bound_by"] == "device-plugin"
    assert journals(tree) == []
    rec = json.loads((tree.root / f"var/lib/vfio_dp/sriov/{PF}.json").read_text())
    assert (rec["count"], rec["before"]) == (2, 0)


def test_a_change_killed_between_its_count_writes_is_put_back_on_vfio(tmp_path: Path) -> None:
    """Killed after 2 -> 0 destroyed the VFs, before 0 -> 3: recovery makes the 2 VFs again
    and binds them back (their bind records were kept while they were away)."""
    tree = nvme_tree(tmp_path / "root")
    bound_twice(tree)
    with pytest.raises(Killed):
        Sriov(Host(tree.root, kernel=KilledAfter(tree, 1))).set(A(PF), 3)
    assert VF1 not in tree.devs
    said = fresh(tree).recover()
    assert len(said) == 1 and f"put {PF} back to 2 VFs; {VF1}, {VF2} back on vfio-pci" in said[0]
    assert tree.driver_of(VF1) == tree.driver_of(VF2) == "vfio-pci" and VF3 not in tree.devs
    assert journals(tree) == []
