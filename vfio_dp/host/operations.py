"""Bind, unbind, recovery and release as operations: plan, lock, journal, execute, commit.

Each operation on devices (``<root>`` omitted):

1. finishes first any INTERRUPTED operation on the same devices (a journal in
   ``/var/lib/vfio_dp/ops/`` whose process died: its locks in ``/run/vfio_dp/`` are free);
2. takes the devices' locks (``/run/vfio_dp/<bdf>.lock``), reads their state again and plans
   from it (:mod:`vfio_dp.model.plan`, pure);
3. checks every sysfs path it will write resolves inside the root, then has the
   :class:`~vfio_dp.host.ledger.Ledger` write the journal and the bind records -- all before
   the first sysfs write (a failure there refuses, changing nothing);
4. has the :class:`~vfio_dp.host.bind.Binder` execute the writes (each journaled first);
5. removes the journal (the commit), or -- when devices could not be put back -- keeps it
   marked ``failed`` for ``vfioctl list`` / ``unbind`` / :func:`recover`.

A failed bind rolls back every device it touched (:func:`_rollback`), so no device is left
without its driver. :func:`release` gives back what one holder bound, group by group, keeping
groups a process holds open. Step 1 -- finishing what a killed run left -- is
:func:`vfio_dp.host.recovery.recover`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vfio_dp.errors import (
    BindError,
    HostError,
    RefusedError,
    StateWriteError,
    VfioError,
)
from vfio_dp.host import sysfs
from vfio_dp.host.bind import Binder, BindResult, Step
from vfio_dp.host.bound_by import pool_refusal
from vfio_dp.host.recovery import executor, recover
from vfio_dp.host.vfio_drivers import mark_on_vfio
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory
from vfio_dp.model.plan import BindPlan, plan_bind, plan_unbind

if TYPE_CHECKING:
    from collections.abc import Mapping

    from vfio_dp.host.host import Host
    from vfio_dp.model.mdev_config import MdevEntry
    from vfio_dp.model.vfio_driver import VfioChoice

    #: ``auto``, ``vfio-pci`` or a driver's name, for every device or per address
    VfioWanted = str | Mapping[PciAddress, str]


@dataclass(slots=True)
class Release:
    """What :func:`release` did: one line per device given back, one per group kept."""

    restored: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


# -- shared steps ------------------------------------------------------------------------
@contextlib.contextmanager
def _locked(host: Host, addresses: Sequence[PciAddress]) -> Iterator[None]:
    """The devices' locks; a lock that cannot be created refuses the operation."""
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(host.state.locked(list(addresses), host.lock_timeout))
        except StateWriteError as e:
            raise StateWriteError(
                f"refused before the first sysfs write (nothing was changed): {e}"
            ) from e
        yield


def _preflight(host: Host, steps: Sequence[Step]) -> None:
    """Every sysfs file an operation will write resolves inside the root (else refuse
    before the first write, naming the path and the link)."""
    for s in steps:
        if s.path:
            host.fs.check_inside(s.path)


def _check_escapes(host: Host, inv: Inventory, addresses: Sequence[PciAddress]) -> None:
    """An address discovery did not find because its sysfs entry leads out of the root:
    :class:`PathEscapeError` naming the link (rather than "no such device")."""
    for a in addresses:
        if a not in inv.devices:
            host.fs.check_inside(f"{sysfs.pci_devices_dir(host.fs)}/{a}/driver_override")


def groups_in_use(host: Host, inv: Inventory, addrs: Sequence[PciAddress]) -> dict[int, bool]:
    """Whether a process holds each IOMMU group of ``addrs`` open (the kernel's ``EBUSY``)."""
    groups = {inv.devices[a].iommu_group for a in addrs if a in inv.devices}
    found = {n: inv.groups[n] for n in groups if n is not None and n in inv.groups}
    return {n: bool(s.in_use) for n, s in host.probe_groups(list(found.values())).items()}


