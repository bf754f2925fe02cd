"""The webhook under abuse: hostile connections held open, and reviews under load with hostile
ones mixed in. Prints the reliability table rows of area ``webhook``.

Runs the real ``vfioctl webhook --self-signed`` in its own process on 127.0.0.1 and measures
its peak RSS (``VmHWM`` in ``/proc/<pid>/status``) against the Deployment's limit (192Mi).

0. **Open connections**: 2,000 open at once with the cap raised above that (a third each:
   bare TCP that never says hello, idle TLS, half a request's headers): RSS per connection.
1. **Hostile connections**: 2,000 clients holding connections of those three kinds for 12 s
   at the default cap (384), each re-opening 1 s (then 0 s: a flood) after the server closes
   its connection, while valid reviews are posted over one keep-alive connection (as the
   API server does) and over a fresh connection each. Every valid review must get its
   correct patch; RSS must stay under the limit.
2. **Load**: ``--reviews`` AdmissionReviews (default 100,000) over keep-alive TLS at
   concurrency 64; every tenth is hostile, in turn: garbage (not a review), oversize (2 MiB),
   JSON nested 100,000 deep, slow headers (trickled until the server closes the connection),
   slow body (trickled until the server answers 408). Each valid one must get the right
   patch; p50/p99 of the valid ones are printed.

    .venv/bin/python bench/reliability_webhook.py [--quick] [--reviews N] [--connections N]

``--quick``: 600 connections (4 s) and 2,000 reviews. ``--only open|connections|load``. The server here runs with its defaults
except ``--read-timeout 2`` in the load case (default 10 s), so slow bodies end sooner. Client
and server share the machine's (2) CPUs, so latency includes the client's own queueing.
"""

import argparse
import asyncio
import base64
import json
import os
import random
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import vfioctl_command  # noqa: E402

LIMIT_MB = 192 * 1024 * 1024 / 1e6  # the Deployment's memory limit, 192Mi, in MB
AREA = "webhook"

REVIEW: dict[str, Any] = {
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
                        "gpus": [{"name": "gpu1", "deviceName": "10DE:1EB8"}],
                        "hostDevices": [{"name": "audio", "deviceName": "10de:10f8"}],
                    }
                }
            },
        },
    },
}
EXPECTED_PATCH = [
    {"op": "replace", "path": "/spec/domain/devices/hostDevices/0/deviceName",
     "value": "devices.kubevirt.io/10de_10f8"},
    {"op": "replace", "path": "/spec/domain/devices/gpus/0/deviceName",
     "value": "devices.kubevirt.io/10de_1eb8"},
]  # fmt: skip


# ------------------------------------------------------------------------- the server


@dataclass
class Server:
    proc: subprocess.Popen[str]
    port: int
    ctx: ssl.SSLContext

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}/mutate"

    def status_mb(self, key: str) -> float:
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024 / 1e6
        raise RuntimeError(f"no {key} for pid {self.proc.pid}")

    def stop(self) -> str:
        self.proc.terminate()
        try:
            _, err = self.proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def start_server(cert_dir: str, *extra: str) -> Server:
    cmd = [
        *vfioctl_command(), "webhook", "--self-signed", "--address", "127.0.0.1",
        "--port", "0", "--cert-dir", cert_dir, "--log-level", "info", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, "VFIOCTL_CONFIG": ""},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # "# CA: ..."
    ca = base64.b64decode(proc.stdout.readline().strip()).decode()
    line = ""
    for _ in range(20):  # log lines may come first
        line = proc.stderr.readline()
        if line.startswith("serving ") or not line:
            break
    if not line.startswith("serving "):
        proc.kill()
        raise SystemExit(f"webhook did not start: {line}{proc.stderr.read()}")
    port = int(line.split()[1].rsplit(":", 1)[1].split("/")[0])
    _CA_PEM[port] = ca
    return Server(proc, port, ssl.create_default_context(cadata=ca))


_CA_PEM: dict[int, str] = {}


def valid_answer(status: int, data: bytes, uid: str) -> bool:
    if status != 200:
        return False
    try:
        response = json.loads(data)["response"]
        patch = json.loads(base64.b64decode(response["patch"]))
    except (ValueError, KeyError, TypeError):
        return False
    return response["uid"] == uid and response["allowed"] is True and patch == EXPECTED_PATCH


def body_of(uid: str) -> bytes:
    return json.dumps({**REVIEW, "request": {**REVIEW["request"], "uid": uid}}).encode()


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * q))] * 1000 if s else float("nan")


