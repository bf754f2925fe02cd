"""The core's resync: a cheap look per period that still catches what a missed uevent hides.

Real core (its resync loop, its executor) on a temp tree, kernel uevents off: every change
below reaches it only through the resync. "Within one period" is counted in resyncs (the
core's own ``vfio_dp_resync_checks_total``), not in seconds: a change made while a check
runs is seen by the next one at the latest.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.core.node import CoreOptions, NodeCore, Snapshot
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DRA

NIC = "0000:65:00.0"
OTHER = "0000:66:00.0"
RESYNC = 0.1


def build(base: Path) -> SysfsTree:
    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "29c0", "060000", group=0))
    t.add(Dev(NIC, "8086", "10d3", "020000", driver="vfio-pci", group=11))
    t.add(Dev(OTHER, "8086", "10d3", "020000", driver="vfio-pci", group=12))
    return t


class Recorder:
    def __init__(self) -> None:
        self.snapshots: list[Snapshot] = []

    async def inventory_changed(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Callable[..., object]]:
    cores: list[NodeCore] = []

    async def start(tree: SysfsTree, **opts: object) -> tuple[NodeCore, Recorder]:
        core = NodeCore(
            CoreOptions(root=str(tree.root), resync=RESYNC, metrics_port=0, uevents=False, **opts)  # type: ignore[arg-type]
        )
        rec = Recorder()
        core.subscribe(rec)
        await core.start()
        cores.append(core)
        return core, rec

    yield start
    for core in cores:
        await core.close()


def checks(core: NodeCore) -> float:
    m = core.metrics
    return m.get("vfio_dp_resync_checks_total", result="unchanged") + m.get(
        "vfio_dp_resync_checks_total", result="changed"
    )


async def two_resyncs(core: NodeCore) -> None:
    """Wait until two resync checks began after now (so one began after the change)."""
    start = checks(core)
    for _ in range(500):
        if checks(core) >= start + 2:
            return
        await asyncio.sleep(RESYNC / 4)
    raise AssertionError("the core stopped resyncing")


def driver(core: NodeCore, address: str) -> str | None:
    assert core.inventory is not None
    return core.inventory.devices[PciAddress.parse(address)].driver


async def test_an_idle_resync_only_looks(running: Callable[..., object], tmp_path: Path) -> None:
    tree = build(tmp_path / "t")
    core, rec = await running(tree)  # type: ignore[misc]
    told = len(rec.snapshots)
    await two_resyncs(core)
    await two_resyncs(core)
    m = core.metrics
    assert m.get("vfio_dp_resync_checks_total", result="unchanged") >= 4
    assert m.get("vfio_dp_resync_checks_total", result="changed") == 0
    assert m.get("vfio_dp_scans_total", trigger="resync") == 0  # nothing read but listings
    assert len(rec.snapshots) == told  # and no front-end recomputed anything
    assert core.health() is None  # a checked view counts as current


async def test_a_driver_change_without_a_uevent_is_seen_within_one_resync(
    running: Callable[..., object], tmp_path: Path
) -> None:
    tree = build(tmp_path / "t")
    core, rec = await running(tree)  # type: ignore[misc]
    await two_resyncs(core)
    tree.set_driver(NIC, "e1000e")  # the kernel's two links; no uevent reaches the core
    await two_resyncs(core)
    assert driver(core, NIC) == "e1000e"
    assert rec.snapshots[-1].trigger == "resync"
    tree.set_driver(NIC, "vfio-pci")
    await two_resyncs(core)
    assert driver(core, NIC) == "vfio-pci"


async def test_a_device_remade_in_another_group_is_read_again_in_full(
    running: Callable[..., object], tmp_path: Path
) -> None:
    tree = build(tmp_path / "t")
    core, _ = await running(tree)  # type: ignore[misc]
    await two_resyncs(core)
    tree.remove(OTHER)  # hot-unplug and plug again with another IOMMU group, no uevent
    tree.add(Dev(OTHER, "8086", "10d3", "020000", driver="vfio-pci", group=13))
    await two_resyncs(core)
    assert core.inventory is not None
    assert core.inventory.devices[PciAddress.parse(OTHER)].iommu_group == 13
    assert OTHER in [str(a) for a in core.inventory.groups[13].devices]


async def test_a_vfio_node_gone_makes_the_resync_scan(
    running: Callable[..., object], tmp_path: Path
) -> None:
    tree = build(tmp_path / "t")
    core, _ = await running(tree)  # type: ignore[misc]
    await two_resyncs(core)
    scans = core.metrics.get("vfio_dp_scans_total", trigger="resync")
    (tree.root / "dev/vfio/11").unlink()
    await two_resyncs(core)
    assert core.metrics.get("vfio_dp_scans_total", trigger="resync") == scans + 1
    await two_resyncs(core)  # and only once: the new look is the one compared from now on
    assert core.metrics.get("vfio_dp_scans_total", trigger="resync") == scans + 1


async def test_with_usage_an_interface_brought_up_is_seen_within_one_resync(
    running: Callable[..., object], tmp_path: Path
) -> None:
    tree = build(tmp_path / "t")
    tree.set_driver(NIC, "e1000e")
    tree.add_net(NIC, "eth0", up=False)
    core, rec = await running(tree, usage=True, path=DRA)  # type: ignore[misc]
    assert core.inventory is not None
    assert core.inventory.devices[PciAddress.parse(NIC)].in_use == ()
    await two_resyncs(core)
    (tree.sys("class/net/eth0") / "flags").write_text("0x1003\n")  # up: no uevent, no link
    await two_resyncs(core)
    assert core.metrics.get("vfio_dp_scans_total", trigger="resync") == 0  # no device read
    uses = core.inventory.devices[PciAddress.parse(NIC)].in_use
    assert any("eth0" in str(u) for u in uses), uses
    assert rec.snapshots[-1].inventory is core.inventory  # the front-ends were told
    (tree.sys("class/net/eth0") / "flags").write_text("0x1002\n")  # down again: given back
    await two_resyncs(core)
    assert core.inventory.devices[PciAddress.parse(NIC)].in_use == ()
    assert rec.snapshots[-1].inventory is core.inventory
    assert core.metrics.get("vfio_dp_scans_total", trigger="resync") == 0


async def test_an_idle_resync_with_usage_hops_to_the_executor_once(
    running: Callable[..., object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 row 6: the cheap look and the host's use it is followed by when unchanged
    are one job on the host-I/O executor, not two (each hop wakes a thread and the loop)."""
    tree = build(tmp_path / "t")
    core, _ = await running(tree, usage=True, path=DRA)  # type: ignore[misc]
    await two_resyncs(core)
    jobs: list[object] = []
    real = core.run

    async def counted(fn: Callable[..., object], *args: object, **kwargs: object) -> object:
        jobs.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(core, "run", counted)
    start = checks(core)
    await two_resyncs(core)
    await two_resyncs(core)
    done = checks(core) - start
    assert done >= 4 and core.metrics.get("vfio_dp_resync_checks_total", result="changed") == 0
    assert len(jobs) <= done + 1, (len(jobs), done)  # one per check (one may be under way)
