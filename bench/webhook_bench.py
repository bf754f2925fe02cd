"""Benchmark the admission webhook over TLS on loopback: p50/p99 latency and requests/s, and
the memory an open connection costs.

Starts the real ``vfioctl webhook --self-signed`` in a subprocess on 127.0.0.1 (a random
port), then POSTs real AdmissionReview JSON (a VMI whose gpus need translating) over HTTPS
with keep-alive connections at concurrency 1, 8 and 64. Bounded: at most ``--requests``
per level and ``--max-seconds`` per level. Target: p99 < 10 ms at concurrency 8.

Then, on the same process: its RSS (``VmRSS``) before and after 300 connections are opened
and held (200 bare TCP that never send a ClientHello, 100 idle TLS, half of them with half a
request line), per connection. Target: < 120 KiB (asyncio's own TLS costs ~300 KiB each:
see vm_translate/listener.py).

    python3 bench/webhook_bench.py [--requests 2000] [--max-seconds 15] [--strict]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
TARGET_P99_MS_AT_8 = 10.0
TARGET_KIB_PER_CONNECTION = 120

REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "bench",
        "operation": "CREATE",
        "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
        "object": {
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "default"},
            "spec": {
                "domain": {
                    "devices": {
                        "gpus": [
                            {"name": "gpu1", "deviceName": "10DE:1EB8"},
                            {"name": "gpu2", "deviceName": "devices.kubevirt.io/10de_1eb8"},
                        ],
                        "hostDevices": [{"name": "audio", "deviceName": "10de:10f8"}],
                        "disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                    },
                    "resources": {"requests": {"memory": "4Gi"}},
                }
            },
        },
    },
}


def start_server(
    cert_dir: str, extra: tuple[str, ...] = (), env_extra: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], str, ssl.SSLContext]:
    """``extra``: more webhook flags (bench/fleet.py row 4: ``--check-nodes``), ``env_extra``:
    more environment (its ``KUBECONFIG``)."""
    cmd = [
        sys.executable, "-c", "from cli.main import main; main()", "webhook", "--self-signed",
        "--address", "127.0.0.1", "--port", "0", "--cert-dir", cert_dir, "--log-level", "warning",
        # the held connections of the memory row stay open while they are measured
        "--handshake-timeout", "60", "--idle-timeout", "60", *extra,
    ]  # fmt: skip
    env = {**os.environ, "VFIOCTL_CONFIG": "", **(env_extra or {})}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # "# CA: ..."
    ca = base64.b64decode(proc.stdout.readline().strip()).decode()
    line = proc.stderr.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise SystemExit(f"webhook did not start: {line}{proc.stderr.read()}")
    url = line.split()[1]
    return proc, url, ssl.create_default_context(cadata=ca)


async def level(
    url: str, ctx: ssl.SSLContext, concurrency: int, requests: int, max_seconds: float
) -> dict[str, float]:
    body = json.dumps(REVIEW).encode()
    headers = {"Content-Type": "application/json"}
    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ctx)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> float:
            t0 = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as r:
                data = await r.read()
                if r.status != 200 or b'"patchType"' not in data:
                    raise RuntimeError(f"unexpected answer {r.status}: {data[:200]!r}")
            return time.perf_counter() - t0

        # warm up: open every connection (TLS handshakes are not what we measure)
        await asyncio.gather(*(one() for _ in range(concurrency * 2)))
        remaining = requests
        deadline = time.perf_counter() + max_seconds

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0 and time.perf_counter() < deadline:
                remaining -= 1
                latencies.append(await one())

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    n = len(latencies)
    return {
        "concurrency": concurrency,
        "requests": n,
        "p50_ms": latencies[n // 2] * 1000,
        "p99_ms": latencies[min(n - 1, int(n * 0.99))] * 1000,
        "rps": n / elapsed,
    }


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def sockets(pid: int) -> int:
    """Open sockets of ``pid``: the connections it has accepted (and its listening socket)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except OSError:
            continue
    return n


async def memory_per_connection(pid: int, url: str, ctx: ssl.SSLContext) -> float:
    """KiB of the server's RSS per open connection, 300 connections held."""
    host, port = "127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0])
    base_sockets, before = sockets(pid), rss_kib(pid)
    held: list[socket.socket | asyncio.StreamWriter] = []
    try:
        for _ in range(200):  # bare TCP: never a ClientHello
            held.append(socket.create_connection((host, port)))
        for i in range(100):  # idle TLS, and TLS with half a request line
            _, w = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
            if i % 2:
                w.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
            held.append(w)
        deadline = time.monotonic() + 30
        while sockets(pid) < base_sockets + len(held):  # until the server has accepted all
            if time.monotonic() > deadline:
                raise RuntimeError(f"the webhook accepted {sockets(pid) - base_sockets} of 300")
            await asyncio.sleep(0.05)
        return (rss_kib(pid) - before) / len(held)
    finally:
        for h in held:
            h.close()


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--requests", type=int, default=2000, help="requests per concurrency level (max)"
    )
    ap.add_argument("--max-seconds", type=float, default=15.0, help="time bound per level")
    ap.add_argument("--levels", default="1,8,64", help="concurrency levels")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="webhook-bench-") as cert_dir:
        proc, url, ctx = start_server(cert_dir)
        try:
            results = [
                asyncio.run(level(url, ctx, int(c), args.requests, args.max_seconds))
                for c in args.levels.split(",")
            ]
            per_conn = asyncio.run(memory_per_connection(proc.pid, url, ctx))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"webhook {url} (TLS, keep-alive, loopback; client and server are separate processes)")
    print(f"{'CONCURRENCY':>11}  {'REQUESTS':>8}  {'P50 MS':>7}  {'P99 MS':>7}  {'REQ/S':>8}")
    for r in results:
        print(
            f"{r['concurrency']:>11.0f}  {r['requests']:>8.0f}  {r['p50_ms']:>7.2f}  {r['p99_ms']:>7.2f}  {r['rps']:>8.0f}"
        )
    missed = False
    at8 = [r for r in results if r["concurrency"] == 8]
    if at8:
        ok = at8[0]["p99_ms"] < TARGET_P99_MS_AT_8
        print(
            f"target p99 < {TARGET_P99_MS_AT_8:g} ms at concurrency 8: {'met' if ok else 'MISSED'} ({at8[0]['p99_ms']:.2f} ms)"
        )
        missed |= not ok
    mem_ok = per_conn < TARGET_KIB_PER_CONNECTION
    print(
        f"RSS per open connection (300 held): {per_conn:.0f} KiB, target < "
        f"{TARGET_KIB_PER_CONNECTION} KiB: {'met' if mem_ok else 'MISSED'}"
    )
    missed |= not mem_ok
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
