"""A claim's driver switch done ahead of its pod, for the binding conditions (KEP-5007).

A device whose claim may need a driver switch is published with
``bindingConditions: ["<driver>/ready"]`` and ``bindingFailureConditions:
["<driver>/failed"]`` (:mod:`vfio_dp.dra.personalities`); the scheduler copies them into the
claim's ``status.allocation.devices.results[]`` and binds the pod only once every binding
condition is True in ``status.devices[].conditions``. The claim watch
(:mod:`vfio_dp.dra.apiserver.claim_watch`) hands each claim allocated from our pool to
:meth:`SwitchAhead.allocated`, which -- under the claim's Prepare lock, through Prepare's
own steps (:class:`~.steps.DeviceSteps`: resolve, check, take -- the bind or
:func:`.native.switch` -- and verify; the same locks, journal, bind records and refusals
as ``vfioctl bind``) --

1. checkpoints the claim ``switched`` (``"state": "switched"`` in
   ``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json``: "switched for claim X, not yet
   prepared") BEFORE anything is touched, when a switch is needed: a crash from here on
   leaves a record of the claim, which reconcile settles like any other (kept while the
   claim is allocated here, the switch done again by the watch's next list; held by the
   pool once it is not, as below);
2. switches: a VFIO entry's group bound to its VFIO driver (bind record
   ``bound_by: claim:<uid>``), a container entry's functions put on their native driver and
   their device nodes waited for;
3. answers what to write: ``<driver>/ready`` True, or ``<driver>/failed`` True with a
   CamelCase reason (:data:`REFUSED`, :data:`SWITCH_FAILED`, :data:`NOT_READY`) and the
   error naming the cause; a failed switch is released (Reconciler.release: what it bound
   given back, the record dropped), so the device is left as it was.

Prepare then finds the devices where they must be and does no driver work: it writes the
files and records the claim ``prepared``. A claim deallocated or deleted before its pod
starts (:meth:`SwitchAhead.gone`, or reconcile after a restart) has its ``switched`` record
dropped and its devices left where they are: a container switch on its native driver, a
VFIO switch's group on its VFIO driver, held by the pool (bind records ``bound_by:
pool:<driver>``, :meth:`~vfio_dp.dra.claimpath.reconcile.Reconciler.hold_for_pool`: nothing
unowned). The pool's next claim takes it over -- a VFIO claim with no driver work, a
container claim switching it back to its native driver -- and nobody else may
(:func:`vfio_dp.host.bound_by.pool_refusal`); ``vfioctl unbind`` gives it back. Without the
API fields (``bindingConditions`` dropped by the server, or ``--binding-conditions=false``)
no result carries binding conditions and Prepare does the switch as before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vfio_dp.dra.claimpath import resolve
from vfio_dp.dra.claimpath.checkpoint import PREPARED, SWITCHED
from vfio_dp.dra.claimpath.claims import (
    AllocationResult,
    ClaimRef,
    Malformed,
    describe,
    ours,
    view_claim,
)
from vfio_dp.errors import VfioError

if TYPE_CHECKING:
    from vfio_dp.dra.claimpath.prepare import ClaimPreparer

log = logging.getLogger("vfio_dp.dra.claimpath.prepare")

#: condition types, after ``<driver>/``
READY = "ready"
FAILED = "failed"
#: reasons of the failure condition
REFUSED = "SwitchRefused"  # refused before anything was touched (a group member in use, ...)
SWITCH_FAILED = "DriverSwitchFailed"  # the bind or the native driver's probe failed
NOT_READY = "DeviceNotReady"  # switched, but not in the state Prepare needs
MAX_MESSAGE = 32768


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one switch ahead came to, for the claim's ``status.devices[]``."""

    devices: tuple[tuple[str, str], ...]  # (pool, device) of the results with conditions
    ok: bool
    reason: str
    message: str

    def conditions(self, driver: str, now: float | None = None) -> dict[tuple[str, str], Any]:
        """``(pool, device) -> condition``: ``<driver>/ready`` True, or
        ``<driver>/failed`` True with the reason and the message."""
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        condition = {
            "type": f"{driver}/{READY if self.ok else FAILED}",
            "status": "True",
            "reason": self.reason,
            "message": self.message[:MAX_MESSAGE],
            "lastTransitionTime": since,
        }
        return {d: dict(condition) for d in self.devices}


def switching(results: Sequence[AllocationResult]) -> list[AllocationResult]:
    """The results whose device carries binding conditions (switched ahead)."""
    return [r for r in results if r.binding_conditions and not r.admin_access]


def decided(claim: Mapping[str, Any], driver: str, results: Sequence[AllocationResult]) -> bool:
    """Is our ready or failed condition True already for every one of ``results``?"""
    types = {f"{driver}/{READY}", f"{driver}/{FAILED}"}
    done = {
        (d.get("pool"), d.get("device"))
        for d in (claim.get("status") or {}).get("devices") or []
        if isinstance(d, dict) and d.get("driver") == driver
        for c in d.get("conditions") or []
        if isinstance(c, dict) and c.get("type") in types and c.get("status") == "True"
    }
    return all((r.pool, r.device) in done for r in results)


