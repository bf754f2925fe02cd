"""Allocate, GetPreferredAllocation and PreStartContainer as pure functions on a :class:`Listing`.

**Allocate** (one container): for every requested unit, the env vars get that resource's
endpoints of the group (primary functions first across all units: ``0000:65:00.0,
0000:66:00.0,0000:65:00.1``) as KubeVirt's ``PCI_RESOURCE_<NAME>`` and the SR-IOV plugin's
``PCIDEVICE_<NAME>``; the device specs get the host's VFIO nodes (``/dev/vfio/vfio``,
``/dev/vfio/<N>`` or ``/dev/vfio/noiommu-<N>``, the cdev ``/dev/vfio/devices/vfioN`` and
``/dev/iommu`` when present) with ``mrw``, container path = host path. The node paths come
from a callable (``Host.device_nodes`` in the daemon) so this module stays free of I/O; they
are HOST paths as the kubelet and runtime see them, never prefixed with the daemon's root.

**CDI** (optional, ``vfioctl plugin --cdi-dir``): every advertised unit also gets ONE CDI spec
of kind ``deviceplugin.vfio-dp.io/vfio`` (:mod:`vfio_dp.model.cdi`) whose single device,
``pci-0000-65-00-0`` (the unit ID as a DRA-style name), carries the same device nodes, and
Allocate adds its ID ``deviceplugin.vfio-dp.io/vfio=pci-0000-65-00-0`` to ``cdi_devices``
(kubelets >= 1.31 pass it to a CDI-enabled runtime, which resolves it when the container is
created). The envs and device specs stay exactly as without CDI: a runtime that applies a
CDI device node first removes any device of the same path (container-device-interface
``ContainerEdits.Apply``), so naming the nodes in both places is harmless. :func:`cdi_specs` is the
whole wanted directory content: the plugin API has no Deallocate, so a spec lives as long as
its unit is advertised and is rewritten in place, never one per Allocate.

**The allocation record** (why PreStartContainer can catch a renumbered group): the kubelet
checkpoints every AllocateResponse and replays it after a kubelet restart or a node reboot
without calling Allocate again, so a container can be started with a ``/dev/vfio/<N>`` from
before a reboot that now names another group. Nothing in PreStartContainer's request carries
what Allocate answered (only the device IDs), so the daemon keeps an :class:`AllocationRecord`:
for every unit ID it handed out, the group number and group node path. The daemon writes it
atomically (temp file, fsync, rename) to ``<root>/var/lib/vfio_dp/allocations.json`` BEFORE
Allocate returns — on the host's disk, so it survives reboots like the kubelet checkpoint does.
**PreStartContainer** then requires, for each ID: the unit still exists and is Healthy (on
vfio-pci, viable group, no conflict) and its current group node equals the recorded one.
No record for an ID fails too (loudly), since the answer cannot be checked. The record holds at
most one entry per device ID (a new Allocate of the same ID overwrites), so it stays bounded.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vfio_dp.deviceplugin.listing import Listing, Unit
from vfio_dp.errors import (
    PluginRequestError,
    StaleAllocationError,
    UnhealthyDeviceError,
    UnknownDeviceError,
)
from vfio_dp.model import cdi, naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import IommuGroup, PciDevice, primary_first

#: ``Host.device_nodes``: (group, its devices) → host device node paths
NodesFor = Callable[[IommuGroup, list[PciDevice]], list[str]]

PERMISSIONS = "mrw"
RECORD_VERSION = 1


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A ``DeviceSpec``: the same path in the container as on the host."""

    host_path: str
    container_path: str
    permissions: str = PERMISSIONS


@dataclass(frozen=True, slots=True)
class Grant:
    """What Allocate handed out for one unit (one entry of the allocation record)."""

    device_id: str
    resource: str
    group: int
    group_node: str  # /dev/vfio/<N> or /dev/vfio/noiommu-<N>
    members: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    envs: dict[str, str]
    devices: tuple[DeviceNode, ...]
    grants: tuple[Grant, ...]
    annotations: dict[str, str] = field(default_factory=dict)
    #: fully qualified CDI device IDs (``cdi_devices``); empty unless CDI is on
    cdi_devices: tuple[str, ...] = ()


#: No device ID this plugin hands out is longer (``0000:65:00.0``); longer ones are not parsed.
_MAX_ID_CHARS = 64


