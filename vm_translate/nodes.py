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
        if all(node.allocatable.get(k, 0) >= v for k, v in wanted.items()):
            return []
    problems: list[str] = []
    for name, count in wanted.items():
        best = max(nodes, key=lambda n: n.allocatable.get(name, 0), default=None)
        have = best.allocatable.get(name, 0) if best else 0
        if have < count:
            where = f" ({best.name})" if best and have else ""
            problems.append(
                f"{name}: {count} requested but no schedulable node advertises more than "
                f"{have}{where}; check the resource name and that the vfio_dp daemon runs on "
                "the nodes with the device (kubectl get nodes -o json | jq '.items[].status.allocatable')"
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
    unreachable API server is asked once, not once per review)."""

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

    def _cached(self) -> list[NodeResources] | None:
        now = self._clock()
        if self._value is not None and now - self._at < self._ttl:
            return self._value
        if self._error is not None and now - self._error_at < self._retry_after:
            raise self._error
        return None

    async def get(self) -> list[NodeResources]:
        cached = self._cached()
        if cached is not None:
            return cached
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