# -- bind ----------------------------------------------------------------------------------
def _plan_bind(
    host: Host,
    inv: Inventory,
    addresses: Sequence[PciAddress],
    in_use: dict[int, bool] | None,
    *,
    group: bool,
    force: bool,
    holder: str,
    mdev: Sequence[MdevEntry] = (),
) -> BindPlan:
    """:func:`vfio_dp.model.plan.plan_bind`, and a device on VFIO already that a DRA pool
    holds refused to every other ``holder`` (:func:`vfio_dp.host.bound_by.pool_refusal`)."""
    plan = plan_bind(
        inv, addresses, group=group, force=force, groups_in_use=in_use,
        root_display=host.fs.display, mdev_entries=mdev,
    )  # fmt: skip
    refusals = list(plan.refusals)
    for a in plan.already:
        with contextlib.suppress(HostError):  # unreadable: read (and named) by an unbind
            rec = host.ledger.record(a)
            if rec is not None and (why := pool_refusal(a, rec.bound_by, holder)) is not None:
                refusals.append(why)
    if refusals:
        raise RefusedError(refusals)
    return plan


def _choices(
    host: Host, inv: Inventory, targets: Sequence[PciAddress], wanted: VfioWanted
) -> dict[PciAddress, VfioChoice]:
    """The VFIO driver for each target (:meth:`Host.vfio_choices`); a device the wanted
    driver cannot serve refuses the whole bind, before any write."""
    out = host.vfio_choices(inv, targets, wanted)
    if problems := [c.problem for c in out.values() if c.problem is not None]:
        raise RefusedError(problems)
    return out


def bind(
    host: Host,
    addresses: Sequence[PciAddress],
    *,
    group: bool,
    force: bool,
    dry_run: bool,
    probe: bool,
    bound_by: str,
    inventory: Inventory | None = None,
    vfio_driver: VfioWanted = "auto",
    mdev: Sequence[MdevEntry] = (),
) -> BindResult:
    """:meth:`vfio_dp.host.Host.bind` (see there)."""
    undone: list[str] = []
    if not dry_run:
        rec_out = recover(host, only=addresses)
        if rec_out.problems:
            raise BindError("\n".join(rec_out.problems))
        undone = [f"undid the interrupted {d} first" for d in rec_out.recovered]
    inv = inventory if inventory is not None and not undone else host.scan_groups(addresses)
    _check_escapes(host, inv, addresses)
    in_use = groups_in_use(host, inv, addresses) if probe else None
    plan = _plan_bind(
        host, inv, addresses, in_use, group=group, force=force, holder=bound_by, mdev=mdev
    )
    planner = Binder(host.fs, host.kernel)
    if dry_run:
        result = BindResult(
            already=list(plan.already), dry_run=True, warnings=[f"forced: {w}" for w in plan.forced]
        )
        loading: set[str] = set()
        result.drivers = _choices(host, inv, plan.targets, vfio_driver)
        for a, choice in result.drivers.items():
            need = choice.module not in loading and not planner.driver_loaded(choice.driver)
            result.steps.extend(planner.bind_steps(inv.devices[a], need, choice))
            loading.add(choice.module)
        return result
    touched: list[PciAddress] = []
    locked = [*plan.targets, *plan.already]
    with _locked(host, locked):
        now = {a: planner.current(a) for a in locked}
        devices = {
            **inv.devices,
            **{
                a: dataclasses.replace(
                    d,
                    in_use=inv.devices[a].in_use,
                    original_driver=inv.devices[a].original_driver,
                )
                for a, d in now.items()
            },
        }
        mark_on_vfio(host.fs, devices)  # on VFIO as the groups are now (a provider's node)
        inv = dataclasses.replace(inv, devices=devices)
        plan = _plan_bind(
            host, inv, addresses, in_use, group=group, force=force, holder=bound_by, mdev=mdev
        )
        forced = [f"forced: {w}" for w in plan.forced]
        result = BindResult(already=list(plan.already), warnings=undone + forced)
        targets = [inv.devices[a] for a in plan.targets]
        choices = _choices(host, inv, plan.targets, vfio_driver)
        for dev in targets:
            _preflight(host, planner.bind_steps(dev, False, choices[dev.address]))
        choices = planner.load_modules(choices, result)  # before the journal: may fail
        result.drivers = choices
        op = host.ledger.begin_bind(
            host.runner, targets, bound_by, {a: c.driver for a, c in choices.items()}
        )
        binder = executor(host, op)
        try:
            binder.bind_all(targets, result, touched, choices)
        except BindError as e:
            problems = _rollback(host, binder, touched)
            msg = f"bind failed: {e}"
            if touched:
                msg += f"\nrolled back {', '.join(map(str, touched))}"
            if problems:
                msg += "\n" + "\n".join(problems)
                host.ledger.failed(op, msg)
            else:
                host.ledger.finish(op)
            raise BindError(msg) from e
        host.ledger.finish(op)
    return result