def _checked_ids(resource: str, call: str, device_ids: Sequence[str]) -> list[str]:
    """The distinct IDs of a request, in order; none at all is a malformed request (the
    kubelet always names at least one device)."""
    ids = list(dict.fromkeys(device_ids))
    if not ids:
        raise PluginRequestError(
            f"{resource}: {call} named no device IDs; a container request needs at least one"
        )
    return ids


def _checked_unit(listing: Listing, resource: str, device_id: str) -> Unit:
    unit = listing.unit(resource, device_id)
    if unit is None:
        if resource not in listing.resources:
            why = "this daemon does not serve that resource now"
        else:
            try:
                addr = PciAddress.parse(device_id) if len(device_id) <= _MAX_ID_CHARS else None
            except ValueError:
                addr = None
            if addr is not None and listing.membership.get(addr) == resource:
                why = "it is a member of another device's IOMMU group, not a device ID"
            elif addr is not None and addr not in listing.inventory.devices:
                why = "no such PCI device in sysfs (removed?)"
            else:
                why = "it is not listed under this resource"
        raise UnknownDeviceError(resource, device_id, why)
    if not unit.healthy:
        raise UnhealthyDeviceError(resource, device_id, list(unit.reasons))
    return unit


def group_node(paths: Sequence[str]) -> str:
    """The group's node among ``Host.device_nodes`` output: ``/dev/vfio/12``,
    ``/dev/vfio/noiommu-12``."""
    for p in paths:
        head, _, name = p.rpartition("/")
        if head == "/dev/vfio" and (name.isdigit() or name.startswith("noiommu-")):
            return p
    raise ValueError(f"no /dev/vfio/<group> node among {list(paths)}")


def _nodes_of(listing: Listing, unit: Unit, nodes_for: NodesFor) -> list[str]:
    assert unit.group is not None  # a healthy unit has a group
    group = listing.inventory.groups[unit.group]
    known = listing.inventory.devices
    devices = [known[a] for a in group.devices if a in known]
    return nodes_for(group, devices)


def allocate(
    listing: Listing,
    resource: str,
    device_ids: Sequence[str],
    nodes_for: NodesFor,
    cdi_vendor: str | None = None,
) -> ContainerAllocation:
    """Answer one ``ContainerAllocateRequest``; raise a :class:`DevicePluginError` subclass naming the
    device and the reason for an unknown or unhealthy ID. With ``cdi_vendor`` the answer also
    names each unit's CDI device (see :func:`cdi_specs`)."""
    units = [
        _checked_unit(listing, resource, i) for i in _checked_ids(resource, "Allocate", device_ids)
    ]
    addresses = primary_first([m for u in units for m in u.members])
    value = ",".join(str(a) for a in addresses)
    envs = {naming.kubevirt_env_var(resource): value, naming.sriov_env_var(resource): value}
    paths: dict[str, None] = {}
    grants: list[Grant] = []
    for u in units:
        nodes = _nodes_of(listing, u, nodes_for)
        paths.update(dict.fromkeys(nodes))
        assert u.group is not None
        grants.append(
            Grant(
                device_id=str(u.id),
                resource=resource,
                group=u.group,
                group_node=group_node(nodes),
                members=tuple(str(m) for m in u.members),
            )
        )
    return ContainerAllocation(
        envs=envs,
        devices=tuple(DeviceNode(p, p) for p in paths),
        grants=tuple(grants),
        cdi_devices=(
            tuple(cdi.device_id(cdi_vendor, cdi_device_name(u)) for u in units)
            if cdi_vendor is not None
            else ()
        ),
    )


# --- CDI specs -------------------------------------------------------------------------------


def cdi_device_name(unit: Unit) -> str:
    """``pci-0000-65-00-0``: the unit's CDI device name (unique on the node: a unit ID is an
    address and belongs to one resource)."""
    return naming.dra_device_name(unit.id)


def cdi_specs(
    listing: Listing, nodes_for: NodesFor, vendor: str = cdi.DEVICE_PLUGIN_VENDOR
) -> dict[str, dict[str, object]]:
    """Every spec file the CDI directory should hold now: file name
    (``<vendor>_pci-0000-65-00-0.json``) → spec with the one device of that unit. Units without
    an IOMMU group (unhealthy; Allocate refuses them) get none."""
    out: dict[str, dict[str, object]] = {}
    for units in listing.resources.values():
        for u in units:
            if u.group is None or u.group not in listing.inventory.groups:
                continue
            name = cdi_device_name(u)
            device = cdi.CdiDevice(name, device_nodes=tuple(_nodes_of(listing, u, nodes_for)))
            out[cdi.spec_file_name(vendor, name)] = cdi.build_spec(vendor, [device])
    return out


