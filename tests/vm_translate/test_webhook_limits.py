"""The webhook under abuse, over REAL sockets and REAL TLS: many open connections, the
connection cap, handshake/header/idle timeouts, body budget, deep JSON, garbage reviews, and
the ``--config`` reload. No timing or size assertions (the memory an open connection costs is
bench/webhook_bench.py's): waits are for conditions, bounded only so a hang fails."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import logging
import os
import socket
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.vm_translate.conftest import CONFIG_YAML
from tests.vm_translate.streams import close_streams
from tests.vm_translate.test_webhook import VMI, Running, post, review, start
from tests.waiting import wait_until_async
from vfio_dp.model.config import Config
from vm_translate.config_watch import ConfigWatch
from vm_translate.errors import NodeCheckError, ReviewError
from vm_translate.nodes import NodeResources
from vm_translate.review import MAX_DEPTH, decide, parse_review
from vm_translate.webhook_limits import MAX_FIELD_SIZE, MAX_HEADERS

ROOT = Path(__file__).resolve().parents[2]


def _sockets(pid: int) -> int:
    """Open sockets of ``pid``: the connections it has accepted, its listening socket."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


def _spawn_webhook(tmp_path: Path) -> tuple[subprocess.Popen[str], int, ssl.SSLContext]:
    """The real ``vfioctl webhook --self-signed`` in its own process (its sockets are its own)."""
    cmd = [
        sys.executable, "-c", "from cli.main import main; main()", "webhook", "--self-signed",
        "--address", "127.0.0.1", "--port", "0", "--cert-dir", str(tmp_path / "certs"),
        "--log-level", "warning", "--handshake-timeout", "60", "--idle-timeout", "60",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "VFIOCTL_CONFIG": ""},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    ca = base64.b64decode(proc.stdout.readline().strip()).decode()
    line = proc.stderr.readline()
    if not line.startswith("serving "):
        proc.kill()
        pytest.fail(f"webhook did not start: {line}{proc.stderr.read()}")
    port = int(line.split()[1].rsplit(":", 1)[1].split("/")[0])
    return proc, port, ssl.create_default_context(cadata=ca)


async def test_many_open_connections_are_held_and_reviews_still_answered(
    tmp_path: Path,
) -> None:
    """300 connections held open (bare TCP, idle TLS, half a request line) under the default
    cap: every one is accepted and kept, and a review is still answered. What they cost in
    memory (asyncio's own TLS ~300 KiB each; ours shares one buffer) is bench/webhook_bench.py's
    row "RSS per open connection"."""
    proc, port, ctx = _spawn_webhook(tmp_path)
    held: list[Any] = []
    try:
        base = _sockets(proc.pid)
        for _ in range(200):  # bare TCP: never a ClientHello
            held.append(socket.create_connection(("127.0.0.1", port)))
        for i in range(100):  # idle TLS, and TLS with half a request line
            _, w = await asyncio.open_connection(
                "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
            )
            if i % 2:
                w.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")
            held.append(w)
        await wait_until_async(
            lambda: _sockets(proc.pid) >= base + len(held),
            what="the webhook to accept the 300 connections",
            state=lambda: _sockets(proc.pid) - base,
        )
        body = json.dumps(review(VMI)).encode()
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"
        )
        writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        head = await asyncio.wait_for(reader.readline(), timeout=10)
        assert head.startswith(b"HTTP/1.1 200"), head
        await close_streams([writer])
        assert _sockets(proc.pid) >= base + len(held)  # the 300 are still held
        assert proc.poll() is None
    finally:
        await close_streams(held)
        proc.kill()
        proc.communicate()


async def _raw_tls(s: Running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        "127.0.0.1", s.hook.port, ssl=s.client_ctx, server_hostname="127.0.0.1"
    )


def _busy(s: Running) -> int:
    """Connections being answered. The listener counts only its open connections; which of
    them are busy is in its private ``_open`` (there is no public view of it)."""
    return sum(c.busy for c in s.hook.listener._open)


