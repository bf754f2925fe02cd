"""ResourceSlices for one node, built from the node core's inventory: pure, no I/O.

One pool per node, named after the node; one DRA device per IOMMU group that can be handed
over (:func:`vfio_dp.model.serving.dra_units`), named after the group's first endpoint
(``pci-0000-3b-00-0``); at most :data:`MAX_DEVICES_PER_SLICE` devices per slice (64 while a
device of the pool is tainted: :mod:`vfio_dp.dra.observers.health`), every slice carrying
``pool.resourceSliceCount``; every slice owned by the Node. Each device is a typed
:class:`Device` (its attributes :class:`~vfio_dp.model.dra_metadata.Attribute` values, which
Prepare copies into the device metadata and checks against the hardware; its taints); the
slices themselves are plain dicts in the API's JSON form (``resource.k8s.io/v1``)::

    {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
     "metadata": {"name": "node-a-vfio.dra.vfio-dp.io-0", "ownerReferences": [<the Node>]},
     "spec": {"driver": "vfio.dra.vfio-dp.io", "nodeName": "node-a",
              "pool": {"name": "node-a", "generation": 7, "resourceSliceCount": 1},
              "devices": [{"name": "pci-0000-3b-00-0", "attributes": {
                  "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
                  "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
                  "resource.kubernetes.io/numaNode": {"int": 0},
                  "vendorID": {"string": "10de"}, "deviceID": {"string": "1eb8"},
                  "classID": {"string": "030200"}, "subsystemVendorID": {"string": "10de"},
                  "subsystemDeviceID": {"string": "12a2"}, "iommuGroup": {"int": 45},
                  "numaNode": {"int": 0}, "resourceName": {"string": "devices.kubevirt.io/10de_1eb8"},
                  "functions": {"int": 2}, "groupFunctions": {"string": "0000:3b:00.1"},
                  "vfioDriver": {"string": "vfio-pci"}, "kind": {"string": "vfio"}}}]}}

An SR-IOV VF also carries its PF's address, ``"pfPciBusID": {"string": "0000:af:00.0"}``
(with ``pcieRoot``, claims can ask for VFs of one PF or spread them across PFs), and consumes
one ``vfs`` counter of its PF's counter set (partitionable devices, KEP-4815: the scheduler
sees the VFs as parts of one PF)::

    "consumesCounters": [{"counterSet": "pf-0000-af-00-0", "counters": {"vfs": {"value": "1"}}}]

The counter sets live in a slice of their own in the same pool (the API allows ``devices`` or
``sharedCounters`` in one slice, never both; at most :data:`MAX_COUNTER_SETS` sets per
slice), counted in ``pool.resourceSliceCount``; each PF's ``vfs`` is the number of its VFs
this pool publishes::

    "spec": {..., "pool": {..., "resourceSliceCount": 2},
             "sharedCounters": [{"name": "pf-0000-af-00-0", "counters": {"vfs": {"value": "2"}}}]}

Every device carries ``"kind": {"string": "vfio"}``; a group offered for containers too
gets a second entry (:mod:`vfio_dp.dra.personalities`), both consuming 1 of the group's
counter (:func:`group_counter`: ``g<N>`` in set ``groups-<N // 32>``, stable across
republishes and restarts; the sets :data:`MAX_COUNTER_SETS` to a slice, so 4,096 groups need
16 counter slices). A VF offered twice consumes its PF's ``vfs`` and its group's counter.

A cluster without ``DRAPartitionableDevices`` (beta, on by default since 1.36) drops the
counter fields when the slice is written, one without ``DRADeviceBindingConditions`` the
binding fields: :func:`fit_api` then leaves them out, and without counters publishes only
the first of a group's personalities (the publisher finds out from the server's answers).

Placement is stable (:class:`Layout`): a device stays in its slice and a counter set in its
slice across republishes; new ones fill the lowest slice with room. So one device changing
rewrites one slice, and the publisher keeps the pool's generation for a single write, as
upstream's ResourceSlice controller does.

Driver attributes are bare identifiers, i.e. in the driver's own domain (CEL:
``device.attributes["<driver>"].vendorID``), as upstream's example driver publishes them. Invariants (tested against the API-server
stand-in's copy of upstream validation): names are DNS labels/subdomains, at most 32
attributes per device, strings at most :data:`MAX_STRING` characters (longer optional values
are left out, never cut), an empty pool is one slice without devices.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vfio_dp.model.device import Inventory
from vfio_dp.model.dra_metadata import Attribute
from vfio_dp.model.serving import DraUnit, dra_units

API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES_PER_SLICE = 128
#: a slice holding any device with taints (or counters, list attributes) holds at most 64
MAX_DEVICES_WITH_TAINTS = 64
#: counter sets per slice (``spec.sharedCounters``)
MAX_COUNTER_SETS = 8
#: the counter each VF consumes one of, in its PF's counter set
VF_COUNTER = "vfs"
#: group counters per counter set (``ResourceSliceMaxCountersPerCounterSet``)
GROUP_COUNTERS_PER_SET = 32
#: the attribute saying which personality a device is, and its values
KIND = "kind"
KIND_VFIO = "vfio"
KIND_NATIVE = "native"
MAX_STRING = 64
MAX_NAME = 253
STANDARD = "resource.kubernetes.io"
#: label on every slice we write (with the pool's name in ``spec``, how we find ours)
MANAGED_BY = ("app.kubernetes.io/managed-by", "vfio-dp")

#: attributes Prepare reads back from a published device
IOMMU_GROUP = "iommuGroup"
PCI_BUS_ID = f"{STANDARD}/pciBusID"

Slice = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Consumption:
    """``value`` of counter ``counter`` in counter set ``counter_set`` a device consumes."""

    counter_set: str
    counter: str
    value: int = 1
    #: the counter's value in its set when the consumer knows it (an mdev parent's
    #: capacity); None: one per VF for :data:`VF_COUNTER`, else 1 (a group's counter)
    total: int | None = None


@dataclass(frozen=True, slots=True)
class Device:
    """One ResourceSlice device: a published IOMMU group (``pci-0000-3b-00-0``) and its
    attributes by name, sorted (see the module docstring)."""

    name: str
    attributes: Mapping[str, Attribute]
    #: ``[{"key": "<driver>/unhealthy", "value": ..., "effect": "NoSchedule", "timeAdded":
    #: ...}]`` while the group is unhealthy and prepared (:mod:`vfio_dp.dra.observers.health`)
    taints: tuple[Mapping[str, str], ...] = ()
    #: the counters it consumes: a VF one :data:`VF_COUNTER` of its PF's set
    #: (:func:`counter_set_name`), each entry of a group offered twice its group's counter
    consumes: tuple[Consumption, ...] = ()
    #: KEP-5007 (:func:`with_personalities`): the scheduler binds the pod only once these
    #: conditions are True in the claim's ``status.devices``, and gives up on a failure one
    binding_conditions: tuple[str, ...] = ()
    binding_failure_conditions: tuple[str, ...] = ()
    #: not its group's first personality: left out where the API has no counters
    alternative: bool = False

    @property
    def iommu_group(self) -> int | None:
        """The ``iommuGroup`` it was published with."""
        attr = self.attributes.get(IOMMU_GROUP)
        return attr.value if attr is not None and isinstance(attr.value, int) else None

    def to_json(self) -> dict[str, Any]:
        """``{"name": ..., "attributes": {"vendorID": {"string": "10de"}, ...}}`` (and
        ``"taints": [...]`` when tainted)."""
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: a.to_json() for k, a in sorted(self.attributes.items())},
        }
        if self.taints:
            out["taints"] = [dict(t) for t in self.taints]
        if self.consumes:
            sets: dict[str, dict[str, Any]] = {}
            for c in self.consumes:
                sets.setdefault(c.counter_set, {})[c.counter] = {"value": str(c.value)}
            out["consumesCounters"] = [
                {"counterSet": name, "counters": counters} for name, counters in sets.items()
            ]
        if self.binding_conditions:
            out["bindingConditions"] = list(self.binding_conditions)
            out["bindingFailureConditions"] = list(self.binding_failure_conditions)
        return out


def counter_set_name(pf: PciAddress) -> str:
    """``pf-0000-af-00-0``: the counter set of the PF at ``pf`` (a DNS label, as the API
    wants counter set names)."""
    return "pf-" + str(pf).replace(":", "-").replace(".", "-")


def group_counter(group: int) -> Consumption:
    """The counter of IOMMU group ``group``: ``g<N>`` in set ``groups-<N // 32>`` (DNS labels)."""
    return Consumption(f"groups-{group // GROUP_COUNTERS_PER_SET}", f"g{group}")


