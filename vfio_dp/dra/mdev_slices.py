"""The pool's mediated-device entries (issue 35 item 4): pure, no I/O.

For each ``mdev:`` entry with ``path: dra`` (:mod:`vfio_dp.model.mdev_config`) and each parent
it names (resolved by :func:`vfio_dp.core.mdev_reconcile.wanted`, the one resolver):

- ``create: static``: one device per instance of the entry's type on the parent
  (``/sys/bus/mdev/devices/<uuid>``, present with its IOMMU group and ``/dev/vfio/<N>``),
  named ``mdev-<uuid>`` (the UUID is kept across reboots: the mdev pass re-makes it);
- ``create: onPrepare``: one device per *slot*, an instance Prepare may make
  (:mod:`vfio_dp.dra.claimpath.mdev`), named ``mdev-<parent>-<type>-<k>``. The slots are the
  type's ``available_instances`` plus the instances claims made (records ``claim:<uid>``
  under ``<root>/var/lib/vfio_dp/mdev``), so their number and names stay as claims come and
  go; ``count: n`` caps them. Each slot consumes its type's cost of the parent's counter::

    "sharedCounters": [{"name": "mdev-mtty", "counters": {"units": {"value": "24"}}}]
    "consumesCounters": [{"counterSet": "mdev-mtty", "counters": {"units": {"value": "2"}}}]

The cost of a type (:func:`type_cost`) comes from ``available_instances``: the parent's
types share its capacity (mtty: 24 ports; ``mtty-1`` offers 24, ``mtty-2`` 12), so a type
costs ``round(max available / its available)`` units (mtty-2: 2) and the parent's counter
holds slots x cost. A type whose ``available_instances`` is 0 keeps the cost seen before
(the feed remembers it), else 1. Without counters (a cluster that drops them) slots are
``alternative`` devices, left out by :func:`vfio_dp.dra.personalities.fit_api`: only
static instances are published then (an uncounted slot could be given twice).

Attributes: ``kind: mdev``, ``mdevType`` (the type id), ``mdevTypeName`` (its ``name``),
``mdevParent``; a static instance's ``mdevUUID``; for a PCI parent its
``resource.kubernetes.io/pciBusID``, ``pcieRoot`` and ``numaNode``. Never ``vendorID``,
``deviceID`` or ``resourceName``: the classes that select whole devices by those never see
an mdev (and their ``kind`` guard keeps them off anyway).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from vfio_dp.dra.slices import KIND, PCI_BUS_ID, STANDARD, Consumption, Device, _string
from vfio_dp.model.dra_metadata import MDEV_UUID, Attribute
from vfio_dp.model.mdev import MdevInventory, MdevParent, MdevRecord
from vfio_dp.model.mdev_config import STATIC
from vfio_dp.model.naming import mdev_label

KIND_MDEV = "mdev"
#: the counter every slot of a parent consumes its type's cost of
MDEV_COUNTER = "units"
PREFIX = "mdev-"


@dataclass(frozen=True, slots=True)
class MdevWant:
    """One parent an entry names: (parent, type id, ``count`` or None for all, create)."""

    parent: str
    type_id: str
    count: int | None
    create: str


@dataclass(frozen=True, slots=True)
class MdevDevice:
    """A published mdev entry: its slice form and what Prepare needs to hand it over."""

    device: Device
    parent: str
    type_id: str
    uuid: str | None  # a static instance's; None for a slot

    @property
    def slot(self) -> bool:
        return self.uuid is None


def slot_name(parent: str, type_id: str, k: int) -> str:
    """``mdev-mtty-mtty-2-3``; ``mdev-0000-3b-00-0-nvidia-222-0`` (a DNS label, stable)."""
    name = f"{PREFIX}{mdev_label(parent)}-{mdev_label(type_id)}-{k}"
    if len(name) <= 63:
        return name
    digest = hashlib.sha256(f"{parent}\0{type_id}".encode()).hexdigest()[:10]
    return f"{PREFIX}{digest}-{k}"


def instance_name(uuid: str) -> str:
    """``mdev-<uuid>`` (41 characters)."""
    return PREFIX + uuid


def counter_set(parent: str) -> str:
    """``mdev-<parent>``: the parent's counter set (a DNS label)."""
    name = PREFIX + mdev_label(parent)
    return name if len(name) <= 63 else PREFIX + hashlib.sha256(parent.encode()).hexdigest()[:20]