async def test_new_connection_refused_while_all_are_young(tmp_path: Path, config: Config) -> None:
    """At the cap with every connection in its first moments (``silent_grace``), the NEW
    connection is closed: load is shed at the door, not from connections under way."""
    s = await start(tmp_path, config, max_connections=20, silent_grace=600)
    listener = s.hook.listener
    held: list[Any] = []
    try:
        for _ in range(20):
            held.append(socket.create_connection(("127.0.0.1", s.hook.port)))
        await wait_until_async(
            lambda: listener.open_connections == 20, what="20 connections accepted"
        )
        late = socket.create_connection(("127.0.0.1", s.hook.port))
        held.append(late)
        late.settimeout(10)
        assert await asyncio.to_thread(late.recv, 1) == b""
        assert listener.refused == 1 and listener.evicted == 0
        assert listener.open_connections == 20
    finally:
        await close_streams(held)
        await s.hook.stop()


async def test_connection_cap_evicts_silent_then_idle_and_reviews_answered(
    tmp_path: Path, config: Config
) -> None:
    s = await start(
        tmp_path, config, max_connections=20, silent_grace=0, handshake_timeout=60,
        idle_timeout=60,
    )  # fmt: skip
    listener = s.hook.listener
    held: list[Any] = []
    try:
        for _ in range(30):  # bare TCP, never a byte: the first to go
            held.append(socket.create_connection(("127.0.0.1", s.hook.port)))
        await wait_until_async(
            lambda: listener.evicted_by.get("silent") == 10,
            what="10 silent connections evicted",
            state=lambda: listener.evicted_by,
        )
        for _ in range(20):  # idle TLS: each evicts a silent one
            held.append((await _raw_tls(s))[1])
        assert listener.evicted_by.get("silent") == 30
        status, answer = await post(s, json.dumps(review(VMI)).encode())  # evicts idle TLS
        assert status == 200 and answer["response"]["allowed"] is True
        assert listener.open_connections <= 20
        assert listener.evicted_by.get("idle", 0) >= 1
        assert listener.refused == 0
        first = held[0]  # an evicted bare-TCP client sees its connection closed
        first.settimeout(10)
        assert await asyncio.to_thread(first.recv, 1) == b""
    finally:
        await close_streams(held)
        await s.hook.stop()


async def test_connection_answering_a_request_is_never_evicted(
    tmp_path: Path, config: Config
) -> None:
    s = await start(tmp_path, config, max_connections=2, handshake_timeout=60, idle_timeout=60)
    held: list[socket.socket] = []
    try:
        reader, writer = await _raw_tls(s)
        body = json.dumps(review(VMI)).encode()
        writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        await writer.drain()
        await wait_until_async(lambda: _busy(s) == 1, what="the request being answered")
        listener = s.hook.listener
        for _ in range(5):
            held.append(socket.create_connection(("127.0.0.1", s.hook.port)))
        # one more fits under the cap of 2; the other 4 are each refused or evict one
        await wait_until_async(
            lambda: listener.refused + listener.evicted >= 4,
            what="the 5 new connections dealt with",
            state=lambda: (listener.refused, listener.evicted_by),
        )
        assert _busy(s) == 1  # the one being answered is still open
        writer.write(body[10:])
        await writer.drain()
        head = await asyncio.wait_for(reader.readline(), timeout=10)
        assert head.startswith(b"HTTP/1.1 200"), head
        await close_streams([writer])
    finally:
        await close_streams(held)
        await s.hook.stop()


async def test_bare_tcp_closed_after_handshake_timeout(tmp_path: Path, config: Config) -> None:
    s = await start(tmp_path, config, handshake_timeout=0.2)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", s.hook.port)
        assert await asyncio.wait_for(reader.read(1), timeout=10) == b""
        await close_streams([writer])
        assert s.hook.listener.open_connections == 0
    finally:
        await s.hook.stop()