@dataclass(frozen=True, slots=True)
class NodeRef:
    """The Node that owns the slices (``uid`` None: not known yet — no owner reference)."""

    name: str
    uid: str | None = None


def _string(value: str) -> Attribute | None:
    return Attribute("string", value) if len(value) <= MAX_STRING else None


def device_for(
    unit: DraUnit,
    inventory: Inventory,
    pcie_roots: Mapping[PciAddress, str],
    vfio_driver: str | None = None,
) -> Device:
    """The ResourceSlice device for one published group (see the module docstring).
    ``vfioDriver``: the VFIO driver its primary function is on, else ``vfio_driver`` (the
    one a ``bind: onPrepare`` Prepare will bind, chosen by the host), else left out."""
    dev = inventory.devices[unit.primary]
    attrs: dict[str, Attribute] = {
        PCI_BUS_ID: Attribute("string", str(unit.primary)),
        "vendorID": Attribute("string", dev.vendor),
        "deviceID": Attribute("string", dev.device),
        "classID": Attribute("string", dev.class_code),
        "subsystemVendorID": Attribute("string", dev.subsystem_vendor),
        "subsystemDeviceID": Attribute("string", dev.subsystem_device),
        IOMMU_GROUP: Attribute("int", unit.group),
        "functions": Attribute("int", len(unit.endpoints)),
        KIND: Attribute("string", KIND_VFIO),
    }
    root = pcie_roots.get(unit.primary)
    if root is not None and (value := _string(root)) is not None:
        attrs[f"{STANDARD}/pcieRoot"] = value
    if dev.numa_node is not None and dev.numa_node >= 0:
        attrs["numaNode"] = Attribute("int", dev.numa_node)
        # KEP-6072's standard name, for matchAttribute across drivers (a NIC of the SR-IOV
        # driver, a GPU of NVIDIA's); the driver-domain one stays for existing selectors
        attrs[f"{STANDARD}/numaNode"] = Attribute("int", dev.numa_node)
    consumes: tuple[Consumption, ...] = ()
    if dev.physfn is not None:  # an SR-IOV VF: claims can ask for VFs of one PF, or spread
        attrs["pfPciBusID"] = Attribute("string", str(dev.physfn))
        consumes = (Consumption(counter_set_name(dev.physfn), VF_COUNTER),)
    if (value := _string(unit.resource_name)) is not None:
        attrs["resourceName"] = value
    driver = dev.vfio_driver or vfio_driver
    if driver is not None and (value := _string(driver)) is not None:
        attrs["vfioDriver"] = value
    others = ",".join(str(a) for a in unit.endpoints if a != unit.primary)
    if others and (value := _string(others)) is not None:
        attrs["groupFunctions"] = value
    return Device(unit.name, dict(sorted(attrs.items())), consumes=consumes)


