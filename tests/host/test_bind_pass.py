"""A ``bind: true`` pass of many IOMMU groups (:meth:`Host.bind_groups`, issue 39 row 3c):
cheap on the disk, each group on its own, and crash safe (kernel simulator, temp trees).

Counted, never timed: the ``fsync`` calls (a counting wrapper around ``os.fsync`` in the test,
naming each synced file through ``/proc/self/fd``), the journal's writes, the scans.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import BindError
from vfio_dp.host import Host
from vfio_dp.host.discovery import Discovery
from vfio_dp.model.address import PciAddress

PF = "0000:01:00.0"
N = 16  # VFs, each in an IOMMU group of its own (as on an SR-IOV card behind an IOMMU)


def vf(i: int) -> str:
    return f"0000:01:{(i + 1) >> 3:02x}.{(i + 1) & 7:x}"


def vf_tree(base: Path, n: int = N) -> SysfsTree:
    """A PF on ``nvme`` and ``n`` VFs on no driver (``sriov_drivers_autoprobe`` 0), each alone
    in its IOMMU group: what ``numVfs`` leaves for the bind pass."""
    t = SysfsTree(base)
    t.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    t.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
              sriov_totalvfs=n, sriov_numvfs=0))  # fmt: skip
    for i in range(n):
        t.add(Dev(vf(i), "1b36", "0010", "010802", driver=None, group=100 + i,
                  parent="0000:00:1b.0", physfn=PF))  # fmt: skip
    return t


def groups(n: int = N) -> list[list[PciAddress]]:
    return [[PciAddress.parse(vf(i))] for i in range(n)]


def journals(tree: SysfsTree) -> list[dict[str, object]]:
    d = tree.root / "var/lib/vfio_dp/ops"
    return [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))] if d.is_dir() else []


def record(tree: SysfsTree, a: str) -> dict[str, object] | None:
    p = tree.root / f"var/lib/vfio_dp/original/{a}.json"
    return json.loads(p.read_text()) if p.exists() else None


class Synced:
    """``os.fsync`` counted by what it syncs (``/proc/self/fd/<fd>``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: list[str] = []
        self.lock = threading.Lock()
        real = os.fsync

        def fsync(fd: int) -> None:
            path = os.readlink(f"/proc/self/fd/{fd}")
            with self.lock:
                self.paths.append(path)
            real(fd)

        monkeypatch.setattr(os, "fsync", fsync)

    def count(self, pred: Callable[[str], bool]) -> int:
        return sum(1 for p in self.paths if pred(p))


def test_a_pass_syncs_its_records_together_and_shares_the_journal_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = vf_tree(tmp_path / "root")
    host = Host(tree.root, kernel=SimulatedKernel(tree), runner="dra-plugin")
    synced = Synced(monkeypatch)
    out = host.bind_groups(groups(), bound_by="dra-plugin")
    assert out.errors == {} and sorted(out.results) == list(range(N))
    assert all(tree.driver_of(vf(i)) == "vfio-pci" for i in range(N))
    assert all((record(tree, vf(i)) or {}).get("bound_by") == "dra-plugin" for i in range(N))
    assert journals(tree) == []
    original = str(tree.root / "var/lib/vfio_dp/original")
    ops = str(tree.root / "var/lib/vfio_dp/ops")
    # every record's data synced, the directory ONCE (a bind per group: once per group)
    assert synced.count(lambda p: p.startswith(original + "/.")) == N
    assert synced.count(lambda p: p == original) == 1
    # ONE journal, written 3 times: at the start, then before each phase -- every VF's
    # driver_override write, every VF's drivers_probe (a bind per group: N journals, 3
    # writes each; one write per sysfs write: 1 + 2N); removed once
    journal_writes = synced.count(lambda p: p.startswith(ops + "/."))
    assert journal_writes == 3, synced.paths
    assert synced.count(lambda p: p == ops) == journal_writes + 1  # each rename, the removal
    # in all, a handful per pass, not ~9 per VF
    assert len(synced.paths) == N + 1 + 2 * 3 + 1


def test_every_write_of_a_pass_is_journaled_before_it_is_made(tmp_path: Path) -> None:
    tree = vf_tree(tmp_path / "root")
    seen: list[str] = []

    class Watching(SimulatedKernel):
        def write(self, path: str, data: str) -> None:
            (op,) = journals(tree)  # on disk, as a crash now would leave it
            devices = op["devices"]
            assert isinstance(devices, list)
            this = f"echo '{data}' > {path}"
            (d,) = [d for d in devices if d["next"] == this]
            seen.append(d["address"])
            super().write(path, data)

    Host(tree.root, kernel=Watching(tree), runner="dra-plugin").bind_groups(
        groups(), bound_by="dra-plugin"
    )
    assert sorted(seen) == sorted(2 * [vf(i) for i in range(N)])
    assert journals(tree) == []


def test_a_pass_reads_the_groups_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tree = vf_tree(tmp_path / "root")
    host = Host(tree.root, kernel=SimulatedKernel(tree), runner="dra-plugin")
    calls: list[int] = []
    real = Discovery.scan_groups

    def counted(self: Discovery, addresses: object, **kw: bool) -> object:
        given = list(addresses)  # type: ignore[call-overload]
        calls.append(len(given))
        return real(self, given, **kw)

    monkeypatch.setattr(Discovery, "scan_groups", counted)
    host.bind_groups(groups(), bound_by="dra-plugin")
    assert calls == [N]  # one read of every group of the pass (a bind per group: N reads)


def test_a_failed_group_is_rolled_back_alone(tmp_path: Path) -> None:
    tree = vf_tree(tmp_path / "root")
    kernel = SimulatedKernel(tree)
    bad = vf(5)
    failures = [1]  # the bind's probe fails; the rollback's goes through

    def refuse(path: str, data: str) -> OSError | None:
        if path.endswith("drivers_probe") and data == bad and failures:
            failures.pop()
            return OSError(errno.EIO, os.strerror(errno.EIO))
        return None

    kernel.fail = refuse
    out = Host(tree.root, kernel=kernel, runner="dra-plugin").bind_groups(
        groups(), bound_by="dra-plugin"
    )
    assert sorted(out.errors) == [5] and isinstance(out.errors[5], BindError)
    assert f"rolled back {bad}" in str(out.errors[5])
    assert sorted(out.results) == [i for i in range(N) if i != 5]
    assert tree.driver_of(bad) is None and tree.override_of(bad) is None
    assert record(tree, bad) is None
    assert all(tree.driver_of(vf(i)) == "vfio-pci" for i in range(N) if i != 5)
    assert all(record(tree, vf(i)) is not None for i in range(N) if i != 5)
    assert journals(tree) == []


def test_a_group_that_cannot_be_rolled_back_is_all_its_kept_journal_names(
    tmp_path: Path,
) -> None:
    """Its rollback fails too: the journal is kept, marked failed, naming that group's
    devices only -- recovery or ``vfioctl unbind`` never undoes the groups that were bound."""
    tree = vf_tree(tmp_path / "root")
    kernel = SimulatedKernel(tree)
    bad = vf(5)

    def refuse(path: str, data: str) -> OSError | None:
        if path.endswith("drivers_probe") and data == bad:
            return OSError(errno.EIO, os.strerror(errno.EIO))
        return None

    kernel.fail = refuse
    out = Host(tree.root, kernel=kernel, runner="dra-plugin").bind_groups(
        groups(), bound_by="dra-plugin"
    )
    assert sorted(out.errors) == [5] and "rollback failed" in str(out.errors[5])
    (op,) = journals(tree)
    assert op["failed"] and op["devices"] == [
        {"address": bad, "target": "vfio-pci", "override": None, "writes_done": 1,
         "next": f"echo '{bad}' > {tree.root}/sys/bus/pci/drivers_probe"}
    ]  # fmt: skip
    assert all(tree.driver_of(vf(i)) == "vfio-pci" for i in range(N) if i != 5)
    kernel.fail = None
    Host(tree.root, kernel=kernel, runner="dra-plugin").recover(runner="dra-plugin")
    assert journals(tree) == [] and record(tree, bad) is None
    assert all(tree.driver_of(vf(i)) == "vfio-pci" for i in range(N) if i != 5)


class Killed(BaseException):
    """The process died (SIGKILL): nothing catches this."""


class KilledAfter(SimulatedKernel):
    """Dies right after its ``k``-th write took effect (the groups' threads write at once)."""

    def __init__(self, tree: SysfsTree, k: int) -> None:
        super().__init__(tree)
        self.k, self.done, self.lock = k, 0, threading.Lock()

    def write(self, path: str, data: str) -> None:
        super().write(path, data)
        with self.lock:
            self.done += 1
            this = self.done
        if this == self.k:
            raise Killed(f"after write {this}")


@pytest.mark.parametrize("k", [1, 2, N // 2, N, N + 3, 2 * N - 1])
def test_a_pass_killed_midway_leaves_nothing_unowned_and_recovers(tmp_path: Path, k: int) -> None:
    """Killed after its ``k``-th sysfs write, with the groups' threads mid-way: every device
    the pass touched has its bind record and is named by the one journal; recovery puts each
    back to the driver it had (none), and the next pass binds them all."""
    tree = vf_tree(tmp_path / "root")
    with pytest.raises(Killed):
        Host(tree.root, kernel=KilledAfter(tree, k), runner="dra-plugin").bind_groups(
            groups(), bound_by="dra-plugin"
        )
    (op,) = journals(tree)
    devices = op["devices"]
    assert isinstance(devices, list)
    named = {d["address"] for d in devices}
    assert named == {vf(i) for i in range(N)}
    touched = [vf(i) for i in range(N) if tree.override_of(vf(i)) or tree.driver_of(vf(i))]
    assert touched, "the kill came after a write"
    for a in touched:  # nothing unowned: each touched device is recorded, to go back to none
        assert record(tree, a) == {
            "address": a, "driver": None, "driver_override": None, "vendor": "1b36",
            "device": "0010", "bound_by": "dra-plugin",
        }  # fmt: skip
    host = Host(tree.root, kernel=SimulatedKernel(tree), runner="dra-plugin")
    rec = host.recover(runner="dra-plugin")
    assert rec.problems == [] and len(rec.recovered) == 1
    assert journals(tree) == []
    for i in range(N):
        assert tree.driver_of(vf(i)) is None and tree.override_of(vf(i)) is None
        assert record(tree, vf(i)) is None
    out = host.bind_groups(groups(), bound_by="dra-plugin")
    assert out.errors == {}
    assert all(tree.driver_of(vf(i)) == "vfio-pci" for i in range(N))
    assert journals(tree) == []


def test_the_core_binds_made_vfs_in_one_pass_and_scans_once_per_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``numVfs: 16``: one count change, then one bind pass of 16 groups; the host read once
    in full after the change, the VFs' groups once by the pass, and once in full after it --
    not once per VF."""
    from vfio_dp.core.node import NodeCore
    from vfio_dp.core.options import CoreOptions

    tree = SysfsTree(tmp_path / "root")
    tree.add(Dev("0000:00:1b.0", "8086", "a113", "060400", driver="pcieport", group=8))
    tree.add(Dev(PF, "1b36", "0010", "010802", driver="nvme", group=9, parent="0000:00:1b.0",
                 sriov_totalvfs=N, sriov_numvfs=0))  # fmt: skip
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f'selectors:\n- addresses: ["{PF}"]\n  numVfs: {N}\n  bind: true\n')
    scans: list[str] = []
    for name in ("scan", "scan_groups", "refresh"):
        real = getattr(Discovery, name)

        def counted(self: object, *a: object, _real: object = real, _n: str = name,
                    **kw: object) -> object:  # fmt: skip
            scans.append(_n)
            return _real(self, *a, **kw)  # type: ignore[operator]

        monkeypatch.setattr(Discovery, name, counted)
    core = NodeCore(
        CoreOptions(root=str(tree.root), config_path=str(cfg), metrics_port=0, uevents=False),
        Host(tree.root, kernel=SimulatedKernel(tree), runner="device-plugin"),
    )
    journal_writes: list[str] = []
    real_begin = Host.bind_groups

    def counted_pass(self: Host, *a: object, **kw: object) -> object:
        journal_writes.append("pass")
        return real_begin(self, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(Host, "bind_groups", counted_pass)

    async def scenario() -> None:
        await core.start()
        await core.close()

    asyncio.run(scenario())
    assert all(tree.driver_of(vf(i)) == "vfio-pci" for i in range(N))
    assert journal_writes == ["pass"]
    assert scans.count("scan_groups") == 1, scans
    assert len(scans) <= 3, scans  # full scan after the change, the pass's read, the rescan
