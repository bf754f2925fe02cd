"""``vfioctl webhook --workers 2`` (issue 39 row 4: one serving process is one core at most):
the real command over real TLS against the API-server stand-in. Every worker answers
reviews and checks them against the nodes; the node list comes from ONE child (the
supervisor's); SIGTERM ends every process of the tree; a killed supervisor leaves none
behind; a worker that dies takes the replica down (exit 1) rather than leaving it half-sized.
Which worker answered a connection is read from /proc: the process holding its socket."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dra.apiserver_standin import ApiServerStandin
from tests.vm_translate.streams import close_streams
from tests.vm_translate.test_webhook import VMI, review
from tests.vm_translate.test_webhook_node_child import api, children, node_lists  # noqa: F401
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


class Tree:
    """The real ``vfioctl webhook --workers 2 --check-nodes`` and its processes."""

    def __init__(self, tmp: Path, *extra: str) -> None:
        self.certs = tmp / "certs"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import main; main()", "webhook",
             "--self-signed", "--address", "127.0.0.1", "--port", "0", "--cert-dir",
             str(self.certs), "--check-nodes", "--workers", "2", "--log-level", "warning",
             *extra],
            cwd=ROOT, env={**os.environ, "VFIOCTL_CONFIG": ""},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.proc.stdout.readline()
        self.proc.stdout.readline()
        line = self.proc.stderr.readline()
        assert line.startswith("serving "), line + self.proc.stderr.read()
        self.port = int(line.split()[1].rsplit(":", 1)[1].split("/")[0])
        self.ctx = ssl.create_default_context(cafile=str(self.certs / "ca.crt"))
        self.forked = self.workers()  # forked before "serving" is printed

    def workers(self) -> list[int]:
        return children(self.proc.pid, "cli.main")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.fixture()
def tree(tmp_path: Path, api: ApiServerStandin) -> Iterator[Tree]:  # noqa: F811
    t = Tree(tmp_path)
    yield t
    t.close()
    for pid in t.forked:  # none is left by the tests; this is for a failed one
        if not gone(pid):
            os.kill(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        return "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return True


def holder(port: int, client_port: int, pids: list[int]) -> int | None:
    """The process among ``pids`` holding the server side of the connection from
    ``client_port`` to ``port`` on 127.0.0.1 (/proc/net/tcp's inode, then each fd)."""
    inode = None
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(f":{port:04X}") and f[2].endswith(f":{client_port:04X}"):
            inode = f[9]
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return pid
            except OSError:
                continue
    return None


async def denied_on_a_new_connection(t: Tree) -> int:
    """One review on a new TLS connection, denied from the stand-in's nodes: the client
    port (the connection stays open until the worker holding it is read)."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", t.port, ssl=t.ctx, server_hostname="127.0.0.1"
    )
    body = json.dumps(review(VMI)).encode()
    writer.write(
        f"POST /mutate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(h[15:]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:"))
    answer = json.loads(await reader.readexactly(length))["response"]
    if answer["allowed"]:  # the first reviews may come before the first list: unchecked
        await close_streams([writer])
        return 0
    assert "no schedulable node advertises" in answer["status"]["message"]
    port = int(writer.get_extra_info("sockname")[1])
    _OPEN.append(writer)
    return port


_OPEN: list[asyncio.StreamWriter] = []


async def test_every_worker_answers_and_checks_the_nodes(
    tree: Tree,
    api: ApiServerStandin,  # noqa: F811
) -> None:
    workers = tree.workers()
    assert len(workers) == 2
    answered: set[int] = set()
    try:
        for _ in range(200):  # the kernel hands each connection to one of them
            port = await denied_on_a_new_connection(tree)
            if port:
                who = holder(tree.port, port, workers)
                assert who is not None
                answered.add(who)
            if answered == set(workers):
                break
    finally:
        await close_streams(_OPEN)
        _OPEN.clear()
    assert answered == set(workers)
    # one node-list child, the supervisor's; none in the workers
    assert len(children(tree.proc.pid)) == 1
    assert [children(w) for w in workers] == [[], []]
    assert node_lists(api) >= 1


async def test_sigterm_ends_every_process_of_the_tree(tree: Tree) -> None:
    await denied_or_allowed(tree)
    pids = [*tree.workers(), *children(tree.proc.pid)]
    assert len(pids) == 3  # two workers and the node-list child
    tree.proc.send_signal(signal.SIGTERM)
    assert tree.proc.wait(30) == 0
    wait_until(lambda: all(gone(p) for p in pids), what=f"{pids} ended with their supervisor")


async def denied_or_allowed(t: Tree) -> None:
    await denied_on_a_new_connection(t)
    await close_streams(_OPEN)
    _OPEN.clear()


async def test_a_killed_supervisor_leaves_no_process(tree: Tree) -> None:
    await denied_or_allowed(tree)
    pids = [*tree.workers(), *children(tree.proc.pid)]
    assert len(pids) == 3
    tree.proc.kill()
    tree.proc.wait()
    wait_until(lambda: all(gone(p) for p in pids), what=f"{pids} ended after SIGKILL of theirs")


async def test_a_dead_worker_stops_the_replica(tree: Tree) -> None:
    first, second = tree.workers()
    os.kill(first, signal.SIGKILL)  # as the OOM killer does
    assert tree.proc.wait(30) == 1
    wait_until(lambda: gone(second), what=f"the other worker {second} stopped")
    assert tree.proc.stderr is not None
    assert f"webhook worker {first} exited" in tree.proc.stderr.read()


def test_the_replicas_bounds_are_shared_by_its_workers() -> None:
    """``--max-connections`` and ``--body-budget-bytes`` stay the replica's with workers; its
    worst case adds a baseline per extra process and one parsed body per worker."""
    import dataclasses

    from vm_translate.webhook_limits import BASELINE_RSS, WebhookSettings, worst_case_rss_bytes

    one = WebhookSettings("c", "k")
    two = dataclasses.replace(one, workers=2)
    assert (two.share(384), two.share(385), one.share(385)) == (192, 193, 385)
    assert worst_case_rss_bytes(two) - worst_case_rss_bytes(one) == (
        2 * BASELINE_RSS + 10 * one.max_body_bytes
    )


def accept_queue(port: int) -> int:
    """Connections waiting in the listening socket's accept queue (/proc/net/tcp: a LISTEN
    entry's rx_queue)."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[1].endswith(f":{port:04X}") and f[3] == "0A":
            return int(f[4].split(":")[1], 16)
    return 0


def held_by(t: Tree, ports: list[int], pids: list[int]) -> list[int | None]:
    """Which of ``pids`` holds each connection from ``ports`` (None: not accepted yet)."""
    return [holder(t.port, p, pids) for p in ports]


async def test_connections_are_balanced_over_the_workers(tree: Tree) -> None:
    """16 connections arrive while one worker is held (SIGSTOP, as a worker busy with a
    burst of reviews): the other takes one and leaves the rest queued until its peer
    catches up (vm_translate.balance); without the balance it took all 16 (asyncio accepts
    up to 16 at a wake-up), and kept them for as long as the client kept them open."""
    held, running = tree.workers()
    socks = [socket.create_connection(("127.0.0.1", tree.port)) for _ in range(16)]
    ports = [s.getsockname()[1] for s in socks]
    writers: list[asyncio.StreamWriter] = []
    os.kill(held, signal.SIGSTOP)
    try:
        wait_until(
            lambda: held_by(tree, ports, [running]).count(running) + accept_queue(tree.port) == 16,
            what="every connection accepted by the running worker or queued",
        )
    finally:
        os.kill(held, signal.SIGCONT)
    whose = wait_until(
        lambda: None if None in (h := held_by(tree, ports, [held, running])) else h,
        what="every connection accepted",
    )
    try:
        for s in socks:  # each is served: a review on it
            r, w = await asyncio.open_connection(sock=s, ssl=tree.ctx, server_hostname="127.0.0.1")
            writers.append(w)
            body = json.dumps(review(VMI)).encode()
            head = f"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
            w.write(head.encode() + body)
            assert (await r.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
    finally:
        await close_streams([*writers, *socks[len(writers) :]])
    assert abs(whose.count(held) - whose.count(running)) <= 2, whose


def test_workers_serve_on_uvloop(tree: Tree) -> None:
    """Each serving process runs uvloop's event loop (vm_translate.listener.event_loop:
    ~10-15 % less CPU a review under row 4): its extension is mapped in every worker."""
    for pid in tree.workers():
        wait_until(
            lambda pid=pid: "uvloop/loop." in Path(f"/proc/{pid}/maps").read_text(),
            what=f"uvloop loaded in worker {pid}",
        )


def test_without_uvloop_the_webhook_serves_on_asyncios_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A platform without uvloop's wheel: asyncio's own loop, and the log says how to get
    uvloop."""
    from vm_translate.listener import event_loop

    monkeypatch.setitem(sys.modules, "uvloop", None)  # import uvloop raises ImportError
    loop = event_loop()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()
    assert "pip install 'uvloop>=0.19'" in caplog.text
