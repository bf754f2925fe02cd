"""A pass binding many IOMMU groups at once, each group on its own: the node core's
``bind: true`` pass (a PF's 256 new VFs are 256 groups).

One bind per group (:func:`vfio_dp.host.operations.bind`) costs a journal written and removed,
a bind record and a journal rewrite before each sysfs write, each ``fsync``'ed: ~9 ``fsync``
calls per VF, 9,000 for 4 PFs x 256 VFs, each waiting for the disk. The pass keeps every
guarantee of that bind and pays for them once::

    <root>/var/lib/vfio_dp/ops/<id>.json          ONE journal: every device of every group
    <root>/var/lib/vfio_dp/original/<bdf>.json    every record, durable together, before any
                                                  sysfs write (:meth:`Ledger.begin_bind`)
    <root>/run/vfio_dp/<bdf>.lock                 every device's lock, for the whole pass

then the groups are bound concurrently (:meth:`vfio_dp.host.bind.Binder.bind_runs`), each
sysfs write journaled before it is made as always -- the writes of concurrent groups share
the journal's rewrites (:meth:`vfio_dp.host.state.StateStore.step`: group commit).

Each group stays on its own: one that is refused (planned from the groups as they are under
the locks) or fails is rolled back alone and reported by its index; the others stay bound.
A crash at any point leaves the one journal naming every device of the pass, each touched
device with its record: recovery (:func:`vfio_dp.host.recovery.recover`) puts every one back
to its recorded driver, as for any interrupted bind, and the next pass binds them again.
When a rollback itself fails, the journal is kept (marked failed) naming only the devices of
the groups that failed. Anything a pass cannot decide per group (an interrupted operation
of its devices to finish first, a module to load that fails) makes it fall back to one
:func:`~vfio_dp.host.operations.bind` per group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vfio_dp.errors import BindError, HostError, RefusedError
from vfio_dp.host.bind import Binder, BindResult, Run, Step, all_at_once, group_runs
from vfio_dp.host.operations import (
    _check_escapes,
    _locked,
    _plan_bind,
    _preflight,
    _rollback,
    bind,
)
from vfio_dp.host.recovery import executor, recover
from vfio_dp.host.vfio_drivers import mark_on_vfio

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from vfio_dp.host.host import Host
    from vfio_dp.host.ledger import JournalAll
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.device import Inventory, PciDevice
    from vfio_dp.model.mdev_config import MdevEntry
    from vfio_dp.model.vfio_driver import VfioChoice


@dataclass(slots=True)
class PassResult:
    """Per group (its index in the pass): what its bind did, or why it did not."""

    results: dict[int, BindResult] = field(default_factory=dict)
    errors: dict[int, HostError] = field(default_factory=dict)


def bind_groups(
    host: Host,
    groups: Sequence[Sequence[PciAddress]],
    *,
    bound_by: str,
    inventory: Inventory | None = None,
    vfio_driver: Mapping[PciAddress, str] | None = None,
    mdev: Sequence[MdevEntry] = (),
) -> PassResult:
    """:meth:`vfio_dp.host.Host.bind_groups` (see there and the module docstring)."""
    out = PassResult()
    wanted = dict(vfio_driver or {})
    every = [a for g in groups for a in g]
    if not every:
        return out
    rec = recover(host, only=every)
    if rec.problems or rec.recovered:  # rare: each group as a bind of its own says its part
        return _one_by_one(host, groups, bound_by, wanted, mdev, out)
    inv = inventory if inventory is not None else host.scan_groups(every)
    locks: dict[int, list[PciAddress]] = {}  # each group's devices to lock (its plan's)
    for i, g in enumerate(groups):
        try:
            _check_escapes(host, inv, g)
            plan = _plan_bind(
                host, inv, g, None, group=True, force=False, holder=bound_by, mdev=mdev
            )
            locks[i] = [*plan.targets, *plan.already]
        except HostError as e:
            out.errors[i] = e
    planner = Binder(host.fs, host.kernel)
    with _locked(host, sorted({a for addrs in locks.values() for a in addrs})):
        targets, choices = _plan_locked(
            host, planner, inv, groups, locks, wanted, mdev, out, bound_by
        )
        try:
            choices = planner.load_modules(choices, BindResult())
        except BindError:  # said per group by a bind of its own, once these locks are free
            targets = {}
        else:
            _bind_locked(host, targets, choices, bound_by, out)
            return out
    return _one_by_one(host, groups, bound_by, wanted, mdev, out, only=list(locks))


def _plan_locked(
    host: Host,
    planner: Binder,
    inv: Inventory,
    groups: Sequence[Sequence[PciAddress]],
    locks: Mapping[int, Sequence[PciAddress]],
    wanted: Mapping[PciAddress, str],
    mdev: Sequence[MdevEntry],
    out: PassResult,
    bound_by: str,
) -> tuple[dict[int, list[PciDevice]], dict[PciAddress, VfioChoice]]:
    """Each group's plan made again under the locks (``locks``: its devices) from its
    devices as they are now (as :func:`~vfio_dp.host.operations.bind` does), every device
    read once and the VFIO drivers chosen once for the whole pass; each group's targets
    and their drivers, each write checked to stay inside the root. A group refused is
    said in ``out.errors``."""
    fresh: dict[PciAddress, PciDevice] = {}
    for i, locked in locks.items():
        try:
            fresh.update({a: planner.current(a) for a in locked})
        except HostError as e:  # a device gone meanwhile
            out.errors[i] = e
    devices = {
        **inv.devices,
        **{
            a: dataclasses.replace(
                d, in_use=inv.devices[a].in_use, original_driver=inv.devices[a].original_driver
            )
            for a, d in fresh.items()
        },
    }
    mark_on_vfio(host.fs, devices)  # whole groups, as they are under the locks
    now = dataclasses.replace(inv, devices=devices)
    plans = {}
    for i in locks:
        if i in out.errors:
            continue
        try:
            plans[i] = _plan_bind(
                host, now, groups[i], None, group=True, force=False, holder=bound_by, mdev=mdev
            )
        except HostError as e:
            out.errors[i] = e
    every = [a for plan in plans.values() for a in plan.targets]
    chosen = host.vfio_choices(now, every, {a: wanted.get(a, "auto") for a in every})
    targets: dict[int, list[PciDevice]] = {}
    choices: dict[PciAddress, VfioChoice] = {}
    for i, plan in plans.items():
        mine = {a: chosen[a] for a in plan.targets}
        try:
            if problems := [c.problem for c in mine.values() if c.problem is not None]:
                raise RefusedError(problems)
            devs = [now.devices[a] for a in plan.targets]
            for dev in devs:
                _preflight(host, planner.bind_steps(dev, False, mine[dev.address]))
        except HostError as e:
            out.errors[i] = e
            continue
        targets[i] = devs
        choices.update(mine)
        out.results[i] = BindResult(
            already=list(plan.already),
            warnings=[f"forced: {w}" for w in plan.forced],
            drivers=mine,
        )
    return targets, choices


def _bind_locked(
    host: Host,
    targets: Mapping[int, list[PciDevice]],
    choices: Mapping[PciAddress, VfioChoice],
    bound_by: str,
    out: PassResult,
) -> None:
    """One journal and every record for the targets of every group, the groups bound
    concurrently, each failed group rolled back alone (see the module docstring)."""
    devices = [d for i in sorted(targets) for d in targets[i]]
    if not devices:
        return
    group_of = {d.address: i for i, devs in targets.items() for d in devs}
    try:
        op = host.ledger.begin_bind(
            host.runner, devices, bound_by, {a: choices[a].driver for a in group_of}
        )
    except HostError as e:  # nothing was written: every group says so
        for i in targets:
            out.results.pop(i, None)
            out.errors[i] = e
        return
    binder = executor(host, op)
    assert op is not None  # devices were given
    runs = _bind_phased(binder, host.ledger.journal_all(op), devices, choices)
    touched: dict[int, list[PciAddress]] = {}
    failed: dict[int, BaseException] = {}
    for run in runs:
        i = group_of[run.devices[0].address]
        touched.setdefault(i, []).extend(run.touched)
        res = out.results[i]
        res.bound.extend(run.result.bound)
        res.steps.extend(run.result.steps)
        if run.failed is not None:
            failed[i] = run.failed[1]
    for why in failed.values():
        if not isinstance(why, BindError):
            raise why  # not a failed write: the journal stays, as for any bind
    unfinished: list[PciAddress] = []
    for i, why in sorted(failed.items()):
        problems = _rollback(host, binder, touched[i])
        msg = f"bind failed: {why}"
        if touched[i]:
            msg += f"\nrolled back {', '.join(map(str, touched[i]))}"
        if problems:
            msg += "\n" + "\n".join(problems)
            unfinished += [d.address for d in targets[i]]
        out.results.pop(i, None)
        out.errors[i] = BindError(msg)
    if unfinished and op is not None:  # the journal keeps only what is left to undo
        keep = {str(a) for a in unfinished}
        op.devices = [d for d in op.devices if d.address in keep]
        host.ledger.failed(op, "; ".join(str(out.errors[i]) for i in sorted(failed)))
    else:
        host.ledger.finish(op)


def _bind_phased(
    binder: Binder,
    journal_all: JournalAll,
    devices: Sequence[PciDevice],
    choices: Mapping[PciAddress, VfioChoice],
) -> list[Run]:
    """Bind ``devices`` group by group as :meth:`Binder.bind_runs` does -- the devices of a
    group one after another, each with its clean sequence (:meth:`Binder.bind_steps`),
    verified after its last write -- in phases: phase ``k`` makes the ``k``-th write of
    every group still going, concurrently, after ONE durable journal write saying, for each
    of them, the write it is about to make. The journal is exact as ever (every write
    journaled before it is made) and written as many times as the longest group has writes
    (2 for a VF: ``driver_override``, ``drivers_probe``), not once per write."""
    runs = [Run(devs) for devs in group_runs(devices)]
    writes: list[list[tuple[PciDevice, int, list[Step]]]] = []  # per run: (device, k, its steps)
    for run in runs:
        todo = []
        for dev in run.devices:
            steps = binder.bind_steps(dev, False, choices[dev.address])
            todo += [(dev, k, steps) for k in range(len(steps))]
        writes.append(todo)
    at = [0] * len(runs)
    while live := [i for i, r in enumerate(runs) if r.failed is None and at[i] < len(writes[i])]:
        journal_all([(writes[i][at[i]][0].address, writes[i][at[i]][1],
                      str(writes[i][at[i]][2][writes[i][at[i]][1]])) for i in live])  # fmt: skip

        def write(j: int, live: list[int] = live) -> None:
            i = live[j]
            run, (dev, k, steps) = runs[i], writes[i][at[i]]
            at[i] += 1
            try:
                if k == 0:
                    run.touched.append(dev.address)
                    run.result.steps.extend(steps)
                binder.run([steps[k]])  # journaled above, with the others of this phase
                if k == len(steps) - 1:
                    binder.verify_bound(dev, run.result, choices[dev.address])
            except BaseException as e:  # reported by the calling thread
                run.failed = (dev.address, e)

        all_at_once(len(live), write)
    return runs


def _one_by_one(
    host: Host,
    groups: Sequence[Sequence[PciAddress]],
    bound_by: str,
    wanted: Mapping[PciAddress, str],
    mdev: Sequence[MdevEntry],
    out: PassResult,
    only: Sequence[int] | None = None,
) -> PassResult:
    """Each group (of ``only``) as a bind of its own."""
    for i in only if only is not None else range(len(groups)):
        g = groups[i]
        out.results.pop(i, None)
        try:
            out.results[i] = bind(
                host, g, group=True, force=False, dry_run=False, probe=False,
                bound_by=bound_by, vfio_driver={a: wanted.get(a, "auto") for a in g}, mdev=mdev,
            )  # fmt: skip
            out.errors.pop(i, None)
        except HostError as e:
            out.errors[i] = e
    return out
