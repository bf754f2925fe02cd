"""Row 4's instruments, each in a process of its own (bench/fleet.py ``webhook_row``), so the
load generator and the API-server stand-in never share a GIL with each other or with the
webhook they measure:

``drive``    the load generator: ``--connections`` keep-alive TLS connections (raw asyncio
             streams: one pre-built request, the answer's Content-Length read; no HTTP
             client library on the measured path), each sending its next review when the
             previous answer is in (closed loop), or at ``--rate`` reviews/s over all
             connections (open loop: each review's latency is counted from the moment it
             was due, so a late send is counted, not hidden). Prints one JSON line: every
             latency (ms), the elapsed seconds and this process's CPU seconds.
``standin``  the API-server stand-in (tests/dra/apiserver_standin.py) seeded with ``--nodes``
             Nodes of ``--devices`` device-plugin devices each, a DeviceClass of ours and one
             ResourceSlice of ``--devices`` DRA devices per node; prints its kubeconfig path,
             then on each line read from stdin one JSON line of the GETs it answered by path
             and its CPU seconds; exits at EOF.
``run_wrk``  the closed loop's peer: ``wrk`` (C, Debian's package; scripts/setup.sh installs
             it) with bench/webhook_wrk.lua: each of ``--connections`` keep-alive TLS
             connections POSTs the review when its previous answer is in, every answer
             checked (200 and a patch); it stops after ``reviews``. The Python drivers
             spend about as much CPU per review as the webhook itself: on 2 cores they
             took a share of the cores the closed loop measures.
``trivial``  the floor: an aiohttp TLS server with the same certificate answering every POST
             with the same fixed AdmissionReview (no parsing, no lookups).

    python3 bench/webhook_load.py drive --url URL --ca CA.crt --connections 32 --reviews 10000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import ssl
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.webhook_bench import REVIEW  # noqa: E402

DRIVER = "vfio.dra.vfio-dp.io"
DRA_RES, DP_RES = "devices.kubevirt.io/10de_1eb8", "devices.kubevirt.io/10de_10f8"


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> None:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    body = await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200") or b'"patchType"' not in body:
        raise RuntimeError(f"unexpected answer: {head[:60]!r} {body[:200]!r}")


async def drive(
    url: str, ca: str, connections: int, reviews: int, rate: float, max_seconds: float
) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 443
    ctx = ssl.create_default_context(cafile=ca)
    body = json.dumps(REVIEW).encode()
    request = (
        f"POST {parts.path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    conns = [
        await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
        for _ in range(connections)
    ]
    for r, w in conns:  # warm-up: each connection answered twice
        await _one(r, w, request)
        await _one(r, w, request)
    latencies: list[float] = []
    start = time.perf_counter()
    deadline = start + max_seconds
    cpu0 = cpu_s()

    async def closed(r: asyncio.StreamReader, w: asyncio.StreamWriter, share: int) -> None:
        for _ in range(share):
            if time.perf_counter() > deadline:
                return
            t0 = time.perf_counter()
            await _one(r, w, request)
            latencies.append(time.perf_counter() - t0)

    async def paced(r: asyncio.StreamReader, w: asyncio.StreamWriter, first: int) -> None:
        for i in range(first, reviews, connections):
            due = start + i / rate
            if due > deadline:
                return
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await _one(r, w, request)
            latencies.append(time.perf_counter() - due)

    if rate > 0:
        await asyncio.gather(*(paced(r, w, k) for k, (r, w) in enumerate(conns)))
    else:
        shares = [reviews // connections + (k < reviews % connections) for k in range(connections)]
        await asyncio.gather(*(closed(r, w, s) for (r, w), s in zip(conns, shares, strict=True)))
    elapsed = time.perf_counter() - start
    cpu = cpu_s() - cpu0
    for _, w in conns:
        w.close()
    return {
        "latencies_ms": [round(x * 1000, 3) for x in latencies],
        "elapsed": elapsed,
        "cpu": cpu,
    }


def standin(directory: str, nodes: int, devices: int) -> None:
    from tests.dra.apiserver_standin import DEVICE_CLASSES, NODES, SLICES, ApiServerStandin
    from vfio_dp.dra.deviceclasses import selector_expression

    api = ApiServerStandin(directory)
    api.start()
    api.seed(DEVICE_CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "vfio-10de-1eb8"},
        "spec": {"extendedResourceName": DRA_RES,
                 "selectors": [{"cel": {"expression": selector_expression(DRIVER, DRA_RES)}}]},
    })  # fmt: skip
    for i in range(nodes):
        node = f"node-{i:03d}"
        api.seed(NODES, {"metadata": {"name": node},
                         "status": {"allocatable": {"cpu": "64", DP_RES: str(devices)}}})  # fmt: skip
        api.seed(SLICES, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}-0"},
            "spec": {"driver": DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": f"pci-0000-{j + 1:02x}-00-0",
                                  "attributes": {"resourceName": {"string": DRA_RES}}}
                                 for j in range(devices)]},
        })  # fmt: skip
    print(api.kubeconfig, flush=True)
    try:
        for _ in sys.stdin:
            gets = Counter(r.path for r in list(api.requests) if r.method == "GET")
            print(json.dumps({"gets": gets, "cpu": cpu_s()}), flush=True)
    finally:
        api.stop()


def trivial(cert: str, key: str) -> None:
    from aiohttp import web

    answer = json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": "bench", "allowed": True, "patchType": "JSONPatch", "patch": "W10="},
    }).encode()  # fmt: skip

    async def mutate(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=answer, content_type="application/json")

    async def main() -> None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(cert, key)
        app = web.Application()
        app.router.add_post("/mutate", mutate)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        print(f"https://127.0.0.1:{port}/mutate", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def run_drivers(
    url: str,
    ca: str,
    connections: int,
    reviews: int,
    rate: float = 0.0,
    procs: int = 2,
    max_seconds: float = 600.0,
) -> dict[str, float]:
    """``connections`` split over ``procs`` drive processes (``rate`` too): p50/p99/max
    (ms), reviews/s, and the drivers' CPU per review (ms) and busiest driver's share of a
    core (near 100 %: the driver, not the server, would be the bottleneck)."""
    import subprocess

    cmds = [
        [sys.executable, __file__, "drive", "--url", url, "--ca", ca,
         "--connections", str(connections // procs + (k < connections % procs)),
         "--reviews", str(reviews // procs + (k < reviews % procs)),
         "--rate", str(rate / procs), "--max-seconds", str(max_seconds)]
        for k in range(procs)
    ]  # fmt: skip
    running = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True) for c in cmds]
    outs = []
    for p in running:
        out, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"a drive process failed ({p.returncode})")
        outs.append(json.loads(out))
    lat = sorted(x for o in outs for x in o["latencies_ms"])
    n = len(lat)
    elapsed = max(o["elapsed"] for o in outs)
    return {
        "reviews": n,
        "p50_ms": lat[n // 2],
        "p99_ms": lat[min(n - 1, int(n * 0.99))],
        "max_ms": lat[-1],
        "mean_ms": sum(lat) / n,
        "rps": n / elapsed,
        "elapsed": elapsed,
        "driver_cpu_ms": 1000 * sum(o["cpu"] for o in outs) / n,
        "driver_busiest": max(o["cpu"] / o["elapsed"] for o in outs),
    }


def run_wrk(url: str, connections: int, reviews: int, max_seconds: float = 600.0) -> dict[str, float]:
    """``reviews`` reviews at ``connections`` connections in a closed loop from ``wrk -t 2``
    (bench/webhook_wrk.lua): the keys of :func:`run_drivers`. Raises when wrk is missing
    (``apt-get install wrk``; scripts/setup.sh) or any answer was not a 200 with a patch."""
    import shutil
    import subprocess
    import tempfile

    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError(
            "row 4's closed loop needs wrk (Debian package wrk; bash scripts/setup.sh installs it)"
        )
    threads = min(2, connections)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as body:
        body.write(json.dumps(REVIEW))
        body.flush()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        wrk_proc = subprocess.Popen(
            [wrk, "-t", str(threads), "-c", str(connections), "-d", f"{max_seconds:.0f}s",
             "--timeout", "10s", "-s", str(Path(__file__).with_name("webhook_wrk.lua")), url,
             "--", body.name, str(-(-reviews // threads))],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert wrk_proc.stdout is not None
        lines, stopped = [], 0
        for line in wrk_proc.stdout:
            stopped += line.startswith("stopped")
            if stopped == threads:  # each thread answered its share: end the -d sleep
                wrk_proc.send_signal(signal.SIGINT)
                stopped = -1
            lines.append(line)
        err = wrk_proc.stderr.read() if wrk_proc.stderr else ""
        wrk_proc.wait()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [ln for ln in lines if ln.startswith("{")]
    if wrk_proc.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({wrk_proc.returncode}): {(err or ''.join(lines))[-300:]}")
    got = json.loads(lines[-1])
    if got["bad"] or got["errors"]:
        raise RuntimeError(f"wrk: {got['bad']} answers without a patch, {got['errors']} errors")
    n, elapsed = got["requests"], got["duration_us"] / 1e6
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {
        "reviews": n,
        "p50_ms": got["p50_us"] / 1000,
        "p99_ms": got["p99_us"] / 1000,
        "max_ms": got["max_us"] / 1000,
        "mean_ms": got["mean_us"] / 1000,
        "rps": n / elapsed,
        "elapsed": elapsed,
        "driver_cpu_ms": 1000 * cpu / n,
        "driver_busiest": cpu / elapsed / threads,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("drive")
    d.add_argument("--url", required=True)
    d.add_argument("--ca", required=True)
    d.add_argument("--connections", type=int, default=64)
    d.add_argument("--reviews", type=int, default=10_000)
    d.add_argument("--rate", type=float, default=0.0, help="reviews/s (0: closed loop)")
    d.add_argument("--max-seconds", type=float, default=600.0)
    s = sub.add_parser("standin")
    s.add_argument("--dir", required=True)
    s.add_argument("--nodes", type=int, default=100)
    s.add_argument("--devices", type=int, default=64)
    t = sub.add_parser("trivial")
    t.add_argument("--cert", required=True)
    t.add_argument("--key", required=True)
    args = ap.parse_args()
    if args.what == "drive":
        out = asyncio.run(
            drive(args.url, args.ca, args.connections, args.reviews, args.rate, args.max_seconds)
        )
        print(json.dumps(out))
    elif args.what == "standin":
        os.makedirs(args.dir, exist_ok=True)
        standin(args.dir, args.nodes, args.devices)
    else:
        trivial(args.cert, args.key)
    return 0


if __name__ == "__main__":
    sys.exit(main())
