"""Prometheus metrics (``prometheus_client``) and the ``/healthz`` probe on one small asyncio
HTTP endpoint.

``GET /metrics`` → Prometheus text format 0.0.4 (``prometheus_client.generate_latest`` of
this process's own :class:`prometheus_client.CollectorRegistry`, never the library's global
one); ``GET /healthz`` → ``200 ok`` while the daemon is serving, its last scan of sysfs is
recent and its kubelet-facing sockets answer, else ``503`` with the reason (the DaemonSet's
liveness and readiness probes use it). One port serves both, so the library's own
``start_http_server`` (a second port, a thread) is not used.

Every series is declared once, in :attr:`Metrics.HELP` (kind, help text, label names);
call sites name a series and its labels (``metrics.inc("vfio_dp_scans_total",
trigger="resync")``), and a name not declared there raises :class:`KeyError` at once
instead of being counted where no scrape sees it.

The ``_created`` series (one gauge per counter and histogram child, holding its creation
time) are turned off (:func:`prometheus_client.disable_created_metrics`, process-wide): in
the 0.0.4 text format Prometheus stores them as ordinary gauges, doubling the series of
every counter for a value nothing here graphs; ``rate()`` and ``increase()`` do not need
them.

Importing this module costs ~0.1 s (``prometheus_client``): only the daemons and the webhook
import it, never ``vfioctl list`` (``tests/cli/test_main.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import ClassVar

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from vfio_dp.errors import PortError

log = logging.getLogger("vfio_dp.core")

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

#: ``Content-Type`` of what :meth:`Metrics.render` returns
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: latency buckets (seconds) of every histogram: an Allocate answers in ~1 ms, a Prepare
#: that binds a group to vfio-pci in 0.1-10 s, a 1,024-device republish in ~0.5 s
LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
#: name -> (kind, help text, label names, sorted: the order they are rendered in)
Spec = tuple[str, str, tuple[str, ...]]


class Metrics:
    """This process's series, in its own registry; rendered on demand."""

    HELP: ClassVar[dict[str, Spec]] = {
        "vfio_dp_devices": (
            GAUGE,
            "Devices (IOMMU-group units) listed, by resource and health.",
            ("health", "resource"),
        ),
        "vfio_dp_group_conflicts": (GAUGE, "IOMMU groups whose endpoints match two resources.", ()),
        "vfio_dp_allocations_total": (
            COUNTER,
            "Allocate calls answered, by resource.",
            ("resource",),
        ),
        "vfio_dp_allocation_errors_total": (
            COUNTER,
            "Allocate/PreStartContainer calls refused, by resource and call.",
            ("call", "resource"),
        ),
        "vfio_dp_allocate_seconds": (
            HISTOGRAM,
            "Time to answer a device-plugin Allocate call (all its containers), by resource.",
            ("resource",),
        ),
        "vfio_dp_bind_failures_total": (COUNTER, "bind: true attempts refused or failed.", ()),
        "vfio_dp_binds_total": (COUNTER, "Devices bound to vfio-pci by bind: true.", ()),
        "vfio_dp_kubelet_registrations_total": (
            COUNTER,
            "Successful Register calls to the kubelet, by resource.",
            ("resource",),
        ),
        "vfio_dp_uevents_total": (COUNTER, "Kernel PCI uevents received.", ()),
        "vfio_dp_scans_total": (COUNTER, "Scans of sysfs, by trigger.", ("trigger",)),
        "vfio_dp_resync_checks_total": (
            COUNTER,
            "Periodic resync looks at sysfs, by result (changed: a scan followed; unchanged).",
            ("result",),
        ),
        "vfio_dp_config_reloads_total": (COUNTER, "Configuration reloads, by result.", ("result",)),
        "vfio_dp_dra_devices": (GAUGE, "DRA devices (IOMMU groups) in this node's pool.", ()),
        "vfio_dp_dra_publishes_total": (COUNTER, "Writes of this node's ResourceSlices.", ()),
        "vfio_dp_dra_publish_seconds": (
            HISTOGRAM,
            "Time to write this node's pool at a new generation (every ResourceSlice of it).",
            (),
        ),
        "vfio_dp_dra_pool_generation": (GAUGE, "The pool generation last published.", ()),
        "vfio_dp_dra_prepared_total": (COUNTER, "DRA claims prepared (NodePrepareResources).", ()),
        "vfio_dp_dra_prepare_errors_total": (COUNTER, "DRA claims refused by Prepare.", ()),
        "vfio_dp_dra_unprepare_errors_total": (
            COUNTER,
            "DRA claims Unprepare could not finish (a group still held open, a failed restore).",
            (),
        ),
        "vfio_dp_dra_prepare_seconds": (
            HISTOGRAM,
            "Time to answer a NodePrepareResources call (all its claims), by API version.",
            ("version",),
        ),
        "vfio_dp_dra_unprepare_seconds": (
            HISTOGRAM,
            "Time to answer a NodeUnprepareResources call (all its claims), by API version.",
            ("version",),
        ),
        "vfio_dp_dra_device_health": (
            GAUGE,
            "1 per DRA device of the pool, labelled with its health (HEALTHY/UNHEALTHY/UNKNOWN).",
            ("device", "health"),
        ),
        "vfio_dp_dra_device_tainted": (
            GAUGE,
            "Per DRA device: 1 while it is published with our taint (prepared, gone bad).",
            ("device",),
        ),
        "vfio_dp_dra_health_changes_total": (
            COUNTER,
            "Health changes of prepared DRA devices, by the new health.",
            ("health",),
        ),
        "vfio_dp_dra_health_streams": (GAUGE, "Open DRAResourceHealth streams (kubelet).", ()),
        "vfio_dp_dra_claim_status_errors_total": (
            COUNTER,
            "ResourceClaim status.devices writes that failed (RBAC, API server).",
            (),
        ),
        "vfio_dp_dra_held_groups": (
            GAUGE,
            "IOMMU groups a released claim bound that stay on vfio-pci: a process holds them open.",
            (),
        ),
    }

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}
        for name, (kind, text, labels) in self.HELP.items():
            if kind == COUNTER:
                self._metrics[name] = Counter(name, text, labels, registry=self.registry)
            elif kind == GAUGE:
                self._metrics[name] = Gauge(name, text, labels, registry=self.registry)
            else:
                self._metrics[name] = Histogram(
                    name, text, labels, registry=self.registry, buckets=LATENCY_BUCKETS
                )

    def _child(self, name: str, labels: dict[str, str]) -> Counter | Gauge | Histogram:
        try:
            metric = self._metrics[name]
        except KeyError:
            raise KeyError(
                f"metric {name!r} is not declared: add it to {type(self).__name__}.HELP "
                "(kind, help text, label names), or it is never exported"
            ) from None
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to a counter (or a gauge)."""
        child = self._child(name, labels)
        assert not isinstance(child, Histogram), name
        child.inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge."""
        child = self._child(name, labels)
        assert isinstance(child, Gauge), f"{name} is not a gauge"
        child.set(value)

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """One observation of a histogram."""
        child = self._child(name, labels)
        assert isinstance(child, Histogram), f"{name} is not a histogram"
        child.observe(seconds)

    @contextlib.contextmanager
    def time(self, name: str, **labels: str) -> Iterator[None]:
        """Observe the time the ``with`` block takes (also when it raises)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(name, time.perf_counter() - start, **labels)

    def clear(self, name: str) -> None:
        """Drop every labelled series of ``name`` (a device or resource gone)."""
        if self.HELP[name][2]:
            self._metrics[name].clear()

    def remove(self, name: str, **labels: str) -> None:
        """Drop one labelled series of ``name`` (absent: nothing to do)."""
        values = tuple(labels[n] for n in self.HELP[name][2])
        with contextlib.suppress(KeyError):
            self._metrics[name].remove(*values)

    def get(self, name: str, **labels: str) -> float:
        """The value of a series as a scrape shows it (0 when absent); a histogram's samples
        by their own names (``<name>_count``, ``<name>_sum``)."""
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def render(self) -> str:
        """The registry in the text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry).decode()


