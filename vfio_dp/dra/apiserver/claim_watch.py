"""The ResourceClaims allocated from this node's pool, kept current by a watch (KEP-5007).

::

    GET /apis/resource.k8s.io/v1/resourceclaims
    GET /apis/resource.k8s.io/v1/resourceclaims?watch=true&resourceVersion=<rv>&allowWatchBookmarks=true&timeoutSeconds=<s>

ResourceClaims have no field selector for their allocation (only ``metadata.name`` and
``metadata.namespace``), so the watch spans every namespace and keeps, on its own thread,
the claims one of whose ``status.allocation.devices.results[]`` is of our driver in our
pool (the node's name) -- the same list-then-watch loop as the slice watch
(:class:`~.watch.ListWatch`: a watch from the last resourceVersion, a ``410 Gone`` lists
again, each call bounded by its deadline). RBAC: ``list`` and ``watch`` on
``resourceclaims`` (``deploy/components/dra/dra-rbac.yaml``).

What it hands on (:data:`OnClaim`, called on the watch's thread): a claim of ours as it is
now, when it was listed, added or changed; ``None`` for a claim that was ours and is no
longer (deallocated, deleted, or gone from a relist). What is done with it -- the driver
switch ahead of the pod and the binding conditions -- is the plugin's
(:mod:`vfio_dp.dra.claimpath.ahead`). The conditions it decides are written by
:class:`BindingWrites` (``PUT .../resourceclaims/<name>/status``, on a lane of their own),
each retried after a failure with a bounded backoff (:data:`FIRST_RETRY` seconds, doubling
to :data:`MAX_RETRY`) -- not left to the watch's next list, up to
:data:`~vfio_dp.dra.apiserver.watch.WATCH_SECONDS` later -- until it is written, the
claim's next outcome replaces it, or the claim goes away.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import kubernetes.client as k8s

from vfio_dp.dra.apiserver.client import Lane, own_client
from vfio_dp.dra.apiserver.plain import RESOURCE_API, lister
from vfio_dp.dra.apiserver.watch import WATCH_SECONDS, ListWatch
from vfio_dp.errors import ApiCallError

#: ``(uid, the claim's JSON, or None: no longer ours)`` -- called on the watch's thread
OnClaim = Callable[[str, dict[str, Any] | None], None]
#: ``write(namespace, name, uid, conditions)``: False when the claim is gone (blocking)
WriteBinding = Callable[[str, str, str, Any], bool]
#: the backoff of a failed condition write: the first retry after this many seconds,
#: doubling, never more than :data:`MAX_RETRY` apart
FIRST_RETRY = 1.0
MAX_RETRY = 30.0

log = logging.getLogger("vfio_dp.dra.apiserver.claim_watch")


def allocated_here(claim: dict[str, Any], driver: str, pool: str) -> bool:
    """Does ``status.allocation.devices.results[]`` hold a device of ``driver`` in ``pool``?"""
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, dict):
        return False
    results = (allocation.get("devices") or {}).get("results") or []
    return any(
        isinstance(r, dict) and r.get("driver") == driver and r.get("pool") == pool for r in results
    )


class ClaimWatch(ListWatch):
    """The claims allocated from our pool (see module doc)."""

    what = "ResourceClaims"

    def __init__(
        self,
        client: k8s.ApiClient,
        driver: str,
        node: str,
        on_claim: OnClaim,
        seconds: int = WATCH_SECONDS,
    ) -> None:
        super().__init__(
            lister(own_client(client), f"{RESOURCE_API}/resourceclaims"),
            None,
            seconds,
            "vfio_dp-claim-watch",
        )
        self.driver = driver
        self.pool = node
        self.on_claim = on_claim
        #: UIDs of the claims allocated from our pool, as last seen
        self.ours: set[str] = set()
        self._ours_lock = threading.Lock()

    def listed(self, items: list[dict[str, Any]]) -> None:
        now = {
            str((c.get("metadata") or {}).get("uid")): c
            for c in items
            if allocated_here(c, self.driver, self.pool)
        }
        with self._ours_lock:
            gone = self.ours - set(now)
            self.ours = set(now)
        with self._lock:
            self.synced = True
        for uid in sorted(gone):
            self.on_claim(uid, None)
        for uid, claim in now.items():
            self.on_claim(uid, claim)

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid"))
        here = kind != "DELETED" and allocated_here(obj, self.driver, self.pool)
        with self._ours_lock:
            was = uid in self.ours
            if here:
                self.ours.add(uid)
            else:
                self.ours.discard(uid)
        if here:
            self.on_claim(uid, obj)
        elif was:
            self.on_claim(uid, None)


class BindingWrites:
    """The binding conditions of our claims written on ``lane``, one task per claim, each
    failed write retried with a bounded backoff (module doc). Event-loop side."""

    def __init__(
        self, lane: Lane, write: WriteBinding, first: float = FIRST_RETRY, cap: float = MAX_RETRY
    ) -> None:
        self.lane = lane
        self.write_fn = write
        self.first = first
        self.cap = cap
        self.failures = 0  # (tests, logs) failed writes, each retried
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def write(self, uid: str, namespace: str, name: str, conditions: Any) -> None:
        """Write ``conditions`` to the claim, replacing a write of it still pending."""
        self.drop(uid)
        task = asyncio.create_task(
            self._write(uid, namespace, name, conditions), name=f"binding conditions {uid}"
        )
        self._tasks[uid] = task
        task.add_done_callback(lambda t: self._done(uid, t))

    def _done(self, uid: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(uid) is task:
            del self._tasks[uid]

    def pending(self, uid: str) -> bool:
        return uid in self._tasks

    def drop(self, uid: str) -> None:
        """The claim went away (or has a newer outcome): its pending write is given up."""
        task = self._tasks.pop(uid, None)
        if task is not None:
            task.cancel()

    def close(self) -> None:
        for uid in list(self._tasks):
            self.drop(uid)

    async def _write(self, uid: str, namespace: str, name: str, conditions: Any) -> None:
        what = f"writing the binding conditions of ResourceClaim {namespace}/{name}"
        delay = self.first
        while True:
            try:
                await self.lane.run(what, self.write_fn, namespace, name, uid, conditions)
                return
            except ApiCallError as e:
                self.failures += 1
                log.warning("claim %s: binding conditions not written (%s); again in %.0f s",
                            uid, e, delay)  # fmt: skip
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.cap)
