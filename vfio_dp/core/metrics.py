"""Prometheus metrics and the ``/healthz`` probe on one small asyncio HTTP endpoint.

``GET /metrics`` → Prometheus text format 0.0.4; ``GET /healthz`` → ``200 ok`` while the
daemon is serving and its last scan of sysfs is recent, else ``503`` with the reason (the
DaemonSet's liveness and readiness probes use it).

Why not ``prometheus-client``: the daemon exposes a dozen series from one process, and the
text format is three lines of code; a hand-written endpoint on the daemon's own event loop
avoids a dependency and the library's extra HTTP thread (the daemon's threads stay bounded).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import defaultdict
from collections.abc import Callable
from typing import ClassVar

from vfio_dp.errors import PortError

log = logging.getLogger("vfio_dp.core")

Labels = tuple[tuple[str, str], ...]


class Metrics:
    """Counters and gauges keyed by (name, labels); rendered on demand."""

    HELP: ClassVar[dict[str, tuple[str, str]]] = {
        "vfio_dp_devices": ("gauge", "Devices (IOMMU-group units) listed, by resource and health."),
        "vfio_dp_group_conflicts": ("gauge", "IOMMU groups whose endpoints match two resources."),
        "vfio_dp_allocations_total": ("counter", "Allocate calls answered, by resource."),
        "vfio_dp_allocation_errors_total": (
            "counter",
            "Allocate/PreStartContainer calls refused, by resource and call.",
        ),
        "vfio_dp_bind_failures_total": ("counter", "bind: true attempts refused or failed."),
        "vfio_dp_binds_total": ("counter", "Devices bound to vfio-pci by bind: true."),
        "vfio_dp_kubelet_registrations_total": (
            "counter",
            "Successful Register calls to the kubelet, by resource.",
        ),
        "vfio_dp_uevents_total": ("counter", "Kernel PCI uevents received."),
        "vfio_dp_scans_total": ("counter", "Scans of sysfs, by trigger."),
        "vfio_dp_config_reloads_total": ("counter", "Configuration reloads, by result."),
        "vfio_dp_dra_devices": ("gauge", "DRA devices (IOMMU groups) in this node's pool."),
        "vfio_dp_dra_publishes_total": ("counter", "Writes of this node's ResourceSlices."),
        "vfio_dp_dra_pool_generation": ("gauge", "The pool generation last published."),
        "vfio_dp_dra_prepared_total": ("counter", "DRA claims prepared (NodePrepareResources)."),
        "vfio_dp_dra_prepare_errors_total": ("counter", "DRA claims refused by Prepare."),
        "vfio_dp_dra_unprepare_errors_total": (
            "counter",
            "DRA claims Unprepare could not finish (a group still held open, a failed restore).",
        ),
        "vfio_dp_dra_device_health": (
            "gauge",
            "1 per DRA device of the pool, labelled with its health (HEALTHY/UNHEALTHY/UNKNOWN).",
        ),
        "vfio_dp_dra_device_tainted": (
            "gauge",
            "Per DRA device: 1 while it is published with our taint (prepared, gone bad).",
        ),
        "vfio_dp_dra_health_changes_total": (
            "counter",
            "Health changes of prepared DRA devices, by the new health.",
        ),
        "vfio_dp_dra_health_streams": ("gauge", "Open DRAResourceHealth streams (kubelet)."),
        "vfio_dp_dra_claim_status_errors_total": (
            "counter",
            "ResourceClaim status.devices writes that failed (RBAC, API server).",
        ),
        "vfio_dp_dra_held_groups": (
            "gauge",
            "IOMMU groups a released claim bound that stay on vfio-pci: a process holds them open.",
        ),
    }

    def __init__(self) -> None:
        self._values: dict[str, dict[Labels, float]] = defaultdict(dict)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        series = self._values[name]
        series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        self._values[name][tuple(sorted(labels.items()))] = value

    def clear(self, name: str) -> None:
        self._values.pop(name, None)

    def get(self, name: str, **labels: str) -> float:
        return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self) -> str:
        lines: list[str] = []
        for name, (kind, text) in self.HELP.items():
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            for labels, value in sorted(self._values.get(name, {}).items()):
                lab = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
                lines.append(f"{name}{{{lab}}} {value:g}" if lab else f"{name} {value:g}")
        return "\n".join(lines) + "\n"


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


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
                status, body, ctype = "200 OK", metrics.render(), "text/plain; version=0.0.4"
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
