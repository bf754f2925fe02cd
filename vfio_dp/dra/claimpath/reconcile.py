"""Giving claims back, and settling what the node holds against the API server and the boot.

:meth:`Reconciler.release` (NodeUnprepareResources, and reconcile for stale claims) removes
the claim's CDI spec and metadata and gives back exactly the devices whose bind record says
``claim:<uid>`` (:meth:`vfio_dp.host.Host.release`; an operator's or a front-end's bindings
are never undone) -- but a group a process holds open (``/dev/vfio/<N>``: a force-deleted
pod's QEMU may still run) is kept: the claim is marked ``releasing`` in the checkpoint,
retried every resync, logged and counted (``vfio_dp_dra_held_groups``).

:meth:`Reconciler.reconcile` (at start and every resync) releases each checkpointed claim
whose ResourceClaim is gone, has another UID, or is no longer allocated on this node -- every
claim read at start (:data:`READS_AT_ONCE` reads under way), at a resync only a share, the
least recently read first (``budget``: the plugin reads each once per ``--claim-check-seconds``;
1,000 claims read at every 5 s resync were 43 GETs a second from every node) -- (one
only switched ahead of its pod, ``switched``, leaves its devices where they are, held by the
pool: :meth:`Reconciler.hold_for_pool`) -- and
any device a claim bound that no checkpoint knows (a crash before the checkpoint). It never
acts on a claim it could not read, nor on a checkpoint record that does not parse (reported
every time, kept: :attr:`Checkpoint.bad`); one claim's failure never stops the others. After a reboot (boot ID changed) each checkpointed claim
is re-verified against the hardware (:meth:`Reconciler.reverify`); one whose devices moved or
changed loses its CDI spec until kubelet prepares it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any

from vfio_dp.dra.claimpath import mdev
from vfio_dp.dra.claimpath.checkpoint import (
    PREPARING,
    RELEASING,
    SWITCHED,
    Checkpoint,
    ClaimRecord,
)
from vfio_dp.dra.claimpath.claims import stale_reason
from vfio_dp.dra.claimpath.edits import ClaimDirs
from vfio_dp.dra.claimpath.outcome import HELD, INTERNAL, Held, outcome
from vfio_dp.errors import VfioError
from vfio_dp.host import Host
from vfio_dp.host.bound_by import bound_by_claim, bound_by_pool, claim_of
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory

log = logging.getLogger("vfio_dp.dra.claimpath.prepare")

#: claim reads a reconcile has under way at once (the claim lane has 8 threads)
READS_AT_ONCE = 4

#: ``await reader(namespace, name)`` → the ResourceClaim in its API JSON form, None if absent.
ClaimReader = Callable[[str, str], Awaitable[dict[str, Any] | None]]
#: ``metric(name, None)`` counts one; ``metric(name, value)`` sets a gauge.
MetricFn = Callable[[str, float | None], None]


@dataclass(slots=True)
class ReconcileReport:
    """What one reconcile did; ``kept`` are groups still held open (retried next time)."""

    unprepared: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    reverified: list[str] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class Reconciler:
    """Release and reconcile for one driver's claims (see the module docstring)."""

    def __init__(
        self,
        *,
        host: Host,
        driver: str,
        node: str,
        dirs: ClaimDirs,
        checkpoint: Checkpoint,
        read_claim: ClaimReader,
        lock: Callable[[str], asyncio.Lock],
        metric: MetricFn,
    ) -> None:
        self.host = host
        self.driver = driver
        self.node = node
        self.dirs = dirs
        self.checkpoint = checkpoint
        self.read_claim = read_claim
        self.lock = lock
        self.metric = metric
        self._checked: dict[str, float] = {}  # uid -> when its claim was last read (monotonic)

    # -- one claim -----------------------------------------------------------------------
    def release(self, uid: str, who: str) -> list[str]:
        """Remove the claim's files; give back the devices it bound (held groups are kept:
        :class:`Held`); forget the claim durably once all is done. Blocking."""
        restored = self.give_back(uid, who)
        self.dirs.sync()
        gen = self.checkpoint.stage_remove(uid)
        if gen is not None:
            self.checkpoint.commit(gen)
        return restored

    def give_back(self, uid: str, who: str) -> list[str]:
        """:meth:`release` up to forgetting the claim: its files removed but not yet synced
        (the caller runs :meth:`ClaimDirs.sync` once for a call's claims, then forgets
        them: :class:`~vfio_dp.dra.claimpath.commit.CallCommit`). Blocking."""
        self.dirs.remove(uid, durable=False)
        removed, held = mdev.release(self.host, uid)
        out = self.host.release(bound_by_claim(uid))
        out.restored[:0] = removed
        out.kept[:0] = held
        if out.kept:
            self.metric("vfio_dp_dra_held_groups", float(len(out.kept)))
            rec = self.checkpoint.get(uid)
            if rec is not None and rec.state != RELEASING:  # reconcile retries it
                self.dirs.sync()
                self.checkpoint.put(replace(rec, state=RELEASING))
            raise Held(who, "; ".join(out.kept))
        return out.restored

    def hold_for_pool(self, uid: str, who: str) -> list[PciAddress]:
        """A claim switched ahead of its pod (``switched``) that went away before its pod:
        the devices stay where its switch put them. What it bound to VFIO is held by the pool
        (bind records ``claim:<uid>`` → ``pool:<driver>``: nothing unowned, and the pool's
        next claim takes it over: :func:`vfio_dp.host.bound_by.claim_takes`); a container
        switch holds no record. Its files (none, normally) go, then its record. → the devices
        now held by the pool. Blocking."""
        mine = self.host.holdings(bound_by_claim(uid))
        pool = bound_by_pool(self.driver)
        taken = self.host.adopt(mine, pool, replacing=lambda h: h == bound_by_claim(uid))
        self.dirs.remove(uid)
        gen = self.checkpoint.stage_remove(uid)
        if gen is not None:
            self.checkpoint.commit(gen)
        if taken:
            log.info(
                "claim %s went away before its pod: %s stay on VFIO, held by %s (its next "
                "claim takes them over; vfioctl unbind gives them back)",
                who, ", ".join(str(a) for a, _ in taken), pool,
            )  # fmt: skip
        return [a for a, _ in taken]

    # -- every claim ---------------------------------------------------------------------
    def _due(self, uids: list[str], budget: int | None) -> set[str]:
        """The claims to read from the API server this time: every one when ``budget`` is
        None; else at most ``budget``, those read longest ago (never read: first)."""
        for gone in self._checked.keys() - set(uids):
            del self._checked[gone]
        if budget is None or budget >= len(uids):
            return set(uids)
        oldest = sorted(uids, key=lambda u: self._checked.get(u, -1.0))
        return set(oldest[: max(budget, 0)])

    async def _read_all(
        self, records: list[tuple[str, ClaimRecord]], report: ReconcileReport
    ) -> dict[str, str | None]:
        """uid -> why the claim is no longer ours (None: it is), for each claim read; at most
        :data:`READS_AT_ONCE` reads under way (the claim lane's other threads stay free for
        kubelet's Prepare). A claim that cannot be read is reported and left out."""
        gate = asyncio.Semaphore(READS_AT_ONCE)
        out: dict[str, str | None] = {}

        async def one(uid: str, rec: ClaimRecord) -> None:
            async with gate:
                try:
                    obj = await self.read_claim(rec.namespace, rec.name)
                    out[uid] = stale_reason(rec.uid, obj, self.driver, self.node)
                except Exception as e:
                    report.errors.append(f"claim {rec.ref}: cannot read it, kept: {e}")
                self._checked[uid] = time.monotonic()

        await asyncio.gather(*(one(uid, rec) for uid, rec in records))
        return out

    async def reconcile(self, budget: int | None = None) -> ReconcileReport:
        """Release what is no longer ours; re-verify claims of another boot. ``budget``: at
        most this many claims read from the API server (the least recently read first:
        the plugin's resync spreads the reads over ``DraOptions.claim_check`` seconds);
        None reads every claim (at start)."""
        report = ReconcileReport()
        bad = self.checkpoint.bad
        for key, problem in sorted(bad.items()):  # never acted on: nobody knows what it held
            report.errors.append(
                f"checkpoint record {key[:100]!r} skipped: {problem} (kept; its devices and files "
                "stay until kubelet prepares or unprepares that claim again)"
            )
        untrusted = await asyncio.to_thread(self.checkpoint.untrusted)
        inv: Inventory | None = None  # one scan for every claim of another boot
        if untrusted:
            try:
                inv = await asyncio.to_thread(self.host.scan, usage=False)
            except (VfioError, OSError) as e:
                report.errors.append(f"cannot scan the host to re-verify claims: {e}")
                untrusted = []
        for rec in untrusted:
            async with self.lock(rec.uid):
                try:
                    await asyncio.to_thread(self.reverify, rec, report, inv)
                except (VfioError, OSError, ValueError) as e:
                    report.errors.append(f"claim {rec.ref}: cannot re-verify it, kept: {e}")
        records = sorted(self.checkpoint.all().items())
        read = self._due([uid for uid, rec in records if rec.state != RELEASING], budget)
        verdicts = await self._read_all(
            [(uid, rec) for uid, rec in records if uid in read], report
        )
        for uid, rec in records:
            if rec.state == RELEASING:
                why: str | None = "kubelet unprepared it while its group was held open"
            elif uid in verdicts:
                why = verdicts[uid]
            else:  # not read this time (or unreadable: reported, kept)
                continue
            if why is not None and rec.state == SWITCHED:  # gone before its pod
                await self._to_pool(uid, rec.ref, why, report)
            elif why is not None:
                await self._release(uid, rec.ref, why, report)
        # devices a claim bound that no checkpoint entry names (crash before the checkpoint
        # was written, or a checkpoint set aside as corrupt)
        holders = await asyncio.to_thread(self.host.record_holders)
        claimed = {u for h in holders.values() if (u := claim_of(h)) is not None}
        claimed |= await asyncio.to_thread(mdev.claim_uids, self.host)  # mdevs claims made
        for uid in sorted(claimed - set(self.checkpoint.all()) - set(bad)):
            await self._release(uid, f"(uid {uid}, not checkpointed)", "unknown", report)
        self.metric("vfio_dp_dra_held_groups", float(len(report.kept)))
        for line in report.kept:
            log.warning("reconcile: %s", line)
        for line in report.errors:
            log.error("reconcile: %s", line)
        return report

    async def _to_pool(self, uid: str, ref: str, why: str, report: ReconcileReport) -> None:
        async with self.lock(uid):
            rec = self.checkpoint.get(uid)
            if rec is None or rec.state != SWITCHED:  # settled meanwhile
                return
            try:
                held = await asyncio.to_thread(self.hold_for_pool, uid, ref)
            except VfioError as e:
                report.errors.append(f"claim {ref}: handing its switch to the pool: {e}")
                return
        report.unprepared.append(f"{ref}: {why}" + (f"; pool holds {len(held)}" if held else ""))

    async def _release(self, uid: str, ref: str, why: str, report: ReconcileReport) -> None:
        async with self.lock(uid):
            try:
                restored = await asyncio.to_thread(self.release, uid, ref)
            except Exception as e:  # this claim only: the others are still settled
                failed = outcome(ref, e, self.checkpoint.path)
                if failed.kind == HELD:
                    report.kept.append(f"{failed.error} ({why})")
                else:  # logged with the report's errors; a bug with its traceback
                    if failed.kind == INTERNAL:
                        failed.log(log, "reconcile")
                    report.errors.append(failed.error)
                return
        report.unprepared.append(f"{ref}: {why}")
        report.restored.extend(restored)
        log.info("reconcile: unprepared claim %s: %s", ref, why)

    def reverify(
        self, rec: ClaimRecord, report: ReconcileReport, inv: Inventory | None = None
    ) -> None:
        """After a reboot: do the claim's devices still exist with the same IDs and IOMMU
        groups? Yes: trust it again. No: withdraw its CDI spec and metadata (a container
        must not get another device's group) until kubelet prepares it again. ``inv``: the
        host as scanned for every claim of this reconcile (None: scanned here). Blocking."""
        inv = inv or self.host.scan(usage=False)
        problems: list[str] = []
        for d in rec.devices:
            for addr_text, ids in zip(d.addresses, d.ids, strict=False):
                dev = inv.devices.get(PciAddress.parse(addr_text))
                if dev is None:
                    problems.append(f"{addr_text} is gone")
                elif dev.ids != ids:
                    problems.append(f"{addr_text} is now {dev.ids}, was {ids}")
                elif d.iommu_group is not None and dev.iommu_group != d.iommu_group:
                    problems.append(
                        f"{addr_text} is in IOMMU group {dev.iommu_group}, was {d.iommu_group}"
                    )
        if not problems:
            self.checkpoint.mark_verified(rec.uid)
            report.reverified.append(rec.ref)
            return
        self.dirs.remove(rec.uid)
        self.checkpoint.put(replace(rec, state=PREPARING))
        report.invalidated.append(f"{rec.ref}: {'; '.join(problems)}")
        log.warning(
            "after reboot, claim %s no longer matches the hardware: %s",
            rec.ref,
            "; ".join(problems),
        )
