"""Do the requested devices exist on any node? (pure logic + a small TTL cache)

Input is what ``GET /api/v1/nodes`` returns, reduced to allocatable device counts::

    {"metadata": {"name": "node-a"}, "spec": {"unschedulable": false},
     "status": {"allocatable": {"cpu": "8", "devices.kubevirt.io/10de_1eb8": "2"}}}

A request passes when ONE schedulable node advertises every requested resource in at least
the requested number (a pod lands on one node). Allocatable is capacity, not what is free
right now: this check catches devices that exist nowhere — typos, a daemon not deployed, a
vendor:device nobody has — at admission instead of at VM start; it cannot promise a slot.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vm_translate.errors import NodeCheckError

_WHOLE = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class NodeResources:
    name: str
    allocatable: Mapping[str, int] = field(default_factory=dict)
    #: names a DeviceClass of another DRA driver serves (its CEL is not ours to evaluate):
    #: not checked
    unchecked: frozenset[str] = frozenset()


def dra_capacity(
    classes: Sequence[Mapping[str, Any]], slices: Sequence[Mapping[str, Any]]
) -> tuple[dict[str, dict[str, int]], frozenset[str]]:
    """What DRA serves as extended resources (KEP-5004): per node, each
    ``extendedResourceName`` of our DeviceClasses → the devices published under it (the
    ``resourceName`` attribute, at each pool's newest generation); and the names classes of
    other drivers serve. From ``GET .../deviceclasses`` and ``.../resourceslices`` items::

        {"spec": {"extendedResourceName": "devices.kubevirt.io/10de_1eb8", "selectors": [...]}}
        {"spec": {"driver": "vfio.dra.vfio-dp.io", "nodeName": "node-a",
                  "pool": {"name": "node-a", "generation": 3},
                  "devices": [{"name": "pci-0000-3b-00-0", "attributes":
                      {"resourceName": {"string": "devices.kubevirt.io/10de_1eb8"}}}]}}
    """
    from vfio_dp.dra.deviceclasses import ours

    wanted: dict[tuple[str, str], str] = {}  # (driver, resourceName attribute) → resource
    others: set[str] = set()
    for c in classes:
        spec = c.get("spec") or {}
        name = spec.get("extendedResourceName") if isinstance(spec, Mapping) else None
        if not isinstance(name, str) or not name:
            continue
        mine = ours(c)
        if mine is None:
            others.add(name)
        else:
            wanted[mine] = name
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver")), str(pool.get("name")))
        newest[key] = max(newest.get(key, 0), int(pool.get("generation") or 0))
    seen: set[tuple[str, str, str]] = set()
    out: dict[str, dict[str, int]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        pool = spec.get("pool") or {}
        driver, node = str(spec.get("driver")), spec.get("nodeName")
        if not isinstance(node, str) or int(pool.get("generation") or 0) != newest.get(
            (driver, str(pool.get("name"))), -1
        ):
            continue
        for d in spec.get("devices") or []:
            attr = ((d.get("attributes") or {}).get("resourceName") or {}).get("string")
            resource = wanted.get((driver, attr)) if isinstance(attr, str) else None
            device_key = (driver, str(pool.get("name")), str(d.get("name")))
            if resource is None or device_key in seen:
                continue
            seen.add(device_key)
            counts = out.setdefault(node, {})
            counts[resource] = counts.get(resource, 0) + 1
    return out, frozenset(others - set(wanted.values()))


def with_dra(
    nodes: Sequence[NodeResources],
    counts: Mapping[str, Mapping[str, int]],
    unchecked: frozenset[str],
) -> list[NodeResources]:
    """``nodes`` with what DRA serves added: a name counts the larger of the device plugin's
    allocatable and DRA's devices on that node (KEP-5004 uses DRA where no device plugin
    advertises the name)."""
    out: list[NodeResources] = []
    for n in nodes:
        merged = dict(n.allocatable)
        for name, count in counts.get(n.name, {}).items():
            merged[name] = max(merged.get(name, 0), count)
        out.append(NodeResources(n.name, merged, unchecked))
    return out


def nodes_from_list(items: Sequence[Mapping[str, Any]]) -> list[NodeResources]:
    """Schedulable nodes and their whole-number allocatable resources, from Node objects."""
    out: list[NodeResources] = []
    for item in items:
        meta = item.get("metadata") or {}
        spec = item.get("spec") or {}
        if spec.get("unschedulable"):
            continue
        alloc = (item.get("status") or {}).get("allocatable") or {}
        counts = {
            k: int(v)
            for k, v in alloc.items()
            if isinstance(v, str | int) and _WHOLE.fullmatch(str(v))
        }
        out.append(NodeResources(str(meta.get("name", "?")), counts))
    return out


def capacity_problems(requests: Mapping[str, int], nodes: Sequence[NodeResources]) -> list[str]:
    """Why no node can take ``requests`` (empty when some node can), naming the best offers."""
    wanted = {k: v for k, v in requests.items() if v > 0}
    if not wanted:
        return []
    for node in nodes:
        if all(k in node.unchecked or node.allocatable.get(k, 0) >= v for k, v in wanted.items()):
            return []
    problems: list[str] = []
    for name, count in wanted.items():
        if any(name in n.unchecked for n in nodes):
            continue
        best = max(nodes, key=lambda n: n.allocatable.get(name, 0), default=None)
        have = best.allocatable.get(name, 0) if best else 0
        if have < count:
            where = f" ({best.name})" if best and have else ""
            problems.append(
                f"{name}: {count} requested but no schedulable node advertises more than "
                f"{have}{where}; check the resource name and that the vfio_dp daemon (or, "
                "for a name a DeviceClass serves through DRA, the DRA plugin) runs on the "
                "nodes with the device (kubectl get nodes -o json | jq "
                "'.items[].status.allocatable'; kubectl get resourceslices)"
            )
    if not problems:
        problems.append(
            "each device exists on some node, but no single node advertises all of "
            + ", ".join(f"{v} x {k}" for k, v in wanted.items())
            + "; request fewer or place the devices on one node"
        )
    return problems


class NodeCache:
    """``fetch`` results kept for ``ttl`` seconds; concurrent callers share one fetch. A failed
    fetch is remembered for ``retry_after`` seconds (callers get the same error at once, so an
    unreachable API server is asked once, not once per review). Once a list is known, an
    expired one is still answered while ONE fetch runs in the background (no review waits
    for the API server after the first: 100 nodes and 6,400 DRA devices listed again held
    every review of that moment, the p99 of a review at 64 connections); a background fetch
    that fails drops the old list, so callers then get its error, as before."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[list[NodeResources]]],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        retry_after: float = 5.0,
    ) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._clock = clock
        self._retry_after = retry_after
        self._value: list[NodeResources] | None = None
        self._at = 0.0
        self._error: NodeCheckError | None = None
        self._error_at = 0.0
        self._lock = asyncio.Lock()
        self._refresh: asyncio.Task[None] | None = None

    def _cached(self) -> list[NodeResources] | None:
        now = self._clock()
        if self._value is not None and now - self._at < self._ttl:
            return self._value
        if self._error is not None and now - self._error_at < self._retry_after:
            raise self._error
        return None

    def peek(self) -> list[NodeResources] | NodeCheckError | None:
        """What :meth:`get` would answer at once (a list, fresh or expired with its refetch
        started; or the remembered error), without an await, a task or a timeout; None
        when the caller must wait for the first fetch (:meth:`get`). The webhook asks this
        first: waiting through a shielded task and a timeout cost ~0.1 ms a review."""
        try:
            cached = self._cached()
        except NodeCheckError as e:
            return e
        if cached is not None:
            return cached
        if self._value is not None:  # expired: answered while one fetch runs
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.get_running_loop().create_task(self._refetch())
            return self._value
        return None

    async def get(self) -> list[NodeResources]:
        got = self.peek()
        if isinstance(got, NodeCheckError):
            raise got
        if got is not None:
            return got
        async with self._lock:
            cached = self._cached()
            if cached is not None:
                return cached
            try:
                value = await self._fetch()
            except NodeCheckError as e:
                self._error, self._error_at = e, self._clock()
                raise
            self._value, self._at, self._error = value, self._clock(), None
            return value

    async def _refetch(self) -> None:
        async with self._lock:
            try:
                value = await self._fetch()
            except NodeCheckError as e:
                self._value, self._error, self._error_at = None, e, self._clock()
                return
            self._value, self._at, self._error = value, self._clock(), None
