"""Who serves which device: the device-plugin path, the DRA path, or nobody — and why.

Pure (plain typed values in, plain typed values out). The rules, shared by the device-plugin
daemon, the DRA plugin, the webhook (through :meth:`Config.resources_for_ids`) and
``vfioctl list``/``groups``:

- The first matching selector decides (:meth:`Config.select`, on the device's identity and,
  for selectors that bind, its recorded original driver), and its ``path`` says who serves
  the device. Without a config every path serves what the default selector takes.
- The unit is the IOMMU group. A group whose endpoints fall to different paths is a
  **path split**: served by neither (the device plugin lists its units Unhealthy with the
  reason, the DRA plugin does not publish it).
- DRA publishes one device per IOMMU group that can be handed over (:func:`dra_units`), named
  after the group's first endpoint (:func:`dra_device_name`); companions are covered by
  ``/dev/vfio/<N>``. Not published (each with its reason): a group whose endpoints are split
  between paths, or between resources (endpoints taken by different selectors that give
  different resource names; one selector taking a GPU and its audio function is one
  resource, named after the first endpoint, although their default device-plugin names
  differ), one with an endpoint the host uses, one that is not viable or
  whose selected endpoints are not on vfio-pci — except with ``bind: onPrepare``, where only
  what binding cannot fix counts (a bridge on a DMA driver).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from operator import attrgetter

from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEVICE_PLUGIN, DRA, NO_EXECUTE, NO_SCHEDULE, Config, Selector
from vfio_dp.model.device import Inventory, PciDevice
from vfio_dp.model.naming import dra_device_name
from vfio_dp.model.personality import Personality

#: One endpoint and the first selector that matches it (None: no selector takes it).
Chosen = list[tuple[PciDevice, Selector | None]]


def choose(inventory: Inventory, config: Config) -> Chosen:
    """Every endpoint (bridges left out) with its selector, in address order: the one
    selector match per device that the functions below share (pass it to each of them when
    calling several on one inventory; each computes it itself otherwise)."""
    select = config.select
    return [
        (dev, select(dev))
        for dev in sorted(inventory.devices.values(), key=_ADDRESS_ORDER)
        if not dev.is_bridge
    ]


#: a device's address as a tuple of ints: sorts in C (PciAddress's own ``<`` is Python)
_ADDRESS_ORDER = attrgetter("address.domain", "address.bus", "address.slot", "address.function")


class ResourceNames:
    """``config.name_for`` with the default names made once per vendor:device pair (a big
    host has thousands of functions and a handful of IDs)."""

    __slots__ = ("_config", "_made")

    def __init__(self, config: Config) -> None:
        self._config = config
        self._made: dict[tuple[str, str], str] = {}

    def __call__(self, sel: Selector, dev: PciDevice) -> str:
        if sel.resource_name:
            return sel.resource_name
        key = (dev.vendor, dev.device)
        name = self._made.get(key)
        if name is None:
            name = self._made[key] = self._config.name_for(sel, dev)
        return name


def group_paths(
    inventory: Inventory, config: Config, chosen: Chosen | None = None
) -> dict[int, dict[PciAddress, str]]:
    """Per IOMMU group: each selected endpoint → the path its selector gives it."""
    out: dict[int, dict[PciAddress, str]] = defaultdict(dict)
    for dev, sel in choose(inventory, config) if chosen is None else chosen:
        if sel is not None and dev.iommu_group is not None:
            out[dev.iommu_group][dev.address] = sel.path
    return dict(out)


def split_reason(group: int, paths: dict[PciAddress, str]) -> str | None:
    """Why a group whose endpoints go to different paths is served by neither (None: not)."""
    if len(set(paths.values())) < 2:
        return None
    who = ", ".join(f"{a} → {p}" for a, p in sorted(paths.items()))
    return (
        f"IOMMU group {group} is split between paths ({who}); one group goes to one pod "
        "through one path: give its endpoints' selectors the same path"
    )


def path_splits(
    inventory: Inventory, config: Config, chosen: Chosen | None = None
) -> dict[int, str]:
    """Every path-split group → the reason (empty without a config: one path serves all)."""
    if config.any_path:
        return {}
    out: dict[int, str] = {}
    for g, paths in group_paths(inventory, config, chosen).items():
        why = split_reason(g, paths)
        if why:
            out[g] = why
    return out


@dataclass(frozen=True, slots=True)
class DraUnit:
    """One IOMMU group as the DRA path sees it (published only when ``reasons`` is empty)."""

    name: str  # pci-<domain>-<bus>-<slot>-<function> of ``primary``
    group: int
    primary: PciAddress  # the group's first endpoint
    endpoints: tuple[PciAddress, ...]  # every endpoint of the group, address order
    resource_name: str  # the device-plugin name of the primary's selector (for attributes)
    on_prepare: bool  # bind: onPrepare (bound by Prepare, next issue)
    reasons: tuple[str, ...] = ()  # why it is not published; empty = published
    #: the effect of its taint when prepared and bad (NoExecute only if a selector says so)
    taint_effect: str = NO_SCHEDULE
    #: the ``vfioDriver`` of its selectors (``auto``, ``vfio-pci`` or a driver's name)
    vfio_driver: str = "auto"
    #: how it is offered (its selectors' ``personalities``, in their order, each once)
    personalities: tuple[Personality, ...] = (Personality.VM,)

    @property
    def published(self) -> bool:
        return not self.reasons


def _dra_reasons(
    group: int,
    inventory: Inventory,
    members: list[tuple[PciDevice, Selector | None]],
    selected: list[tuple[PciDevice, str, int]],
    on_prepare: bool,
    config: Config,
) -> list[str]:
    """Why the group of ``members`` (its endpoints with their selectors, address order) is
    not published; ``selected``: the endpoints DRA selects (device, resource, selector index)."""
    reasons: list[str] = []
    if not config.any_path:
        why = split_reason(group, {d.address: sel.path for d, sel in members if sel is not None})
        if why:
            reasons.append(why)
    if len(selected) > 1 and (
        len({i for _, _, i in selected}) > 1 and len({r for _, r, _ in selected}) > 1
    ):
        who = ", ".join(f"{d.address} → {r}" for d, r, _ in selected)
        reasons.append(
            f"IOMMU group {group} has endpoints of several resources ({who}); one group can "
            "only go to one pod: give them one resourceName or select only one"
        )
    for d, _ in members:
        if d.in_use:
            uses = "; ".join(f"{u}; fix: {u.fix}" for u in d.in_use)
            reasons.append(f"{d.describe()} is used by the host: {uses}")
    g = inventory.groups.get(group)
    if g is None:
        reasons.append(f"IOMMU group {group} is missing from sysfs")
        return reasons
    if on_prepare:
        # binding the group moves every endpoint to vfio-pci; it cannot fix a bridge
        for problem in g.problems:
            bridge = inventory.devices.get(problem.address)
            if bridge is not None and bridge.is_bridge:
                reasons.append(f"IOMMU group {group} cannot become viable: {problem.reason}")
        return reasons
    for dev, _, _ in selected:
        if not dev.on_vfio:
            reasons.append(
                f"{dev.describe()} is not on vfio-pci; bind it (vfioctl bind --group "
                f"{dev.address}) or select it with bind: true or bind: onPrepare"
            )
    if not g.viable:
        reasons.extend(f"IOMMU group {group} is not viable: {p.reason}" for p in g.problems)
    return reasons


def dra_units(inventory: Inventory, config: Config, chosen: Chosen | None = None) -> list[DraUnit]:
    """Every IOMMU group with an endpoint the DRA path selects, published or not (with the
    reasons), in group-number order. Linear in the devices: one selector match each."""
    by_group: dict[int, list[tuple[PciDevice, Selector | None]]] = {}
    for dev, sel in choose(inventory, config) if chosen is None else chosen:
        g = dev.iommu_group
        if g is not None:
            members = by_group.get(g)
            if members is None:
                by_group[g] = [(dev, sel)]
            else:
                members.append((dev, sel))
    names = ResourceNames(config)
    index = {id(s): i for i, s in enumerate(config.selectors)}
    units: list[DraUnit] = []
    for group in sorted(by_group):
        members = by_group[group]
        selected: list[tuple[PciDevice, str, int]] = []
        on_prepare = False
        effect = NO_SCHEDULE
        vfio_driver = "auto"
        offered: dict[Personality, None] = {}
        for dev, sel in members:
            if sel is None or not config.selector_serves(sel, DRA):
                continue
            offered.update(dict.fromkeys(sel.personalities))
            selected.append((dev, names(sel, dev), index[id(sel)]))
            on_prepare = on_prepare or sel.bind_on_prepare
            if vfio_driver == "auto":
                vfio_driver = sel.vfio_driver
            if sel.taint_effect == NO_EXECUTE:
                effect = NO_EXECUTE
        if not selected:
            continue
        primary = members[0][0].address
        reasons = _dra_reasons(group, inventory, members, selected, on_prepare, config)
        units.append(
            DraUnit(
                name=dra_device_name(primary),
                group=group,
                primary=primary,
                endpoints=tuple(d.address for d, _ in members),
                resource_name=selected[0][1],
                on_prepare=on_prepare,
                reasons=tuple(reasons),
                taint_effect=effect,
                vfio_driver=vfio_driver,
                personalities=tuple(offered),
            )
        )
    return units


@dataclass(frozen=True, slots=True)
class DeviceServing:
    """What ``vfioctl list`` says about one device: one field per path."""

    path: str | None  # the path its selector gives it (None: no selector takes it)
    resource: str | None  # the device-plugin resource it is listed under (None: not)
    dra_device: str | None  # the DRA device (its group's) it is published as (None: not)
    not_served: str | None  # why the path its selector names does not serve it
    #: the resource its DRA device is requested as (a DeviceClass's extendedResourceName)
    dra_resource: str | None = None

    @property
    def served_by(self) -> str | None:
        """The path that serves it now (None: neither)."""
        if self.resource is not None:
            return DEVICE_PLUGIN
        if self.dra_device is not None:
            return DRA
        return None


def withdraw_held(units: list[DraUnit], held: dict[int, str]) -> list[DraUnit]:
    """``units`` with every published group in ``held`` (group → who holds its
    ``/dev/vfio/<N>`` open, e.g. a VM the device plugin started before the node moved to
    DRA) withdrawn, the holder as the reason: a VFIO group is opened by one process only, so
    a claim for it could never be prepared. Callers leave out the groups their own prepared
    claims hold. Nothing held: ``units`` itself."""
    if not held:
        return units
    out: list[DraUnit] = []
    for u in units:
        why = held.get(u.group)
        if u.published and why is not None:
            reason = (
                f"{why}, outside any claim of ours (a VFIO group is opened by one process "
                "only: a VM started through the device plugin keeps it until it stops)"
            )
            u = replace(u, reasons=(reason,))
        out.append(u)
    return out


def device_serving(
    inventory: Inventory,
    config: Config,
    dp_membership: dict[PciAddress, str],
    units: list[DraUnit],
    chosen: Chosen | None = None,
) -> dict[PciAddress, DeviceServing]:
    """Join the device-plugin listing's membership (``Listing.membership``) and the DRA units
    into one answer per device."""
    by_endpoint = {a: u for u in units for a in u.endpoints}
    chosen = choose(inventory, config) if chosen is None else chosen
    splits = path_splits(inventory, config, chosen)
    selectors = {id(dev): sel for dev, sel in chosen}
    out: dict[PciAddress, DeviceServing] = {}
    nobody = DeviceServing(None, None, None, None)
    for addr, dev in inventory.devices.items():
        sel = selectors.get(id(dev))
        path = None if sel is None else sel.path
        resource = dp_membership.get(addr)
        unit = by_endpoint.get(addr)
        if path is None and resource is None and unit is None:
            out[addr] = nobody  # a bridge, or a device no selector takes
            continue
        dra_name = unit.name if unit is not None and unit.published else None
        dra_resource = unit.resource_name if unit is not None and unit.published else None
        why: str | None = None
        if dev.iommu_group is not None and dev.iommu_group in splits and path is not None:
            why = splits[dev.iommu_group]
        elif (
            (path == DRA or (config.any_path and path is not None))
            and unit is not None
            and not unit.published
        ):
            why = "; ".join(unit.reasons)
        out[addr] = DeviceServing(path, resource, dra_name, why, dra_resource)
    return out


def resource_path_conflicts(inventory: Inventory, config: Config) -> list[str]:
    """Every resource name both paths would serve on this node, each with the selectors and
    devices on either side (empty without a config: one process serves everything).

    The device plugin's names are its selected devices' names; DRA's are its groups'
    (:func:`dra_units`: the first selected endpoint's name — a companion's own name is not
    served). A name on both would be advertised by the device plugin AND reachable through a
    DeviceClass's ``extendedResourceName``; KEP-5004 leaves that undefined, so neither
    process starts."""
    if config.any_path:
        return []
    sides: dict[str, dict[str, dict[int, list[PciAddress]]]] = defaultdict(
        lambda: {DEVICE_PLUGIN: defaultdict(list), DRA: defaultdict(list)}
    )
    for addr in sorted(inventory.devices):
        dev = inventory.devices[addr]
        sel = config.select(dev)
        if sel is None or dev.is_bridge or sel.path != DEVICE_PLUGIN:
            continue
        sides[config.name_for(sel, dev)][DEVICE_PLUGIN][config.selectors.index(sel)].append(addr)
    for unit in dra_units(inventory, config):
        for addr in unit.endpoints:
            sel = config.select_for(inventory.devices[addr], DRA)
            if (
                sel is not None
                and config.name_for(sel, inventory.devices[addr]) == unit.resource_name
            ):
                sides[unit.resource_name][DRA][config.selectors.index(sel)].append(addr)
                break
    out: list[str] = []
    for name in sorted(sides):
        by_path = sides[name]
        if not (by_path[DEVICE_PLUGIN] and by_path[DRA]):
            continue
        said = "; ".join(
            f"selectors[{i}] (path: {path}) takes {', '.join(map(str, addrs))}"
            for path in (DEVICE_PLUGIN, DRA)
            for i, addrs in sorted(by_path[path].items())
        )
        out.append(f"{name}: {said}")
    return out
