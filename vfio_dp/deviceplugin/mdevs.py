"""Mediated devices on the device-plugin path, pure: their kubelet devices, Allocate,
PreStartContainer and GetPreferredAllocation (the node's view comes in as typed values).

Each ``mdev:`` entry with ``path: devicePlugin`` is one resource
(:meth:`vfio_dp.model.mdev_config.MdevEntry.resource_for`: its ``resourceName``, else the
default from the type's ``name`` file, ``GRID T4-1Q`` -> ``devices.kubevirt.io/GRID_T4-1Q``).
One kubelet device per instance of the entry's type on the parents it names, its ID the
instance's UUID (``/sys/bus/mdev/devices/<uuid>``). Health, from sysfs only:

- Healthy: the instance is there, has an IOMMU group (``<uuid>/iommu_group``) and the
  group's ``/dev/vfio/<N>`` exists;
- Unhealthy: either is missing, or the instance is gone while this process's record of it
  (``<root>/var/lib/vfio_dp/mdev/<uuid>.json``) says it should be there (the node core's
  mdev pass makes it again with that UUID, e.g. after a reboot; the kubelet replays
  Allocate's env with the UUID) -- also while its parent is gone from
  ``/sys/class/mdev_bus`` (an entry with a ``resourceName``: :func:`with_gone_parents`).
  A gone instance without such a record is withdrawn.

**Allocate** answers, for the container, ``/dev/vfio/vfio`` and each instance's
``/dev/vfio/<N>`` (``mrw``, host path = container path) and KubeVirt's
``MDEV_PCI_RESOURCE_<RESOURCE>`` = the UUIDs, comma-separated in the order asked
(:func:`vfio_dp.model.naming.kubevirt_mdev_env_var`; virt-launcher splits it on ``,``). The
grants go into the same allocation record as PCI units (device ID = UUID), so
PreStartContainer refuses an instance whose group was renumbered since.

**CDI** (``vfioctl plugin --cdi-dir``), as for PCI units (:mod:`vfio_dp.deviceplugin.cdi`): each
Healthy instance gets ONE spec ``<cdi-dir>/deviceplugin.vfio-dp.io_mdev-<uuid>.json`` whose
device ``mdev-<uuid>`` has the ``deviceNodes`` ``/dev/vfio/vfio`` and ``/dev/vfio/<N>``, and
Allocate adds ``deviceplugin.vfio-dp.io/vfio=mdev-<uuid>`` to ``cdi_devices``
(:func:`mdev_cdi_specs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from vfio_dp.deviceplugin.allocation import (
    ContainerAllocation,
    DeviceNode,
    Grant,
    _checked_ids,
)
from vfio_dp.deviceplugin.listing import HEALTHY, UNHEALTHY
from vfio_dp.errors import StaleAllocationError, UnhealthyDeviceError, UnknownDeviceError
from vfio_dp.model import cdi, naming
from vfio_dp.model.config import DEVICE_PLUGIN
from vfio_dp.model.mdev import MdevInventory, MdevRecord
from vfio_dp.model.mdev_config import STATIC, MdevEntry

#: the container's VFIO container node, handed out with every instance's group node
VFIO_CONTAINER = "/dev/vfio/vfio"


@dataclass(frozen=True, slots=True)
class MdevUnit:
    """One kubelet device: one mdev instance (ID = its UUID)."""

    id: str
    resource: str
    parent: str
    type_id: str
    group: int | None
    vfio_node: str | None  # /dev/vfio/<N>; None when it is missing
    reasons: tuple[str, ...] = ()  # why it is unhealthy; empty = Healthy
    numa_nodes: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


#: resource -> its units, sorted by ID
MdevUnits = dict[str, tuple[MdevUnit, ...]]


def mdev_units(
    inv: MdevInventory,
    served: Iterable[tuple[str, MdevEntry]],
    records: Sequence[MdevRecord],
    by: str,
    domain: str,
) -> MdevUnits:
    """Every device-plugin mdev resource's units. ``served``: (parent name, entry) for each
    parent a ``path: devicePlugin`` entry names now (:func:`vfio_dp.core.mdev_reconcile.wanted`);
    ``records``: the instance records, those ``by`` this process keep a gone instance listed."""
    parents = {p.name: p for p in inv.parents}
    present = {i.uuid for i in inv.instances}
    out: dict[str, dict[str, MdevUnit]] = {}
    for parent_name, entry in served:
        parent = parents.get(parent_name)
        mdev_type = parent.type(entry.type_id) if parent is not None else None
        if mdev_type is None and (parent is not None or not entry.resource_name):
            continue  # a type the parent does not offer; a gone parent's default name is unknown
        resource = entry.resource_for(mdev_type.name if mdev_type else None, domain)
        units = out.setdefault(resource, {})
        for inst in parent.instances if parent is not None else ():
            if inst.type_id != entry.type_id:
                continue
            reasons: list[str] = []
            if inst.iommu_group is None:
                reasons.append(
                    f"mdev {inst.uuid} has no IOMMU group (/sys/bus/mdev/devices/{inst.uuid}/"
                    "iommu_group is missing): is its vendor driver's VFIO support loaded?"
                )
            elif inst.vfio_node is None:
                reasons.append(
                    f"mdev {inst.uuid}: /dev/vfio/{inst.iommu_group} is missing (is vfio "
                    "loaded, and /dev mounted from the host?)"
                )
            units[inst.uuid] = MdevUnit(
                inst.uuid, resource, parent_name, entry.type_id, inst.iommu_group,
                inst.vfio_node, tuple(reasons),
            )  # fmt: skip
        gone = (
            f" when its parent is back (gone from /sys/class/mdev_bus/{parent_name}: is its "
            "vendor driver loaded?)"
        )
        for rec in records:
            if (
                rec.by == by
                and rec.uuid not in present
                and (rec.parent, rec.type_id) == (parent_name, entry.type_id)
            ):
                why = (
                    f"mdev {rec.uuid} ({rec.type_id} on {rec.parent}) is gone from "
                    "/sys/bus/mdev/devices; the node's mdev pass makes it again with this UUID"
                ) + (gone if parent is None else "")
                units[rec.uuid] = MdevUnit(
                    rec.uuid, resource, parent_name, rec.type_id, None, None, (why,)
                )
    return {r: tuple(u[k] for k in sorted(u)) for r, u in sorted(out.items())}


def with_gone_parents(
    served: Sequence[tuple[str, MdevEntry]], entries: Iterable[MdevEntry], inv: MdevInventory
) -> list[tuple[str, MdevEntry]]:
    """``served`` (the parents :func:`vfio_dp.core.mdev_reconcile.wanted` names now) and each
    parent a ``path: devicePlugin``, ``create: static`` entry names by name or address that
    is gone from ``/sys/class/mdev_bus`` (its driver unloaded): with a ``resourceName`` its
    recorded instances stay listed Unhealthy until the parent is back and they are made again
    (:func:`mdev_units`)."""
    present = {p.name for p in inv.parents} | {name for name, _ in served}
    gone = [
        (e.parent, e)
        for e in entries
        if e.parent is not None and e.parent not in present
        and e.path == DEVICE_PLUGIN and e.create == STATIC
    ]  # fmt: skip
    return [*served, *gone]


def mdev_changes(previous: MdevUnits, current: MdevUnits) -> list[str]:
    """Log lines: which instance was listed, changed health, or was withdrawn, and why."""
    before = {(u.resource, u.id): u for us in previous.values() for u in us}
    after = {(u.resource, u.id): u for us in current.values() for u in us}
    out: list[str] = []
    for key in sorted(after):
        u, old = after[key], before.get(key)
        why = "" if u.healthy else ": " + "; ".join(u.reasons)
        if old is None:
            out.append(
                f"{u.resource}: mdev {u.id} ({u.type_id} on {u.parent}) listed {u.health}{why}"
            )
        elif old.reasons != u.reasons:
            out.append(f"{u.resource}: mdev {u.id} now {u.health}{why}")
    out += [
        f"{r}: mdev {i} withdrawn: gone from /sys/bus/mdev/devices, or its entry from the config"
        for r, i in sorted(set(before) - set(after))
    ]
    return out


def _checked(units: Sequence[MdevUnit], resource: str, device_id: str) -> MdevUnit:
    unit = next((u for u in units if u.id == device_id), None)
    if unit is None:
        raise UnknownDeviceError(
            resource, device_id, "no such mdev instance is listed under this resource"
        )
    if not unit.healthy:
        raise UnhealthyDeviceError(resource, device_id, list(unit.reasons))
    return unit


def mdev_cdi_name(uuid: str) -> str:
    """``mdev-<uuid>``: an instance's CDI device name (a UUID is unique on the node, and
    never looks like a PCI unit's ``pci-…`` name)."""
    return f"mdev-{uuid}"