def published_devices(
    inventory: Inventory, config: Config, pcie_roots: Mapping[PciAddress, str]
) -> list[Device]:
    """Every device this node publishes, by name."""
    return devices_for(dra_units(inventory, config), inventory, pcie_roots)


def devices_for(
    units: Sequence[DraUnit], inventory: Inventory, pcie_roots: Mapping[PciAddress, str]
) -> list[Device]:
    """The devices of the published ``units`` (from :func:`dra_units`), by name."""
    return sorted(
        (device_for(u, inventory, pcie_roots) for u in units if u.published),
        key=lambda d: d.name,
    )


def slice_name(node: str, driver: str, index: int | str) -> str:
    """``<node>-<driver>-<index>``: a DNS subdomain (both parts are); a hash keeps it at most
    253 characters when the node and driver names are long. Counter slices have the index
    ``counters-<k>``."""
    name = f"{node}-{driver}-{index}"
    if len(name) <= MAX_NAME:
        return name
    import hashlib  # here: it loads OpenSSL (~4 ms), and only slice names need it

    digest = hashlib.sha256(f"{node}\0{driver}".encode()).hexdigest()[:12]
    return f"{node[: MAX_NAME - len(digest) - 24].rstrip('.-')}-{digest}-{index}"


def _place(keys: Sequence[str], capacity: int, previous: Mapping[str, int]) -> dict[str, int]:
    """Each key's bin: the one ``previous`` gave it while that bin has room, else the lowest
    bin with room (in ``keys``' order)."""
    out: dict[str, int] = {}
    fill: dict[int, int] = {}
    for k in keys:
        b = previous.get(k)
        if b is not None and fill.get(b, 0) < capacity:
            out[k] = b
            fill[b] = fill.get(b, 0) + 1
    b = 0
    for k in keys:
        if k not in out:
            while fill.get(b, 0) >= capacity:
                b += 1
            out[k] = b
            fill[b] = fill.get(b, 0) + 1
    return out


@dataclass(frozen=True, slots=True)
class Layout:
    """Where each device and counter set is published: device name -> device slice index,
    counter set name -> counter slice index, at ``size`` devices per slice at most.
    :func:`layout` keeps what it is given (module docstring)."""

    size: int = MAX_DEVICES_PER_SLICE
    devices: Mapping[str, int] = field(default_factory=dict)
    counter_sets: Mapping[str, int] = field(default_factory=dict)


def _size(devices: Sequence[Device]) -> int:
    if any(d.taints or d.consumes for d in devices):
        return MAX_DEVICES_WITH_TAINTS
    return MAX_DEVICES_PER_SLICE


