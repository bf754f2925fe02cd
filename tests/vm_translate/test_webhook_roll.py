"""The webhook's Deployment roll while reviews run: none may fail.

What a rolling update (``maxSurge: 1, maxUnavailable: 0``) does, at process level: the new pod
starts and joins the Service once ``/healthz`` answers; the old pod gets SIGTERM and, a moment
later (kube-proxy's propagation), leaves the Service's endpoints. A Service stand-in — a TCP
forwarder on 127.0.0.1 choosing an endpoint per connection, as kube-proxy does, named for what it
is — carries reviews from eight concurrent clients through it all, each on a new TLS connection
(the API server's webhook client). The outgoing process is this release (``--shutdown-delay``:
it keeps answering while ``/healthz`` fails); the incoming one is this release again (a config
roll) or the previous release (a rollback). The previous release itself closes its socket at
SIGTERM: the first upgrade away from it can refuse reviews sent in that moment
(docs/install.md, "Upgrade").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
from pathlib import Path

import pytest

from tests.releases import PREVIOUS_MAIN, REPO, archive
from tests.vm_translate.streams import close_streams
from tests.vm_translate.test_webhook import VMI, review

LAG = 1.0  # seconds between SIGTERM and the endpoint leaving the Service
DRAIN = 3.0  # --shutdown-delay of the outgoing process (the Deployment sets 5)


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return archive(PREVIOUS_MAIN, tmp_path_factory.mktemp("previous-webhook"))


class Pod:
    """One webhook process (a pod of the Deployment). The first makes the certificate
    (``--self-signed``); the others serve the same files, as pods sharing the Secret do."""

    def __init__(self, tree: Path, certs: Path, *extra: str, tls_from: Pod | None = None) -> None:
        tls = (
            ["--tls-cert", str(tls_from.certs / "tls.crt"), "--tls-key", str(tls_from.certs / "tls.key")]
            if tls_from
            else ["--self-signed", "--cert-dir", str(certs)]
        )  # fmt: skip
        self.certs = tls_from.certs if tls_from else certs
        certs.mkdir(parents=True, exist_ok=True)
        cmd = [
            sys.executable, "-c", "from cli.main import main; main()", "webhook", *tls,
            "--address", "127.0.0.1", "--port", "0", "--log-level", "warning", *extra,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=certs, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "VFIOCTL_CONFIG": "", "PYTHONPATH": str(tree)},
        )  # fmt: skip
        assert self.proc.stdout is not None and self.proc.stderr is not None
        if tls_from is None:
            self.proc.stdout.readline()
            self.proc.stdout.readline()  # the CA's base64, for a caBundle
        self.ca = (self.certs / "ca.crt").read_text()
        line = self.proc.stderr.readline()
        if not line.startswith("serving "):
            self.proc.kill()
            pytest.fail(f"webhook did not start: {line}{self.proc.stderr.read()}")
        self.port = int(line.split()[1].rsplit(":", 1)[1].split("/")[0])

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        self.proc.communicate(timeout=30)


class Service:
    """The Service stand-in: per new connection, the first endpoint in :attr:`endpoints`
    (round robin), forwarded byte for byte both ways."""

    def __init__(self) -> None:
        self.endpoints: list[int] = []
        self.turn = 0
        self.server: asyncio.Server | None = None
        self.port = 0
        self.open: set[asyncio.StreamWriter] = set()  # both ends of every forwarded connection

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _conn(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.turn += 1
        port = self.endpoints[self.turn % len(self.endpoints)]
        self.open.add(w)
        try:
            br, bw = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await close_streams([w])  # the endpoint refused: the client sees a reset, as through kube-proxy
            self.open.discard(w)
            return
        self.open.add(bw)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(pipe(r, bw), pipe(br, w))
        await close_streams([w, bw])
        self.open -= {w, bw}

    async def stop(self) -> None:
        """Stop listening and close what is still forwarded, before the test's loop ends."""
        assert self.server is not None
        self.server.close()
        await close_streams(list(self.open))


async def _review(port: int, ctx: ssl.SSLContext, body: bytes) -> str:
    """One review on a new TLS connection; '' when answered 200 with a response, else why."""
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, ssl=ctx, server_hostname="127.0.0.1"), 10
        )
    except (OSError, TimeoutError, ssl.SSLError) as e:
        return f"{type(e).__name__}: {e}"
    try:
        writer.write(
            b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        raw = await asyncio.wait_for(reader.read(), 10)
    except (OSError, TimeoutError, ssl.SSLError) as e:
        return f"{type(e).__name__}: {e}"
    finally:
        await close_streams([writer])
    head, _, payload = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        return head[:80].decode(errors="replace") or "no answer"
    return "" if json.loads(payload).get("response") else "no response object"


@pytest.mark.parametrize("incoming", ["this release", "previous release"])
async def test_reviews_running_through_a_roll_all_succeed(
    incoming: str, previous: Path, tmp_path: Path
) -> None:
    old = Pod(REPO, tmp_path / "old", "--shutdown-delay", str(DRAIN))
    new = Pod(REPO if incoming == "this release" else previous, tmp_path / "new", tls_from=old)
    ctx = ssl.create_default_context(cadata=old.ca)
    service = Service()
    await service.start()
    service.endpoints = [old.port]
    body = json.dumps(review(VMI)).encode()
    failures: list[str] = []
    answered = 0
    stop = asyncio.Event()

    async def client() -> None:
        nonlocal answered
        while not stop.is_set():
            why = await _review(service.port, ctx, body)
            if why:
                failures.append(why)
            answered += 1

    clients = [asyncio.create_task(client()) for _ in range(8)]
    try:
        await asyncio.sleep(0.5)
        service.endpoints = [old.port, new.port]  # the new pod is Ready: it joins
        await asyncio.sleep(0.5)
        old.proc.send_signal(signal.SIGTERM)  # the old pod terminates ...
        await asyncio.sleep(LAG)
        service.endpoints = [new.port]  # ... and leaves the endpoints a moment later
        code = await asyncio.to_thread(old.proc.wait, 30)
        assert code == 0
        await asyncio.sleep(0.5)
    finally:
        stop.set()
        await asyncio.gather(*clients)
        await service.stop()
        old.close()
        new.close()
    assert answered > 20, answered
    assert failures == [], f"{len(failures)} of {answered} reviews failed: {failures[:5]}"


def test_healthz_fails_while_draining(tmp_path: Path) -> None:
    """After SIGTERM the readiness probe fails at once (the Service stops sending), while
    reviews are still answered until the delay ends; then the process exits 0."""
    import time
    import urllib.request

    pod = Pod(REPO, tmp_path / "w", "--shutdown-delay", "3")
    ctx = ssl.create_default_context(cadata=pod.ca)
    url = f"https://127.0.0.1:{pod.port}"

    def get(path: str) -> int:
        try:
            with urllib.request.urlopen(url + path, context=ctx, timeout=5) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return e.code

    assert get("/healthz") == 200
    t0 = time.monotonic()
    pod.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 2
    while get("/healthz") != 503:
        assert time.monotonic() < deadline, "/healthz still 200 after SIGTERM"
    reviewed = asyncio.run(_review(pod.port, ctx, json.dumps(review(VMI)).encode()))
    assert reviewed == "", reviewed
    _, err = pod.proc.communicate(timeout=30)
    assert pod.proc.returncode == 0, err
    pod.close()
    assert time.monotonic() - t0 >= 2.5  # it waited out the delay
