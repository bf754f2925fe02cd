"""A group offered to VMs and to containers from one pool (issue 36 items 2 and 5): two
entries consuming 1 of the group's counter (value 1), checked against the API-server
stand-in's copy of upstream validation, the DeviceClasses' CEL (cel-python) and the
scheduler stand-in's allocator, which never gives out both."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import (
    BINDING_FIELDS,
    PARTITIONABLE_FIELDS,
    pool_counter_problems,
    validate_slice,
)
from tests.dra.cel_view import cel_view, selected
from tests.dra.test_sriov_slices import _made_vfs
from tests.dra.topologies import DRA_CONFIG, dra_host
from vfio_dp.dra.deviceclasses import device_classes, native_device_class, selector_expression
from vfio_dp.dra.personalities import Offer, fit_api, with_personalities
from vfio_dp.dra.slices import (
    GROUP_COUNTERS_PER_SET,
    MAX_COUNTER_SETS,
    Consumption,
    Device,
    NodeRef,
    build_slices,
    published_devices,
)
from vfio_dp.host import Host
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.config import load_config_text
from vfio_dp.model.dra_metadata import Attribute
from vfio_dp.model.personality import Personality

DRIVER = "vfio.dra.vfio-dp.io"
BOTH = Offer((Personality.VM, Personality.CONTAINER), "nvme")
NVME = "pci-0000-07-00-0"  # two NVMe functions in IOMMU group 9 (tests/dra/topologies.py)


def _topology(tmp_path: Path) -> list[Device]:
    config = load_config_text(DRA_CONFIG, "c.yaml")
    host = Host(dra_host(tmp_path).root)
    inv = host.scan()
    return published_devices(inv, config, pcie_roots(host.fs, inv.devices))


def _spec_devices(slices: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}


def test_every_device_says_it_is_vfio_and_a_vm_only_pool_is_unchanged(tmp_path: Path) -> None:
    devices = _topology(tmp_path)
    assert all(d.attributes["kind"] == Attribute("string", "vfio") for d in devices)
    assert with_personalities(devices, {}, DRIVER) == devices
    vm = Offer((Personality.VM,))
    assert with_personalities(devices, {NVME: vm}, DRIVER) == devices
    # no counter, no binding condition where nothing is shared
    assert not any(d.consumes or d.binding_conditions for d in devices if d.name == NVME)


def test_a_group_offered_twice_is_two_entries_sharing_its_counter(tmp_path: Path) -> None:
    devices = with_personalities(_topology(tmp_path), {NVME: BOTH}, DRIVER)
    slices = build_slices(devices, driver=DRIVER, node=NodeRef("n"), generation=1)
    assert [validate_slice(s, None) for s in slices] == [[] for _ in slices]
    by_name = _spec_devices(slices)
    vfio, native = by_name[NVME], by_name[f"{NVME}-native"]
    assert vfio["attributes"]["kind"] == {"string": "vfio"}
    assert vfio["attributes"]["vendorID"] == {"string": "144d"}  # today's device, unchanged
    assert native["attributes"] == {
        "iommuGroup": {"int": 9},
        "kind": {"string": "native"},
        "nativeDriver": {"string": "nvme"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
    }  # NOT vendorID/deviceID/resourceName: the VM classes never select it
    counter = [{"counterSet": "groups-0", "counters": {"g9": {"value": "1"}}}]
    assert vfio["consumesCounters"] == native["consumesCounters"] == counter
    for d in (vfio, native):
        assert d["bindingConditions"] == [f"{DRIVER}/ready"]
        assert d["bindingFailureConditions"] == [f"{DRIVER}/failed"]
    (counters,) = [s for s in slices if "sharedCounters" in s["spec"]]
    assert {"name": "groups-0", "counters": {"g9": {"value": "1"}}} in counters["spec"][
        "sharedCounters"
    ]  # beside the SR-IOV PF's set of this topology
    # the other groups are offered as before: no counter
    assert "consumesCounters" not in by_name["pci-0000-3b-00-0"]
    # upstream's rule: publishing both is fine, allocating both is not
    assert pool_counter_problems(slices) == []
    assert pool_counter_problems(slices, allocated={NVME}) == []
    assert pool_counter_problems(slices, allocated={NVME, f"{NVME}-native"}) == [
        "groups-0/g9: 2 consumed, 1 available"
    ]


def test_container_only_is_the_native_entry_alone(tmp_path: Path) -> None:
    only = Offer((Personality.CONTAINER,), "nvme")
    devices = with_personalities(_topology(tmp_path), {NVME: only}, DRIVER)
    names = {d.name for d in devices}
    assert f"{NVME}-native" in names and NVME not in names
    native = next(d for d in devices if d.name == f"{NVME}-native")
    assert not native.consumes and not native.binding_conditions  # nothing shared


def test_a_vf_offered_twice_consumes_its_pf_and_its_group(tmp_path: Path) -> None:
    vfs = _made_vfs(tmp_path, 1, 2)
    offers = {d.name: BOTH for d in vfs}
    devices = with_personalities(vfs, offers, DRIVER)
    slices = build_slices(devices, driver=DRIVER, node=NodeRef("n"), generation=1)
    assert [validate_slice(s, None) for s in slices] == [[] for _ in slices]
    vf = _spec_devices(slices)["pci-0000-10-00-1"]
    native = _spec_devices(slices)["pci-0000-10-00-1-native"]
    group = vf["attributes"]["iommuGroup"]["int"]
    want = [
        {"counterSet": "pf-0000-10-00-0", "counters": {"vfs": {"value": "1"}}},
        {"counterSet": f"groups-{group // 32}", "counters": {f"g{group}": {"value": "1"}}},
    ]
    assert vf["consumesCounters"] == native["consumesCounters"] == want
    assert native["attributes"]["pfPciBusID"] == {"string": "0000:10:00.0"}
    sets = {cs["name"]: cs for s in slices for cs in s["spec"].get("sharedCounters") or []}
    assert sets["pf-0000-10-00-0"]["counters"] == {"vfs": {"value": "2"}}  # one per VF
    one_each = {"pci-0000-10-00-1", "pci-0000-10-00-2-native"}
    assert pool_counter_problems(slices, allocated=one_each) == []
    assert pool_counter_problems(slices, allocated={*one_each, "pci-0000-10-00-1-native"}) == [
        f"groups-{group // 32}/g{group}: 2 consumed, 1 available",
        "pf-0000-10-00-0/vfs: 3 consumed, 2 available",
    ]


def _groups(n: int) -> list[Device]:
    """``n`` synthetic published groups (one function each), by name."""
    return sorted(
        (
            Device(
                f"pci-0000-{g // 256:02x}-{(g % 256) // 8:02x}-{g % 8}",
                {
                    "iommuGroup": Attribute("int", g),
                    "kind": Attribute("string", "vfio"),
                    "resource.kubernetes.io/pciBusID": Attribute(
                        "string", f"0000:{g // 256:02x}:{(g % 256) // 8:02x}.{g % 8}"
                    ),
                },
            )
            for g in range(n)
        ),
        key=lambda d: d.name,
    )


def test_4096_groups_need_16_counter_slices() -> None:
    base = _groups(4096)
    devices = with_personalities(base, {d.name: BOTH for d in base}, DRIVER)
    assert len(devices) == 8192
    slices = build_slices(devices, driver=DRIVER, node=NodeRef("n"), generation=1)
    counter_slices = [s for s in slices if "sharedCounters" in s["spec"]]
    assert len(counter_slices) == 4096 // GROUP_COUNTERS_PER_SET // MAX_COUNTER_SETS == 16
    assert all(len(s["spec"]["sharedCounters"]) == MAX_COUNTER_SETS for s in counter_slices)
    assert all(
        len(cs["counters"]) == GROUP_COUNTERS_PER_SET
        for s in counter_slices
        for cs in s["spec"]["sharedCounters"]
    )
    assert all(validate_slice(s, None) == [] for s in slices)
    assert pool_counter_problems(slices) == []
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {len(slices)}


def test_without_counters_only_the_first_personality_is_published(tmp_path: Path) -> None:
    base = _topology(tmp_path)
    vm_first = with_personalities(base, {NVME: BOTH}, DRIVER)
    container_first = with_personalities(
        base, {NVME: Offer((Personality.CONTAINER, Personality.VM), "nvme")}, DRIVER
    )
    assert fit_api(vm_first, counters=True, binding=True) == vm_first
    plain = fit_api(vm_first, counters=False, binding=True)
    assert {d.name for d in plain} == {d.name for d in base}  # the VFIO entry only
    assert all(not d.consumes for d in plain)
    natives = fit_api(container_first, counters=False, binding=True)
    names = {d.name for d in natives}
    assert f"{NVME}-native" in names and NVME not in names
    no_binding = fit_api(vm_first, counters=True, binding=False)
    assert len(no_binding) == len(vm_first)
    assert not any(d.binding_conditions or d.binding_failure_conditions for d in no_binding)
    assert all(d.consumes for d in no_binding if d.name.startswith(NVME))
    # what is left is what a cluster with both gates off keeps of the full pool
    dropped = PARTITIONABLE_FIELDS | BINDING_FIELDS
    for s in build_slices(fit_api(vm_first, counters=False, binding=False), driver=DRIVER,
                          node=NodeRef("n"), generation=1):  # fmt: skip
        assert not dropped & set(s["spec"])
        assert not any(dropped & set(d) for d in s["spec"]["devices"])


def test_classes_keep_vm_claims_off_container_entries(tmp_path: Path) -> None:
    """The generated classes (kind guard) and the container class, evaluated with CEL."""
    config = load_config_text(DRA_CONFIG, "c.yaml")
    devices = with_personalities(_topology(tmp_path), {NVME: BOTH}, DRIVER)
    view = cel_view([d.to_json() for d in devices], DRIVER)
    classes = device_classes(config, DRIVER, [("10de", "1eb8"), ("144d", "a808")])
    by = {
        c["spec"]["extendedResourceName"]: selected(
            [s["cel"]["expression"] for s in c["spec"]["selectors"]], view
        )
        for c in classes
    }
    assert by["devices.kubevirt.io/144d_a808"] == {NVME}  # never the native entry
    native = native_device_class(DRIVER)
    assert selected([native["spec"]["selectors"][0]["cel"]["expression"]], view) == {
        f"{NVME}-native"
    }
    # a device an older plugin published (no kind) is still a VM's
    old = [{**v, "attributes": {DRIVER: {k: x for k, x in v["attributes"][DRIVER].items()
                                         if k != "kind"}} | {
        k: x for k, x in v["attributes"].items() if k != DRIVER}} for v in view if v["name"] == NVME]  # fmt: skip
    assert selected([selector_expression(DRIVER, "devices.kubevirt.io/144d_a808")], old) == {NVME}
    assert selected([native["spec"]["selectors"][0]["cel"]["expression"]], old) == set()


@pytest.mark.parametrize(
    ("field", "value", "cause"),
    [
        ("bindingConditions", [], "bindingConditions are required"),
        ("bindingFailureConditions", [], "bindingFailureConditions are required"),
        ("bindingFailureConditions", [f"{DRIVER}/ready"], "must not overlap"),
        ("bindingConditions", ["a", "b", "c", "d", "e"], "Too many"),
    ],
)
def test_standin_refuses_broken_binding_conditions(
    tmp_path: Path, field: str, value: list[str], cause: str
) -> None:
    """The stand-in's copy of validateDeviceBindingParameters can fail."""
    devices = with_personalities(_topology(tmp_path), {NVME: BOTH}, DRIVER)
    (s, *_) = build_slices(devices, driver=DRIVER, node=NodeRef("n"), generation=1)
    d = next(d for d in s["spec"]["devices"] if d["name"] == NVME)
    d[field] = value
    assert any(cause in f"{p} {m}" for p, m in validate_slice(s, None))


def test_a_counter_whose_consumers_say_its_total() -> None:
    """What mdev slots reuse (issue 35): a parent's counter of its capacity, each slot
    consuming its cost; allocating past the capacity is refused by the pool check."""
    slots = [
        Device(f"mdev-slot-{i}", {"kind": Attribute("string", "mdev")},
               consumes=(Consumption("parent-mtty", "ports", cost, total=24),))
        for i, cost in enumerate([2] * 12 + [1])
    ]  # fmt: skip
    slices = build_slices(slots, driver=DRIVER, node=NodeRef("n"), generation=1)
    assert all(validate_slice(s, None) == [] for s in slices)
    sets = [cs for s in slices for cs in s["spec"].get("sharedCounters") or []]
    assert sets == [{"name": "parent-mtty", "counters": {"ports": {"value": "24"}}}]
    twelve = {f"mdev-slot-{i}" for i in range(12)}
    assert pool_counter_problems(slices, allocated=twelve) == []
    assert pool_counter_problems(slices, allocated={*twelve, "mdev-slot-12"}) == [
        "parent-mtty/ports: 25 consumed, 24 available"
    ]