# ------------------------------------------------------------- 1. hostile connections


@dataclass
class Hold:
    opened: dict[str, int] = field(default_factory=lambda: {"tcp": 0, "tls": 0, "slow": 0})
    failed_opens: int = 0
    open_now: int = 0
    open_max: int = 0


async def _hostile(
    server: Server, kind: str, until: float, hold: Hold, reopen_after: float
) -> None:
    """One hostile client: keep a connection of ``kind`` open until ``until``."""
    first = True
    while time.monotonic() < until:
        if not first:
            await asyncio.sleep(reopen_after)
        first = False
        try:
            if kind == "tcp":
                reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            else:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", server.port, ssl=server.ctx, server_hostname="127.0.0.1"
                )
        except (TimeoutError, OSError, ssl.SSLError):
            hold.failed_opens += 1
            await asyncio.sleep(0.05)
            continue
        hold.opened[kind] += 1
        hold.open_now += 1
        hold.open_max = max(hold.open_max, hold.open_now)
        header = b"POST /mutate HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4000
        try:
            i = 0
            while time.monotonic() < until:
                if kind == "slow" and i < len(header):
                    writer.write(header[i : i + 1])
                    i += 1
                try:
                    data = await asyncio.wait_for(reader.read(1024), timeout=0.5)
                except TimeoutError:
                    continue
                if not data:
                    break  # closed by the server: open another
        except (OSError, ssl.SSLError):
            pass
        finally:
            hold.open_now -= 1
            writer.close()


@dataclass
class Stream:
    sent: int = 0
    ok: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


async def _valid_stream(server: Server, until: float, keepalive: bool) -> Stream:
    """Valid reviews, 20 a second: over one keep-alive session (as the API server does), or
    each on a fresh connection (what a client whose connection was closed must do)."""
    st = Stream()
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=server.ctx))
    try:
        while time.monotonic() < until:
            st.sent += 1
            uid = f"valid-{st.sent}"
            t0 = time.perf_counter()
            try:
                if not keepalive:
                    await session.close()
                    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=server.ctx))
                async with session.post(
                    server.url,
                    data=body_of(uid),
                    headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=5),  # the API server's timeoutSeconds
                ) as r:
                    if valid_answer(r.status, await r.read(), uid):
                        st.ok += 1
                        st.latencies.append(time.perf_counter() - t0)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                st.errors.append(f"{type(e).__name__}: {e}"[:120])
            await asyncio.sleep(0.05)
    finally:
        await session.close()
    return st


async def _attack(
    port: int, ca_file: str, connections: int, seconds: float, reopen_after: float
) -> Hold:
    """The hostile clients (run in their own process: see :func:`_connections_case`)."""
    server = Server(None, port, ssl.create_default_context(cafile=ca_file))  # type: ignore[arg-type]
    hold = Hold()
    until = time.monotonic() + seconds
    kinds = ["tcp", "tls", "slow"]
    await asyncio.gather(
        *(_hostile(server, kinds[i % 3], until, hold, reopen_after) for i in range(connections))
    )
    return hold