# --- the allocation record -------------------------------------------------------------------

AllocationRecord = dict[str, Grant]


def record_grants(record: Mapping[str, Grant], grants: Sequence[Grant]) -> AllocationRecord:
    """A new record with ``grants`` replacing any earlier entry for the same device IDs."""
    out = dict(record)
    for g in grants:
        out[g.device_id] = g
    return out


def record_to_json(record: Mapping[str, Grant]) -> str:
    data = {
        "version": RECORD_VERSION,
        "allocations": {
            k: {
                "resource": g.resource,
                "group": g.group,
                "groupNode": g.group_node,
                "members": list(g.members),
            }
            for k, g in sorted(record.items())
        },
    }
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def record_from_json(text: str) -> AllocationRecord:
    """Parse a record; raise ``ValueError`` when it is not one (the daemon then refuses every
    PreStartContainer it cannot check, and says so)."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        raise ValueError(f"not an allocation record of version {RECORD_VERSION}")
    out: AllocationRecord = {}
    for key, v in dict(data.get("allocations", {})).items():
        out[key] = Grant(
            device_id=key,
            resource=str(v["resource"]),
            group=int(v["group"]),
            group_node=str(v["groupNode"]),
            members=tuple(str(m) for m in v["members"]),
        )
    return out


def verify_prestart(
    listing: Listing,
    resource: str,
    device_ids: Sequence[str],
    record: Mapping[str, Grant],
    nodes_for: NodesFor,
) -> None:
    """PreStartContainer: raise unless every device is still Healthy and its group node is the
    one recorded at Allocate time (see the module docstring)."""
    for device_id in _checked_ids(resource, "PreStartContainer", device_ids):
        unit = _checked_unit(listing, resource, device_id)
        grant = record.get(device_id)
        if grant is None or grant.resource != resource:
            raise StaleAllocationError(
                resource, device_id, "no record of an Allocate for it on this node"
            )
        now = group_node(_nodes_of(listing, unit, nodes_for))
        if now != grant.group_node:
            raise StaleAllocationError(
                resource,
                device_id,
                f"its IOMMU group node is now {now} but Allocate handed out "
                f"{grant.group_node} (groups were renumbered, e.g. by a reboot)",
            )
        if tuple(str(m) for m in unit.members) != grant.members:
            raise StaleAllocationError(
                resource,
                device_id,
                f"its group's endpoints are now {[str(m) for m in unit.members]} but Allocate "
                f"put {list(grant.members)} in the environment",
            )


# --- GetPreferredAllocation ------------------------------------------------------------------


def preferred_allocation(
    listing: Listing,
    resource: str,
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
) -> list[str]:
    """Pick ``size`` IDs: all of ``must_include`` first, then from one NUMA node if possible
    (the node of the must-include devices, else the smallest node that fits the rest), then by
    address. Each ID is already a whole IOMMU group, so whole groups are preferred by
    construction; unknown or unhealthy IDs are never picked beyond ``must_include``."""
    chosen = list(dict.fromkeys(must_include))
    if len(chosen) >= size:
        return chosen
    units = {str(u.id): u for u in listing.units(resource) if u.healthy}
    candidates = [i for i in dict.fromkeys(available) if i in units and i not in chosen]
    need = size - len(chosen)

    def node_of(i: str) -> int | None:
        nodes = units[i].numa_nodes if i in units else ()
        return nodes[0] if len(nodes) == 1 else None

    must_nodes = Counter(n for i in chosen if (n := node_of(i)) is not None)
    per_node = Counter(n for i in candidates if (n := node_of(i)) is not None)
    preferred: int | None = None
    if must_nodes:
        preferred = must_nodes.most_common(1)[0][0]
    elif per_node:
        fitting = [n for n, c in per_node.items() if c >= need]
        if fitting:
            preferred = min(fitting, key=lambda n: (per_node[n], n))
        else:
            preferred = max(per_node, key=lambda n: (per_node[n], -n))

    def rank(i: str) -> tuple[bool, int, PciAddress]:
        n = node_of(i)
        return (n != preferred, n if n is not None else 1 << 30, units[i].id)

    chosen.extend(sorted(candidates, key=rank)[:need])
    return chosen
