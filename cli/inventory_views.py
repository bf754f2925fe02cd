"""What the rows of ``vfioctl list`` and ``vfioctl groups`` say: each device's JSON row, what
each node process would serve of it, the DRA plugin's view of each group, its container
entries, and the table cells.

The serving is the daemons' own pure rules (:mod:`vfio_dp.model.serving`,
:mod:`vfio_dp.deviceplugin.listing`); the DRA view reads the plugin's checkpoint read-only
(``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json``) and lists ``<root>/dev/vfio`` once;
the container entries ask :func:`vfio_dp.host.devnodes.container_problems`. The commands
themselves (options, scan, print) are :mod:`cli.inventory_cmds`. Each heavier module is
imported by the function that needs it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cli.common import say

if TYPE_CHECKING:  # types only: each function imports what it uses when it runs
    from collections.abc import Container

    from vfio_dp.dra.observers.health import GroupView
    from vfio_dp.host import Host
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.config import Config
    from vfio_dp.model.device import Inventory, PciDevice
    from vfio_dp.model.serving import Chosen, DeviceServing, DraUnit
    from vfio_dp.model.vfio_driver import VfioChoice


def device_json(
    dev: PciDevice,
    serving: DeviceServing,
    names: dict[tuple[str, str | None], str],
    choice: VfioChoice | None = None,
) -> dict[str, object]:
    """One row of ``vfioctl list -o json``: the device, and what each path would serve of it
    (``resource``: the device-plugin resource; ``dra_device``: the DRA device; null: not);
    ``vfio_driver``: the VFIO driver it is on now (null: not on VFIO); ``vfioDriver``: the
    one a bind would write, and why (null: never bound, a bridge or an mdev parent)."""
    return {
        "address": str(dev.address),
        "vendor": dev.vendor,
        "device": dev.device,
        "class": dev.class_code,
        "subsystem_vendor": dev.subsystem_vendor,
        "subsystem_device": dev.subsystem_device,
        "vendor_name": names.get((dev.vendor, None)),
        "device_name": names.get((dev.vendor, dev.device)),
        "driver": dev.driver,
        "driver_override": dev.driver_override,
        "vfio_driver": dev.vfio_driver,
        "vfioDriver": None
        if choice is None
        else {
            "driver": choice.driver,
            "module": choice.module,
            "why": choice.why,
            "problem": choice.problem,
        },
        "original_driver": dev.original_driver,
        "iommu_group": dev.iommu_group,
        "numa_node": dev.numa_node,
        "physfn": str(dev.physfn) if dev.physfn else None,
        "sriov_numvfs": dev.sriov_numvfs,
        "bridge": dev.is_bridge,
        "path": serving.path,
        "resource": serving.resource,
        "dra_device": serving.dra_device,
        "dra_resource": serving.dra_resource,
        "served_by": serving.served_by,
        "not_served": serving.not_served,
        "in_use": [str(u) for u in dev.in_use],
    }


def serving(
    inv: Inventory, cfg: Config, chosen: Chosen | None = None
) -> tuple[dict[PciAddress, DeviceServing], list[DraUnit]]:
    """What each path would serve of ``inv`` under ``cfg`` (the daemons' own pure rules), and
    the DRA units it was computed from (for :func:`dra_view`: computed once); ``chosen``:
    :func:`vfio_dp.model.serving.choose` of them, when the caller has it."""
    from vfio_dp.deviceplugin.listing import compute_listing
    from vfio_dp.model.serving import choose, device_serving, dra_units

    if chosen is None:  # one selector match per device, shared by both paths' rules
        chosen = choose(inv, cfg)
    listing = compute_listing(inv, cfg, chosen=chosen)
    units = dra_units(inv, cfg, chosen)
    return device_serving(inv, cfg, listing.membership, units, chosen), units


def dra_view(host: Host, inv: Inventory, units: list[DraUnit], driver: str) -> dict[int, GroupView]:
    """By IOMMU group: the health and taint the DRA plugin would publish now (its pure rules,
    the prepared claims of its checkpoint read-only, ``/dev/vfio`` listed once)."""
    import time

    from vfio_dp.model.naming import dra_checkpoint_file

    if not units and host.has_state_file(dra_checkpoint_file(driver)) is False:
        return {}  # nothing on the DRA path, no claim prepared: its rules are not needed

    from vfio_dp.dra.claimpath.checkpoint import peek

    records, problem = peek(host, driver)
    if problem:
        say(f"vfioctl: warning: {problem}; prepared claims not shown", err=True)
    if not units and not records:
        return {}  # an empty or unreadable checkpoint: the same

    from vfio_dp.dra.observers import health
    from vfio_dp.host.vfio import group_nodes_present

    holds = health.claim_holds(records)
    present = group_nodes_present(host.fs, health.nodes_to_check(inv, units, holds))
    missing = {g for g, ok in present.items() if not ok}
    return health.node_view(units, inv, holds, missing, driver, time.time())


def view_json(v: GroupView | None) -> dict[str, object]:
    if v is None:
        return {"dra_health": None, "dra_message": None, "dra_taint": None}
    return {"dra_health": v.health, "dra_message": v.message or None, "dra_taint": v.taint}


def native(
    host: Host, inv: Inventory, units: list[DraUnit], driver: str
) -> dict[PciAddress, tuple[str | None, str | None, str | None]]:
    """Each function of a published group whose selectors offer ``container``: its group's
    container entry (``pci-…-native``) or why it is not offered
    (:func:`vfio_dp.host.devnodes.container_problems`: no device nodes of its own; or, as the
    DRA plugin recorded in ``<root>/var/lib/vfio_dp/dra-<driver>.api.json``, a cluster that
    drops counters: ``[vm, container]`` publishes ``vm`` alone), and why its VFIO entry is
    not offered (None: it is; ``[container, vm]`` on that cluster: ``container`` alone)."""
    from vfio_dp.model.personality import Personality

    offering = [u for u in units if u.published and Personality.CONTAINER in u.personalities]
    if not offering:
        return {}
    from vfio_dp.dra.observers.api_fields import ApiFieldsStore
    from vfio_dp.errors import CorruptRecordError
    from vfio_dp.host.devnodes import container_problems
    from vfio_dp.model.naming import dra_native_name

    problems = container_problems(host.fs, inv, offering)
    try:
        fields = ApiFieldsStore(host.fs, driver).get()
    except CorruptRecordError as e:
        say(f"vfioctl: warning: {e}", err=True)
        fields = None
    no_vm: dict[str, str] = {}
    for u in offering:
        why = fields.first_only([p.value for p in u.personalities]) if fields else None
        if why and u.personalities[0] == Personality.CONTAINER:
            no_vm[u.name] = why
        elif why and u.name not in problems:
            problems[u.name] = why
    out: dict[PciAddress, tuple[str | None, str | None, str | None]] = {}
    for u in offering:
        why = problems.get(u.name)
        for a in u.endpoints:
            name = None if why else dra_native_name(u.name)
            out[a] = (name, why, no_vm.get(u.name))
    return out


def pool_hold(holder: str | None) -> str | None:
    """``held by pool:<driver> (…)`` for a device its bind record says a DRA pool holds
    (:func:`vfio_dp.host.state.pool_of`), else None."""
    from vfio_dp.host.bound_by import pool_of

    if holder is None or pool_of(holder) is None:
        return None
    return (
        f"held by {holder} (a claim switched it ahead of its pod and went away: that pool's "
        "next claim takes it over; vfioctl unbind gives it back)"
    )


def joined(*parts: str | None, sep: str = " ") -> str | None:
    return sep.join(p for p in parts if p) or None


def wanted_drivers(chosen: Chosen, shown: Container[PciAddress]) -> dict[PciAddress, str]:
    """Each shown device's ``vfioDriver`` from the selector that takes it (``auto``
    otherwise), from the one selector match per device (``chosen``, as :func:`serving` used)."""
    return {
        d.address: sel.vfio_driver for d, sel in chosen if sel is not None and d.address in shown
    }


def choice_cell(choice: VfioChoice | None) -> str | None:
    if choice is None:
        return None
    if choice.problem is not None:
        return f"{choice.driver}: CANNOT ({choice.problem})"
    return f"{choice.driver} ({choice.why})"


def dra_cell(view: dict[int, GroupView], group: int | None, device: str | None) -> str | None:
    from vfio_dp.dra.observers.health import describe

    v = view.get(group) if group is not None else None
    if v is None or (device is None and not v.held):
        return None
    return describe(v)


def member_cell(d: PciDevice) -> str:
    """``0000:01:00.0(e1000e)``; a device on a VFIO driver other than vfio-pci says so:
    ``0000:01:00.0(nvidia:vfio)``."""
    vfio = ":vfio" if d.on_vfio and d.driver != "vfio-pci" else ""
    return f"{d.address}({d.driver or '-'}{vfio})"


def dra_group_cell(view: dict[int, GroupView], group: int) -> str | None:
    from vfio_dp.dra.observers.health import describe

    v = view.get(group)
    return None if v is None else describe(v)


def wanted(d: PciDevice, driver: str | None, pci_class: str | None, vendor: str | None) -> bool:
    """``list``'s filters: driver name, class prefix (``0200`` or ``020000``), vendor ID."""
    if driver is not None and d.driver != driver:
        return False
    if pci_class is not None and not d.class_code.startswith(pci_class.lower().removeprefix("0x")):
        return False
    return vendor is None or d.vendor == vendor.lower().removeprefix("0x")