async def _connections_case(
    server: Server, connections: int, seconds: float, reopen_after: float
) -> dict[str, Any]:
    """Attackers in a child process, the valid client here: each has a CPU's worth of its own
    event loop, as the API server and an attacker would."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as ca:
        ca.write(_CA_PEM[server.port])
        ca.flush()
        attack = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--attack",
            f"{server.port}:{ca.name}:{connections}:{seconds}:{reopen_after}",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        until = time.monotonic() + seconds
        await asyncio.sleep(min(3.0, seconds / 3))  # let the flood build up first
        kept, fresh = await asyncio.gather(
            _valid_stream(server, until, True), _valid_stream(server, until, False)
        )
        out, _ = await attack.communicate()
    return {"hold": Hold(**json.loads(out)), "kept": kept, "fresh": fresh}


def connections_row(
    connections: int, seconds: float, reopen_after: float = 1.0
) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="webhook-rel-") as d:
        server = start_server(d)
        try:
            r = asyncio.run(_connections_case(server, connections, seconds, reopen_after))
            peak = server.status_mb("VmHWM")
        finally:
            err = server.stop()
    hold: Hold = r["hold"]
    kept: Stream = r["kept"]
    fresh: Stream = r["fresh"]
    opened = sum(hold.opened.values())
    correct = kept.ok == kept.sent > 0 and fresh.ok == fresh.sent > 0 and peak < LIMIT_MB
    failed = sorted(set(kept.errors + fresh.errors))[:3]
    server_says = [ln.split(": ", 1)[-1] for ln in err.splitlines() if "evicted at the cap" in ln]
    return {
        "area": AREA,
        "case": f"{connections:,} hostile connections held open (bare TCP, idle TLS, slow "
        f"headers), each re-opened {reopen_after:g} s after the server closes it, {seconds:g} s",
        "fault_or_load": f"{opened:,} hostile connections opened, up to {hold.open_max:,} open "
        "at once (client side)",
        "answered_correctly": correct,
        "devices_without_driver": "n/a",
        "rss_peak_mb": round(peak, 1),
        "note": f"valid reviews answered right: keep-alive {kept.ok}/{kept.sent} (p99 "
        f"{pct(kept.latencies, 0.99):.0f} ms), fresh connection each {fresh.ok}/{fresh.sent} "
        f"(p99 {pct(fresh.latencies, 0.99):.0f} ms); server keeps at most 384 open; limit "
        f"{LIMIT_MB:.0f} MB"
        + (f"; failed: {failed}" if failed else "")
        + (f"; server: {server_says[0]}" if server_says else "")
        + ("; TRACEBACK in the server log" if "Traceback" in err else ""),
    }


async def _open_all(server: Server, n: int) -> tuple[dict[str, float], Stream]:
    """Open ``n`` connections (a third each: bare TCP, idle TLS, half a request's headers),
    hold them, and measure the server's RSS after each third; then one valid review."""
    held: list[Any] = []
    per: dict[str, float] = {}
    sem = asyncio.Semaphore(32)

    async def one(kind: str) -> None:
        async with sem:
            if kind == "tcp":
                _, w = await asyncio.open_connection("127.0.0.1", server.port)
            else:
                _, w = await asyncio.open_connection(
                    "127.0.0.1", server.port, ssl=server.ctx, server_hostname="127.0.0.1"
                )
                if kind == "slow":
                    w.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
            held.append(w)

    try:
        await asyncio.sleep(0.5)
        before = server.status_mb("VmRSS")
        for kind in ("tcp", "tls", "slow"):
            k = n // 3
            await asyncio.gather(*(one(kind) for _ in range(k)))
            await asyncio.sleep(0.5)
            now = server.status_mb("VmRSS")
            per[kind] = (now - before) * 1e3 / k  # KB
            before = now
        valid = await _valid_stream(server, time.monotonic() + 0.5, keepalive=False)
    finally:
        for w in held:
            w.close()
    return per, valid


def open_connections_row(n: int) -> dict[str, object]:
    """``n`` connections really open at once (cap raised above ``n``, long timeouts): what
    each costs. asyncio's own TLS (before this change) cost 280-310 KB each."""
    with tempfile.TemporaryDirectory(prefix="webhook-rel-") as d:
        server = start_server(
            d, "--max-connections", str(n + 100), "--handshake-timeout", "120",
            "--idle-timeout", "120",
        )  # fmt: skip
        try:
            per, valid = asyncio.run(_open_all(server, n))
            peak = server.status_mb("VmHWM")
        finally:
            server.stop()
    return {
        "area": AREA,
        "case": f"{n:,} connections open at once (--max-connections raised above it): a third "
        "bare TCP, idle TLS, half a request's headers",
        "fault_or_load": "held open, timeouts 120 s",
        "answered_correctly": valid.ok == valid.sent > 0 and peak < LIMIT_MB,
        "devices_without_driver": "n/a",
        "rss_peak_mb": round(peak, 1),
        "note": "RSS per connection: "
        + ", ".join(f"{k} {v:.0f} KB" for k, v in per.items())
        + f" (asyncio's own TLS: 280-310 KB each); valid reviews meanwhile {valid.ok}/"
        f"{valid.sent}; limit {LIMIT_MB:.0f} MB",
    }


# ------------------------------------------------------------------------- 2. load


@dataclass
class LoadStats:
    valid_sent: int = 0
    valid_ok: int = 0
    latencies: list[float] = field(default_factory=list)
    hostile: dict[str, list[int]] = field(default_factory=dict)  # kind -> [sent, as expected]
    wrong: list[str] = field(default_factory=list)

    def count(self, kind: str, as_expected: bool, what: str) -> None:
        sent_ok = self.hostile.setdefault(kind, [0, 0])
        sent_ok[0] += 1
        sent_ok[1] += as_expected
        if not as_expected and len(self.wrong) < 5:
            self.wrong.append(f"{kind}: {what}")


DEEP = b"[" * 100_000 + b"]" * 100_000
GARBAGE = [
    b"{{{",
    b'{"kind": "Pod", "apiVersion": "v1"}',
    b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": 7}',
    json.dumps({**REVIEW, "request": {"object": {}}}).encode(),
    bytes(range(256)),
]


async def _slow(server: Server, stats: LoadStats, body: bool) -> None:
    """Trickle a request a byte every 0.2 s: its headers (the server must close the connection
    after --idle-timeout) or, headers sent, its body (the server must answer 408 after
    --read-timeout)."""
    kind = "slow body" if body else "slow headers"
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=server.ctx, server_hostname="127.0.0.1"
        )
    except (OSError, ssl.SSLError) as e:
        stats.count(kind, False, f"could not connect: {e}")
        return
    head = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if body:
        writer.write(head + b"Content-Length: 400\r\n\r\n")
        trickle = b"{" + b" " * 398 + b"}"
    else:
        trickle = head + b"X-Slow: " + b"a" * 400
    answer = b""
    try:
        for byte in trickle:
            writer.write(bytes([byte]))
            try:
                data = await asyncio.wait_for(reader.read(1024), timeout=0.2)
            except TimeoutError:
                continue
            answer += data
            if not data or answer:
                break
    except (OSError, ssl.SSLError):
        pass
    finally:
        writer.close()
    if body:
        stats.count(kind, answer.startswith(b"HTTP/1.1 408"), f"answer {answer[:60]!r}")
    else:
        stats.count(kind, answer == b"", f"not closed by the server: {answer[:60]!r}")