async def serve_http(
    host: str, port: int, metrics: Metrics, health: Callable[[], str | None]
) -> asyncio.Server:
    """Serve ``/metrics`` and ``/healthz``; ``health()`` returns None when healthy, else why not."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            parts = request.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) > 1 else ""
            if path == "/metrics":
                status, body, ctype = "200 OK", metrics.render(), CONTENT_TYPE
            elif path == "/healthz":
                why = health()
                status = "200 OK" if why is None else "503 Service Unavailable"
                body, ctype = (why or "ok") + "\n", "text/plain"
            else:
                status, body, ctype = "404 Not Found", "try /metrics or /healthz\n", "text/plain"
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    try:
        server = await asyncio.start_server(handle, host, port)
    except OSError as e:  # busy or not ours to bind: one line naming the flag, not a traceback
        raise PortError(
            f"--metrics-port {port}: cannot listen on {host or '0.0.0.0'}:{port}: "
            f"{os.strerror(e.errno) if e.errno else e}; the pods use hostNetwork, so another process on the node may "
            "hold it (ss -ltnp 'sport = :%d'): pick another --metrics-port, or 0 to turn "
            "metrics off" % port
        ) from e
    log.info("metrics and /healthz on http://%s:%d", host or "0.0.0.0", port)
    return server