class SwitchAhead:
    """The claim watch's handler over the plugin's :class:`ClaimPreparer` (module doc)."""

    def __init__(self, preparer: ClaimPreparer) -> None:
        self.p = preparer
        self.switches = 0  # (tests, logs) switches done ahead
        self.dropped = 0  # (tests) records of claims gone before their pod

    async def allocated(self, claim: Mapping[str, Any]) -> Outcome | None:
        """Switch the devices of ``claim`` (its API JSON) that carry binding conditions; the
        outcome to write, or None when there is nothing to do (none carries them, or our
        conditions are written already)."""
        await self.p.loaded()
        try:
            view = view_claim(claim)
        except Malformed as e:
            log.warning("claim watch: a ResourceClaim skipped: %s", e)
            return None
        who = describe(view.namespace, view.name, view.uid)
        mine = [r for r in view.results if r.driver == self.p.driver and r.pool == self.p.node]
        wanted = switching(mine)
        if not wanted or decided(claim, self.p.driver, wanted):
            return None
        devices = tuple((r.pool, r.device) for r in wanted)
        ref = ClaimRef(view.namespace, view.uid, view.name)
        async with self.p.lock(view.uid):
            held = self.p.checkpoint.get(view.uid)
            if held is not None and held.state == PREPARED:  # Prepare came first: it switched
                return Outcome(devices, True, "Prepared", f"claim {who} is prepared")
            try:
                results = ours(view, self.p.driver, self.p.node, who)
            except VfioError as e:
                return Outcome(devices, False, REFUSED, str(e))
            started = time.monotonic()
            outcome = await asyncio.to_thread(self._switch, ref, view, results, devices)
        if outcome.ok:
            self.switches += 1
            log.info("claim %s switched ahead of its pod in %.2f s: %s", who,
                     time.monotonic() - started, outcome.message)  # fmt: skip
        else:
            log.warning("claim %s: the switch ahead of its pod failed (%s): %s", who,
                        outcome.reason, outcome.message)  # fmt: skip
        return outcome

    def _switch(
        self,
        ref: ClaimRef,
        view: Any,
        results: Sequence[AllocationResult],
        devices: tuple[tuple[str, str], ...],
    ) -> Outcome:
        """Prepare's steps up to the files (module doc). Blocking; under the claim's lock."""
        p, steps, uid = self.p, self.p.steps, ref.uid
        who = describe(ref.namespace, ref.name, uid)
        try:
            inv, chosen = steps.resolve(who, uid, results)
            expected = steps.check(p.checkpoint.all(), who, uid, chosen, inv)
        except VfioError as e:
            return Outcome(devices, False, REFUSED, str(e))
        if steps.moves(chosen, inv) and p.checkpoint.get(uid) is None:  # durable first
            records = resolve.device_records(chosen, inv)
            p.checkpoint.commit(p.record(ref, view, SWITCHED, records))
        reason = SWITCH_FAILED
        try:
            inv, _ = steps.take(who, uid, chosen, inv, expected)
            reason = NOT_READY
            steps.verify(who, chosen, inv)
        except VfioError as e:
            self._release(uid, who, "the switch failed")
            return Outcome(devices, False, reason, str(e))
        on = ", ".join(
            f"{a} on {d.driver}" for c in chosen for a in c.unit.endpoints
            if (d := inv.devices.get(a)) is not None and d.driver
        )  # fmt: skip
        return Outcome(devices, True, "Switched", on or "in place")

    def _release(self, uid: str, who: str, why: str) -> bool:
        """What the claim's switch bound given back, its record dropped (Unprepare's
        release); False when that failed (logged; reconcile retries). Blocking."""
        if self.p.checkpoint.get(uid) is None:
            return True
        try:
            self.p.reconciler.release(uid, who)
        except VfioError as e:
            log.error("claim %s: giving back its switch ahead (%s): %s", who, why, e)
            return False
        return True

    async def gone(self, uid: str) -> bool:
        """The claim is no longer allocated here (deallocated or deleted): a ``switched``
        record of it is dropped (True), its devices left where the switch put them, what it
        bound to VFIO held by the pool
        (:meth:`~vfio_dp.dra.claimpath.reconcile.Reconciler.hold_for_pool`). A prepared
        claim is kubelet's to unprepare."""
        await self.p.loaded()
        async with self.p.lock(uid):
            rec = self.p.checkpoint.get(uid)
            if rec is None or rec.state != SWITCHED:
                return False
            try:
                held = await asyncio.to_thread(self.p.reconciler.hold_for_pool, uid, rec.ref)
            except VfioError as e:  # reconcile retries it
                log.error("claim %s: handing its switch ahead to the pool: %s", rec.ref, e)
                return False
            self.dropped += 1
        log.info(
            "claim %s is no longer allocated here: its switch ahead is dropped%s", rec.ref,
            f"; the pool holds {', '.join(map(str, held))}" if held else "",
        )  # fmt: skip
        return True