def shared_counters(devices: Sequence[Device]) -> dict[str, dict[str, int]]:
    """The counter sets the pool defines for ``devices``, by name: a PF's :data:`VF_COUNTER`
    holds one per VF (not per entry: a VF offered twice is one VF), a group's counter 1, a
    counter whose consumers say its ``total`` that (issue 35's mdev slots: the parent's
    capacity, each slot consuming its cost)."""
    sets: dict[str, dict[str, int]] = {}
    for d in devices:
        for c in d.consumes:
            counters = sets.setdefault(c.counter_set, {})
            if c.total is not None:
                counters[c.counter] = c.total
            elif c.counter == VF_COUNTER:  # a VF's second entry is the same VF again
                counters[c.counter] = counters.get(c.counter, 0) + (0 if d.alternative else c.value)
            else:
                counters[c.counter] = 1
    return sets


def layout(devices: Sequence[Device], previous: Layout | None = None) -> Layout:
    """Where ``devices`` go, keeping ``previous`` placements (dropped whole when the slice
    size changes: a first taint or counter in a pool of 128-device slices)."""
    size = _size(devices)
    if previous is None or previous.size != size:
        previous = Layout(size)
    sets = sorted(shared_counters(devices))
    return Layout(
        size,
        _place([d.name for d in devices], size, previous.devices),
        _place(sets, MAX_COUNTER_SETS, previous.counter_sets),
    )


def layout_of(slices: Sequence[Slice], node: str, driver: str) -> Layout:
    """The :class:`Layout` of slices we wrote (as found on the server, e.g. at a restart);
    slices not named by :func:`slice_name` are left out."""
    names = {slice_name(node, driver, i): i for i in range(len(slices) + 1)}
    counter_names = {slice_name(node, driver, f"counters-{i}"): i for i in range(len(slices) + 1)}
    devices: dict[str, int] = {}
    sets: dict[str, int] = {}
    size = MAX_DEVICES_PER_SLICE
    for s in slices:
        name, spec = s["metadata"]["name"], s.get("spec") or {}
        for d in spec.get("devices") or []:
            if name in names:
                devices[d["name"]] = names[name]
            if d.get("taints") or d.get("consumesCounters"):
                size = MAX_DEVICES_WITH_TAINTS
        for cs in spec.get("sharedCounters") or []:
            if name in counter_names:
                sets[cs["name"]] = counter_names[name]
    return Layout(size, devices, sets)


def build_slices(
    devices: Sequence[Device],
    *,
    driver: str,
    node: NodeRef,
    generation: int,
    encode: Callable[[Device], dict[str, Any]] = Device.to_json,
    placement: Layout | None = None,
) -> list[Slice]:
    """The slices of this node's pool at ``generation`` (one without devices when empty):
    the devices' slices as ``placement`` puts them (:func:`layout`; without one, packed in
    order), :data:`MAX_DEVICES_WITH_TAINTS` per slice while any device of the pool is tainted
    or consumes counters; after them, the counter sets in slices of their own (see the
    module docstring). ``encode`` gives a device's JSON (a caller may reuse what it encoded
    before for the same device: the result is only read)."""
    where = placement if placement is not None else layout(devices)
    chunks: dict[int | str, dict[str, Any]] = {}
    for d in devices:
        chunks.setdefault(where.devices[d.name], {"devices": []})["devices"].append(encode(d))
    if not chunks:
        chunks[0] = {"devices": []}
    by_index = dict(sorted(chunks.items(), key=lambda kv: int(kv[0])))
    counted = shared_counters(devices)
    sets: dict[int, list[dict[str, Any]]] = {}
    for name in sorted(counted):
        sets.setdefault(where.counter_sets[name], []).append(
            {
                "name": name,
                "counters": {k: {"value": str(v)} for k, v in sorted(counted[name].items())},
            }
        )
    for k, items in sorted(sets.items()):
        by_index[f"counters-{k}"] = {"sharedCounters": items}
    out: list[Slice] = []
    for index, chunk in by_index.items():
        meta: dict[str, Any] = {
            "name": slice_name(node.name, driver, index),
            "labels": {MANAGED_BY[0]: MANAGED_BY[1]},
        }
        if node.uid:
            meta["ownerReferences"] = [
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "name": node.name,
                    "uid": node.uid,
                    "controller": True,
                }
            ]
        out.append(
            {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": meta,
                "spec": {
                    "driver": driver,
                    "nodeName": node.name,
                    "pool": {
                        "name": node.name,
                        "generation": generation,
                        "resourceSliceCount": len(by_index),
                    },
                    **chunk,
                },
            }
        )
    return out
