"""``vfioctl bind | unbind | check`` — the commands that change or judge devices.

Thin: parse addresses, call :class:`vfio_dp.host.Host`, print (``list`` and ``groups`` are
:mod:`cli.inventory_cmds`). Imports nothing heavier than
the host layer (stdlib only), so they start fast (no gRPC, no Kubernetes client).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cli.common import (
    MACHINE,
    fail,
    host_for,
    option,
    output_option,
    print_json,
    print_names,
    root_option,
    run_guarded,
    say,
)

if TYPE_CHECKING:  # types only: each command imports what it uses when it runs
    from vfio_dp.errors import RefusedError
    from vfio_dp.host import BindResult, Host
    from vfio_dp.host.sriov import SriovResult
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.device import Inventory
    from vfio_dp.model.mdev_config import MdevEntry


def _parse(addresses: tuple[str, ...]) -> list[PciAddress]:
    from vfio_dp.model.address import parse_many
    from vfio_dp.model.naming import dra_device_address

    if not addresses:
        fail("give at least one PCI address, e.g. 0000:65:00.0", 2)
    # the DRA device names `list` prints (pci-0000-3b-00-0) name the same function
    given = [str(a) if (a := dra_device_address(t)) is not None else t for t in addresses]
    return parse_many(given)


#: what an unbind without a recorded driver does (its restore ends with drivers_probe)
NO_DRIVER_RECORDED = (
    "no driver recorded for it: its driver_override is cleared and drivers_probe lets the "
    "kernel bind the loaded driver that matches it (none if no loaded driver does)"
)


def _report(
    result: BindResult, output: str, verb: str, sriov: list[SriovResult] | None = None
) -> None:
    if output == "name":
        from vfio_dp.model.address import name_of

        print_names(
            [name_of(a) for a in [*result.bound, *(a for a, _ in result.restored), *result.already]]
        )
        return
    if output in MACHINE:
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
                "vfioDrivers": {
                    str(a): {"driver": c.driver, "module": c.module, "why": c.why}
                    for a, c in result.drivers.items()
                },
                "steps": [str(s) for s in result.steps],
                "warnings": result.warnings,
            },
            output,
        )
        return
    for w in result.warnings:
        say(f"warning: {w}", err=True)
    for r in sriov or ():
        if result.dry_run:
            say(f"# {r.pf}: SR-IOV PF back to {r.target} VFs")
            for step in r.steps:
                say(step)
        elif not r.already:
            say(f"{r.pf}: SR-IOV PF back to {r.target} VFs")
    if result.dry_run:  # a script a person can paste: comments say where each device goes
        for a, d in result.restored:
            say(f"# {a}: back to {d}" if d else f"# {a}: {NO_DRIVER_RECORDED}")
        for a in result.already:
            say(f"# {a}: already {verb}: nothing to do")
        for a, to in result.drivers.items():
            if to.driver != "vfio-pci" or to.why.startswith("modules.alias"):
                say(f"# {a}: to {to.driver} ({to.why})")
        for s in result.steps:
            say(str(s))
        return
    for a in result.bound:
        c = result.drivers.get(a)
        if c is None or c.driver == "vfio-pci":
            say(f"{a}: bound to vfio-pci")
        else:
            say(f"{a}: bound to {c.driver} ({c.why})")
    for a, d in result.restored:
        say(f"{a}: restored to {d or 'no driver'}")
    for a in result.already:
        say(f"{a}: already {verb}")


def _persist(
    host: Host, result: BindResult, addresses: list[PciAddress], dry_run: bool, output: str
) -> None:
    """``bind --persist``: record ``addresses`` (as they are now on their VFIO driver: the one
    this bind chose, or the one they were already on) and rewrite the udev rule that
    re-applies them at boot (:mod:`vfio_dp.host.persist`)."""
    from vfio_dp.host.persist import Persistence
    from vfio_dp.host.vfio_drivers import driver_module
    from vfio_dp.model.persist import PLAIN_MODULE, PersistedBind
    from vfio_dp.model.vfio_driver import VFIO_PCI_MODULE, module_of

    inv = host.scan_groups(addresses, usage=False)
    devices = [inv.devices[a] for a in sorted(set(addresses)) if a in inv.devices]
    drivers: dict[PciAddress, tuple[str, str]] = {}
    for d in devices:
        c = result.drivers.get(d.address)
        driver = c.driver if c is not None else (d.vfio_driver or "vfio-pci")
        module = (
            c.module if c is not None else (driver_module(host.fs, driver) or module_of(driver))
        )
        drivers[d.address] = (driver, PLAIN_MODULE if module == VFIO_PCI_MODULE else module)
    store = Persistence(host.fs)
    if dry_run:
        for d in devices if output not in MACHINE else ():
            rec = PersistedBind(
                d.address, d.vendor, d.device, d.subsystem_vendor, d.subsystem_device,
                *drivers[d.address],
            )  # fmt: skip
            say(f"# {store.rules_path}: {rec.udev_rule()}")
        return
    added = store.add(devices, drivers)
    if output not in MACHINE:
        for a in sorted(set(addresses)):
            state = "persists" if a in added else "already persists"
            say(f"{a}: {state} across reboots ({store.rules_path})")


def _would_bind(host: Host, addresses: list[PciAddress], group: bool) -> list[PciAddress]:
    """What a bind of ``addresses`` (with ``--group``: their groups' endpoints) takes, for a
    dry run's ``--persist`` (the bind itself was planned and not refused)."""
    if not group:
        return addresses
    inv = host.scan_groups(addresses, usage=False)
    return [a for a, d in inv.devices.items() if not d.is_bridge]


def _unpersist(host: Host, addresses: list[PciAddress] | None, output: str) -> None:
    """Forget persistent binds of ``addresses`` (None: all) after they were given back."""
    from vfio_dp.host.persist import Persistence

    store = Persistence(host.fs)
    gone = store.drop(addresses)
    if output not in MACHINE:
        for a in gone:
            say(f"{a}: no longer bound at boot (removed from {store.record_path})")


def _restore_vf_counts(host: Host, dry_run: bool) -> tuple[list[SriovResult], RefusedError | None]:
    """Every SR-IOV PF vfio_dp changed back to the VF count it had (before the binds are
    given back: the VFs' own bind records go with them); a PF with a held VF is refused."""
    from vfio_dp.deviceplugin.podresources import DEFAULT_SOCKET, holds
    from vfio_dp.dra.claimpath.holds import checkpoint_holds
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
        say(f"warning: {r}", err=True)
    return results, None


def _mdev_entries(config: str | None) -> tuple[MdevEntry, ...]:
    """``--config``'s ``mdev:`` entries (none without it; the config is read only if given)."""
    if config is None:
        return ()
    from vfio_dp.host.files import load_config

    return load_config(config).mdev


@click.command("bind")
@click.argument("addresses", nargs=-1)
@root_option
@output_option
@option("--group", is_flag=True, help="Also bind the other endpoints of the devices' IOMMU groups.")
@option("--force", is_flag=True, help="Take devices the host is using (dangerous).")
@option("--dry-run", is_flag=True, help="Print the exact sysfs writes, change nothing.")
@option(
    "--persist",
    is_flag=True,
    help="Also put them back on vfio-pci at every boot, before host drivers probe (a udev rule).",
)
@option(
    "--vfio-driver",
    default="auto",
    show_default=True,
    help="The VFIO driver to bind: auto (the variant the kernel's modules.alias names for "
    "each device, else vfio-pci), vfio-pci, or a driver's name (e.g. mlx5_vfio_pci).",
)
@option(
    "--config",
    type=click.Path(dir_okay=False),
    default=None,
    help="The node's config (YAML): a parent its mdev: entries want instances of is refused "
    "(it stays on its vendor driver).",
)
def bind_cmd(
    addresses: tuple[str, ...],
    root: str,
    output: str,
    group: bool,
    force: bool,
    dry_run: bool,
    persist: bool,
    vfio_driver: str,
    config: str | None,
) -> None:
    """Move devices to their VFIO driver (recording their drivers for unbind)."""

    def body() -> int:
        addrs = _parse(addresses)
        host = host_for(root)
        if vfio_driver != "auto" and not host.valid_driver_name(vfio_driver):
            fail(f"--vfio-driver {vfio_driver!r} is not a kernel driver name", 2)
        result = host.bind(
            addrs, group=group, force=force, dry_run=dry_run, vfio_driver=vfio_driver,
            mdev=_mdev_entries(config),
        )  # fmt: skip
        _report(result, output, "on vfio-pci")
        if persist:
            done = [*result.bound, *result.already]
            would = _would_bind(host, addrs, group) if dry_run else done
            _persist(host, result, would, dry_run, output)
        return 0

    run_guarded(body)


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

            host = host_for(root)
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
            if not dry_run:
                _unpersist(host, None, output)
            if refused is not None:  # the rest was restored; say what was not, and fail
                _report(result, output, "off vfio-pci", sriov)
                raise refused
            if output not in MACHINE and not (
                result.restored or result.already or result.steps or sriov or result.warnings
            ):
                say(
                    f"nothing to restore: no device has a record under {host.display}"
                    "var/lib/vfio_dp/original"
                )
                return 0
            _report(result, output, "off vfio-pci", sriov)
            return 0
        addrs = _parse(addresses)
        host = host_for(root)
        if driver is not None and not host.valid_driver_name(driver):
            fail(f"--driver {driver!r} is not a kernel driver name", 2)
        result = host.unbind(addrs, driver=driver, force=force, dry_run=dry_run)
        _report(result, output, "off vfio-pci")
        if not dry_run:
            _unpersist(host, [*addrs, *(a for a, _ in result.restored)], output)
        return 0

    run_guarded(body)


def _native_nodes(
    host: Host, inv: Inventory, addresses: list[PciAddress]
) -> dict[PciAddress, tuple[list[str] | None, str | None]]:
    """Each device's own nodes on its native driver (found now, or as recorded) and, when
    it has none, why it is not offered as a container (``personalities``); ``inv``: the
    devices' groups, as the check read them."""
    from vfio_dp.host.devnodes import native_nodes
    from vfio_dp.model.devnodes import container_problem

    found = native_nodes(host.fs, inv, addresses)
    out: dict[PciAddress, tuple[list[str] | None, str | None]] = {}
    for a in addresses:
        n = found.get(a)
        dev = inv.devices.get(a)
        why = container_problem(a, dev.describe() if dev else str(a), n)
        out[a] = (list(n.paths) if n is not None else None, why)
    return out


@click.command("check")
@click.argument("addresses", nargs=-1)
@root_option
@output_option
@option(
    "--vfio-driver",
    default="auto",
    show_default=True,
    help="Say what a bind with this VFIO driver would do (auto, vfio-pci or a driver's name).",
)
def check_cmd(addresses: tuple[str, ...], root: str, output: str, vfio_driver: str) -> None:
    """Is each device ready for passthrough now? Every reason and its fix, and the VFIO
    driver a bind would choose; exit 1 if not."""

    def body() -> int:
        host = host_for(root)
        if vfio_driver != "auto" and not host.valid_driver_name(vfio_driver):
            fail(f"--vfio-driver {vfio_driver!r} is not a kernel driver name", 2)
        addrs = _parse(addresses)
        inv = host.scan_groups(addrs)  # read once: the check and the native nodes ask it
        reports = host.check(addrs, vfio_driver=vfio_driver, inv=inv)
        native = _native_nodes(host, inv, addrs)
        if output == "name":
            from vfio_dp.model.address import name_of

            print_names([name_of(r.address) for r in reports if r.ready])
        elif output in MACHINE:
            print_json(
                [
                    {
                        "address": str(r.address),
                        "ready": r.ready,
                        "reasons": list(r.reasons),
                        "vfio_driver": r.vfio_driver,
                        "vfioDriver": r.would_bind,
                        "native_nodes": native[r.address][0],
                        "not_offered_as_container": native[r.address][1],
                    }
                    for r in reports
                ],
                output,
            )
        else:
            for r in reports:
                on = f" (on {r.vfio_driver})" if r.ready and r.vfio_driver else ""
                say(f"{r.address}: {'ready' if r.ready else 'NOT ready'}{on}")
                for why in r.reasons:
                    say(f"  - {why}")
                if r.would_bind is not None and r.vfio_driver is None:
                    say(f"  would bind {r.would_bind}")
                nodes, not_offered = native[r.address]
                if not_offered:
                    say(f"  {not_offered}")
                else:  # what a container claim gets (personalities: container)
                    say(f"  its own device nodes (for a container): {', '.join(nodes or ())}")
        return 0 if all(r.ready for r in reports) else 1

    run_guarded(body)
