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
(:mod:`vfio_dp.dra.claimpath.ahead`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import kubernetes.client as k8s

from vfio_dp.dra.apiserver.client import own_client
from vfio_dp.dra.apiserver.watch import WATCH_SECONDS, ListWatch

#: ``(uid, the claim's JSON, or None: no longer ours)`` -- called on the watch's thread
OnClaim = Callable[[str, dict[str, Any] | None], None]


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
        self.api = k8s.ResourceV1Api(own_client(client))
        super().__init__(
            self.api.list_resource_claim_for_all_namespaces,
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
