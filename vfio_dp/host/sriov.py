"""SR-IOV PFs on the host: read them, set their VF count by the kernel's rules, give it back.

Reads (through :mod:`.sriov_pf`), per PF (any ``<root>/sys/bus/pci/devices/<bdf>`` with
``sriov_totalvfs``)::

    sriov_totalvfs  sriov_numvfs  sriov_drivers_autoprobe  driver ->  virtfn<i> -> ../<vf>

and each VF's ``iommu_group`` (whose ``/dev/vfio/<N>`` may be held open: found from
``<root>/proc/*/fd`` by :mod:`.holders`, never by opening the node). The plan of writes is
:func:`vfio_dp.model.sriov.plan_count`; this module executes it under the PF's lock (the
one binds take, ``<root>/run/vfio_dp/<pf>.lock``) with the journal and record of
:mod:`.sriov_store`, through the host's :class:`~vfio_dp.host.kernel.KernelIO`. Made VFs are
then bound through :meth:`Host.bind` (recorded like any bind, ``bound_by`` the caller);
bind records of VFs a count change destroyed are dropped (there is nothing to restore).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vfio_dp.errors import BindError, HostError, LockTimeoutError, RefusedError
from vfio_dp.host import sysfs
from vfio_dp.host.bound_by import BOUND_BY_OPERATOR, recovers
from vfio_dp.host.holders import scan_holders
from vfio_dp.host.host import Host
from vfio_dp.host.sriov_pf import list_pfs, read_pf
from vfio_dp.host.sriov_store import SriovOp, SriovStore
from vfio_dp.model.address import PciAddress
from vfio_dp.model.sriov import (
    AUTOPROBE,
    NUMVFS,
    PfState,
    SriovPlan,
    SriovRecord,
    Write,
    plan_count,
    record_after,
)

#: who holds a VF, from outside the host layer (a prepared claim, a pod's allocation); the
#: key ``"*"`` holds every VF (a record that cannot be read: refuse rather than guess)
Held = Mapping[PciAddress | str, Sequence[str]]


@dataclass(slots=True)
class SriovResult:
    """What a count change did (or, with ``dry_run``, would do)."""

    pf: PciAddress
    target: int
    steps: list[str] = field(default_factory=list)  # the writes, as pasteable shell commands
    made: list[PciAddress] = field(default_factory=list)
    destroyed: list[PciAddress] = field(default_factory=list)
    bound: list[PciAddress] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False
    already: bool = False
    bind_error: str | None = None  # the VFs exist but could not be bound: why (a failure)


@dataclass(frozen=True, slots=True)
class PfView:
    """One PF for ``vfioctl sriov``: its state, our record, and who holds which VF."""

    pf: PfState
    record: SriovRecord | None
    held: dict[PciAddress, list[str]]
    interrupted: SriovOp | None = None

    def why_not(self, wanted: int | None) -> list[str]:
        """Why the PF does not have ``wanted`` VFs: what a change to it would be refused for
        now (empty when it has them, or nothing is wanted)."""
        if wanted is None or wanted == self.pf.numvfs:
            return []
        plan = plan_count(self.pf, wanted, record=self.record, held=self.held)
        return list(plan.refusals)


class Sriov:
    """SR-IOV count changes on one :class:`Host`; ``by`` goes into records and binds
    (``operator`` for vfioctl, ``daemon`` for the node core)."""

    def __init__(self, host: Host, *, by: str = BOUND_BY_OPERATOR) -> None:
        self.host = host
        self.by = by
        self.store = SriovStore(host.fs)

    def _path(self, pf: PciAddress, attr: str) -> str:
        return self.host.fs.path("sys", "bus", "pci", "devices", str(pf), attr)

    def step_text(self, pf: PciAddress, w: Write) -> str:
        return f"echo {w.value} > {self._path(pf, w.attr)}"

    # -- who holds a VF ----------------------------------------------------------------
    def held(self, pf: PfState, extra: Held | None = None) -> dict[PciAddress, list[str]]:
        """For each VF of ``pf`` that something holds: who. A VF group's node held open (or
        that cannot be told: unreadable ``/proc/<pid>/fd``) and ``extra`` both count."""
        out: dict[PciAddress, list[str]] = {}
        nodes: dict[str, list[PciAddress]] = {}
        for vf in pf.vfs:
            dev = sysfs.read_device(self.host.fs, vf)
            if dev is not None and dev.iommu_group is not None:
                nodes.setdefault(f"/dev/vfio/{dev.iommu_group}", []).append(vf)
            for who in [*(extra or {}).get(vf, ()), *(extra or {}).get("*", ())]:
                out.setdefault(vf, []).append(who)
        if nodes:
            scan = scan_holders(self.host.fs, nodes)
            for node, vfs in nodes.items():
                if scan.held(node) is not False:
                    for vf in vfs:
                        out.setdefault(vf, []).append(scan.describe(node))
        return out

    def view(self, extra: Held | None = None) -> list[PfView]:
        out = []
        for pf in list_pfs(self.host):
            interrupted = self.store.op(pf.address)
            if interrupted is not None and self.host.state.busy([pf.address]):
                interrupted = None  # in progress, not interrupted
            out.append(PfView(pf, self.store.get(pf.address), self.held(pf, extra), interrupted))
        return out

    # -- changing a count --------------------------------------------------------------
    def plan(
        self, address: PciAddress, count: int, *, force: bool = False, extra: Held | None = None
    ) -> SriovPlan:
        pf = read_pf(self.host, address)
        if pf is None:
            if sysfs.read_device(self.host.fs, address) is None:
                raise RefusedError([f"no PCI device {address} under {self.host.display}"])
            raise RefusedError([f"{address} is not an SR-IOV PF (it has no sriov_totalvfs)"])
        changes = pf.numvfs > 0 and count != pf.numvfs  # only then can a held VF matter
        held = self.held(pf, extra) if changes else {}
        return plan_count(pf, count, record=self.store.get(address), held=held, force=force)

    def set(
        self,
        address: PciAddress,
        count: int,
        *,
        force: bool = False,
        dry_run: bool = False,
        bind: bool = True,
        extra: Held | None = None,
    ) -> SriovResult:
        """Make ``address`` have ``count`` VFs; with ``bind``, the new VFs go to vfio-pci --
        and so do the driverless VFs of a PF already at ``count`` that we made (a bind that
        was killed or failed is finished this way); ``bind_error`` says why one could not.

        Refuses (:class:`RefusedError`, nothing changed) by :func:`plan_count`'s rules. An
        interrupted change of this PF, and an interrupted bind or unbind of its VFs
        (:meth:`Host.recover`), are undone first. On a failed write the PF is put back to the
        count it had, its VFs that were ours on vfio-pci bound again, and :class:`BindError`
        says which write failed and why."""
        if dry_run:
            plan = self.plan(address, count, force=force, extra=extra)
            if plan.refusals:
                raise RefusedError(list(plan.refusals))
            return SriovResult(
                address,
                count,
                steps=[self.step_text(address, w) for w in plan.writes],
                destroyed=list(plan.destroys),
                warnings=[f"forced: {f}" for f in plan.forced],
                dry_run=True,
                already=plan.noop,
            )
        with self.host.state.locked([address], self.host.lock_timeout):
            result = SriovResult(address, count)
            result.warnings += self._recover_locked(address)
            result.warnings += self._recover_vfs(address)
            plan = self.plan(address, count, force=force, extra=extra)
            if plan.refusals:
                raise RefusedError(list(plan.refusals))
            result.warnings += [f"forced: {f}" for f in plan.forced]
            result.already = plan.noop
            if plan.noop:
                rec = self.store.get(address)
                ours = rec is not None and rec.count == plan.pf.numvfs
                todo = self._driverless(plan.pf.vfs) if bind and ours else []
            else:
                self._execute(plan, result)
                todo = result.made
        if bind and todo:
            try:
                br = self.host.bind(todo, bound_by=self.by)
                result.bound = list(br.bound) + list(br.already)
                result.warnings += br.warnings
            except HostError as e:  # the VFs exist; say why they are not on vfio-pci
                result.bind_error = f"could not bind {len(todo)} VF(s) of {address}: {e}"
        return result

    def _driverless(self, vfs: Sequence[PciAddress]) -> list[PciAddress]:
        """The VFs among ``vfs`` on no driver (``<vf>/driver`` absent)."""
        return [v for v in vfs if (d := sysfs.read_device(self.host.fs, v)) and d.driver is None]

    def _recover_vfs(self, pf: PciAddress) -> list[str]:
        """Finish an interrupted bind or unbind of ``pf``'s VFs (:meth:`Host.recover`, as
        ``vfioctl bind`` does) before they are destroyed or bound; a problem refuses."""
        if not (now := read_pf(self.host, pf)) or not now.vfs:
            return []
        out = self.host.recover(only=now.vfs)
        if out.problems:
            raise BindError("\n".join(out.problems))
        return [f"undid the interrupted {d}" for d in out.recovered]

    def _execute(self, plan: SriovPlan, result: SriovResult) -> None:
        pf = plan.pf
        previous = self.store.get(pf.address)
        op = SriovOp(
            pf=str(pf.address),
            runner=self.host.runner,
            pid=os.getpid(),
            started=time.time(),
            from_count=pf.numvfs,
            from_autoprobe=pf.autoprobe,
            previous=previous,
            writes=[(w.attr, w.value) for w in plan.writes],
        )
        for w in plan.writes:
            self.host.fs.check_inside(self._path(pf.address, w.attr))
        self.store.begin(op)
        try:
            for i, w in enumerate(plan.writes):
                self.store.step(op, i)
                self._write(pf, w)
                result.steps.append(self.step_text(pf.address, w))
            self.store.step(op, len(plan.writes))
        except (OSError, HostError) as e:
            why = self._why(pf, e)
            undo = self._rollback(op)
            raise BindError(
                f"SR-IOV count change of {pf.describe()} to {plan.target} failed: {why}"
                + (f"\n{undo}" if undo else "")
            ) from e
        rec = record_after(plan, previous, previous.by if previous else self.by)
        if rec is None:
            self.store.remove(pf.address)
        else:
            self.store.put(rec)
        self._forget_gone(plan.destroys)
        self.store.finish(op)
        now = read_pf(self.host, pf.address)
        result.destroyed = list(plan.destroys)
        fresh = set(plan.destroys) | (set(now.vfs if now else ()) - set(pf.vfs))
        result.made = [a for a in (now.vfs if now else ()) if a in fresh]

    def _write(self, pf: PfState, w: Write) -> None:
        self.host.kernel.write(self._path(pf.address, w.attr), f"{w.value}\n")

    def _why(self, pf: PfState, e: BaseException) -> str:
        code = getattr(e, "errno", None)
        if code == errno.ENOENT:
            return (
                f"the kernel refused (ENOENT): PF driver {pf.driver or '(none)'} cannot make "
                "VFs (it has no sriov_configure); bind the PF to its SR-IOV capable host driver"
            )
        if code == errno.ERANGE:
            return f"the kernel refused (ERANGE): more than sriov_totalvfs ({pf.totalvfs})"
        if code == errno.EBUSY:
            return "the kernel refused (EBUSY): VFs already exist (the count goes through 0)"
        return str(e)

    def _rollback(self, op: SriovOp) -> str:
        """Put the PF back to where ``op`` found it; '' when done, else why not."""
        pf = read_pf(self.host, PciAddress.parse(op.pf))
        if pf is None:
            return f"the PF {op.pf} is gone; nothing to put back"
        writes: list[Write] = []
        if pf.numvfs != op.from_count and pf.numvfs > 0:
            writes.append(Write(NUMVFS, 0))
        if op.from_autoprobe is not None and pf.autoprobe != op.from_autoprobe:
            writes.append(Write(AUTOPROBE, op.from_autoprobe))
        if op.from_count > 0 and pf.numvfs != op.from_count:
            writes.append(Write(NUMVFS, op.from_count))
        try:
            for w in writes:
                self._write(pf, w)
        except (OSError, HostError) as e:
            return (
                f"could not put {op.pf} back to {op.from_count} VFs ({self._why(pf, e)}); its "
                f"journal {self.store.shown(('var', 'lib', 'vfio_dp', 'sriov', 'ops'), op.pf)} "
                "is kept: retry with vfioctl unbind --all"
            )
        if op.previous is None:
            self.store.remove(pf.address)
        else:
            self.store.put(op.previous)
        self._forget_gone(pf.vfs)
        self.store.finish(op)
        return f"put {op.pf} back to {op.from_count} VFs{self._rebind(pf.address)}"

    def _rebind(self, pf: PciAddress) -> str:
        """Bind again, for the holder each one's bind record names, the VFs a rollback made
        anew that were ours on vfio-pci (``original/<vf>.json`` is kept while they are away);
        what it did, as the tail of the rollback's message."""
        now, out = read_pf(self.host, pf), ""
        by_holder: dict[str, list[PciAddress]] = {}
        try:
            for vf in self._driverless(now.vfs if now else ()):
                if (rec := self.host.ledger.record(vf)) is not None:
                    by_holder.setdefault(rec.bound_by, []).append(vf)
            for holder, vfs in sorted(by_holder.items()):
                self.host.bind(vfs, bound_by=holder)
                out += f"; {', '.join(map(str, vfs))} back on vfio-pci"
        except HostError as e:
            out += f"; its VFs could not be bound again: {e}"
        return out

    def _forget_gone(self, vfs: Sequence[PciAddress]) -> None:
        """Drop the bind records of VFs that no longer exist (nothing to give back)."""
        for vf in vfs:
            if sysfs.read_device(self.host.fs, vf) is None:
                with contextlib.suppress(HostError):
                    if self.host.ledger.record(vf) is not None:
                        self.host.ledger.forget(vf)

    # -- giving back, recovering -------------------------------------------------------
    def _recover_locked(self, pf: PciAddress) -> list[str]:
        op = self.store.op(pf)
        if op is None:
            return []
        return [f"undid the interrupted {op.describe()}: {self._rollback(op)}"]

    def recover(self) -> list[str]:
        """Undo every interrupted count change (its process died; its PF's lock is free)."""
        out: list[str] = []
        for pf in self.store.journaled():
            out += self.recover_one(pf)
        return out

    def reconcile(
        self, wanted: Mapping[PciAddress, int], extra: Held | None = None
    ) -> tuple[list[str], list[PciAddress]]:
        """A node process's pass (``by`` its front-end, ``device-plugin`` / ``dra-plugin``):
        undo its interrupted changes, give each PF ``wanted`` names its count, and give back
        every PF it changed (or an older version recorded as ``daemon``) that is no longer
        wanted. Never raises for one PF: returns a message per change made or refused (the
        refused are retried on the next pass), and the VFs made. Made VFs are NOT bound
        here: the core's ``bind: true`` pass binds them like any new device."""
        out: list[str] = []
        made: list[PciAddress] = []
        for pf in self.store.journaled():
            try:
                op = self.store.op(pf)
            except HostError as e:  # unreadable: said, kept, every other PF still served
                out.append(f"SR-IOV {pf}: {e}")
                continue
            if op is not None and recovers(self.host.runner, op.runner):  # "daemon": older
                out += self.recover_one(pf)
        todo = dict(wanted)
        for pf in self.store.recorded():
            try:
                rec = self.store.get(pf)
            except HostError as e:
                out.append(f"SR-IOV {pf}: {e}")
                continue
            if rec is not None and recovers(self.by, rec.by) and pf not in todo:
                todo[pf] = rec.before
        for pf, count in sorted(todo.items()):
            try:
                res = self.set(pf, count, bind=False, extra=extra)
            except HostError as e:
                out.append(f"SR-IOV {pf}: not set to {count} VFs: {e}")
                continue
            if not res.already:
                out.append(f"SR-IOV {pf}: now {count} VFs ({'; '.join(res.steps)})")
            out += [f"SR-IOV {pf}: {w}" for w in res.warnings]
            made += res.made
        return out, made

    def recover_one(self, pf: PciAddress) -> list[str]:
        try:
            with self.host.state.locked([pf], timeout=0):
                return self._recover_locked(pf)
        except LockTimeoutError:
            return []  # in progress
        except HostError as e:
            return [f"{pf}: {e}"]

    def restore_all(
        self, *, extra: Held | None = None, dry_run: bool = False
    ) -> tuple[list[SriovResult], list[str]]:
        """Every PF with a record back to the count (and autoprobe) it had before we changed
        it, after undoing interrupted changes; returns the results and what recovery did. A
        PF that cannot be given back (a VF is held, its record or journal is unreadable) does
        not stop the others; raises :class:`RefusedError` listing every such PF at the end."""
        results: list[SriovResult] = []
        refused: list[str] = []
        recovered: list[str] = []
        unknown: set[PciAddress] = set()
        for pf in self.store.journaled():
            try:
                self.store.op(pf)  # an unreadable journal: a PF in a state nobody knows
            except HostError as e:
                refused.append(str(e))
                unknown.add(pf)
                continue
            if not dry_run:
                recovered += self.recover_one(pf)
        for pf in self.store.recorded():
            if pf in unknown:
                continue
            try:
                rec = self.store.get(pf)
            except HostError as e:  # unreadable: kept and named; every other PF goes back
                refused.append(str(e))
                continue
            if rec is None:
                continue
            try:
                results.append(self.set(pf, rec.before, dry_run=dry_run, bind=False, extra=extra))
            except RefusedError as e:
                refused += e.reasons
            except HostError as e:  # a failed write, or this PF's unreadable journal
                refused.append(str(e))
        if refused:
            raise RefusedError(refused)
        return results, recovered