async def _load(server: Server, reviews: int, concurrency: int) -> LoadStats:
    stats = LoadStats()
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=server.ctx)
    slow_tasks: set[asyncio.Task[None]] = set()
    next_i = 0
    async with aiohttp.ClientSession(connector=connector) as session:

        async def post(data: bytes, extra: dict[str, str] | None = None) -> tuple[int, bytes]:
            async with session.post(
                server.url, data=data, headers={**headers, **(extra or {})}
            ) as r:
                return r.status, await r.read()

        async def one(i: int) -> None:
            if i % 10 != 9:
                uid = f"r{i}"
                t0 = time.perf_counter()
                stats.valid_sent += 1
                try:
                    status, data = await post(body_of(uid))
                except (TimeoutError, aiohttp.ClientError, OSError) as e:
                    stats.wrong.append(f"valid {uid}: {type(e).__name__}: {e}")
                    return
                if valid_answer(status, data, uid):
                    stats.valid_ok += 1
                    stats.latencies.append(time.perf_counter() - t0)
                elif len(stats.wrong) < 5:
                    stats.wrong.append(f"valid {uid}: {status} {data[:200]!r}")
                return
            kind = ("garbage", "oversize", "deep", "slow headers", "slow body")[(i // 10) % 5]
            try:
                if kind == "garbage":
                    status, data = await post(random.choice(GARBAGE))
                    stats.count(
                        kind, status == 400 and b'"error"' in data, f"{status} {data[:100]!r}"
                    )
                elif kind == "oversize":
                    big = b"x" * (2 * 1024 * 1024)
                    status, data = await post(big)
                    stats.count(kind, status == 413, f"{status} {data[:100]!r}")
                elif kind == "deep":
                    status, data = await post(DEEP)
                    stats.count(
                        kind, status == 400 and b"nested" in data, f"{status} {data[:100]!r}"
                    )
                else:
                    while len(slow_tasks) >= concurrency:  # slow clients: at most 64 at once
                        await asyncio.wait(slow_tasks, return_when=asyncio.FIRST_COMPLETED)
                    t = asyncio.create_task(_slow(server, stats, kind == "slow body"))
                    slow_tasks.add(t)
                    t.add_done_callback(slow_tasks.discard)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                # the server may close an oversize upload before reading it all
                stats.count(kind, kind == "oversize", f"{type(e).__name__}: {e}")

        async def worker() -> None:
            nonlocal next_i
            while next_i < reviews:
                i = next_i
                next_i += 1
                await one(i)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        if slow_tasks:
            await asyncio.gather(*slow_tasks)
    return stats


def load_rows(reviews: int, concurrency: int = 64) -> list[dict[str, object]]:
    with tempfile.TemporaryDirectory(prefix="webhook-rel-") as d:
        server = start_server(d, "--read-timeout", "2")
        t0 = time.perf_counter()
        try:
            stats = asyncio.run(_load(server, reviews, concurrency))
            peak = server.status_mb("VmHWM")
        finally:
            err = server.stop()
        elapsed = time.perf_counter() - t0
    hostile_sent = sum(s for s, _ in stats.hostile.values())
    traceback = "Traceback" in err
    correct = (
        stats.valid_ok == stats.valid_sent
        and all(s == ok for s, ok in stats.hostile.values())
        and peak < LIMIT_MB
        and not traceback
    )
    rows: list[dict[str, object]] = [
        {
            "area": AREA,
            "case": f"{reviews:,} AdmissionReviews over keep-alive TLS at concurrency "
            f"{concurrency}, one in ten hostile",
            "fault_or_load": f"{stats.valid_sent:,} valid + {hostile_sent:,} hostile "
            f"(garbage, 2 MiB oversize, 100,000-deep JSON, slow headers, slow body) in "
            f"{elapsed:.0f} s",
            "answered_correctly": correct,
            "devices_without_driver": "n/a",
            "rss_peak_mb": round(peak, 1),
            "note": f"{stats.valid_ok:,}/{stats.valid_sent:,} valid answered with the right "
            f"patch; p50 {pct(stats.latencies, 0.5):.1f} ms, p99 "
            f"{pct(stats.latencies, 0.99):.1f} ms; limit {LIMIT_MB:.0f} MB"
            + (f"; wrong: {stats.wrong}" if stats.wrong else "")
            + ("; TRACEBACK in the server log" if traceback else ""),
        }
    ]
    expected = {
        "garbage": "HTTP 400 naming what is wrong",
        "oversize": "HTTP 413 before the body is read",
        "deep": "HTTP 400 'nested more than 200 levels' (was 500 + RecursionError)",
        "slow headers": "the connection closed by the server after --idle-timeout",
        "slow body": "HTTP 408 after --read-timeout",
    }
    for kind, (sent, ok) in stats.hostile.items():
        rows.append(
            {
                "area": AREA,
                "case": f"hostile review: {kind}",
                "fault_or_load": f"{sent:,} sent during the load run",
                "answered_correctly": sent == ok,
                "devices_without_driver": "n/a",
                "rss_peak_mb": "n/a",
                "note": f"{ok:,}/{sent:,} got {expected[kind]}",
            }
        )
    return rows


# ------------------------------------------------------------------------- entry points


def rows(
    quick: bool = False, reviews: int | None = None, connections: int | None = None
) -> list[dict[str, object]]:
    """The ``webhook`` rows of the reliability table (quick: smaller counts)."""
    n_conn = connections or (600 if quick else 2000)
    hold = 4.0 if quick else 12.0
    n_reviews = reviews or (2000 if quick else 100_000)
    return [
        open_connections_row(n_conn),
        connections_row(n_conn, hold, reopen_after=1.0),
        connections_row(n_conn, hold, reopen_after=0.0),
        *load_rows(n_reviews),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="600 connections, 2,000 reviews")
    ap.add_argument("--reviews", type=int, default=None, help="reviews in the load case")
    ap.add_argument("--connections", type=int, default=None, help="hostile connections")
    ap.add_argument("--only", choices=["open", "connections", "load"], default=None)
    ap.add_argument("--attack", help=argparse.SUPPRESS)  # internal: the hostile clients
    args = ap.parse_args()
    if args.attack:
        port, ca_file, n, secs, pause = args.attack.split(":")
        hold = asyncio.run(_attack(int(port), ca_file, int(n), float(secs), float(pause)))
        print(json.dumps(hold.__dict__))
        return 0
    if args.only == "open":
        result = [open_connections_row(args.connections or (600 if args.quick else 2000))]
    elif args.only == "connections":
        n = args.connections or (600 if args.quick else 2000)
        secs = 4.0 if args.quick else 12.0
        result = [connections_row(n, secs, 1.0), connections_row(n, secs, 0.0)]
    elif args.only == "load":
        result = load_rows(args.reviews or (2000 if args.quick else 100_000))
    else:
        result = rows(args.quick, args.reviews, args.connections)
    keys = ("case", "fault_or_load", "answered_correctly", "rss_peak_mb", "note")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in result:
        print("| " + " | ".join(str(r[k]) for k in keys) + " |")
    return 0 if all(r["answered_correctly"] is not False for r in result) else 1


if __name__ == "__main__":
    sys.exit(main())
