"""Per-resource device lists computed from an :class:`Inventory` and a :class:`Config`.

The unit advertised to the kubelet is the **IOMMU group**: one kubelet device per (group,
resource), whose ID is the lowest PCI address among that resource's endpoints in the group.
Allocate hands over ``/dev/vfio/<N>`` for the whole group, so two pods can never share a group
(the kubelet never gives one device ID to two pods). Trade-off, chosen on purpose: a group with
two endpoints of one resource counts as ONE device, like KubeVirt's own plugin; users who want
every function counted separately need ACS-split groups.

Invariants (tested):

- A unit is Healthy only if every one of its endpoints is on a vfio driver, its group exists
  and is viable (:func:`vfio_dp.model.device.analyse_group`, judged from sysfs only — the
  daemon never opens ``/dev/vfio/<N>``), and no endpoint of the group belongs to another
  resource. A group whose endpoints match two resources is a **conflict**: listed under both,
  Healthy under neither.
- Stickiness: a device once listed under a resource that leaves vfio-pci stays listed
  (Unhealthy) until it leaves sysfs or the config would no longer give it that resource even
  on vfio-pci. Stickiness lives in the daemon's memory (``previous`` listing), so a daemon
  restart forgets devices that were already off vfio-pci.
- Only devices whose selector has ``path: devicePlugin`` are listed (every selected device
  without a config). A group whose endpoints fall to different paths
  (:mod:`vfio_dp.model.serving`) is served by neither: its units are listed Unhealthy with
  the reason.
- Bridges are never listed; companions of a group that no selector takes (a GPU's audio
  function) are not listed but must be vfio/DMA-safe for the group to be viable.
- A unit one of whose endpoints a DRA pool holds (its bind record
  ``<root>/var/lib/vfio_dp/original/<bdf>.json`` says ``bound_by: pool:<driver>``: a claim
  switched it to VFIO ahead of its pod and went away) is Unhealthy, the hold and the fix as
  the reason: only that pool's claims take it over (:func:`vfio_dp.host.bound_by.pool_refusal`).
- Lists are sorted by ID, so equal inventories give equal lists (no spurious updates).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from vfio_dp.errors import no_iommu_group
from vfio_dp.host.bound_by import BOUND_BY_DEVICE_PLUGIN, pool_refusal
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEVICE_PLUGIN, Config
from vfio_dp.model.device import VFIO_PCI, Inventory, PciDevice, primary_first
from vfio_dp.model.serving import Chosen, ResourceNames, choose, path_splits

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, slots=True)
class Unit:
    """One kubelet device: the endpoints of one IOMMU group that belong to one resource."""

    id: PciAddress  # lowest address among ``members``; the kubelet's device ID (str form)
    resource: str
    members: tuple[PciAddress, ...]  # this resource's endpoints in the group, primary first
    group: int | None
    reasons: tuple[str, ...] = ()  # why it is unhealthy; empty = Healthy
    numa_nodes: tuple[int, ...] = ()  # empty when numa_node is -1 / unknown

    @property
    def healthy(self) -> bool:
        return not self.reasons

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


@dataclass(frozen=True, slots=True)
class Listing:
    """What every resource lists at one moment, plus the inventory it was computed from."""

    inventory: Inventory
    resources: dict[str, tuple[Unit, ...]] = field(default_factory=dict)
    #: every listed endpoint → its resource (what stickiness remembers)
    membership: dict[PciAddress, str] = field(default_factory=dict)
    #: group number → the resources that claim its endpoints (only groups with >1)
    conflicts: dict[int, tuple[str, ...]] = field(default_factory=dict)

    def units(self, resource: str) -> tuple[Unit, ...]:
        return self.resources.get(resource, ())

    def unit(self, resource: str, device_id: str) -> Unit | None:
        for u in self.resources.get(resource, ()):
            if str(u.id) == device_id:
                return u
        return None


def _sticky_resource(dev: PciDevice, config: Config, previous: Listing | None) -> str | None:
    """The resource an endpoint no selector gives the device-plugin path keeps, if any."""
    if previous is None or dev.on_vfio:
        return None
    before = previous.membership.get(dev.address)
    if before is None:
        return None
    # It was listed and left vfio-pci: keep it if the config still gives it that resource
    # were it on vfio-pci (a ``drivers: [vfio-pci]`` selector no longer matches it now).
    if config.resource_for(replace(dev, driver=VFIO_PCI), DEVICE_PLUGIN) == before:
        return before
    return None


def _not_on_vfio(dev: PciDevice, sticky: bool) -> str:
    if sticky:
        return (
            f"{dev.describe()} left vfio-pci; it stays listed Unhealthy until it is bound "
            f"again (vfioctl bind {dev.address}) or removed"
        )
    return f"{dev.describe()} is not on vfio-pci; bind it: vfioctl bind --group {dev.address}"


def compute_listing(
    inventory: Inventory,
    config: Config,
    previous: Listing | None = None,
    chosen: Chosen | None = None,
    holders: Mapping[PciAddress, str] | None = None,
) -> Listing:
    """Every resource's units from one inventory (see the module docstring for the rules).
    Linear in the devices: one selector match each (``chosen``, when the caller has it).
    ``holders``: the bind records' holders by address (a pool hold is refused)."""
    chosen = choose(inventory, config) if chosen is None else chosen
    names = ResourceNames(config)
    claimed: dict[PciAddress, str] = {}
    sticky: set[PciAddress] = set()
    # (resource, group) → endpoints; devices without a group are their own unit.
    buckets: dict[tuple[str, int | None, PciAddress | None], list[PciDevice]] = {}
    group_claims: dict[int, set[str]] = defaultdict(set)
    for dev, sel in chosen:
        if sel is not None and config.selector_serves(sel, DEVICE_PLUGIN):
            name = names(sel, dev)
        else:
            kept = _sticky_resource(dev, config, previous)
            if kept is None:
                continue
            name = kept
            sticky.add(dev.address)
        claimed[dev.address] = name
        g = dev.iommu_group
        key = (name, None, dev.address) if g is None else (name, g, None)
        members = buckets.get(key)
        if members is None:
            buckets[key] = [dev]
        else:
            members.append(dev)
        if g is not None:
            group_claims[g].add(name)
    conflicts = {g: tuple(sorted(rs)) for g, rs in group_claims.items() if len(rs) > 1}
    splits = path_splits(inventory, config, chosen)

    resources: dict[str, list[Unit]] = defaultdict(list)
    for (name, g, _), devs in buckets.items():
        reasons: list[str] = []
        for dev in devs:
            if not dev.on_vfio:
                reasons.append(_not_on_vfio(dev, dev.address in sticky))
            held = (holders or {}).get(dev.address)
            if held and (why := pool_refusal(dev.address, held, BOUND_BY_DEVICE_PLUGIN)):
                reasons.append(why)
        if g is None:
            reasons.append(no_iommu_group(str(devs[0].address)))
        else:
            group = inventory.groups.get(g)
            if group is None:
                reasons.append(f"IOMMU group {g} of {devs[0].address} is missing from sysfs")
            elif not group.viable:
                reasons.extend(f"IOMMU group {g} is not viable: {p.reason}" for p in group.problems)
            if g in conflicts:
                others = ", ".join(
                    f"{a} → {r}"
                    for a, r in sorted(claimed.items())
                    if inventory.devices[a].iommu_group == g
                )
                reasons.append(
                    f"IOMMU group {g} has endpoints of several resources ({others}); one group "
                    "can only go to one pod: give them one resourceName or select only one"
                )
            if g in splits:
                reasons.append(splits[g])
        numa = sorted({n for d in devs if (n := d.numa_node) is not None and n >= 0})
        addrs = [d.address for d in devs]  # address order: the first is the lowest
        resources[name].append(
            Unit(
                id=addrs[0],
                resource=name,
                members=tuple(addrs if len(addrs) == 1 else primary_first(addrs)),
                group=g,
                reasons=tuple(reasons),
                numa_nodes=tuple(numa),
            )
        )
    return Listing(
        inventory=inventory,
        resources={
            name: tuple(sorted(units, key=_unit_id)) for name, units in sorted(resources.items())
        },
        membership=claimed,
        conflicts=conflicts,
    )


