"""``Host.scan_groups``: a device's IOMMU group read alone says what a full scan says of it, so
a DRA Prepare, ``bind``, ``unbind``, ``check`` and a front-end's release read only the groups
they act on."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.counting_host import CountingHost
from tests.dra.topologies import DRA_CONFIG, dra_host
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree, gpu_host
from vfio_dp.host import Host
from vfio_dp.host.bound_by import bound_by_claim
from vfio_dp.host.state import OriginalDriver
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text
from vfio_dp.model.plan import plan_bind, plan_check, plan_unbind
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


def test_bind_unbind_and_check_plan_the_same_from_the_group_alone(tmp_path: Path) -> None:
    """Every rule of ``bind`` (with and without ``--group`` and ``--force``), ``check`` and
    ``unbind`` gives the same answer from the device's group read alone as from a full scan
    (with host use, and without it as ``unbind`` reads), for every device of two hosts."""
    planned = 0
    for tree, _text in _trees(tmp_path):
        host = Host(tree.root)
        full, bare = host.scan(), host.scan(usage=False)
        records = host.ledger.records()
        for addr in full.devices:
            part, part_bare = host.scan_groups([addr]), host.scan_groups([addr], usage=False)
            assert part_bare.devices == {a: bare.devices[a] for a in part_bare.devices}, addr
            for group in (False, True):
                for force in (False, True):
                    want = plan_bind(full, [addr], group=group, force=force)
                    assert plan_bind(part, [addr], group=group, force=force) == want, addr
            assert plan_check(part, [addr], {}) == plan_check(full, [addr], {}), addr
            want_unbind = plan_unbind(bare, records, [addr])
            assert plan_unbind(part_bare, records, [addr]) == want_unbind, addr
            planned += 1
    assert planned >= 25


def test_bind_unbind_check_and_release_read_only_their_groups(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """Checking, binding, releasing and unbinding the shared e1000 group read that group
    (the addresses they act on), never every device of the host; each still judged and done
    as before."""
    h = CountingHost(tree.root, kernel=kernel)
    nic, nic2 = PciAddress.parse("0000:03:01.0"), PciAddress.parse("0000:03:02.0")
    [report] = h.check([nic])
    assert not report.ready and "vfioctl bind --group 0000:03:01.0" in " ".join(report.reasons)
    h.bind([nic], group=True, probe=False, bound_by=bound_by_claim("u"))
    assert tree.driver_of(str(nic)) == "vfio-pci" and tree.driver_of(str(nic2)) == "vfio-pci"
    released = h.release(bound_by_claim("u"))
    assert len(released.restored) == 2 and not released.kept, released
    assert tree.driver_of(str(nic)) == "e1000" and tree.driver_of(str(nic2)) == "e1000"
    h.bind([nic], group=True, probe=False)
    h.unbind([nic, nic2])
    assert tree.driver_of(str(nic)) == "e1000" and tree.driver_of(str(nic2)) == "e1000"
    assert h.scans == 0
    both = ["0000:03:01.0", "0000:03:02.0"]
    # check, bind, release (its holdings, then the group it gives back), bind, unbind
    assert h.group_reads == [["0000:03:01.0"], ["0000:03:01.0"], both, both,
                             ["0000:03:01.0"], both]  # fmt: skip


def test_a_group_read_reads_the_bind_records_of_its_own_devices_only(tmp_path: Path) -> None:
    """Issue 39 row 3: ``numVfs: 256`` on 4 PFs bound 1,024 VFs one group at a time, and each
    bind's group read read every bind record on the node (~500,000 reads). It reads its own
    group's now; what it says of them is unchanged (the record's driver)."""
    tree = gpu_host(tmp_path / "gpu")
    host = Host(tree.root)
    host.state.put(OriginalDriver("0000:3b:00.0", "nvidia", None, "10de", "1eb8"))
    for i in range(40):  # other devices' records (bound VFs elsewhere on the node)
        host.state.put(OriginalDriver(f"0000:{0x80 + i:02x}:00.1", "mlx5_core", None, "15b3",
                                      "101c"))  # fmt: skip
    state = host.state
    got, listed = [], []
    real_get, real_all = state.get, state.all
    state.get = lambda a: got.append(a) or real_get(a)  # type: ignore[method-assign]
    state.all = lambda: listed.append(1) or real_all()  # type: ignore[method-assign]
    inv = host.scan_groups([PciAddress.parse("0000:3b:00.0")])
    assert inv.devices[PciAddress.parse("0000:3b:00.0")].original_driver == "nvidia"
    assert listed == [] and len(got) <= len(inv.devices), got  # its group's records only
