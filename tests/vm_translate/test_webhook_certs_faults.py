"""``vfioctl webhook-certs`` against API servers that refuse, vanish, stall, trickle or lie
(issues 37.15 and 38.4): every failure is ONE line naming the call, the server and the cause,
never a traceback; exit 2 when the server cannot be reached, 1 otherwise; a call that does not
finish within ``--timeout`` is given up on, a trickling answer included.

The real CLI in a subprocess and the real ``kubernetes`` client, against a scripted HTTP
server on 127.0.0.1 that answers the four calls the Job makes (the happy path is
:mod:`tests.vm_translate.test_webhook_certs`, on the API-server stand-in).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from vm_translate.webhook_certs import CALL_DEADLINE

REPO = Path(__file__).resolve().parents[2]
SECRET = "/api/v1/namespaces/vfio-dp/secrets/vfio-dp-webhook-tls"
SECRETS = "/api/v1/namespaces/vfio-dp/secrets"
MWC = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/vfio-dp-webhook"
#: a liveness guard so that code without a deadline fails instead of hanging the suite
GUARD = 90


def status(code: int, reason: str, message: str) -> tuple[int, bytes]:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}  # fmt: skip
    return code, json.dumps(body).encode()


def _mwc() -> bytes:
    doc = yaml.safe_load((REPO / "deploy/base/mutatingwebhookconfiguration.yaml").read_text())
    return json.dumps(doc).encode()


#: (method, path) -> what to do; a value is (status, body), or a callable writing the answer
Script = dict[tuple[str, str], Any]


def happy() -> Script:
    """No Secret yet; create, read the configuration, patch it: all accepted."""
    return {
        ("GET", SECRET): status(404, "NotFound", 'secrets "vfio-dp-webhook-tls" not found'),
        ("POST", SECRETS): (201, b'{"kind": "Secret", "apiVersion": "v1"}'),
        ("GET", MWC): (200, _mwc()),
        ("PATCH", MWC): (200, _mwc()),
    }


class ScriptedApi:
    """An HTTP server answering each (method, path) as scripted; it records what it was asked."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.asked: list[tuple[str, str]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                path = self.path.split("?")[0]
                outer.asked.append((self.command, path))
                what = outer.script.get((self.command, path), status(404, "NotFound", "no"))
                if callable(what):
                    what(self)
                    return
                code, body = what
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = do_PUT = do_PATCH = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    }))  # fmt: skip
    return str(path)


def run(kc: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "webhook-certs",
         "--kubeconfig", kc, *args],
        capture_output=True, text=True, timeout=GUARD, env=env, cwd=REPO, check=False,
    )  # fmt: skip


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[Callable[[Script], tuple[ScriptedApi, str]]]:
    servers: list[ScriptedApi] = []

    def make(script: Script) -> tuple[ScriptedApi, str]:
        api = ScriptedApi(script)
        servers.append(api)
        return api, kubeconfig(tmp_path, api.url)

    yield make
    for s in servers:
        s.stop()


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """The failure is one line on stderr, no traceback, nothing on stdout."""
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert out.stdout == ""
    assert len(lines[0]) < 1200, len(lines[0])
    return lines[0]


def test_the_scripted_server_is_a_working_api_server(scripted: Any) -> None:
    api, kc = scripted(happy())
    out = run(kc)
    assert out.returncode == 0, out.stderr
    assert "created; caBundle set on 2 webhook(s)" in out.stdout
    assert [m for m, _ in api.asked] == ["GET", "POST", "GET", "PATCH"]


REFUSALS = [
    (("POST", SECRETS), 403, "Forbidden", "create Secret vfio-dp/vfio-dp-webhook-tls",
     "certs-rbac.yaml"),
    (("POST", SECRETS), 409, "AlreadyExists", "create Secret vfio-dp/vfio-dp-webhook-tls",
     "run the Job again"),
    (("POST", SECRETS), 500, "InternalError", "create Secret vfio-dp/vfio-dp-webhook-tls", ""),
    (("PATCH", MWC), 403, "Forbidden", "PATCH MutatingWebhookConfiguration vfio-dp-webhook (caBundle)",
     "certs-rbac.yaml"),
    (("PATCH", MWC), 409, "Conflict", "PATCH MutatingWebhookConfiguration vfio-dp-webhook (caBundle)", ""),
    (("PATCH", MWC), 500, "InternalError", "PATCH MutatingWebhookConfiguration vfio-dp-webhook (caBundle)", ""),
    (("GET", SECRET), 403, "Forbidden", "GET Secret vfio-dp/vfio-dp-webhook-tls", "certs-rbac"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "code", "reason", "what", "hint"), REFUSALS)
def test_a_refused_call_is_one_line_naming_call_server_and_status(
    scripted: Any, call: tuple[str, str], code: int, reason: str, what: str, hint: str
) -> None:
    script = happy()
    script[call] = status(code, reason, f"the server says no ({reason})")
    api, kc = scripted(script)
    out = run(kc)
    assert out.returncode == 1
    line = one_line(out)
    assert line.startswith(f"vfioctl: {what}: the API server {api.url} refused: HTTP {code}")
    assert f"the server says no ({reason})" in line
    assert hint in line


