"""The PCIe root of each device (:func:`vfio_dp.host.topology.pcie_roots`), read through the
root's links once per call: the slice feed reads it for every device of a big host."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import PathEscapeError
from vfio_dp.host.root import Root
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.address import PciAddress


def tree_of(base: Path, n: int) -> tuple[SysfsTree, list[PciAddress]]:
    tree = SysfsTree(base)
    addrs = []
    for i in range(n):
        addr = f"0000:{1 + i // 8:02x}:00.{i % 8}"
        tree.add(Dev(addr, "15b3", "101c", "020000", driver="vfio-pci", group=100 + i))
        addrs.append(PciAddress.parse(addr))
    return tree, addrs


def test_each_link_on_the_way_is_read_once_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 64 devices share sys/bus/pci/devices and sys/devices/pci0000:00 and their bridges'
    # directories: each device's own link is read, the shared ones once (was ~9 a device)
    tree, addrs = tree_of(tmp_path, 64)
    fs = Root(str(tree.root))
    read: list[str] = []
    real = os.readlink

    def counted(path: str, *a: object, **k: object) -> str:
        read.append(path)
        return real(path, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "readlink", counted)
    roots = pcie_roots(fs, addrs)
    assert roots == {a: "pci0000:00" for a in addrs}
    assert len(read) == len(set(read)), "a path read twice"
    assert len(read) <= 3 * len(addrs)
    one = [p for p in read if p.endswith(f"/{addrs[0]}")]
    assert one, "the device's own link is read"


def test_the_same_roots_as_one_device_at_a_time(tmp_path: Path) -> None:
    tree, addrs = tree_of(tmp_path, 20)
    fs = Root(str(tree.root))
    assert pcie_roots(fs, addrs) == {a: r for one in addrs for a, r in pcie_roots(fs, [one]).items()}


def test_a_link_out_of_the_root_still_raises_with_links_kept(tmp_path: Path) -> None:
    tree, addrs = tree_of(tmp_path, 2)
    link = tree.root / "sys/bus/pci/devices" / str(addrs[1])
    link.unlink()
    os.symlink("../../../../../../../..", link)
    fs = Root(str(tree.root))
    links: dict[str, str | None] = {}
    fs.resolve(fs.path("sys", "bus", "pci", "devices", str(addrs[0])), links)
    with pytest.raises(PathEscapeError):
        fs.resolve(fs.path("sys", "bus", "pci", "devices", str(addrs[1])), links)
    assert pcie_roots(fs, addrs) == {addrs[0]: "pci0000:00"}
