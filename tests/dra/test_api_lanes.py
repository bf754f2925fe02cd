"""API servers that trickle or shout (issue 37 items 11-13, issue 33 item 2), against a real
HTTP server on 127.0.0.1 and the real ``kubernetes`` client.

- a call ends by its overall deadline even when the server sends one byte per 0.3 s (urllib3's
  read timeout restarts with every byte): the client hangs up then, and its thread is free;
- trickling DeviceClass reads and claim-status writes fill their own lanes, never the claim
  reads of a later Prepare;
- a 5 MB error body is never a 5 MB error (or log line).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra.test_client_config import spawn_plugin
from tests.dra.topologies import dra_host
from vfio_dp.host import Host

#: a liveness guard so that the old code fails instead of hanging; never a performance target
GUARD = 60.0
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims/"

Route = Callable[[str, str], tuple[str, int, bytes]]  # (method, path) -> (how, code, body)


class PeerServer:
    """HTTP/1.1 on 127.0.0.1, one thread per connection. ``route(method, path)`` says how
    to answer: ``fast`` (at once), or ``trickle`` (the answer's headers promise a 1 MB body
    and every byte comes ``interval`` seconds after the last). Records each connection's
    life: when the client hung up on a trickle (``hangups``)."""

    def __init__(self, route: Route, interval: float = 0.3) -> None:
        self.route = route
        self.interval = interval
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.cond = threading.Condition()
        self.trickling = 0  # trickles under way now
        self.hangups: list[float] = []  # monotonic times the client closed a trickle
        self.requests: list[tuple[str, str]] = []
        self.closed = False
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        f = conn.makefile("rb")
        with contextlib.suppress(OSError, ValueError):
            while not self.closed:
                line = f.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                length = 0
                while (h := f.readline()) not in (b"\r\n", b""):
                    if h.lower().startswith(b"content-length:"):
                        length = int(h.split(b":")[1])
                if length:
                    f.read(length)
                with self.cond:
                    self.requests.append((method, path))
                    self.cond.notify_all()
                how, code, body = self.route(method, path)
                if how == "fast":
                    conn.sendall(
                        f"HTTP/1.1 {code} X\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    continue
                self._trickle(conn)
                return

    def _trickle(self, conn: socket.socket) -> None:
        answer = (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{"
        )
        with self.cond:
            self.trickling += 1
            self.cond.notify_all()
        try:
            for i in range(1_000_000):
                conn.sendall(answer[i : i + 1] or b" ")
                # a peer that hung up shows as readable with nothing to read
                readable = (
                    conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                    if _ready(conn, self.interval)
                    else None
                )
                if readable == b"":
                    break
        except OSError:
            pass
        finally:
            with self.cond:
                self.trickling -= 1
                if not self.closed:
                    self.hangups.append(time.monotonic())
                self.cond.notify_all()

    def wait(self, what: str, check: Callable[[PeerServer], bool]) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: check(self), timeout=GUARD), what

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for c in self.conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()


def _ready(conn: socket.socket, timeout: float) -> bool:
    import select

    r, _, _ = select.select([conn], [], [], timeout)
    return bool(r)


def _claim(name: str) -> bytes:
    return json.dumps(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
            "spec": {},
        }
    ).encode()


def _client(url: str) -> Any:
    import kubernetes.client as k8s

    cfg = k8s.Configuration()
    cfg.host = url
    cfg.retries = 0
    return k8s.ApiClient(cfg)


@pytest.fixture
def servers() -> Iterator[list[PeerServer]]:
    made: list[PeerServer] = []
    yield made
    for s in made:
        s.close()


def test_a_trickling_answer_is_cut_off_at_the_deadline(servers: list[PeerServer]) -> None:
    """One byte every 0.3 s never trips urllib3's 2 s read timeout: the call's overall
    deadline (2 s) ends it -- the caller hears so at 2 s, and the client hangs up then, so its
    thread and connection are free (before: the caller heard at 2 s, the thread read on)."""
    from vfio_dp.dra.apiserver.publisher import claim_reader

    srv = PeerServer(lambda m, p: ("trickle", 200, b""))
    servers.append(srv)
    read = claim_reader(_client(srv.url), timeout=2.0)

    async def scenario() -> str:
        try:
            await asyncio.wait_for(read("default", "c"), GUARD)
        except Exception as e:
            return str(e)
        return "answered"

    t0 = time.monotonic()
    err = asyncio.run(scenario())
    took = time.monotonic() - t0
    assert "reading ResourceClaim default/c" in err and "did not answer within 2 s" in err, err
    assert took < 2.0 + 3.0, took  # at the deadline (slack for a loaded machine)
    srv.wait("the client hung up on the trickle", lambda s: len(s.hangups) == 1)
    assert srv.hangups[0] - t0 < 2.0 + 3.0


async def test_a_caller_cancelled_as_its_call_ends_is_cancelled_all_the_same() -> None:
    """A stop cancels the publisher's loop while it awaits a lane; when the call has just
    ended (its answer queued for the event loop), the cancel still wins: the loop ends, so
    the stop that awaits it returns. (Python 3.11's ``asyncio.wait_for`` returned the answer
    and lost the cancel: the loop went on waiting for work, the stop waited for it for ever.)"""
    from concurrent.futures import Future, ThreadPoolExecutor

    from vfio_dp.dra.apiserver.client import Lane

    lane = Lane(_client("http://127.0.0.1:1"), "test", 1)
    submitted: list[Future[Any]] = []

    class Recording(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Future[Any]:
            fut = super().submit(*args, **kwargs)
            submitted.append(fut)
            return fut

    lane._executor = Recording(1)
    release, chained = threading.Event(), threading.Event()
    caller = asyncio.create_task(lane.run("a call", release.wait))
    try:
        while not submitted:
            await asyncio.sleep(0)
        # after the event loop's own callback, which queues the answer for the loop
        submitted[0].add_done_callback(lambda _f: chained.set())
        release.set()
        assert chained.wait(GUARD)  # the event loop is held here: the answer waits in its queue
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, GUARD)
    finally:
        release.set()
        lane.close()


def _plugin(tmp_path: Path, url: str) -> Any:
    """A DRA plugin (not started) whose API client talks to ``url``."""
    from vfio_dp.dra.options import DraOptions
    from vfio_dp.dra.plugin import DraPlugin

    tree = dra_host(tmp_path / "host")
    options = DraOptions(
        node_name="node-a", driver_name="vfio.example.com",
        registry_dir=str(tmp_path / "reg"), plugins_dir=str(tmp_path / "plugins"),
        cdi_dir=str(tmp_path / "cdi"), root=str(tree.root), metrics_port=0, uevents=False,
    )  # fmt: skip
    return DraPlugin(options, _client(url), host=Host(tree.root))


def test_trickling_class_reads_and_status_writes_never_delay_a_claim_read(
    servers: list[PeerServer], tmp_path: Path
) -> None:
    """Issue 37 item 12: eight DeviceClass GETs and eight claim-status writes against a
    server that trickles them fill their own lanes; a later Prepare's claim read is answered
    at once (before: one pool of eight threads, full, and the read failed "did not answer
    within 10 s")."""

    def route(method: str, path: str) -> tuple[str, int, bytes]:
        if path.startswith(CLAIMS + "fast"):
            return "fast", 200, _claim("fast")
        return "trickle", 200, b""  # DeviceClasses, and the status writes' claim GETs

    srv = PeerServer(route)
    servers.append(srv)
    plugin = _plugin(tmp_path, srv.url)

    async def scenario() -> tuple[float, Any]:
        slow = [asyncio.ensure_future(plugin.claims.read_class(f"class-{i}")) for i in range(8)]
        for i in range(8):  # claims unprepared: their entries are removed (GET, then PUT)
            plugin.status.claim_changed("default", f"slow-{i}", f"u{i}")
        loop = asyncio.get_running_loop()
        # eight threads busy trickling: all of the old shared pool; here the class lane's
        # four and the status feed's four, the rest of their calls queued behind them
        await loop.run_in_executor(None, srv.wait, "8 trickles", lambda s: s.trickling >= 8)
        t0 = time.monotonic()
        got = await asyncio.wait_for(plugin.claims.read_claim("default", "fast"), GUARD)
        took = time.monotonic() - t0
        for t in slow:
            t.cancel()
        await asyncio.gather(*slow, return_exceptions=True)
        await plugin.status.close(grace=0)
        return took, got

    try:
        took, got = asyncio.run(scenario())
    finally:
        lanes = getattr(plugin, "api", None)
        if lanes is not None:
            lanes.close()
        srv.close()
    assert isinstance(got, dict) and got["metadata"]["name"] == "fast"
    assert took < 3.0, took  # at once: no queue behind the trickles (slack for load)


def test_a_5mb_error_body_is_a_bounded_error(servers: list[PeerServer], tmp_path: Path) -> None:
    """Issue 37 item 13: a server answering 500 with a 5 MB Status message (or 5 MB of
    non-JSON) gives errors of a few KB that say how long the rest was: the claim read's,
    the status writer's and the publisher's (whose line the log gets)."""
    from vfio_dp.dra.apiserver.claim_status import ClaimStatusWriter, StatusError
    from vfio_dp.dra.apiserver.publisher import PublishError, SlicePublisher, claim_reader

    huge = json.dumps(
        {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
         "reason": "InternalError", "message": "x" * (5 << 20)}
    ).encode()  # fmt: skip
    raw = b"<html>" + b"y" * (5 << 20)

    def route(method: str, path: str) -> tuple[str, int, bytes]:
        return "fast", 500, raw if "nodes" in path else huge

    srv = PeerServer(route)
    servers.append(srv)
    client = _client(srv.url)
    errors: list[str] = []

    async def read() -> None:
        await claim_reader(client)("default", "c")

    with pytest.raises(Exception) as e:
        asyncio.run(read())
    errors.append(str(e.value))
    with pytest.raises(StatusError) as e2:
        ClaimStatusWriter(client, "vfio.example.com").write("default", "c", "u", [])
    errors.append(str(e2.value))
    with pytest.raises(PublishError) as e3:
        SlicePublisher(client, "vfio.example.com", "node-a", watch=False).reconcile([])
    errors.append(str(e3.value))  # reading the Node: 5 MB of HTML
    for err in errors:
        assert len(err) < 8192, (len(err), err[:200])
        assert "HTTP 500" in err, err[:300]
        assert f"...[{5 << 20}" in err or f"[{len(raw)} chars]" in err, err[-200:]


def test_sigterm_ends_the_plugin_while_the_api_server_trickles(
    servers: list[PeerServer], tmp_path: Path
) -> None:
    """Every API call trickles: SIGTERM still ends ``vfioctl dra-plugin`` at once with exit
    0 -- its calls under way are cut off (their sockets shut), so no thread is left to wait
    for, without ``os._exit``."""
    srv = PeerServer(lambda m, p: ("trickle", 200, b""))
    servers.append(srv)
    proc, kdir = spawn_plugin(tmp_path, srv.url)
    try:
        # serving (its start's own list of the slices ended at its deadline), with the
        # watch's list and the publisher's calls trickling
        reg = kdir / "plugins_registry" / "vfio.dra.vfio-dp.io-reg.sock"
        srv.wait("serving", lambda s: reg.exists() and s.trickling >= 2)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=GUARD)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
    assert took < 8.0, took  # not the 10 s of a call's deadline, nor for ever
