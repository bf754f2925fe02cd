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

from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEVICE_PLUGIN, DRA, NO_EXECUTE, NO_SCHEDULE, Config
from vfio_dp.model.device import Inventory, PciDevice
from vfio_dp.model.naming import dra_device_name


def group_paths(inventory: Inventory, config: Config) -> dict[int, dict[PciAddress, str]]:
    """Per IOMMU group: each selected endpoint → the path its selector gives it."""
    out: dict[int, dict[PciAddress, str]] = defaultdict(dict)
    for addr in sorted(inventory.devices):
        dev = inventory.devices[addr]
        if dev.is_bridge or dev.iommu_group is None:
            continue
        path = config.path_of(dev)
        if path is not None:
            out[dev.iommu_group][addr] = path
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


def path_splits(inventory: Inventory, config: Config) -> dict[int, str]:
    """Every path-split group → the reason (empty without a config: one path serves all)."""
    if config.any_path:
        return {}
    out: dict[int, str] = {}
    for g, paths in group_paths(inventory, config).items():
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

    @property
    def published(self) -> bool:
        return not self.reasons


def _dra_reasons(
    group: int,
    inventory: Inventory,
    endpoints: list[PciDevice],
    selected: dict[PciAddress, str],
    selectors: dict[PciAddress, int],
    on_prepare: bool,
    config: Config,
) -> list[str]:
    reasons: list[str] = []
    if not config.any_path:
        why = split_reason(
            group, {d.address: p for d in endpoints if (p := config.path_of(d)) is not None}
        )
        if why:
            reasons.append(why)
    if len(set(selectors.values())) > 1 and len(set(selected.values())) > 1:
        who = ", ".join(f"{a} → {r}" for a, r in sorted(selected.items()))
        reasons.append(
            f"IOMMU group {group} has endpoints of several resources ({who}); one group can "
            "only go to one pod: give them one resourceName or select only one"
        )
    for d in endpoints:
        if d.in_use:
            reasons.append(f"{d.describe()} is used by the host: {'; '.join(map(str, d.in_use))}")
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
    for a in sorted(selected):
        dev = inventory.devices[a]
        if not dev.on_vfio:
            reasons.append(
                f"{dev.describe()} is not on vfio-pci; bind it (vfioctl bind --group {a}) "
                "or select it with bind: true or bind: onPrepare"
            )
    if not g.viable:
        reasons.extend(f"IOMMU group {group} is not viable: {p.reason}" for p in g.problems)
    return reasons


def dra_units(inventory: Inventory, config: Config) -> list[DraUnit]:
    """Every IOMMU group with an endpoint the DRA path selects, published or not (with the
    reasons), in group-number order."""
    by_group: dict[int, list[PciDevice]] = defaultdict(list)
    for addr in sorted(inventory.devices):
        dev = inventory.devices[addr]
        if not dev.is_bridge and dev.iommu_group is not None:
            by_group[dev.iommu_group].append(dev)
    units: list[DraUnit] = []
    for group in sorted(by_group):
        endpoints = by_group[group]
        selected: dict[PciAddress, str] = {}
        selectors: dict[PciAddress, int] = {}
        on_prepare = False
        effect = NO_SCHEDULE
        for dev in endpoints:
            sel = config.select_for(dev, DRA)
            if sel is None:
                continue
            selected[dev.address] = config.name_for(sel, dev)
            selectors[dev.address] = config.selectors.index(sel)
            on_prepare = on_prepare or sel.bind_on_prepare
            if sel.taint_effect == NO_EXECUTE:
                effect = NO_EXECUTE
        if not selected:
            continue
        primary = endpoints[0].address
        first_selected = min(selected)
        reasons = _dra_reasons(group, inventory, endpoints, selected, selectors, on_prepare, config)
        units.append(
            DraUnit(
                name=dra_device_name(primary),
                group=group,
                primary=primary,
                endpoints=tuple(d.address for d in endpoints),
                resource_name=selected[first_selected],
                on_prepare=on_prepare,
                reasons=tuple(reasons),
                taint_effect=effect,
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
    claims hold."""
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
) -> dict[PciAddress, DeviceServing]:
    """Join the device-plugin listing's membership (``Listing.membership``) and the DRA units
    into one answer per device."""
    by_endpoint = {a: u for u in units for a in u.endpoints}
    splits = path_splits(inventory, config)
    out: dict[PciAddress, DeviceServing] = {}
    for addr, dev in inventory.devices.items():
        path = None if dev.is_bridge else config.path_of(dev)
        resource = dp_membership.get(addr)
        unit = by_endpoint.get(addr)
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
