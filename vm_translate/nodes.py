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
    """``fetch`` results kept for ``ttl`` seconds; concurrent callers share one fetch."""

    def __init__(
        self,
        fetch: Callable[[], Awaitable[list[NodeResources]]],
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._ttl = ttl
        self._clock = clock
        self._value: list[NodeResources] | None = None
        self._at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> list[NodeResources]:
        if self._value is not None and self._clock() - self._at < self._ttl:
            return self._value
        async with self._lock:
            if self._value is not None and self._clock() - self._at < self._ttl:
                return self._value
            value = await self._fetch()
            self._value, self._at = value, self._clock()
            return value
