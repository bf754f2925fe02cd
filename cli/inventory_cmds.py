"""``vfioctl list | groups`` — what the host has, and what each node process would serve.

Thin: scan through :class:`vfio_dp.host.Host`, work out serving with the pure rules of
:mod:`vfio_dp.model.serving`, print; what each row and cell says is :mod:`cli.inventory_views`.
Imports nothing heavier than the host layer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cli import inventory_views as views
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
    from vfio_dp.model.config import Config


_NO_NATIVE: tuple[None, None, None] = (None, None, None)


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
        from vfio_dp.model.serving import choose

        chosen = choose(inv, cfg)  # one selector match per device: serving and vfioDriver
        serving, units = views.serving(inv, cfg, chosen)
        view = views.dra_view(host, inv, units, dra_driver)
        native = views.native(host, inv, units, dra_driver)
        holders = host.record_holders()  # who holds each binding (a pool hold named below)
        shown = {a: d for a, d in inv.devices.items() if views.wanted(d, driver, pci_class, vendor)}
        if output == "name":
            from vfio_dp.model.address import name_of

            print_names([name_of(a) for a in shown])
            return 0
        # what a bind would choose: only for -o wide and machines (plain list never reads
        # modules.alias), with each selector's vfioDriver
        choices = (
            host.vfio_choices(inv, shown, views.wanted_drivers(chosen, shown))
            if output == "wide" or output in MACHINE
            else {}
        )
        rows = [
            {
                **views.device_json(d, serving[a], names, choices.get(a)),
                **views.view_json(view.get(d.iommu_group) if d.iommu_group is not None else None),
                "dra_native_device": nat[0],
                "not_offered_as_container": nat[1],
                "not_offered_as_vm": nat[2],
                "held_by": holders.get(a),
            }
            for a, d in shown.items()
            for nat in (native.get(a, _NO_NATIVE),)
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
                    *((views.choice_cell(choices.get(a)),) if output == "wide" else ()),
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
                            views.joined(None if nat[2] else serving[a].dra_device, nat[0]),
                            views.dra_cell(view, d.iommu_group, serving[a].dra_device),
                            views.joined(
                                serving[a].not_served,
                                nat[1] and f"not offered as container: {nat[1]}",
                                nat[2] and f"not offered as vm: {nat[2]}",
                                views.pool_hold(holders.get(a)),
                                sep="; ",
                            ),
                        )
                        if serve_cols
                        else ()
                    ),
                )
                for a, d in shown.items()
                for nat in (native.get(a, _NO_NATIVE),)
            ],
            wide=output == "wide",
        )
        report_operations(host)
        return 0

    run_guarded(body)


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
        serving, units = views.serving(inv, cfg)
        resources: dict[int, dict[str, str]] = {}
        for a, s in serving.items():
            group = inv.devices[a].iommu_group
            name = s.resource or s.dra_resource
            if group is not None and name and s.served_by:
                resources.setdefault(group, {})[name] = s.served_by
        view = views.dra_view(host, inv, units, dra_driver)
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
                        **views.view_json(view.get(g.number)),
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
                    " ".join(
                        views.member_cell(inv.devices[a]) for a in g.devices if a in inv.devices
                    ),
                    " | ".join(
                        [p.reason for p in g.problems]
                        + ([splits[g.number]] if g.number in splits else [])
                    )
                    or None,
                    *((views.dra_group_cell(view, g.number),) if config else ()),
                )
                for g in groups
            ],
            wide=output == "wide",
        )
        return 0

    run_guarded(body)
