"""A group offered as a VM device and as itself, for containers, in one pool: pure.

design.md, "What a passthrough unit is": a unit may be offered in two personalities on the
DRA path. A selector's ``personalities`` (``[vm]`` by default, ``[vm, container]``,
``[container]``) and the host's discovery of the device nodes its native driver makes give
each published group an :class:`Offer`; :func:`with_personalities` turns the group's VFIO
entry (:func:`vfio_dp.dra.slices.device_for`) into what the pool publishes for it.

Every device carries ``"kind": {"string": "vfio"}``. A group offered in more than one
personality (an :class:`Offer` with ``container``: design.md, "What a passthrough unit is")
is published as two devices that each consume 1 of the group's counter (value 1), so the
scheduler hands out at most one of them: today's device (``kind`` ``vfio``) and
``<name>-native`` (``kind`` ``native``: ``pciBusID``, ``pcieRoot``, ``numaNode``,
``iommuGroup`` and ``nativeDriver``, never ``vendorID``/``deviceID``/``resourceName``, which
the VM DeviceClasses select by)::

    "consumesCounters": [{"counterSet": "groups-1", "counters": {"g45": {"value": "1"}}}]

Group counters are :data:`~vfio_dp.dra.slices.GROUP_COUNTERS_PER_SET` to a set, the set fixed by the group
number (``groups-<N // 32>``, counter ``g<N>``: stable across republishes and restarts), the
sets :data:`~vfio_dp.dra.slices.MAX_COUNTER_SETS` to a slice (4,096 groups: 16 counter slices). A VF offered
twice consumes both its PF's ``vfs`` and its group's counter. Both entries of such a group
carry ``bindingConditions: ["<driver>/ready"]`` and ``bindingFailureConditions:
["<driver>/failed"]`` (KEP-5007: a claim on either may need a driver switch, done before the
pod is bound).

:func:`fit_api` shapes the pool for a cluster that drops the counter or binding fields on
write (their feature gates off): the publisher finds that out from the server's answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from vfio_dp.dra.slices import (
    IOMMU_GROUP,
    KIND,
    KIND_NATIVE,
    PCI_BUS_ID,
    STANDARD,
    Device,
    group_counter,
)
from vfio_dp.model.dra_metadata import Attribute
from vfio_dp.model.naming import dra_native_name
from vfio_dp.model.personality import Personality

MAX_STRING = 64


@dataclass(frozen=True, slots=True)
class Offer:
    """How one published group is offered (from its selector's ``personalities``, in order,
    and the host's discovery of its device nodes): ``native_driver`` is the driver its
    container entry runs on (``nvme``); a group offered only as ``vm`` needs no Offer."""

    personalities: tuple[Personality, ...] = (Personality.VM,)
    native_driver: str | None = None


#: the attributes a container entry shares with its VFIO entry (never the IDs or the
#: resource name the VM DeviceClasses select by)
_NATIVE_SHARED = (PCI_BUS_ID, f"{STANDARD}/pcieRoot", f"{STANDARD}/numaNode", "numaNode",
                  IOMMU_GROUP, "pfPciBusID")  # fmt: skip


def with_personalities(
    devices: Sequence[Device], offers: Mapping[str, Offer], driver: str
) -> list[Device]:
    """``devices`` (each a group's VFIO entry, by name) as the groups are offered
    (``offers`` by device name; a group without one is offered as ``vm``): a group offered
    as ``container`` only is its native entry; one offered in both is both entries, each
    consuming its group's counter and carrying the binding conditions (module docstring);
    one offered in no personality (``container`` only, without device nodes) is left out."""
    out: list[Device] = []
    for d in devices:
        offer = offers.get(d.name)
        if offer is None or offer.personalities == (Personality.VM,):
            out.append(d)
            continue
        if Personality.CONTAINER not in offer.personalities:  # ``[]``: nothing to offer
            out.extend([d] if Personality.VM in offer.personalities else [])
            continue
        native_attrs = {k: d.attributes[k] for k in _NATIVE_SHARED if k in d.attributes}
        native_attrs[KIND] = Attribute("string", KIND_NATIVE)
        if offer.native_driver and len(offer.native_driver) <= MAX_STRING:
            native_attrs["nativeDriver"] = Attribute("string", offer.native_driver)
        native = Device(
            dra_native_name(d.name), dict(sorted(native_attrs.items())), d.taints, d.consumes
        )
        entries = {Personality.VM: d, Personality.CONTAINER: native}
        wanted = [entries[p] for p in dict.fromkeys(offer.personalities) if p in entries]
        if len(wanted) > 1 and d.iommu_group is not None:
            shared = group_counter(d.iommu_group)
            wanted = [
                replace(
                    e,
                    consumes=(*e.consumes, shared),
                    binding_conditions=(f"{driver}/ready",),
                    binding_failure_conditions=(f"{driver}/failed",),
                    alternative=i > 0,
                )
                for i, e in enumerate(wanted)
            ]
        out.extend(wanted)
    return sorted(out, key=lambda d: d.name)


def fit_api(devices: Sequence[Device], *, counters: bool, binding: bool) -> list[Device]:
    """``devices`` as a cluster that keeps (or drops) the counter fields
    (``DRAPartitionableDevices``) and the binding fields (``DRADeviceBindingConditions``)
    can hold them: without counters only each group's first personality, consuming nothing;
    without binding conditions none. The same list when both are kept."""
    if counters and binding:
        return list(devices)
    out = []
    for d in devices:
        if not counters and d.alternative:
            continue
        if (not counters and d.consumes) or (not binding and d.binding_conditions):
            d = replace(
                d,
                consumes=d.consumes if counters else (),
                binding_conditions=d.binding_conditions if binding else (),
                binding_failure_conditions=d.binding_failure_conditions if binding else (),
            )
        out.append(d)
    return out


def dropped(sent: Mapping[str, Any], got: Mapping[str, Any]) -> tuple[bool, bool]:
    """(counter fields dropped, binding fields dropped): what the server's answer ``got``
    lacks of the slice spec ``sent`` (a feature gate off drops them without an error)."""
    pairs = list(zip(sent.get("devices") or [], got.get("devices") or [], strict=False))
    counters = ("sharedCounters" in sent and "sharedCounters" not in got) or any(
        "consumesCounters" in d and "consumesCounters" not in g for d, g in pairs
    )
    binding = any("bindingConditions" in d and "bindingConditions" not in g for d, g in pairs)
    return counters, binding