def _unit_id(u: Unit) -> PciAddress:
    return u.id


def changes(previous: Listing | None, current: Listing) -> list[str]:
    """Log lines saying what happened to which device and why, between two listings."""
    out: list[str] = []
    before: dict[tuple[str, PciAddress], Unit] = {}
    if previous is not None:
        before = {(u.resource, u.id): u for us in previous.resources.values() for u in us}
    after = {(u.resource, u.id): u for us in current.resources.values() for u in us}
    for key in sorted(after):
        u = after[key]
        old = before.get(key)
        where = f"{u.resource}: {_describe_unit(u)}"
        if old is None:
            out.append(f"{where} listed {u.health}" + _why(u))
        elif old.healthy != u.healthy or old.reasons != u.reasons or old.members != u.members:
            out.append(f"{where} now {u.health}" + _why(u))
        elif old.numa_nodes != u.numa_nodes:
            out.append(f"{where} NUMA nodes now {list(u.numa_nodes) or 'none'}")
    for key in sorted(set(before) - set(after)):
        u = before[key]
        gone = current.inventory.devices.get(u.id) is None
        why = "it left sysfs" if gone else "no selector of the configuration takes it any more"
        out.append(f"{u.resource}: {_describe_unit(u)} withdrawn: {why}")
    return out


def _describe_unit(u: Unit) -> str:
    group = f"IOMMU group {u.group}" if u.group is not None else "no IOMMU group"
    others = ", ".join(str(m) for m in u.members if m != u.id)
    extra = f" with {others}" if others else ""
    return f"{u.id}{extra} ({group})"


def _why(u: Unit) -> str:
    return "" if u.healthy else ": " + "; ".join(u.reasons)


def resource_names(listings: Iterable[Listing]) -> set[str]:
    """Every resource any of the listings has."""
    return {name for listing in listings for name in listing.resources}