def type_cost(parent: MdevParent, type_id: str, seen: MutableMapping[tuple[str, str], int]) -> int:
    """The units of the parent's capacity one instance of ``type_id`` takes (module doc);
    ``seen`` remembers it for when ``available_instances`` says nothing (0)."""
    counts = [t.available for t in parent.types if t.available]
    mine = next((t.available for t in parent.types if t.type_id == type_id), None)
    key = (parent.name, type_id)
    if mine and counts:
        seen[key] = max(1, round(max(counts) / mine))
    return seen.get(key, 1)


def mdev_devices(
    inv: MdevInventory,
    wants: Sequence[MdevWant],
    records: Iterable[MdevRecord],
    roots: Mapping[str, str],
    numa: Mapping[str, int],
    costs: MutableMapping[tuple[str, str], int],
    held: Iterable[str] = (),
) -> list[MdevDevice]:
    """The pool's mdev entries (module docstring). ``records``: the mdev store's records;
    ``roots``/``numa``: a PCI parent's PCIe root and NUMA node by parent name; ``held``:
    slot names prepared claims hold (kept published even when the slots shrank)."""
    parents = {p.name: p for p in inv.parents}
    claimed = [r for r in records if r.by.startswith("claim:")]
    claimed_uuids = {r.uuid for r in claimed}
    held_names = set(held)
    out: list[MdevDevice] = []
    for w in wants:
        p = parents.get(w.parent)
        t = p.type(w.type_id) if p is not None else None
        if p is None or t is None:
            continue
        attrs: dict[str, Attribute] = {
            KIND: Attribute("string", KIND_MDEV),
            "mdevType": Attribute("string", w.type_id),
        }
        for key, value in (("mdevTypeName", t.name), ("mdevParent", p.name)):
            if value and (a := _string(value)) is not None:
                attrs[key] = a
        if p.address is not None:
            attrs[PCI_BUS_ID] = Attribute("string", str(p.address))
            if (root := roots.get(p.name)) and (a := _string(root)) is not None:
                attrs[f"{STANDARD}/pcieRoot"] = a
            if (node := numa.get(p.name)) is not None and node >= 0:
                attrs["numaNode"] = Attribute("int", node)
                attrs[f"{STANDARD}/numaNode"] = Attribute("int", node)
        if w.create == STATIC:
            for i in p.instances:
                if i.type_id != w.type_id or i.uuid in claimed_uuids:
                    continue
                if i.iommu_group is None or i.vfio_node is None:
                    continue  # not usable: withdrawn until its group node is back
                mine = {**attrs, MDEV_UUID: Attribute("string", i.uuid)}
                dev = Device(instance_name(i.uuid), dict(sorted(mine.items())))
                out.append(MdevDevice(dev, p.name, w.type_id, i.uuid))
            continue
        made = sum(
            1
            for r in claimed
            if (r.parent, r.type_id) == (p.name, w.type_id)
            and any(i.uuid == r.uuid for i in p.instances)
        )
        slots = (t.available or 0) + made
        if w.count is not None:
            slots = min(slots, w.count)
        cost = type_cost(p, w.type_id, costs)
        use = Consumption(counter_set(p.name), MDEV_COUNTER, cost, total=slots * cost)
        names = [slot_name(p.name, w.type_id, k) for k in range(slots)]
        extra = sorted(n for n in held_names if n.startswith(slot_name(p.name, w.type_id, 0)[:-1]))
        for name in dict.fromkeys([*names, *extra]):
            dev = Device(name, dict(sorted(attrs.items())), consumes=(use,), alternative=True)
            out.append(MdevDevice(dev, p.name, w.type_id, None))
    return sorted(out, key=lambda m: m.device.name)
