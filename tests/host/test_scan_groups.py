"""``Host.scan_groups``: a claim's IOMMU groups read alone say what a full scan says of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dra.topologies import DRA_CONFIG, dra_host
from tests.sysfs_tree import Dev, SysfsTree, gpu_host
from vfio_dp.host import Host
from vfio_dp.host.state import OriginalDriver
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text
from vfio_dp.model.serving import dra_units

#: everything on the DRA path, so every group of gpu_host has a unit to compare
ALL_DRA = """
selectors:
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - class: "02"
    path: dra
  - class: "01"
    path: dra
    bind: onPrepare
  - class: "03"
    path: dra
"""


def _trees(base: Path) -> list[tuple[SysfsTree, str]]:
    dra = dra_host(base / "dra")
    gpu = gpu_host(base / "gpu")
    # a bind record: original_driver comes from it in both reads
    Host(gpu.root).state.put(OriginalDriver("0000:3b:00.0", "nvidia", None, "10de", "1eb8"))
    return [(dra, DRA_CONFIG), (gpu, ALL_DRA)]


def test_each_group_read_alone_is_what_a_full_scan_says_of_it(tmp_path: Path) -> None:
    compared = 0
    for tree, text in _trees(tmp_path):
        host = Host(tree.root)
        config = load_config_text(text, "test")
        full = host.scan()
        full_units = {u.group: u for u in dra_units(full, config)}
        for addr, dev in full.devices.items():
            if dev.iommu_group is None:
                continue
            part = host.scan_groups([addr])
            group = full.groups[dev.iommu_group]
            assert part.groups == {group.number: group}, addr
            assert part.devices == {a: full.devices[a] for a in group.devices}, addr
            assert list(part.devices) == sorted(part.devices)  # address order, as a scan's
            want = [full_units[group.number]] if group.number in full_units else []
            assert dra_units(part, config) == want, addr
            compared += 1
    assert compared >= 20
    # the comparison saw what matters: host use, a bind record, reasons, a shared group
    dra_full = Host(tmp_path / "dra").scan()
    assert dra_full.devices[PciAddress.parse("0000:00:03.0")].in_use
    gpu_full = Host(tmp_path / "gpu").scan()
    assert gpu_full.devices[PciAddress.parse("0000:3b:00.0")].original_driver == "nvidia"


def test_several_addresses_and_unknown_ones(tmp_path: Path) -> None:
    tree = dra_host(tmp_path)
    host = Host(tree.root)
    part = host.scan_groups(
        [PciAddress.parse(a) for a in ("0000:07:00.0", "0000:af:00.1", "0000:99:00.0")]
    )
    assert sorted(part.groups) == [9, 61]
    assert [str(a) for a in part.devices] == [
        "0000:05:00.0", "0000:06:00.0", "0000:06:01.0", "0000:07:00.0", "0000:08:00.0",
        "0000:af:00.1",
    ]  # fmt: skip
    assert host.scan_groups([PciAddress.parse("0000:99:00.0")]).devices == {}


def test_a_device_without_a_group_is_read_and_groupless(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path, iommu=False)
    tree.add(Dev("0000:01:00.0", "8086", "10d3", "020000", driver="e1000e"))
    part = Host(tree.root).scan_groups([PciAddress.parse("0000:01:00.0")])
    assert list(part.devices) == [PciAddress.parse("0000:01:00.0")]
    assert part.groups == {} and not part.iommu_present


@pytest.mark.parametrize("member", ["0000:06:00.0", "0000:08:00.0"])
def test_any_member_names_the_whole_group(tmp_path: Path, member: str) -> None:
    tree = dra_host(tmp_path)
    part = Host(tree.root).scan_groups([PciAddress.parse(member)])
    assert sorted(map(str, part.groups[9].devices)) == [
        "0000:05:00.0", "0000:06:00.0", "0000:06:01.0", "0000:07:00.0", "0000:08:00.0",
    ]  # fmt: skip


def test_a_group_dir_linking_out_of_the_root_lists_nothing(tmp_path: Path) -> None:
    tree = dra_host(tmp_path / "root")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "0000:65:00.0").touch()  # a device of another group, named from outside
    devices = tree.root / "sys/kernel/iommu_groups/9/devices"
    for entry in devices.iterdir():
        entry.unlink()
    devices.rmdir()
    devices.symlink_to(outside)
    part = Host(tree.root).scan_groups([PciAddress.parse("0000:07:00.0")])
    # the named device is still read (through sys/bus/pci/devices, inside the root); the
    # listing out of the root is not used
    assert [str(a) for a in part.devices] == ["0000:07:00.0"]
    assert part.groups[9].devices == (PciAddress.parse("0000:07:00.0"),)
