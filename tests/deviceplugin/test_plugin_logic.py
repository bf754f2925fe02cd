"""The pure plugin logic on hand-built inventories (no I/O, no gRPC)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from vfio_dp.deviceplugin.allocation import (
    allocate,
    preferred_allocation,
    record_from_json,
    record_grants,
    record_to_json,
    verify_prestart,
)
from vfio_dp.deviceplugin.listing import changes, compute_listing
from vfio_dp.errors import StaleAllocationError, UnhealthyDeviceError, UnknownDeviceError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEFAULT_CONFIG, load_config_text
from vfio_dp.model.device import Inventory, IommuGroup, PciDevice, analyse_group

A = PciAddress.parse
NIC = "devices.kubevirt.io/8086_10d3"
GPU = "devices.kubevirt.io/10de_1eb8"


def dev(
    addr: str,
    vendor: str = "8086",
    device: str = "10d3",
    *,
    driver: str | None = "vfio-pci",
    group: int | None = None,
    numa: int | None = -1,
    cls: str = "020000",
) -> PciDevice:
    return PciDevice(A(addr), vendor, device, cls, driver=driver, iommu_group=group, numa_node=numa)


def inventory(*devices: PciDevice) -> Inventory:
    members: dict[int, list[PciDevice]] = {}
    for d in devices:
        if d.iommu_group is not None:
            members.setdefault(d.iommu_group, []).append(d)
    return Inventory(
        devices={d.address: d for d in devices},
        groups={n: analyse_group(n, ms) for n, ms in members.items()},
    )


def nodes_for(group: IommuGroup, devices: list[PciDevice]) -> list[str]:
    name = f"noiommu-{group.number}" if group.noiommu else str(group.number)
    return ["/dev/vfio/vfio", f"/dev/vfio/{name}"]


def gpu_box() -> Inventory:
    """Two lone NICs (groups 1, 2; NUMA 0, 1), a GPU + audio in group 7, a NIC on e1000e."""
    return inventory(
        dev("0000:01:00.0", group=1, numa=0),
        dev("0000:02:00.0", group=2, numa=1),
        dev("0000:65:00.0", "10de", "1eb8", group=7, cls="030000"),
        dev("0000:65:00.1", "10de", "10f8", group=7, cls="040300"),
        dev("0000:03:00.0", driver="e1000e", group=3),
        dev("0000:00:01.0", "8086", "1234", driver="pcieport", group=7, cls="060400"),
    )


def test_default_config_lists_vfio_devices_one_unit_per_group() -> None:
    listing = compute_listing(gpu_box(), DEFAULT_CONFIG)
    assert set(listing.resources) == {NIC, GPU, "devices.kubevirt.io/10de_10f8"}
    nics = listing.units(NIC)
    assert [str(u.id) for u in nics] == ["0000:01:00.0", "0000:02:00.0"]
    assert all(u.healthy for u in nics)
    assert [u.numa_nodes for u in nics] == [(0,), (1,)]
    # the GPU's audio function would be its own default resource: the group is a conflict
    gpu = listing.units(GPU)[0]
    assert not gpu.healthy and "several resources" in gpu.reasons[0]
    assert listing.conflicts == {7: ("devices.kubevirt.io/10de_10f8", GPU)}


def test_one_resource_name_for_a_group_makes_one_healthy_unit_with_primary_first() -> None:
    cfg = load_config_text(
        "selectors:\n- vendor: '10de'\n  resourceName: gpu\n- drivers: [vfio-pci]\n", "t"
    )
    listing = compute_listing(gpu_box(), cfg)
    (unit,) = listing.units("devices.kubevirt.io/gpu")
    assert unit.healthy and unit.id == A("0000:65:00.0")
    assert unit.members == (A("0000:65:00.0"), A("0000:65:00.1"))
    assert unit.numa_nodes == ()  # numa_node -1 → no topology


def test_a_non_viable_group_is_never_healthy() -> None:
    inv = inventory(
        dev("0000:65:00.0", "10de", "1eb8", group=7, cls="030000"),
        dev("0000:65:00.1", "10de", "10f8", driver="snd_hda_intel", group=7, cls="040300"),
    )
    (unit,) = compute_listing(inv, DEFAULT_CONFIG).units(GPU)
    assert not unit.healthy
    assert "not viable" in unit.reasons[0] and "snd_hda_intel" in unit.reasons[0]


def test_selected_device_off_vfio_is_listed_unhealthy_and_sticky() -> None:
    inv = gpu_box()
    first = compute_listing(inv, DEFAULT_CONFIG)
    off = replace(inv.devices[A("0000:01:00.0")], driver="e1000e")
    inv2 = inventory(*(off if d.address == off.address else d for d in inv.devices.values()))
    second = compute_listing(inv2, DEFAULT_CONFIG, first)
    unit = second.unit(NIC, "0000:01:00.0")
    assert unit is not None and not unit.healthy and "left vfio-pci" in unit.reasons[0]
    third = compute_listing(inv2, DEFAULT_CONFIG, second)  # stays while in sysfs
    assert third.unit(NIC, "0000:01:00.0") is not None
    # gone from sysfs: withdrawn
    inv3 = inventory(*(d for d in inv2.devices.values() if d.address != off.address))
    fourth = compute_listing(inv3, DEFAULT_CONFIG, third)
    assert fourth.unit(NIC, "0000:01:00.0") is None
    assert any("withdrawn: it left sysfs" in line for line in changes(third, fourth))
    # config drops it: withdrawn too
    other = load_config_text("selectors:\n- vendor: '10de'\n", "t")
    assert compute_listing(inv2, other, third).unit(NIC, "0000:01:00.0") is None
    # no stickiness without a previous listing (daemon restart)
    assert compute_listing(inv2, DEFAULT_CONFIG).unit(NIC, "0000:01:00.0") is None


def test_changes_say_what_happened_to_which_device() -> None:
    first = compute_listing(gpu_box(), DEFAULT_CONFIG)
    lines = changes(None, first)
    assert f"{NIC}: 0000:01:00.0 (IOMMU group 1) listed Healthy" in lines
    assert changes(first, compute_listing(gpu_box(), DEFAULT_CONFIG, first)) == []


def test_allocate_envs_and_device_nodes() -> None:
    listing = compute_listing(gpu_box(), DEFAULT_CONFIG)
    alloc = allocate(listing, NIC, ["0000:02:00.0", "0000:01:00.0"], nodes_for)
    value = "0000:01:00.0,0000:02:00.0"
    assert alloc.envs == {
        "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3": value,
        "PCIDEVICE_DEVICES_KUBEVIRT_IO_8086_10D3": value,
    }
    assert [d.host_path for d in alloc.devices] == ["/dev/vfio/vfio", "/dev/vfio/2", "/dev/vfio/1"]
    assert all(d.permissions == "mrw" and d.container_path == d.host_path for d in alloc.devices)
    assert [(g.device_id, g.group, g.group_node) for g in alloc.grants] == [
        ("0000:02:00.0", 2, "/dev/vfio/2"),
        ("0000:01:00.0", 1, "/dev/vfio/1"),
    ]


def test_allocate_refuses_unknown_and_unhealthy_ids_naming_them() -> None:
    listing = compute_listing(gpu_box(), DEFAULT_CONFIG)
    with pytest.raises(UnknownDeviceError, match=r"0000:09:00\.0"):
        allocate(listing, NIC, ["0000:09:00.0"], nodes_for)
    with pytest.raises(UnhealthyDeviceError, match=r"0000:65:00\.0.*several resources"):
        allocate(listing, GPU, ["0000:65:00.0"], nodes_for)


def test_allocate_with_no_ids_is_a_malformed_request() -> None:
    from vfio_dp.errors import PluginRequestError

    listing = compute_listing(gpu_box(), DEFAULT_CONFIG)
    with pytest.raises(PluginRequestError, match="no device IDs"):
        allocate(listing, NIC, [], nodes_for)
    with pytest.raises(PluginRequestError, match="no device IDs"):
        verify_prestart(listing, NIC, [], {}, nodes_for)


def test_a_huge_id_is_not_echoed_whole() -> None:
    listing = compute_listing(gpu_box(), DEFAULT_CONFIG)
    huge = "0000:" + "f" * 1_000_000
    with pytest.raises(UnknownDeviceError) as err:
        allocate(listing, NIC, [huge], nodes_for)
    text = str(err.value)
    assert len(text) < 300 and "[1000005 chars]" in text and "0000:ffff" in text
    assert err.value.device_id == huge  # the data is kept; only the message is cut


def test_prestart_catches_a_renumbered_group_and_a_missing_record() -> None:
    inv = gpu_box()
    listing = compute_listing(inv, DEFAULT_CONFIG)
    alloc = allocate(listing, NIC, ["0000:01:00.0"], nodes_for)
    record = record_from_json(record_to_json(record_grants({}, alloc.grants)))
    verify_prestart(listing, NIC, ["0000:01:00.0"], record, nodes_for)
    # reboot: group 1 is now group 9
    moved = replace(inv.devices[A("0000:01:00.0")], iommu_group=9)
    inv2 = inventory(*(moved if d.address == moved.address else d for d in inv.devices.values()))
    listing2 = compute_listing(inv2, DEFAULT_CONFIG)
    stale = "now /dev/vfio/9 but Allocate handed out /dev/vfio/1"
    with pytest.raises(StaleAllocationError, match=stale):
        verify_prestart(listing2, NIC, ["0000:01:00.0"], record, nodes_for)
    with pytest.raises(StaleAllocationError, match="no record"):
        verify_prestart(listing, NIC, ["0000:02:00.0"], record, nodes_for)


def test_preferred_allocation_numa_and_must_include() -> None:
    devices = [dev(f"0000:{b:02x}:00.0", group=b, numa=0 if b < 3 else 1) for b in range(1, 7)]
    listing = compute_listing(inventory(*devices), DEFAULT_CONFIG)
    ids = [str(u.id) for u in listing.units(NIC)]
    # must-include on node 1 pulls the rest from node 1
    assert preferred_allocation(listing, NIC, ids, ["0000:05:00.0"], 3) == [
        "0000:05:00.0",
        "0000:03:00.0",
        "0000:04:00.0",
    ]
    # no must-include: the smallest node that fits (node 0 has 2, node 1 has 4)
    assert preferred_allocation(listing, NIC, ids, [], 2) == ["0000:01:00.0", "0000:02:00.0"]
    assert preferred_allocation(listing, NIC, ids, [], 3) == [
        "0000:03:00.0",
        "0000:04:00.0",
        "0000:05:00.0",
    ]
