"""``/metrics`` as Prometheus reads it, and ``/healthz`` as the kubelet's probes see it.

The series names are taken from the code itself (every ``inc``/``set``/``observe``/``time``
call and the claim path's ``metric`` callbacks whose first argument is a ``vfio_dp_*``
literal), then a real daemon's real endpoint is scraped over HTTP and parsed with
``prometheus_client.parser``: a name the code counts but the endpoint leaves out (as
``vfio_dp_resync_checks_total`` once was) fails here.
"""

from __future__ import annotations

import ast
import asyncio
import os
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.deviceplugin.conftest import NIC, NIC_ID
from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.sysfs_tree import SysfsTree
from tests.waiting import wait_until_async
from vfio_dp.core.metrics import Metrics
from vfio_dp.deviceplugin.app import Daemon, Options

ROOT = Path(__file__).resolve().parents[2]
#: the calls that name a series first (Metrics' methods, the claim path's callbacks)
CALLS = {"inc", "set", "observe", "time", "clear", "metric", "_metric"}


def series_named_in(package: str) -> set[str]:
    """Every ``vfio_dp_*`` literal passed first to one of :data:`CALLS` in ``package``."""
    out: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        if "_pb" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            first = node.args[0]
            if (
                called in CALLS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and first.value.startswith("vfio_dp_")
            ):
                out.add(first.value)
    return out


def families(text: str) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    """Parsed exposition: every family under the names a query uses (a counter's family is
    ``x`` for the series ``x_total``), with its samples."""
    out: dict[str, list[tuple[str, dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        samples = [(s.name, s.labels, s.value) for s in fam.samples]
        out[fam.name] = samples
        if fam.type == "counter":
            out[fam.name + "_total"] = samples
    return out


def sample(
    fams: dict[str, list[tuple[str, dict[str, str], float]]], name: str, **labels: str
) -> float | None:
    for family in fams.values():
        for n, lab, value in family:
            if n == name and lab == labels:
                return value
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return r.headers["Content-Type"], r.read().decode()


def test_the_code_names_its_series_and_each_is_declared_once() -> None:
    node = series_named_in("vfio_dp")
    # the scan finds the call sites (a broken scan would make the next test vacuous)
    assert {"vfio_dp_resync_checks_total", "vfio_dp_dra_prepared_total"} <= node
    assert len(node) >= 25, sorted(node)
    assert node <= set(Metrics.HELP), sorted(node - set(Metrics.HELP))


async def test_every_series_the_code_names_is_on_the_daemons_metrics_endpoint(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin
) -> None:
    port = free_port()
    daemon = Daemon(
        Options(
            root=str(tree.root),
            kubelet_dir=kdir,
            resync=0.1,
            metrics_port=port,
            metrics_host="127.0.0.1",
            uevents=False,
        )
    )
    await daemon.start()
    try:
        await kubelet.wait_for("the NIC listed", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"})
        await kubelet.allocate(NIC, [NIC_ID])
        await wait_until_async(
            lambda: daemon.metrics.get("vfio_dp_resync_checks_total", result="unchanged") >= 1,
            what="an idle resync",
        )
        ctype, text = await asyncio.to_thread(scrape, port)
    finally:
        await daemon.stop()
    assert ctype.startswith("text/plain; version=0.0.4")
    fams = families(text)
    missing = sorted(n for n in series_named_in("vfio_dp") if n not in fams)
    assert not missing, f"counted by the code, not on /metrics: {missing}"
    assert (sample(fams, "vfio_dp_resync_checks_total", result="unchanged") or 0) >= 1
    assert sample(fams, "vfio_dp_allocations_total", resource=NIC) == 1
    assert sample(fams, "vfio_dp_allocate_seconds_count", resource=NIC) == 1
    assert sample(fams, "vfio_dp_allocate_seconds_bucket", le="+Inf", resource=NIC) == 1
    # no _created series (prometheus_client.disable_created_metrics, see docs/install.md)
    assert not [n for f in fams.values() for n, _, _ in f if n.endswith("_created")]


def get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


async def test_healthz_fails_while_a_kubelet_socket_stays_unanswered_past_the_window(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin
) -> None:
    """A socket of ours that cannot be served again (a directory put at its path) makes
    /healthz 503 once it has been unanswered for longer than the window (60 s in production,
    0.5 s here), naming the path and why; served again, /healthz is 200 again."""
    port = free_port()
    daemon = Daemon(
        Options(
            root=str(tree.root),
            kubelet_dir=kdir,
            resync=0.2,
            metrics_port=port,
            metrics_host="127.0.0.1",
            uevents=False,
        )
    )
    daemon.socket_window = 0.5
    await daemon.start()
    try:
        await kubelet.wait_for("the NIC listed", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"})
        assert await asyncio.to_thread(get, port, "/healthz") == (200, "ok\n")
        path = daemon.endpoints[NIC].path
        os.unlink(path)
        os.mkdir(path)  # what restore refuses (never deletes): the socket stays unserved
        await wait_until_async(
            lambda: daemon.endpoints[NIC].socket.problem != "", what="a failed restore"
        )
        # within the window: still healthy (a kubelet restart is not our failure)
        status, _ = await asyncio.to_thread(get, port, "/healthz")
        down = daemon.endpoints[NIC].socket.down_since
        assert down is not None
        if time.monotonic() - down < 0.4:
            assert status == 200

        async def unhealthy() -> bool:
            return (await asyncio.to_thread(get, port, "/healthz"))[0] == 503

        await wait_until_async(unhealthy, what="/healthz 503")
        status, body = await asyncio.to_thread(get, port, "/healthz")
        assert status == 503 and f"{path} is not served for" in body and "is a directory" in body
        os.rmdir(path)
        await wait_until_async(lambda: os.path.exists(path), what="the socket served again")

        async def healthy() -> bool:
            return await asyncio.to_thread(get, port, "/healthz") == (200, "ok\n")

        await wait_until_async(healthy, what="/healthz 200 again")
    finally:
        await daemon.stop()