def mdev_cdi_specs(
    units: Mapping[str, Sequence[MdevUnit]], vendor: str, only: Iterable[str] | None = None
) -> dict[str, dict[str, object]]:
    """Spec file name (``<vendor>_mdev-<uuid>.json``) -> spec with the one device of that
    instance, for every Healthy instance (``only``: of these UUIDs)."""
    keep = None if only is None else set(only)
    out: dict[str, dict[str, object]] = {}
    for listed in units.values():
        for u in listed:
            if u.vfio_node is None or not u.healthy or (keep is not None and u.id not in keep):
                continue
            name = mdev_cdi_name(u.id)
            device = cdi.CdiDevice(name, device_nodes=(VFIO_CONTAINER, u.vfio_node))
            out[cdi.spec_file_name(vendor, name)] = cdi.build_spec(vendor, [device])
    return out


def allocate_mdev(
    units: Sequence[MdevUnit],
    resource: str,
    device_ids: Sequence[str],
    cdi_vendor: str | None = None,
) -> ContainerAllocation:
    """Answer one ``ContainerAllocateRequest`` for mdev instances (module docstring); raise a
    :class:`~vfio_dp.errors.DevicePluginError` naming an unknown or unhealthy UUID. With
    ``cdi_vendor`` the answer also names each instance's CDI device (:func:`mdev_cdi_specs`)."""
    chosen = [_checked(units, resource, i) for i in _checked_ids(resource, "Allocate", device_ids)]
    paths: dict[str, None] = {VFIO_CONTAINER: None}
    grants: list[Grant] = []
    for u in chosen:
        assert u.vfio_node is not None and u.group is not None  # healthy
        paths[u.vfio_node] = None
        grants.append(Grant(u.id, resource, u.group, u.vfio_node, (u.id,)))
    return ContainerAllocation(
        envs={naming.kubevirt_mdev_env_var(resource): ",".join(u.id for u in chosen)},
        devices=tuple(DeviceNode(p, p) for p in paths),
        grants=tuple(grants),
        cdi_devices=(
            tuple(cdi.device_id(cdi_vendor, mdev_cdi_name(u.id)) for u in chosen)
            if cdi_vendor is not None
            else ()
        ),
    )


