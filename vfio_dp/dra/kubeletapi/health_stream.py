"""``DRAResourceHealth.NodeWatchResources`` (v1 and v1alpha1): the DRA plugin's health stream.

A gRPC shell, served on ``<plugins>/<driver>/dra.sock`` beside the DRAPlugin services and
named in the registration's ``supported_versions`` (``v1.DRAResourceHealth``,
``v1alpha1.DRAResourceHealth``). Protos vendored from kubernetes/kubelet
``pkg/apis/dra-health/{v1,v1alpha1}``: packages ``v1`` and ``v1alpha1``, so the method paths
are ``/v1.DRAResourceHealth/NodeWatchResources`` and ``/v1alpha1...``.

kubelet opens one stream per registered plugin and keeps it; every response carries the FULL
device list of the pool (kubelet treats a device missing from it as gone: Unknown after its
timeout)::

    NodeWatchResourcesResponse{devices: [DeviceHealth{
        device: {pool_name: "node-a", device_name: "pci-0000-3b-00-0"},
        health: UNHEALTHY, last_updated_time: 1763998874, health_check_timeout_seconds: 90,
        message: "0000:3b:00.0 (8086:10d3) was unbound from vfio-pci underneath ..."}]}

A new stream gets the current list at once; every stream gets a new one after a scan that
changed it (a device came or went, a health or its message changed): a change reaches
kubelet within a scan. A scan that changed nothing (an idle resync) sends nothing, unless
:data:`REFRESH` seconds have passed since the last list sent: kubelet stamps each device with
the time a list ARRIVED (it ignores ``last_updated_time``) and says Unknown once
``health_check_timeout_seconds`` (three refreshes, :func:`timeout_for`) pass without one. (A
list of 4,096 devices resent every 5 s resync cost the plugin 0.35 % of a core.) Only the
latest list is kept: a slow reader skips lists, never sees an old one after a new one.

At most :data:`MAX_STREAMS` streams are open at once; one more is refused at once with
``RESOURCE_EXHAUSTED``. The streams share ``dra.sock``'s gRPC server, whose bound on running
calls (:data:`vfio_dp.core.sockets.MAX_CONCURRENT_RPCS`, 64) they would otherwise fill:
watchers that never close must not make kubelet's NodePrepareResources fail (kubelet itself
opens one stream per plugin).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from vfio_dp.dra._pb.dra_health.v1 import api_pb2 as v1_pb2
from vfio_dp.dra._pb.dra_health.v1 import api_pb2_grpc as v1_grpc
from vfio_dp.dra._pb.dra_health.v1alpha1 import api_pb2 as v1alpha1_pb2
from vfio_dp.dra._pb.dra_health.v1alpha1 import api_pb2_grpc as v1alpha1_grpc
from vfio_dp.dra.observers.health import Report

log = logging.getLogger("vfio_dp.dra")

#: what the registration adds to ``supported_versions`` (after the DRAPlugin services)
SERVICE_NAMES = ("v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth")
#: open health streams at most: kubelet opens one; the rest of the server's bound on running
#: calls stays free for NodePrepareResources / NodeUnprepareResources
MAX_STREAMS = 16
#: an unchanged list is sent again after this many seconds (at the first scan after them)
REFRESH = 30.0


def timeout_for(resync: float, refresh: float = REFRESH) -> int:
    """``health_check_timeout_seconds``: an unchanged list is resent at the first scan
    ``refresh`` s after the last one (every ``max(resync, refresh)`` s, a resync later at
    most); three missed refreshes (as ``/healthz`` counts missed scans) make kubelet say
    Unknown."""
    return max(1, math.ceil(3 * max(resync, refresh)))


class HealthStream:
    """The latest health list of one pool and the streams that follow it."""

    def __init__(self, pool: str, timeout_seconds: int, refresh: float = REFRESH) -> None:
        """``refresh``: seconds after which an unchanged list is sent again."""
        self.pool = pool
        self.timeout_seconds = timeout_seconds
        self.refresh = refresh
        self._woken = -math.inf  # time.monotonic() when the streams were last told to send
        self._latest: tuple[Report, ...] | None = None
        self._make: Callable[[], Sequence[Report]] | None = None
        self.sent = 0  # responses sent, all streams (metrics, tests)
        self.closed = False
        self._subscribers: set[asyncio.Event] = set()

    @property
    def streams(self) -> int:
        return len(self._subscribers)

    @property
    def latest(self) -> tuple[Report, ...] | None:
        """The latest full list (None before the first :meth:`publish`)."""
        if self._make is not None:
            self._latest, self._make = tuple(self._make()), None
        return self._latest

    def publish(
        self,
        reports: Sequence[Report] | Callable[[], Sequence[Report]],
        *,
        changed: bool = True,
    ) -> None:
        """The new full list, or what makes it: a callable is called only when a stream (or
        :attr:`latest`) needs the list -- with no kubelet stream open, an idle resync builds
        none. Every stream sends it (the event loop's thread only) -- unless ``changed`` is
        False (the devices, their health and messages are what the last list said; only the
        times of the checks moved) and a list went out less than :attr:`refresh` s ago: then
        it is only kept, for a stream opened now."""
        first = self._latest is None and self._make is None
        if callable(reports):
            self._make = reports
            self._latest = ()  # published: a stream opened now sends it at once
        else:
            self._latest, self._make = tuple(reports), None
        now = time.monotonic()
        if not changed and not first and now - self._woken < self.refresh:
            return
        self._woken = now
        for wake in self._subscribers:
            wake.set()

    def close(self) -> None:
        """End every stream cleanly (the plugin stops: the RPCs finish, none is cancelled)."""
        self.closed = True
        for wake in self._subscribers:
            wake.set()

    def add_to_server(self, server: Any) -> None:
        v1_grpc.add_DRAResourceHealthServicer_to_server(_Servicer(self, v1_pb2, "v1"), server)
        v1alpha1_grpc.add_DRAResourceHealthServicer_to_server(
            _Servicer(self, v1alpha1_pb2, "v1alpha1"), server
        )

    def response(self, pb: Any) -> Any:
        """The latest list as ``pb``'s ``NodeWatchResourcesResponse``. Each entry is made in
        place (``devices.add``), not built apart and copied in: 2.5x less CPU for the 4,096
        entries every resync sends."""
        out = pb.NodeWatchResourcesResponse()
        add, code = out.devices.add, pb.HealthStatus.Value
        for r in self.latest or ():
            entry = add(
                health=code(r.health),
                last_updated_time=r.checked,
                health_check_timeout_seconds=self.timeout_seconds,
                message=r.message,
            )
            entry.device.pool_name = self.pool
            entry.device.device_name = r.device
        return out

    async def follow(self, pb: Any, version: str) -> AsyncIterator[Any]:
        wake = asyncio.Event()
        if self.latest is not None:
            wake.set()
        self._subscribers.add(wake)
        log.info("kubelet opened a %s health stream (%d open)", version, self.streams)
        try:
            while not self.closed:
                await wake.wait()
                wake.clear()
                if self.closed:
                    return
                self.sent += 1
                yield self.response(pb)
        finally:
            self._subscribers.discard(wake)
            log.info("a %s health stream closed (%d open)", version, self.streams)


class _Servicer:
    def __init__(self, stream: HealthStream, pb: Any, version: str) -> None:
        self.stream = stream
        self.pb = pb
        self.version = version

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        # an async generator function itself: that is how grpc.aio knows it streams
        if self.stream.streams >= MAX_STREAMS:  # no await until follow() counts this one
            log.warning(
                "a %s health stream refused: %d are open already (at most %d)",
                self.version,
                self.stream.streams,
                MAX_STREAMS,
            )
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.stream.streams} health streams are open already (at most "
                f"{MAX_STREAMS}); close one first",
            )
        async for response in self.stream.follow(self.pb, self.version):
            yield response
