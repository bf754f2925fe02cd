"""A scheduler stand-in: allocates ResourceClaims from the API-server stand-in's slices, with
counters and binding conditions, as kube-scheduler's DRA plugin does. Named as such on
purpose — it is not kube-scheduler.

What it keeps of upstream's allocator and scheduler plugin (``../shared/reference/dra.md``,
"Beyond Prepare"; kubernetes/dynamic-resource-allocation ``structured``):

- a pool is used at its highest ``pool.generation`` only, and only when all its
  ``resourceSliceCount`` slices at that generation are there (an incomplete pool is skipped);
- a device already allocated to another claim is not free; one tainted ``NoSchedule`` or
  ``NoExecute`` is not given out (no tolerations here);
- a request (``exactly``: ``deviceClassName``, ``selectors``, ``allocationMode`` ExactCount,
  ``count``) takes devices its class's and its own CEL selectors select;
- **counters (KEP-4815)**: the sum of what the allocated devices consume never exceeds a
  counter's value (:func:`tests.dra.apiserver_standin.over_consumed`, the stand-in's one
  copy of that rule): two devices consuming 1 of a counter of value 1 are never both
  allocated, whichever claims ask;
- **binding conditions (KEP-5007)**: the allocation copies each device's
  ``bindingConditions`` / ``bindingFailureConditions`` into its result and sets
  ``allocationTimestamp``; :meth:`SchedulerStandin.prebind` then does what PreBind does: the
  pod is bound only when every binding condition is True in that device's
  ``status.devices[].conditions``; any failure condition True, or the binding timeout
  passing, deallocates the claim (the real scheduler then schedules the pod again).

Claims are written through the stand-in's own operations under its lock (the status
subresource, strict decoding and validation included), as ``schedule_extended_resources``
does.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.dra.apiserver_standin import (
    CLAIMS,
    DEVICE_CLASSES,
    SLICES,
    ApiServerStandin,
    Unschedulable,
    _selects,
    over_consumed,
    pool_counters,
)

#: kube-scheduler's DynamicResources plugin default ``bindingTimeout``
BINDING_TIMEOUT = 600.0
#: how often the real PreBind looks again (the stand-in also wakes on every claim write)
PREBIND_INTERVAL = 5.0


@dataclass(frozen=True)
class PreBind:
    """What PreBind decided: ``bound``, or ``deallocated`` with why (a failure condition's
    type and reason, or the timeout)."""

    outcome: str
    why: str = ""
    #: the failure condition that decided it, as the claim held it before the deallocation
    condition: dict[str, Any] | None = None


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


class SchedulerStandin:
    """Allocates claims on one node's pools (module docstring)."""

    def __init__(
        self,
        api: ApiServerStandin,
        *,
        binding_timeout: float = BINDING_TIMEOUT,
        interval: float = PREBIND_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.binding_timeout = binding_timeout
        self.interval = interval
        self.clock = clock
        self._allocated_at: dict[tuple[str, str], float] = {}

    # -- allocation ----------------------------------------------------------------------
    def pools(self, node: str) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """The complete pools on ``node`` at their newest generation: (driver, pool) -> slices."""
        by_pool: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for s in self.api.objects(SLICES):
            if s["spec"].get("nodeName") == node:
                by_pool.setdefault((s["spec"]["driver"], s["spec"]["pool"]["name"]), []).append(s)
        out = {}
        for key, slices in by_pool.items():
            newest = max(s["spec"]["pool"]["generation"] for s in slices)
            current = [s for s in slices if s["spec"]["pool"]["generation"] == newest]
            if len(current) == current[0]["spec"]["pool"]["resourceSliceCount"]:
                out[key] = current
        return out

    def allocated(self) -> dict[tuple[str, str, str], str]:
        """Every allocated device (driver, pool, device) -> the claim's ``ns/name``."""
        return {
            (r["driver"], r["pool"], r["device"]): (
                f"{c['metadata']['namespace']}/{c['metadata']['name']}"
            )
            for c in self.api.objects(CLAIMS)
            for r in _results(c)
        }

    def allocate(self, namespace: str, name: str, node: str) -> dict[str, Any]:
        """Allocate the claim ``namespace/name`` on ``node`` and write its
        ``status.allocation``; the claim as stored. Raises :class:`Unschedulable`."""
        claim = self._claim(namespace, name)
        if _results(claim):
            raise Unschedulable(f"claim {namespace}/{name} is allocated already")
        classes = {c["metadata"]["name"]: c for c in self.api.objects(DEVICE_CLASSES)}
        pools = self.pools(node)
        taken = set(self.allocated())
        counters = {key: pool_counters(slices) for key, slices in pools.items()}
        in_use: dict[tuple[str, str], list[str]] = {
            key: [dev for (drv, pool, dev) in taken if (drv, pool) == key] for key in pools
        }
        results: list[dict[str, Any]] = []
        for req in claim["spec"]["devices"]["requests"]:
            exact = req.get("exactly")
            if exact is None or exact.get("allocationMode", "ExactCount") != "ExactCount":
                raise Unschedulable(f"claim {namespace}/{name}: only exactly/ExactCount here")
            cls = classes.get(exact["deviceClassName"])
            if cls is None:
                raise Unschedulable(f"DeviceClass {exact['deviceClassName']} not found")
            want = int(exact.get("count", 1))
            for (driver, pool), slices in sorted(pools.items()):
                defined, consumes = counters[(driver, pool)]
                for s in slices:
                    for d in s["spec"].get("devices") or []:
                        key = (driver, pool, d["name"])
                        if want == 0 or key in taken or self._tainted(d):
                            continue
                        if not _selects(cls, driver, d) or not _selects(
                            {"spec": {"selectors": exact.get("selectors") or []}}, driver, d
                        ):
                            continue
                        if over_consumed(defined, consumes, [*in_use[(driver, pool)], d["name"]]):
                            continue  # its counters are spent by what is allocated
                        taken.add(key)
                        in_use[(driver, pool)].append(d["name"])
                        result = {
                            "request": req["name"],
                            "driver": driver,
                            "pool": pool,
                            "device": d["name"],
                        }
                        for f in ("bindingConditions", "bindingFailureConditions"):
                            if d.get(f):
                                result[f] = list(d[f])
                        results.append(result)
                        want -= 1
            if want:
                raise Unschedulable(
                    f"claim {namespace}/{name}: {want} more device(s) of class "
                    f"{exact['deviceClassName']} needed on node {node} for {req['name']}"
                )
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status = {
            **(claim.get("status") or {}),
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
                "allocationTimestamp": now,
            },
        }  # fmt: skip
        with self.api.lock:
            stored = self.api._replace(
                CLAIMS, namespace, name, {**claim, "status": status}, status=True
            )
        self._allocated_at[(namespace, name)] = self.clock()
        return stored

    def deallocate(self, namespace: str, name: str) -> None:
        """Drop the claim's allocation (what the scheduler's PostFilter does) and the device
        statuses with it (upstream's validation allows ``status.devices`` only for allocated
        devices)."""
        claim = self._claim(namespace, name)
        status = {
            k: v
            for k, v in (claim.get("status") or {}).items()
            if k not in ("allocation", "devices")
        }
        with self.api.lock:
            self.api._replace(CLAIMS, namespace, name, {**claim, "status": status}, status=True)
        self._allocated_at.pop((namespace, name), None)

    # -- PreBind -------------------------------------------------------------------------
    def check(self, namespace: str, name: str) -> PreBind | None:
        """One look at the claim's binding conditions: a decision, or None (wait)."""
        claim = self._claim(namespace, name)
        statuses = {
            (d.get("driver"), d.get("pool"), d.get("device")): {
                c.get("type"): c for c in d.get("conditions") or []
            }
            for d in (claim.get("status") or {}).get("devices") or []
        }
        ready = True
        for r in _results(claim):
            conditions = statuses.get((r["driver"], r["pool"], r["device"]), {})
            for t in r.get("bindingFailureConditions") or []:
                c = conditions.get(t)
                if c is not None and c.get("status") == "True":
                    return PreBind("deallocated", f"{r['device']}: {t}: {c.get('reason')}", dict(c))
            for t in r.get("bindingConditions") or []:
                c = conditions.get(t)
                if c is None or c.get("status") != "True":
                    ready = False
        return PreBind("bound") if ready else None

    def prebind(self, namespace: str, name: str) -> PreBind:
        """Wait until the claim may be bound (every binding condition True), or deallocate
        it on a failure condition True or when the binding timeout passes."""
        started = self._allocated_at.get((namespace, name), self.clock())
        while True:
            with self.api.lock:
                seen = self.api.store.rv
            decision = self.check(namespace, name)
            if decision is None and self.clock() - started > self.binding_timeout:
                decision = PreBind("deallocated", f"binding timeout {self.binding_timeout:g} s")
            if decision is not None:
                if decision.outcome == "deallocated":
                    self.deallocate(namespace, name)
                return decision
            with self.api.lock:  # the next write, or the next interval
                if self.api.store.rv == seen:
                    self.api.lock.wait(self.interval)

    # -- the parts -----------------------------------------------------------------------
    def _claim(self, namespace: str, name: str) -> dict[str, Any]:
        for c in self.api.objects(CLAIMS, namespace):
            if c["metadata"]["name"] == name:
                return c
        raise Unschedulable(f"claim {namespace}/{name} not found")

    @staticmethod
    def _tainted(device: dict[str, Any]) -> bool:
        return any(
            t.get("effect") in ("NoSchedule", "NoExecute") for t in device.get("taints") or []
        )
