"""The claims' device status (KEP-4817): which claims to write, and writing them off the
kubelet's path.

Our entries of a prepared claim's ``status.devices[]`` say each device's health
(:class:`DeviceStatus`, built purely by :func:`statuses` from the checkpoint's record, the
health model and the bind records); the writer that PUTs them through the
``resourceclaims/status`` subresource is the API shell's
(:class:`vfio_dp.dra.apiserver.claim_status.ClaimStatusWriter`, blocking).

:class:`StatusFeed` is told *which* claim changed -- prepared, unprepared, a held device's
health changed -- and writes in the background, never on the caller's path: a Prepare
answers the kubelet without waiting for an API server that trickles its answer (issue 37
item 11). Writes are coalesced per claim: what to write is decided when the write starts,
from the checkpoint as it is then (a prepared claim: our entries; a claim no longer
checkpointed: none of ours; a prepare or release under way: nothing yet, its end asks
again), so ten changes of one claim while its write runs make one more write. At most
:data:`WORKERS` writes run at once, each on a daemon thread of its own: a write stuck on a
trickling server holds no executor the process waits for at exit, and
:meth:`StatusFeed.close` gives running writes :data:`CLOSE_GRACE` seconds, then leaves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, TypeVar

from vfio_dp.core.health import HEALTHY, DeviceHealth
from vfio_dp.dra.claimpath.checkpoint import PREPARED, ClaimRecord
from vfio_dp.dra.observers.health import rfc3339
from vfio_dp.model.address import PciAddress

log = logging.getLogger("vfio_dp.dra")

#: claim-status writes running at once (each on its own daemon thread)
WORKERS = 4
#: seconds :meth:`StatusFeed.close` gives writes still running or queued
CLOSE_GRACE = 3.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class DeviceStatus:
    """What we say about one prepared device of a claim."""

    pool: str
    device: str
    health: str  # HEALTHY / UNHEALTHY / UNKNOWN (core.health)
    message: str
    since: str  # RFC 3339: when the health was entered
    addresses: tuple[str, ...]
    iommu_group: int
    devnodes: tuple[str, ...]
    bound_by: str


def statuses(
    rec: ClaimRecord,
    states: Mapping[str, DeviceHealth],
    holders: Mapping[PciAddress, str],
    now: float,
) -> list[DeviceStatus]:
    """Our entries for one prepared claim: each group it holds with its health (``states``,
    by device name) and who bound it (``holders``: the bind records' holders, by address)."""
    out: list[DeviceStatus] = []
    for d in rec.devices:
        if d.admin_access or d.iommu_group is None or not d.addresses:
            continue
        h = states.get(d.device)
        bound = holders.get(PciAddress.parse(d.addresses[0]))
        out.append(
            DeviceStatus(
                pool=d.pool,
                device=d.device,
                health=h.health if h else HEALTHY,
                message=h.message if h else "prepared: viable and on vfio-pci",
                since=rfc3339(h.since if h else now),
                addresses=d.addresses,
                iommu_group=d.iommu_group,
                devnodes=("/dev/vfio/vfio", f"/dev/vfio/{d.iommu_group}"),
                bound_by=bound or "none (it was on vfio-pci already)",
            )
        )
    return out


#: ``write(namespace, name, uid, ours)``: make our entries of that claim exactly ``ours``
#: (blocking; raises on a refusal, with the fix in its message)
WriteFn = Callable[[str, str, str, Sequence[DeviceStatus]], object]
_Key = tuple[str, str, str]  # (namespace, name, uid)


async def _detached(fn: Callable[[], T]) -> T:
    """``fn()`` on a daemon thread of its own: awaiting it can be cancelled, and a call that
    never returns (a server trickling its answer) never keeps the process from exiting."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():
            return  # cancelled meanwhile: nobody waits for it
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, error = fn(), None
        except BaseException as e:  # handed to the awaiting task
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is closed: the process stops
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name="vfio_dp-claim-status", daemon=True).start()
    return await done


class StatusFeed:
    """Claim-status writes in the background, coalesced per claim (see the module doc)."""

    def __init__(
        self,
        write: WriteFn,
        *,
        record: Callable[[str], ClaimRecord | None],
        records: Callable[[], Mapping[str, ClaimRecord]],
        states: Callable[[], Mapping[str, DeviceHealth]],
        holders: Callable[[], Mapping[PciAddress, str]],
        failed: Callable[[], None] | None = None,
        workers: int = WORKERS,
    ) -> None:
        """``record(uid)`` / ``records()``: the checkpoint's claims now; ``states()``: the
        health model's states by device name; ``holders()``: who bound each address (blocking,
        called on the write's thread); ``failed()``: told of each write that failed."""
        self.write = write
        self.record = record
        self.records = records
        self.states = states
        self.holders = holders
        self.failed = failed
        self.workers = workers
        self.written = 0
        self.errors = 0
        self._queue: dict[str, _Key] = {}  # uid -> claim, oldest first
        self._running: dict[str, asyncio.Task[None]] = {}
        self._again: dict[str, _Key] = {}  # asked for while its write ran
        self._closed = False
        self._hold: asyncio.TimerHandle | None = None  # writes wait until :meth:`release`

    # -- what changed ----------------------------------------------------------------------
    def claim_changed(self, namespace: str, name: str, uid: str) -> None:
        """Prepared or unprepared: write the claim's entries as the checkpoint then says."""
        if self._closed:
            return
        key = (namespace, name, uid)
        if uid in self._running:
            self._again[uid] = key
        else:
            self._queue[uid] = key
        self._pump()

    def device_changed(self, device: str) -> None:
        """A held device's health changed: every prepared claim holding it."""
        self.devices_changed({device})

    def devices_changed(self, devices: Set[str]) -> None:
        """Held devices' health changed: every prepared claim holding one, in one pass over
        the claims (1,024 devices going bad at once were 1,024 passes over 1,024 claims on
        the event loop, ahead of the health stream)."""
        if not devices:
            return
        for rec in self.records().values():
            if rec.state == PREPARED and any(d.device in devices for d in rec.devices):
                self.claim_changed(rec.namespace, rec.name, rec.uid)

    def hold(self, seconds: float) -> None:
        """Start no write for up to ``seconds`` (until :meth:`release`): the tainted slices
        go to the API server first. 1,024 held devices going bad were 1,024 status GETs and
        PUTs queued ahead of, and racing, the 16 slice writes scheduling depends on. Writes
        under way go on; the ones asked for meanwhile are only queued (coalesced)."""
        if self._hold is not None:
            self._hold.cancel()
        self._hold = asyncio.get_running_loop().call_later(seconds, self.release)

    def release(self) -> None:
        """Writes may start again (the slices were written, or the hold ran out)."""
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
            if not self._closed:
                self._pump()

    @property
    def busy(self) -> int:
        """Writes queued or running."""
        return len(self._queue) + len(self._running) + len(self._again)

    # -- writing ---------------------------------------------------------------------------
    def _pump(self) -> None:
        if self._hold is not None and not self._closed:
            return
        while self._queue and len(self._running) < self.workers:
            uid = next(iter(self._queue))
            key = self._queue.pop(uid)
            task = asyncio.get_running_loop().create_task(self._write_one(key))
            self._running[uid] = task
            task.add_done_callback(functools.partial(self._done, uid))

    def _done(self, uid: str, _task: object = None) -> None:
        self._running.pop(uid, None)
        again = self._again.pop(uid, None)
        if again is not None:
            self._queue[uid] = again
        if not self._closed:  # close() pumps for itself within its grace
            self._pump()

    async def _write_one(self, key: _Key) -> None:
        namespace, name, uid = key
        rec = self.record(uid)
        if rec is not None and rec.state != PREPARED:
            return  # a prepare or release of it under way: its end asks again
        states = self.states()
        now = time.time()

        def job() -> None:
            ours = statuses(rec, states, self.holders(), now) if rec is not None else []
            self.write(namespace, name, uid, ours)

        try:
            await _detached(job)
        except Exception as e:  # the writer's refusal says which and why (and the fix)
            self.errors += 1
            if self.failed is not None:
                self.failed()
            log.error("claim %s/%s: device status not written: %s", namespace, name, e)
            return
        self.written += 1

    async def close(self, grace: float = CLOSE_GRACE) -> None:
        """Stop taking changes; give the writes queued and running ``grace`` seconds, then
        leave the rest (logged: a write stuck on the API server ends with the process)."""
        self._closed = True
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
        end = time.monotonic() + grace
        while self._queue and len(self._running) < self.workers:
            self._pump()  # queued writes still get their chance within the grace
        while self._running and (left := end - time.monotonic()) > 0:
            await asyncio.wait(set(self._running.values()), timeout=left)
            self._pump()
        left_over = len(self._running) + len(self._queue) + len(self._again)
        for task in self._running.values():
            task.cancel()  # their threads are left to the process's end
        self._running.clear()
        self._queue.clear()
        self._again.clear()
        if left_over:
            log.warning(
                "%d claim status write(s) not done within %g s of the stop; left (those "
                "claims' status.devices may be stale until they next change)",
                left_over,
                grace,
            )