def verify_mdev_prestart(
    units: Sequence[MdevUnit],
    resource: str,
    device_ids: Sequence[str],
    record: Mapping[str, Grant],
) -> None:
    """PreStartContainer: every instance is still Healthy and its group node is the one
    Allocate handed out (a reboot re-makes an instance with its UUID, maybe in another group)."""
    for device_id in _checked_ids(resource, "PreStartContainer", device_ids):
        unit = _checked(units, resource, device_id)
        grant = record.get(device_id)
        if grant is None or grant.resource != resource:
            raise StaleAllocationError(
                resource, device_id, "no record of an Allocate for it on this node"
            )
        if unit.vfio_node != grant.group_node:
            raise StaleAllocationError(
                resource,
                device_id,
                f"its IOMMU group node is now {unit.vfio_node} but Allocate handed out "
                f"{grant.group_node} (the instance was made again in another group)",
            )


def preferred_mdev(
    units: Sequence[MdevUnit], available: Sequence[str], must: Sequence[str], size: int
) -> list[str]:
    """``must`` first, then healthy available instances by UUID, up to ``size``."""
    chosen = list(dict.fromkeys(must))
    healthy = {u.id for u in units if u.healthy}
    for i in sorted(set(available) & healthy):
        if len(chosen) >= size:
            break
        if i not in chosen:
            chosen.append(i)
    return chosen