def _rollback(host: Host, binder: Binder, touched: list[PciAddress]) -> list[str]:
    """Undo every device touched, newest first, to its bind record; what could not be."""
    problems: list[str] = []
    for addr in reversed(touched):
        rec = host.ledger.record(addr)
        try:
            now = binder.current(addr)
            if (
                rec is not None
                and now.driver == rec.driver
                and (now.driver_override == rec.driver_override)
            ):
                host.ledger.forget(addr)
                continue
            binder.restore_one(
                addr,
                rec.driver if rec else None,
                rec.driver_override if rec else None,
                explicit=False,
            )
        except BindError as e:
            problems.append(f"{addr}: rollback failed: {e}")
    return problems


# -- unbind --------------------------------------------------------------------------------
def unbind(
    host: Host,
    addresses: list[PciAddress],
    *,
    driver: str | None = None,
    force: bool,
    dry_run: bool,
    every: bool = False,
    native: bool = False,
) -> BindResult:
    """:meth:`vfio_dp.host.Host.unbind` and ``unbind_all`` (``every``; see there).
    ``native`` (:meth:`vfio_dp.host.Host.to_native`): a device no driver took is a failure
    too, and on any failure every device is put back where it was, with its record."""
    result = BindResult(dry_run=dry_run)
    recovered: set[PciAddress] = set()
    if not dry_run:  # an interrupted bind/unbind of these devices: finish it first
        rec_out = recover(host, only=() if every else addresses)
        result.restored.extend(rec_out.restored)
        recovered = {a for a, _ in rec_out.restored}
        result.warnings.extend(f"undid the interrupted {d}" for d in rec_out.recovered)
        result.warnings.extend(rec_out.unreadable)
        if rec_out.problems:
            raise BindError("\n".join(rec_out.problems))
        if every:
            addresses = sorted(host.ledger.records())
    if not addresses:
        return result
    planner = Binder(host.fs, host.kernel)
    with _locked(host, addresses):
        inv = host.scan_groups(addresses, usage=False)
        _check_escapes(host, inv, addresses)
        for a in addresses:  # an unreadable record refuses (CorruptRecordError), never
            host.ledger.record(a)  # reads as "no record": it would be restored over, dropped
        if every:
            result.warnings.extend(host.state.problems())
        plan = plan_unbind(
            inv,
            host.ledger.records(),
            addresses,
            driver=driver,
            force=force,
            groups_in_use=groups_in_use(host, inv, addresses),
            root_display=host.fs.display,
            skip_missing=every,
        )
        if plan.refusals:
            raise RefusedError(list(plan.refusals))
        result.already.extend(a for a in plan.already if a not in recovered)
        jobs = [(inv.devices[r.address], r.driver, r.override) for r in plan.restores]
        if dry_run:  # ``restored`` then says what WOULD go back where
            for dev, target, override in jobs:
                result.steps.extend(planner.restore_steps(dev, target, override))
                result.restored.append((dev.address, target))
            return result
        for a in plan.forget:
            host.ledger.forget(a)
        gone = [
            f"{a}: recorded in {host.state.state_dir}/{a}.json but there is no such device "
            f"under {host.fs.display}sys/bus/pci/devices; nothing to restore (remove the "
            "record once the card is gone for good)"
            for a in plan.missing
        ]
        for dev, target, override in jobs:
            _preflight(host, planner.restore_steps(dev, target, override))
        before = {dev.address: host.ledger.record(dev.address) for dev, _, _ in jobs}
        op = host.ledger.begin_unbind(host.runner, jobs)
        try:
            restored = executor(host, op).restore_all(jobs, explicit=driver is not None)
            if native:
                from vfio_dp.host.native import took

                took(restored)
            result.restored.extend(restored)
        except BindError as e:
            if native:
                from vfio_dp.host.native import put_back

                put_back(host, op, jobs, before, e)
            host.ledger.failed(op, str(e))
            if not gone:
                raise
            raise BindError("\n".join([str(e), *gone])) from e
        host.ledger.finish(op)
        if gone:
            done = [f"{a}: restored to {d or 'no driver'}" for a, d in result.restored]
            raise BindError(
                f"{len(gone)} of the recorded devices could not be restored\n"
                + "\n".join(gone + done)
            )
    return result


