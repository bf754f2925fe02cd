"""``vfioctl list | groups | bind | unbind | check`` — the host commands.

Thin: parse addresses, call :class:`vfio_dp.host.Host`, print. Imports nothing heavier than
the host layer (stdlib only), so they start fast (no gRPC, no Kubernetes client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cli.common import (
    F,
    envvar_for,
    fail,
    option,
    output_option,
    print_json,
    print_table,
    root_option,
    run_guarded,
)
from cli.dra_cmd import DEFAULT_DRIVER

if TYPE_CHECKING:  # types only: each command imports what it uses when it runs
    from vfio_dp.dra.health import GroupView
    from vfio_dp.errors import RefusedError
    from vfio_dp.host import BindResult, Host
    from vfio_dp.host.sriov import SriovResult
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.config import Config
    from vfio_dp.model.device import Inventory, PciDevice
    from vfio_dp.model.serving import DeviceServing


def _parse(addresses: tuple[str, ...]) -> list[PciAddress]:
    from vfio_dp.model.address import parse_many

    if not addresses:
        fail("give at least one PCI address, e.g. 0000:65:00.0", 2)
    return parse_many(addresses)


def _host(root: str) -> Host:
    import os

    from vfio_dp.host import Host

    # a big host's scan may use the CPUs this process may run on (a container's cpuset)
    return Host(root, scan_processes=len(os.sched_getaffinity(0)))


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
    dev: PciDevice, serving: DeviceServing, names: dict[tuple[str, str | None], str]
) -> dict[str, object]:
    """One row of ``vfioctl list -o json``: the device, and what each path would serve of it
    (``resource``: the device-plugin resource; ``dra_device``: the DRA device; null: not)."""
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


def _serving(inv: Inventory, cfg: Config) -> dict[PciAddress, DeviceServing]:
    """What each path would serve of ``inv`` under ``cfg`` (the daemons' own pure rules)."""
    from vfio_dp.deviceplugin.listing import compute_listing
    from vfio_dp.model.serving import device_serving, dra_units

    listing = compute_listing(inv, cfg)
    return device_serving(inv, cfg, listing.membership, dra_units(inv, cfg))


def _dra_view(host: Host, inv: Inventory, cfg: Config, driver: str) -> dict[int, GroupView]:
    """By IOMMU group: the health and taint the DRA plugin would publish now (its pure rules,
    the prepared claims of its checkpoint read-only, ``/dev/vfio`` listed once)."""
    import time

    from vfio_dp.dra import health
    from vfio_dp.dra.checkpoint import peek
    from vfio_dp.host.vfio import group_nodes_present
    from vfio_dp.model.serving import dra_units

    records, problem = peek(host, driver)
    if problem:
        click.echo(f"vfioctl: warning: {problem}; prepared claims not shown", err=True)
    units = dra_units(inv, cfg)
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
    default=DEFAULT_DRIVER,
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
def list_cmd(
    root: str, output: str, config: str | None, node_name: str | None, dra_driver: str
) -> None:
    """Every PCI device: IDs, driver, IOMMU group, NUMA node, host use, and exactly what each
    path would serve: the resource, the path serving it (devicePlugin, or dra through the
    DeviceClass whose extendedResourceName it is) and the DRA device (null: not served)."""

    def body() -> int:
        cfg = _config(config, node_name)
        host = _host(root)
        inv = host.scan()
        names = host.names(inv)
        serving = _serving(inv, cfg)
        view = _dra_view(host, inv, cfg, dra_driver)
        rows = [
            {
                **device_json(d, serving[a], names),
                **_view_json(view.get(d.iommu_group) if d.iommu_group is not None else None),
            }
            for a, d in inv.devices.items()
        ]
        if output == "json":
            print_json(rows)
            _report_operations(host)
            return 0
        headers = ["address", "ids", "class", "driver", "group", "numa", "name", "in use"]
        if config:
            headers += ["resource", "served by", "dra device", "dra health", "not served"]
        print_table(
            headers,
            [
                (
                    str(a),
                    d.ids,
                    d.class_code,
                    d.driver,
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
                            serving[a].dra_device,
                            _dra_cell(view, d.iommu_group, serving[a].dra_device),
                            serving[a].not_served,
                        )
                        if config
                        else ()
                    ),
                )
                for a, d in inv.devices.items()
            ],
        )
        _report_operations(host)
        return 0

    run_guarded(body)


