"""``vfioctl list | groups`` — what the host has, and what each node process would serve.

Thin: scan through :class:`vfio_dp.host.Host`, work out serving with the pure rules of
:mod:`vfio_dp.model.serving`, print. Imports nothing heavier than the host layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cli.common import (
    MACHINE,
    F,
    envvar_for,
    host_for,
    option,
    output_option,
    print_json,
    print_names,
    print_table,
    report_operations,
    root_option,
    run_guarded,
    say,
)
from vfio_dp.model.naming import DEFAULT_DRA_DRIVER

if TYPE_CHECKING:  # types only: each command imports what it uses when it runs
    from collections.abc import Iterable

    from vfio_dp.dra.observers.health import GroupView
    from vfio_dp.host import Host
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.config import Config
    from vfio_dp.model.device import Inventory, PciDevice
    from vfio_dp.model.serving import DeviceServing, DraUnit
    from vfio_dp.model.vfio_driver import VfioChoice


def _config(path: str | None, node: str | None = None) -> Config:
    from vfio_dp.host.files import load_config

    return load_config(path).for_node(node)


def _node_option(f: F) -> F:
    return option(
        "--node-name",
        envvar=[envvar_for("--node-name"), "NODE_NAME"],
        default=None,
        help="Read the config as this node does (selectors limited to nodes: apply only "
        "where the name matches).",
    )(f)


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


def _serving(inv: Inventory, cfg: Config) -> tuple[dict[PciAddress, DeviceServing], list[DraUnit]]:
    """What each path would serve of ``inv`` under ``cfg`` (the daemons' own pure rules), and
    the DRA units it was computed from (for :func:`_dra_view`: computed once)."""
    from vfio_dp.deviceplugin.listing import compute_listing
    from vfio_dp.model.serving import choose, device_serving, dra_units

    chosen = choose(inv, cfg)  # one selector match per device, shared by both paths' rules
    listing = compute_listing(inv, cfg, chosen=chosen)
    units = dra_units(inv, cfg, chosen)
    return device_serving(inv, cfg, listing.membership, units, chosen), units


def _dra_view(
    host: Host, inv: Inventory, units: list[DraUnit], driver: str
) -> dict[int, GroupView]:
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


def _view_json(v: GroupView | None) -> dict[str, object]:
    if v is None:
        return {"dra_health": None, "dra_message": None, "dra_taint": None}
    return {"dra_health": v.health, "dra_message": v.message or None, "dra_taint": v.taint}


dra_driver_option = option(
    "--dra-driver",
    default=DEFAULT_DRA_DRIVER,
    show_default=True,
    help="With --config: the DRA driver whose prepared claims (checkpoint) count.",
)


@click.command("list")
@root_option
@output_option
@option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Node config (YAML): the table gets what each path would serve (device-plugin "
    "resource, DRA device, the DRA health and taint). Without it: what a process without "
    "--config would serve.",
)
@_node_option
@dra_driver_option
@option("--driver", "driver", default=None, help="Only devices on this driver (e.g. vfio-pci).")
@option("--class", "pci_class", default=None, help="Only this PCI class, e.g. 0200 or 020000.")
@option("--vendor", default=None, help="Only this vendor ID, e.g. 10de.")
def list_cmd(
    root: str,
    output: str,
    config: str | None,
    node_name: str | None,
    dra_driver: str,
    driver: str | None,
    pci_class: str | None,
    vendor: str | None,
) -> None:
    """Every PCI device: IDs, driver, IOMMU group, NUMA node, host use, and exactly what each
    path would serve: the resource, the path serving it (devicePlugin, or dra through the
    DeviceClass whose extendedResourceName it is) and the DRA device (null: not served)."""

    def body() -> int:
        cfg = _config(config, node_name)
        host = host_for(root)
        inv = host.scan()
        names = host.names(inv)
        serving, units = _serving(inv, cfg)
        view = _dra_view(host, inv, units, dra_driver)
        native = _native(host, inv, units)
        shown = {a: d for a, d in inv.devices.items() if _wanted(d, driver, pci_class, vendor)}
        if output == "name":
            from vfio_dp.model.address import name_of

            print_names([name_of(a) for a in shown])
            return 0
        # what a bind would choose: only for -o wide and machines (plain list never reads
        # modules.alias), with each selector's vfioDriver
        choices = (
            host.vfio_choices(inv, shown, _wanted_drivers(inv, cfg, shown))
            if output == "wide" or output in MACHINE
            else {}
        )
        rows = [
            {
                **device_json(d, serving[a], names, choices.get(a)),
                **_view_json(view.get(d.iommu_group) if d.iommu_group is not None else None),
                "dra_native_device": native.get(a, (None, None))[0],
                "not_offered_as_container": native.get(a, (None, None))[1],
            }
            for a, d in shown.items()
        ]
        if output in MACHINE:
            print_json(rows, output)
            report_operations(host)
            return 0
        headers = ["address", "ids", "class", "driver", "vfio", "group", "numa", "name", "in use"]
        if output == "wide":
            headers.insert(5, "bind would use")
        # the serving columns: with a config always; without one only where a device is
        # served (what a process without --config would serve: devices on vfio-pci)
        serve_cols = bool(config) or any(
            serving[a].resource or serving[a].dra_device for a in shown
        )
        if serve_cols:
            headers += ["resource", "served by", "dra device", "dra health", "not served"]
        print_table(
            headers,
            [
                (
                    str(a),
                    d.ids,
                    d.class_code,
                    d.driver,
                    d.vfio_driver,
                    *((_choice_cell(choices.get(a)),) if output == "wide" else ()),
                    d.iommu_group,
                    d.numa_node,
                    " ".join(
                        x
                        for x in (names.get((d.vendor, None)), names.get((d.vendor, d.device)))
                        if x
                    )
                    or None,
                    "; ".join(str(u) for u in d.in_use) or None,
                    *(
                        (
                            serving[a].resource or serving[a].dra_resource,
                            serving[a].served_by,
                            _joined(serving[a].dra_device, native.get(a, (None, None))[0]),
                            _dra_cell(view, d.iommu_group, serving[a].dra_device),
                            _joined(
                                serving[a].not_served,
                                (why := native.get(a, (None, None))[1])
                                and f"not offered as container: {why}",
                                sep="; ",
                            ),
                        )
                        if serve_cols
                        else ()
                    ),
                )
                for a, d in shown.items()
            ],
            wide=output == "wide",
        )
        report_operations(host)
        return 0

    run_guarded(body)


def _native(
    host: Host, inv: Inventory, units: list[DraUnit]
) -> dict[PciAddress, tuple[str | None, str | None]]:
    """Each function of a published group whose selectors offer ``container``: its group's
    container entry (``pci-…-native``) or why it is not offered
    (:func:`vfio_dp.host.devnodes.container_problems`: no device nodes of its own)."""
    from vfio_dp.model.personality import Personality

    offering = [u for u in units if u.published and Personality.CONTAINER in u.personalities]
    if not offering:
        return {}
    from vfio_dp.host.devnodes import container_problems
    from vfio_dp.model.naming import dra_native_name

    problems = container_problems(host.fs, inv, offering)
    out: dict[PciAddress, tuple[str | None, str | None]] = {}
    for u in offering:
        why = problems.get(u.name)
        for a in u.endpoints:
            out[a] = (None, why) if why else (dra_native_name(u.name), None)
    return out


def _joined(*parts: str | None, sep: str = " ") -> str | None:
    return sep.join(p for p in parts if p) or None


def _wanted_drivers(
    inv: Inventory, cfg: Config, shown: Iterable[PciAddress]
) -> dict[PciAddress, str]:
    """Each device's ``vfioDriver`` from the selector that takes it (``auto`` otherwise)."""
    out = {}
    for a in shown:
        sel = cfg.select(inv.devices[a])
        if sel is not None:
            out[a] = sel.vfio_driver
    return out


def _choice_cell(choice: VfioChoice | None) -> str | None:
    if choice is None:
        return None
    if choice.problem is not None:
        return f"{choice.driver}: CANNOT ({choice.problem})"
    return f"{choice.driver} ({choice.why})"


def _dra_cell(view: dict[int, GroupView], group: int | None, device: str | None) -> str | None:
    from vfio_dp.dra.observers.health import describe

    v = view.get(group) if group is not None else None
    if v is None or (device is None and not v.held):
        return None
    return describe(v)


@click.command("groups")
@root_option
@output_option
@option(
    "--probe/--no-probe",
    default=True,
    show_default=True,
    help="Ask the kernel (VFIO_GROUP_GET_STATUS) for groups with a /dev/vfio node.",
)
@option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    help="Node config (YAML): say which path serves each group, or why none does, and the "
    "health and taint the DRA plugin would publish.",
)
@_node_option
@dra_driver_option
def groups_cmd(
    root: str,
    output: str,
    probe: bool,
    config: str | None,
    node_name: str | None,
    dra_driver: str,
) -> None:
    """Every IOMMU group: members, viability with reasons, the kernel's own verdict, and
    which path serves it under which resource name (a group split between paths is served
    by neither: why)."""

    def body() -> int:
        from vfio_dp.errors import NoIommuError
        from vfio_dp.model.serving import group_paths, path_splits

        cfg = _config(config, node_name)
        host = host_for(root)
        try:
            inv, status = host.groups(probe=probe)
        except NoIommuError as e:  # an answer, not a failure: there are no groups to list
            say(f"vfioctl: {e}", err=True)
            if output in MACHINE:
                print_json([], output)
            return 0
        groups = list(inv.groups.values())
        if output == "name":
            print_names([g.number for g in groups])
            return 0
        paths = group_paths(inv, cfg)
        splits = path_splits(inv, cfg)
        serving, units = _serving(inv, cfg)
        resources: dict[int, dict[str, str]] = {}
        for a, s in serving.items():
            group = inv.devices[a].iommu_group
            name = s.resource or s.dra_resource
            if group is not None and name and s.served_by:
                resources.setdefault(group, {})[name] = s.served_by
        view = _dra_view(host, inv, units, dra_driver)
        if output in MACHINE:
            print_json(
                [
                    {
                        "group": g.number,
                        "devices": [str(a) for a in g.devices],
                        "drivers": {
                            str(a): inv.devices[a].driver for a in g.devices if a in inv.devices
                        },
                        "vfio_drivers": {
                            str(a): inv.devices[a].vfio_driver
                            for a in g.devices
                            if a in inv.devices
                        },
                        "viable": g.viable,
                        "problems": [
                            {"address": str(p.address), "reason": p.reason} for p in g.problems
                        ],
                        "noiommu": g.noiommu,
                        "kernel_viable": status[g.number].viable,
                        "in_use": status[g.number].in_use,
                        "paths": {str(a): p for a, p in paths.get(g.number, {}).items()},
                        "not_served": splits.get(g.number),
                        "resources": resources.get(g.number, {}),
                        "dra_device": view[g.number].device if g.number in view else None,
                        **_view_json(view.get(g.number)),
                    }
                    for g in groups
                ],
                output,
            )
            return 0
        kernel = {True: "viable", False: "not viable", None: None}
        print_table(
            ["group", "viable", "kernel", "path", "resources", "devices", "problems"]
            + (["dra health"] if config else []),
            [
                (
                    g.number,
                    "yes" if g.viable else "NO",
                    "in use" if status[g.number].in_use else kernel[status[g.number].viable],
                    "SPLIT"
                    if g.number in splits
                    else (",".join(sorted(set(paths.get(g.number, {}).values()))) or None),
                    ", ".join(f"{n} ({p})" for n, p in resources.get(g.number, {}).items()) or None,
                    " ".join(_member_cell(inv.devices[a]) for a in g.devices if a in inv.devices),
                    " | ".join(
                        [p.reason for p in g.problems]
                        + ([splits[g.number]] if g.number in splits else [])
                    )
                    or None,
                    *((_dra_group_cell(view, g.number),) if config else ()),
                )
                for g in groups
            ],
            wide=output == "wide",
        )
        return 0

    run_guarded(body)


def _member_cell(d: PciDevice) -> str:
    """``0000:01:00.0(e1000e)``; a device on a VFIO driver other than vfio-pci says so:
    ``0000:01:00.0(nvidia:vfio)``."""
    vfio = ":vfio" if d.on_vfio and d.driver != "vfio-pci" else ""
    return f"{d.address}({d.driver or '-'}{vfio})"


def _dra_group_cell(view: dict[int, GroupView], group: int) -> str | None:
    from vfio_dp.dra.observers.health import describe

    v = view.get(group)
    return None if v is None else describe(v)


def _wanted(d: PciDevice, driver: str | None, pci_class: str | None, vendor: str | None) -> bool:
    """``list``'s filters: driver name, class prefix (``0200`` or ``020000``), vendor ID."""
    if driver is not None and d.driver != driver:
        return False
    if pci_class is not None and not d.class_code.startswith(pci_class.lower().removeprefix("0x")):
        return False
    return vendor is None or d.vendor == vendor.lower().removeprefix("0x")