def unbind_all(host: Host, *, force: bool, dry_run: bool) -> BindResult:
    """:meth:`vfio_dp.host.Host.unbind_all` (see there): :func:`unbind` of every recorded
    device, with the records that cannot be read named after the others are restored."""
    unreadable = host.state.unreadable()
    head = (
        f"{len(unreadable)} bind record(s) cannot be read; their devices are left as they "
        "are (maybe still on vfio-pci)"
    )
    try:
        result = unbind(
            host, sorted(host.ledger.records()), force=force, dry_run=dry_run, every=True
        )
    except HostError as e:
        if not unreadable:
            raise
        raise BindError("\n".join([head, *unreadable, str(e)])) from e
    if unreadable and dry_run:
        result.warnings.extend(w for w in unreadable if w not in result.warnings)
    elif unreadable:
        done = [f"{a}: restored to {d or 'no driver'}" for a, d in result.restored]
        raise BindError("\n".join([head, *unreadable, *done]))
    return result


# -- release -------------------------------------------------------------------------------
def release(host: Host, holder: str) -> Release:
    """:meth:`vfio_dp.host.Host.release` (see there)."""
    from vfio_dp.host.holders import scan_holders

    out = Release()
    mine = host.ledger.holdings(holder)
    if not mine:
        return out
    inv = host.scan_groups(mine, usage=False)
    by_group: dict[int | None, list[PciAddress]] = {}
    for a in mine:
        dev = inv.devices.get(a)
        by_group.setdefault(dev.iommu_group if dev else None, []).append(a)
    nodes = {
        n: f"/dev/vfio/{inv.groups[n].node}" for n in by_group if n is not None and n in inv.groups
    }
    holders = scan_holders(host.fs, nodes.values())
    for n, addrs in sorted(by_group.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        node = nodes.get(n) if n is not None else None
        if node is not None and holders.held(node) is not False:
            out.kept.append(
                f"IOMMU group {n} ({', '.join(map(str, addrs))}) kept on vfio-pci: "
                f"{holders.describe(node)} (a VFIO group is opened by one process only, "
                "typically the VM's QEMU); it is given back once that process closes it"
            )
            continue
        present = [a for a in addrs if a in inv.devices]
        for a in addrs:
            if a not in inv.devices:  # unplugged: nothing to give back, forget it
                host.ledger.forget(a)
        if not present:
            continue
        try:
            res = unbind(host, present, force=False, dry_run=False)
        except VfioError as e:
            out.kept.append(f"IOMMU group {n}: restoring {', '.join(map(str, present))}: {e}")
            continue
        out.restored.extend(f"{a} → {d or 'no driver'}" for a, d in res.restored)
        out.restored.extend(f"{a} (already on its driver)" for a in res.already)
    return out