def test_a_refused_replace_is_one_line(scripted: Any) -> None:
    """A Secret without the keys is replaced (PUT); a 409 there is one line too."""
    script = happy()
    script["GET", SECRET] = (200, json.dumps(
        {"kind": "Secret", "metadata": {"name": "vfio-dp-webhook-tls", "resourceVersion": "7"},
         "data": {}}).encode())  # fmt: skip
    script["PUT", SECRET] = status(409, "Conflict", "the object has been modified")
    api, kc = scripted(script)
    out = run(kc)
    assert out.returncode == 1
    line = one_line(out)
    assert f"replace Secret vfio-dp/vfio-dp-webhook-tls: the API server {api.url} refused: " \
        "HTTP 409" in line  # fmt: skip
    assert "run the Job again" in line


def test_an_unreachable_server_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = run(kubeconfig(tmp_path, f"http://127.0.0.1:{port}"))
    assert out.returncode == 2
    line = one_line(out)
    assert f"cannot reach the API server http://127.0.0.1:{port}" in line
    assert "Connection refused" in line
    assert "kubeconfig" in line


def test_a_server_that_never_answers_is_given_up_on(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        out = run(kubeconfig(tmp_path, f"http://127.0.0.1:{port}"), "--timeout", "2")
        took = time.monotonic() - started
    assert out.returncode == 1
    line = one_line(out)
    assert f"GET Secret vfio-dp/vfio-dp-webhook-tls: the API server http://127.0.0.1:{port} " \
        "did not answer within 2 s" in line  # fmt: skip
    assert took < GUARD


def test_a_trickling_answer_is_given_up_on_at_the_deadline(scripted: Any) -> None:
    """One byte every 2 s never trips a read timeout; the overall deadline ends it."""
    stop = threading.Event()

    def trickle(handler: BaseHTTPRequestHandler) -> None:
        body = json.dumps({"kind": "Secret", "metadata": {"resourceVersion": "1"}}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        for b in body:
            if stop.wait(2):
                return
            try:
                handler.wfile.write(bytes([b]))
                handler.wfile.flush()
            except OSError:
                return

    script = happy()
    script["GET", SECRET] = trickle
    api, kc = scripted(script)
    try:
        started = time.monotonic()
        out = run(kc, "--timeout", "3")
        took = time.monotonic() - started
    finally:
        stop.set()
    assert out.returncode == 1
    line = one_line(out)
    assert f"the API server {api.url} did not answer within 3 s" in line
    assert took < 30, took  # the whole answer would take ~2 minutes


GARBAGE = [
    (("GET", SECRET), (200, b"<html>hello</html>"), "not a Secret ('<html>hello</html>')"),
    (("GET", SECRET), (200, b'{"kind": "Secret", "metadata": {"resourceVersion": "1"}, '
                            b'"data": {"tls.crt": 5}}'), "malformed Secret (its data is not"),
    (("GET", SECRET), (200, b'{"kind": "Secret", "data": {}}'),
     "malformed Secret (it has no metadata.resourceVersion)"),
    (("GET", SECRET), (200, b'[1, 2]'), "not a Secret"),
    (("GET", SECRET), (200, b'{"kind": "ConfigMap"}'), "not a Secret"),
    (("GET", MWC), (200, b'{"kind": "MutatingWebhookConfiguration", "webhooks": "x"}'),
     "malformed MutatingWebhookConfiguration"),
    (("GET", MWC), (200, b'{"kind": "MutatingWebhookConfiguration", "webhooks": ["x"]}'),
     "malformed MutatingWebhookConfiguration"),
    (("GET", MWC), (200, b"\xff\xfe garbage"), "not a MutatingWebhookConfiguration"),
]  # fmt: skip


@pytest.mark.parametrize(("call", "answer", "said"), GARBAGE)
def test_garbage_or_a_malformed_object_is_one_line(
    scripted: Any, call: tuple[str, str], answer: tuple[int, bytes], said: str
) -> None:
    script = happy()
    script[call] = answer
    api, kc = scripted(script)
    out = run(kc)
    assert out.returncode == 1
    line = one_line(out)
    assert api.url in line and said in line, line


def test_a_huge_error_body_is_shown_bounded(scripted: Any) -> None:
    script = happy()
    script["POST", SECRETS] = (500, b"x" * (5 << 20))
    _api, kc = scripted(script)
    out = run(kc)
    assert out.returncode == 1
    line = one_line(out)
    assert "HTTP 500" in line and f"...[{5 << 20} chars]" in line


def test_the_flag_default_is_the_library_deadline() -> None:
    from cli.certs_cmd import webhook_certs

    (timeout,) = [p for p in webhook_certs.params if p.name == "timeout"]
    assert timeout.default == CALL_DEADLINE