@pytest.mark.parametrize("sent", [b"", b"POST /mutate HTTP/1.1\r\nHost: x\r\n"])
async def test_idle_and_slow_header_connections_closed(
    tmp_path: Path, config: Config, sent: bytes
) -> None:
    s = await start(tmp_path, config, idle_timeout=0.2)
    try:
        reader, writer = await _raw_tls(s)
        writer.write(sent)
        await writer.drain()
        try:
            data = await asyncio.wait_for(reader.read(100), timeout=10)
        except ConnectionError:  # closed without close_notify: closed all the same
            data = b""
        assert data == b"", data
        await close_streams([writer])
    finally:
        await s.hook.stop()


async def test_declared_oversize_body_gets_413_before_it_is_sent(
    tmp_path: Path, config: Config
) -> None:
    s = await start(tmp_path, config, max_body_bytes=64 * 1024)
    try:
        reader, writer = await _raw_tls(s)
        writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{")
        await writer.drain()
        head = await asyncio.wait_for(reader.readline(), timeout=10)
        assert head.startswith(b"HTTP/1.1 413"), head
        rest = await asyncio.wait_for(reader.read(4096), timeout=10)
        assert b"100000000 bytes is over the limit of 65536" in rest
        await close_streams([writer])  # else stop() waits for it (10 s)
    finally:
        await s.hook.stop()


async def test_large_bodies_beyond_budget_get_503_small_ones_pass(
    tmp_path: Path, config: Config
) -> None:
    s = await start(tmp_path, config, body_budget_bytes=200 * 1024, read_timeout=30)
    writers = []
    try:
        for _ in range(2):  # two 90 KiB bodies being received: 180 of 200 KiB reserved
            _, w = await _raw_tls(s)
            w.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 92160\r\n\r\n{")
            await w.drain()
            writers.append(w)
        await wait_until_async(lambda: _busy(s) == 2, what="both bodies being received")
        status, answer = await post(s, json.dumps(review({**VMI, "pad": "x" * 90000})).encode())
        assert status == 503 and "--body-budget-bytes" in answer["error"]
        status, _ = await post(s, json.dumps(review(VMI)).encode())
        assert status == 200
    finally:
        await close_streams(writers)
        await s.hook.stop()


async def test_json_nested_100000_deep_gets_400_without_traceback(
    tmp_path: Path, config: Config, caplog: pytest.LogCaptureFixture
) -> None:
    s = await start(tmp_path, config)
    try:
        with caplog.at_level(logging.DEBUG):
            for body in (
                b"[" * 100_000 + b"]" * 100_000,
                b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
            ):
                status, answer = await post(s, body)
                assert status == 400
                assert f"at most {MAX_DEPTH} levels" in answer["error"]
        assert "Traceback" not in caplog.text and "RecursionError" not in caplog.text
        assert (await post(s, json.dumps(review(VMI)).encode()))[0] == 200
    finally:
        await s.hook.stop()


def test_depth_limit_is_exact() -> None:
    inner: Any = {"uid": "u"}
    ok = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": inner}
    obj: Any = 1
    for _ in range(MAX_DEPTH - 3):  # review -> request -> object -> ... = MAX_DEPTH levels
        obj = [obj]
    inner["object"] = {"o": obj}
    assert parse_review(json.dumps(ok).encode())["uid"] == "u"
    inner["object"] = {"o": [obj]}
    with pytest.raises(ReviewError, match=f"nested more than {MAX_DEPTH} levels"):
        parse_review(json.dumps(ok).encode())


def test_depth_walk_only_for_bodies_that_could_be_too_deep(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body opening at most MAX_DEPTH arrays/objects cannot nest deeper: the review's
    depth walk (~0.06 ms) is skipped for it; one with more is still walked and judged."""
    from vm_translate import review as review_module

    walks: list[int] = []
    real = review_module.nesting_depth

    def counted(value: object, limit: int) -> int:
        walks.append(1)
        return real(value, limit)

    monkeypatch.setattr(review_module, "nesting_depth", counted)
    assert parse_review(json.dumps(review(VMI)).encode())["uid"] == "uid-7"
    assert walks == []
    wide = review(VMI)
    wide["request"]["object"]["metadata"]["labels"] = {"x": [[] for _ in range(MAX_DEPTH)]}
    assert parse_review(json.dumps(wide).encode())["uid"] == "uid-7"
    assert walks == [1]


def _paths(o: Any, p: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [p]
    if isinstance(o, dict):
        for k, v in o.items():
            out += _paths(v, (*p, k))
    elif isinstance(o, list):
        for i, v in enumerate(o):
            out += _paths(v, (*p, i))
    return out


POD_REVIEW = {
    "apiVersion": "admission.k8s.io/v1",
    "kind": "AdmissionReview",
    "request": {
        "uid": "p",
        "operation": "CREATE",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "object": {
            "kind": "Pod",
            "metadata": {
                "name": "p",
                "annotations": {
                    "devices.kubevirt.io/passthrough": "- {name: g, vendor: '10de', device: '1eb8'}"
                },
            },
            "spec": {"containers": [{"name": "compute", "resources": {"limits": {"cpu": "1"}}}]},
        },
    },
}
JUNK: list[Any] = [None, 1, -1, 1.5, True, "", "x" * 300, [], {}, [1], {"a": 1}, "- [", "\x00"]


def test_garbage_in_every_field_gets_a_clear_answer(config: Config) -> None:
    """Every field of a VMI and a Pod review replaced by each junk value: a ReviewError (400)
    or an AdmissionReview (allowed or denied with a message) — never another exception."""
    answered = 0
    for base in (review(VMI), POD_REVIEW):
        for path in _paths(base)[1:]:
            for junk in JUNK:
                doc = copy.deepcopy(base)
                target = doc
                for k in path[:-1]:
                    target = target[k]
                target[path[-1]] = junk
                try:
                    answer = decide(parse_review(json.dumps(doc).encode()), config)
                except ReviewError as e:
                    assert str(e)
                    continue
                json.dumps(answer)
                response = answer["response"]
                assert response["allowed"] or response["status"]["message"]
                answered += 1
    assert answered > 100


# ------------------------------------------------------------------ --config reload

NEW_CONFIG = """\
selectors:
  - vendor: "10de"
    device: "1eb8"
    resourceName: example.com/gpu
"""


def _configmap_dir(d: Path, text: str) -> Path:
    """A ConfigMap volume as the kubelet writes it: config.yaml -> ..data/ -> ..<timestamp>/."""
    d.mkdir()
    (d / "..v1").mkdir()
    (d / "..v1" / "config.yaml").write_text(text)
    (d / "..data").symlink_to("..v1")
    (d / "config.yaml").symlink_to("..data/config.yaml")
    return d / "config.yaml"


def _swap(d: Path, version: str, text: str) -> None:
    (d / version).mkdir()
    (d / version / "config.yaml").write_text(text)
    tmp = d / "..data_tmp"
    tmp.symlink_to(version)
    os.replace(tmp, d / "..data")  # atomic, like the kubelet's atomic writer


async def _patched_name(s: Running) -> str:
    status, answer = await post(s, json.dumps(review(VMI)).encode())
    assert status == 200, answer
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    return str(ops[0]["value"])


async def test_config_reloaded_on_configmap_swap_bad_one_kept_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    d = tmp_path / "cm"
    path = _configmap_dir(d, CONFIG_YAML)
    watch = ConfigWatch(str(path))
    s = await start(tmp_path, watch, reload_interval=0.05)
    try:
        assert await _patched_name(s) == "devices.kubevirt.io/10de_1eb8"
        _swap(d, "..v2", NEW_CONFIG)
        await wait_until_async(lambda: watch.reloads, what="the new config loaded")
        assert await _patched_name(s) == "example.com/gpu"

        with caplog.at_level(logging.ERROR):
            _swap(d, "..v3", "selectors:\n  - vendor: 8086x\n")
            await wait_until_async(lambda: watch.rejected, what="the bad config rejected")
        assert watch.rejected == 1
        assert "keeping the previous configuration" in caplog.text
        assert "8086x" in caplog.text
        assert await _patched_name(s) == "example.com/gpu"
    finally:
        await s.hook.stop()


def test_config_watch_reads_only_when_the_file_changes(tmp_path: Path) -> None:
    d = tmp_path / "cm"
    path = _configmap_dir(d, CONFIG_YAML)
    loads: list[str] = []

    def load(p: str) -> Config:
        from vm_translate.inputs import load_config

        loads.append(p)
        return load_config(p)

    watch = ConfigWatch(str(path), load=load)
    assert not watch.check() and not watch.check()
    assert loads == [str(path)]
    (d / "..data").unlink()  # mid-swap: missing for a moment → keep going, retry later
    assert not watch.check()
    (d / "..data").symlink_to("..v1")
    _swap(d, "..v2", NEW_CONFIG)
    assert watch.check()
    assert len(loads) == 2


# ------------------------------------------------------------------ --check-nodes time bound


async def test_node_list_that_never_comes_is_not_waited_for(tmp_path: Path, config: Config) -> None:
    never = asyncio.Event()

    async def fetch() -> list[NodeResources]:
        await never.wait()
        return []

    s = await start(tmp_path, config, check_nodes=True, node_fetch=fetch, node_wait=0.2)
    try:
        status, answer = await post(s, json.dumps(review(VMI)).encode())
        assert status == 200 and answer["response"]["allowed"] is True
        assert "did not arrive within 0.2s" in answer["response"]["warnings"][0]
    finally:
        never.set()
        await s.hook.stop()


async def test_failed_node_list_is_asked_once_for_many_reviews(
    tmp_path: Path, config: Config
) -> None:
    calls = []

    async def fetch() -> list[NodeResources]:
        calls.append(1)
        raise NodeCheckError("cannot list nodes: forbidden")

    s = await start(tmp_path, config, check_nodes=True, node_fetch=fetch)
    try:
        answers = await asyncio.gather(
            *(post(s, json.dumps(review(VMI)).encode()) for _ in range(5))
        )
        for status, answer in answers:
            assert status == 200 and "forbidden" in answer["response"]["warnings"][0]
        assert len(calls) == 1
    finally:
        await s.hook.stop()


@pytest.mark.parametrize(
    "headers",
    [
        b"".join(b"X-H%d: v\r\n" % i for i in range(MAX_HEADERS + 1)),
        b"X-Big: " + b"a" * (MAX_FIELD_SIZE + 1) + b"\r\n",
    ],
    ids=["too-many", "too-long"],
)
async def test_header_block_is_bounded(
    tmp_path: Path, config: Config, headers: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    """aiohttp's defaults (128 headers of 8 KiB) let a client hold 2 MB in one incomplete
    header block; the webhook's limits answer 400 instead, logged as one warning line."""
    s = await start(tmp_path, config)
    try:
        with caplog.at_level(logging.DEBUG):
            for _ in range(3):
                reader, writer = await _raw_tls(s)
                writer.write(b"POST /mutate HTTP/1.1\r\nHost: x\r\n" + headers)
                await writer.drain()
                head = await asyncio.wait_for(reader.readline(), timeout=10)
                assert head.split()[1] == b"400", head
                await close_streams([writer])
        assert "Traceback" not in caplog.text
        warnings = [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    finally:
        await s.hook.stop()


async def test_connections_share_the_listeners_receive_buffer(
    tmp_path: Path, config: Config
) -> None:
    """The memory fix rests on asyncio's SSLProtocol reading through ``get_buffer()``: if a
    Python version stops doing so, this fails (and bench/webhook_bench.py's memory row)."""
    s = await start(tmp_path, config)
    try:
        _, writer = await _raw_tls(s)
        listener = s.hook.listener
        (conn,) = list(listener._open)
        assert conn.get_buffer(-1) is listener.recv_view
        assert len(conn.get_buffer(-1)) == len(listener.recv_buffer)
        await close_streams([writer])
    finally:
        await s.hook.stop()