def _dra_cell(view: dict[int, GroupView], group: int | None, device: str | None) -> str | None:
    from vfio_dp.dra.health import describe

    v = view.get(group) if group is not None else None
    if v is None or (device is None and not v.held):
        return None
    return describe(v)


def _report_operations(host: Host) -> None:
    """Interrupted binds/unbinds and unreadable records, plainly, on stderr (stdout stays a
    table or JSON)."""
    found, problems = host.interrupted()
    for op in found:
        click.echo(f"vfioctl: {op.message()}", err=True)
    for p in problems:
        click.echo(f"vfioctl: warning: {p}", err=True)


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
        host = _host(root)
        try:
            inv, status = host.groups(probe=probe)
        except NoIommuError as e:  # an answer, not a failure: there are no groups to list
            click.echo(f"vfioctl: {e}", err=True)
            if output == "json":
                print_json([])
            return 0
        groups = list(inv.groups.values())
        paths = group_paths(inv, cfg)
        splits = path_splits(inv, cfg)
        serving = _serving(inv, cfg)
        resources: dict[int, dict[str, str]] = {}
        for a, s in serving.items():
            group = inv.devices[a].iommu_group
            name = s.resource or s.dra_resource
            if group is not None and name and s.served_by:
                resources.setdefault(group, {})[name] = s.served_by
        view = _dra_view(host, inv, cfg, dra_driver)
        if output == "json":
            print_json(
                [
                    {
                        "group": g.number,
                        "devices": [str(a) for a in g.devices],
                        "drivers": {
                            str(a): inv.devices[a].driver for a in g.devices if a in inv.devices
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
                ]
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
                        f"{a}({inv.devices[a].driver or '-'})"
                        for a in g.devices
                        if a in inv.devices
                    ),
                    " | ".join(
                        [p.reason for p in g.problems]
                        + ([splits[g.number]] if g.number in splits else [])
                    )
                    or None,
                    *((_dra_group_cell(view, g.number),) if config else ()),
                )
                for g in groups
            ],
        )
        return 0

    run_guarded(body)


def _dra_group_cell(view: dict[int, GroupView], group: int) -> str | None:
    from vfio_dp.dra.health import describe

    v = view.get(group)
    return None if v is None else describe(v)


def _report(
    result: BindResult, output: str, verb: str, sriov: list[SriovResult] | None = None
) -> None:
    if output == "json":
        print_json(
            {
                **(
                    {}
                    if sriov is None
                    else {
                        "sriov": [
                            {"address": str(r.pf), "count": r.target, "steps": r.steps}
                            for r in sriov
                        ]
                    }
                ),
                "dry_run": result.dry_run,
                "bound": [str(a) for a in result.bound],
                "restored": [{"address": str(a), "driver": d} for a, d in result.restored],
                "already": [str(a) for a in result.already],
                "steps": [str(s) for s in result.steps],
                "warnings": result.warnings,
            }
        )
        return
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    for r in sriov or ():
        if result.dry_run:
            click.echo(f"# {r.pf}: SR-IOV PF back to {r.target} VFs")
            for step in r.steps:
                click.echo(step)
        elif not r.already:
            click.echo(f"{r.pf}: SR-IOV PF back to {r.target} VFs")
    if result.dry_run:  # a script a person can paste: comments say where each device goes
        for a, d in result.restored:
            click.echo(f"# {a}: back to {d or 'no driver'}")
        for s in result.steps:
            click.echo(str(s))
        return
    for a in result.bound:
        click.echo(f"{a}: bound to vfio-pci")
    for a, d in result.restored:
        click.echo(f"{a}: restored to {d or 'no driver'}")
    for a in result.already:
        click.echo(f"{a}: already {verb}")


@click.command("bind")
@click.argument("addresses", nargs=-1)
@root_option
@output_option
@option("--group", is_flag=True, help="Also bind the other endpoints of the devices' IOMMU groups.")
@option("--force", is_flag=True, help="Take devices the host is using (dangerous).")
@option("--dry-run", is_flag=True, help="Print the exact sysfs writes, change nothing.")
def bind_cmd(
    addresses: tuple[str, ...], root: str, output: str, group: bool, force: bool, dry_run: bool
) -> None:
    """Move devices to vfio-pci (recording their drivers for unbind)."""

    def body() -> int:
        addrs = _parse(addresses)
        _report(
            _host(root).bind(addrs, group=group, force=force, dry_run=dry_run),
            output,
            "on vfio-pci",
        )
        return 0

    run_guarded(body)


