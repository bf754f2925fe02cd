"""The resync's cheap look (:func:`vfio_dp.host.changes.fingerprint`) on a temp tree: what
it reads (two listings; the rest one ``stat`` each, issue 39 row 6) and that every change a
missed uevent would hide still changes it -- the VFIO nodes and the IOMMU groups included,
though they are no longer listed."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.core.test_resync import NIC, OTHER, build  # the resync tests' two-NIC tree
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.host.changes import devices_or_groups_changed, fingerprint
from vfio_dp.host.root import Root


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return build(tmp_path / "t")


@pytest.fixture
def listed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The directories ``os.listdir`` / ``os.scandir`` are called on (by their fd's path)."""
    seen: list[str] = []
    real_listdir, real_scandir = os.listdir, os.scandir

    def where(fd: object) -> str:
        return os.readlink(f"/proc/self/fd/{fd}") if isinstance(fd, int) else str(fd)

    def listdir(fd: object = ".") -> list[str]:
        seen.append(where(fd))
        return real_listdir(fd)  # type: ignore[call-overload,no-any-return]

    def scandir(fd: object = ".") -> object:
        seen.append(where(fd))
        return real_scandir(fd)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    yield seen


def test_the_look_lists_only_the_devices_and_the_drivers(
    tree: SysfsTree, listed: list[str]
) -> None:
    """Listing a directory of 4,096 entries costs ~2.5 ms of CPU on the bench's tree: the
    IOMMU groups and the VFIO nodes are looked at with one ``stat`` each, not listed."""
    fingerprint(Root(str(tree.root)))
    rel = sorted(os.path.relpath(p, tree.root) for p in listed)
    assert rel == [
        "sys/bus/pci/devices",
        "sys/bus/pci/drivers",
        "sys/bus/pci/drivers/vfio-pci",
    ]


def test_a_group_that_came_without_a_new_device_changes_the_look(tree: SysfsTree) -> None:
    """An IOMMU driver that probes late gives present devices a group: no device entry is
    new, the groups' count is (a re-made device is a new entry: its own test)."""
    root = Root(str(tree.root))
    before = fingerprint(root)
    (tree.sys("kernel/iommu_groups") / "77" / "devices").mkdir(parents=True)
    after = fingerprint(root)
    assert after != before and devices_or_groups_changed(after, before)
    assert fingerprint(root) == after  # and equal again while nothing changes


def test_a_device_remade_changes_the_devices_part(tree: SysfsTree) -> None:
    root = Root(str(tree.root))
    before = fingerprint(root)
    tree.remove(OTHER)
    tree.add(Dev(OTHER, "8086", "10d3", "020000", driver="vfio-pci", group=13))
    assert devices_or_groups_changed(fingerprint(root), before)


def test_a_driver_change_changes_the_look_but_not_the_devices_part(tree: SysfsTree) -> None:
    root = Root(str(tree.root))
    before = fingerprint(root)
    tree.set_driver(NIC, "e1000e")
    after = fingerprint(root)
    assert after != before and not devices_or_groups_changed(after, before)


def _multigrain() -> bool:
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (6, 13)


@pytest.mark.skipif(
    not _multigrain(),
    reason="before Linux 6.13 (multigrain timestamps) a directory changed in the same clock "
    "tick as the look keeps its times; devtmpfs's size still moves, an ext4 test tree's not",
)
@pytest.mark.parametrize("where", ["dev/vfio", "dev/vfio/devices"])
def test_every_vfio_node_made_or_removed_right_after_a_look_changes_it(
    tree: SysfsTree, where: str
) -> None:
    """The VFIO nodes' directories are looked at with a ``stat``: a node made or removed at
    once after the look (the same clock tick) still makes the next look differ, each time."""
    root = Root(str(tree.root))
    d = tree.root / where
    d.mkdir(parents=True, exist_ok=True)
    for i in range(200):
        before = fingerprint(root)
        node = d / ("vfio9" if where.endswith("devices") else "99")
        if i % 2:
            node.unlink()
        else:
            node.write_text("")
        assert fingerprint(root) != before, i
        assert not devices_or_groups_changed(fingerprint(root), before)