def _restore_vf_counts(host: Host, dry_run: bool) -> tuple[list[SriovResult], RefusedError | None]:
    """Every SR-IOV PF vfio_dp changed back to the VF count it had (before the binds are
    given back: the VFs' own bind records go with them); a PF with a held VF is refused."""
    from vfio_dp.deviceplugin.podresources import DEFAULT_SOCKET, holds
    from vfio_dp.dra.holds import checkpoint_holds
    from vfio_dp.errors import RefusedError
    from vfio_dp.host.sriov import Sriov

    held = checkpoint_holds(host.fs)
    for a, who in holds(DEFAULT_SOCKET).items():  # pods the kubelet gave a VF
        held.setdefault(a, []).extend(who)
    sr = Sriov(host)
    try:
        results, recovered = sr.restore_all(extra=held, dry_run=dry_run)
    except RefusedError as e:
        return [], e
    for r in recovered:
        click.echo(f"warning: {r}", err=True)
    return results, None


@click.command("unbind")
@click.argument("addresses", nargs=-1)
@root_option
@output_option
@option(
    "--all",
    "every",
    is_flag=True,
    help="Every device with a record of its driver before `vfioctl bind` (to give them all back).",
)
@option("--driver", default=None, help="Restore to this driver instead of the recorded one.")
@option("--force", is_flag=True, help="Unbind even if a process holds the group open.")
@option("--dry-run", is_flag=True, help="Print the exact sysfs writes, change nothing.")
def unbind_cmd(
    addresses: tuple[str, ...],
    root: str,
    output: str,
    every: bool,
    driver: str | None,
    force: bool,
    dry_run: bool,
) -> None:
    """Give devices back to the driver they had before `vfioctl bind`."""

    def body() -> int:
        if every:
            if addresses:
                fail("give either --all or addresses, not both", 2)
            if driver is not None:
                fail("--all gives each device back to its own recorded driver; drop --driver", 2)
            if force:
                fail(
                    "--all never takes a group a process holds open (a VM's QEMU): stop the VM "
                    "first, or give that one device back by address with --force",
                    2,
                )
            from vfio_dp.host.instance import none_running
            from vfio_dp.host.root import Root

            host = _host(root)
            from vfio_dp.errors import VfioError

            with none_running(Root(root), "unbind --all refused"):
                # VF counts first: destroying made VFs drops their bind records too
                sriov, refused = _restore_vf_counts(host, dry_run)
                try:
                    result = host.unbind_all(dry_run=dry_run)
                except VfioError as e:
                    if refused is None:
                        raise
                    raise type(refused)([*refused.reasons, str(e)]) from e
            if refused is not None:  # the rest was restored; say what was not, and fail
                _report(result, output, "off vfio-pci", sriov)
                raise refused
            if output != "json" and not (
                result.restored or result.already or result.steps or sriov
            ):
                click.echo(
                    f"nothing to restore: no device has a record under {host.display}"
                    "var/lib/vfio_dp/original"
                )
                return 0
            _report(result, output, "off vfio-pci", sriov)
            return 0
        addrs = _parse(addresses)
        host = _host(root)
        if driver is not None and not host.valid_driver_name(driver):
            fail(f"--driver {driver!r} is not a kernel driver name", 2)
        _report(
            host.unbind(addrs, driver=driver, force=force, dry_run=dry_run),
            output,
            "off vfio-pci",
        )
        return 0

    run_guarded(body)


@click.command("check")
@click.argument("addresses", nargs=-1)
@root_option
@output_option
def check_cmd(addresses: tuple[str, ...], root: str, output: str) -> None:
    """Is each device ready for passthrough now? Every reason and its fix; exit 1 if not."""

    def body() -> int:
        reports = _host(root).check(_parse(addresses))
        if output == "json":
            print_json(
                [
                    {"address": str(r.address), "ready": r.ready, "reasons": list(r.reasons)}
                    for r in reports
                ]
            )
        else:
            for r in reports:
                click.echo(f"{r.address}: {'ready' if r.ready else 'NOT ready'}")
                for why in r.reasons:
                    click.echo(f"  - {why}")
        return 0 if all(r.ready for r in reports) else 1

    run_guarded(body)
