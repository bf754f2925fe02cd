"""A claim-status write never delays Prepare's answer, and never holds up a stop (issue 37
item 11): ``vfioctl dra-plugin`` as a real process against the API-server stand-in whose
``PUT .../resourceclaims/<name>/status`` answers one byte every 2 s (everything else is
answered as usual). Prepare answers at once; SIGTERM ends the process within a few seconds
while the PUT still trickles."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.dra import apiserver_standin
from tests.dra.apiserver_standin import CLAIMS, ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.test_dra_plugin_process import vfioctl
from tests.dra.test_prepare_e2e import claim
from tests.dra.topologies import DRA_CONFIG, dra_host
from vfio_dp.model.naming import DEFAULT_DRA_DRIVER as DRIVER

#: liveness guards for a loaded 2-CPU machine: the old code needed the trickle to end
#: (hours) for both; never performance targets
ANSWER_GUARD = 10.0
STOP_GUARD = 10.0
TRICKLE_EVERY = 2.0


class Trickle:
    """Makes the stand-in answer every claim-status PUT one byte every 2 s (a 100 kB body
    announced); ``started`` is set when the first one begins."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.stop = threading.Event()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        answer = apiserver_standin._Handler.do_PUT
        trickle = self

        def do_put(handler: apiserver_standin._Handler) -> None:
            if not handler.path.split("?")[0].endswith("/status"):
                answer(handler)
                return
            handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", "100000")
            handler.end_headers()
            trickle.started.set()
            while not trickle.stop.is_set():
                try:
                    handler.wfile.write(b" ")
                    handler.wfile.flush()
                except OSError:
                    return  # the client went away
                trickle.stop.wait(TRICKLE_EVERY)

        monkeypatch.setattr(apiserver_standin._Handler, "do_PUT", do_put)


@pytest.fixture
def trickle(monkeypatch: pytest.MonkeyPatch, apiserver: ApiServerStandin) -> Iterator[Trickle]:
    t = Trickle()
    t.install(monkeypatch)
    yield t
    t.stop.set()


@pytest.fixture
async def kubelet(
    kdirs: tuple[str, str], apiserver: ApiServerStandin
) -> AsyncIterator[KubeletDraStandin]:
    k = KubeletDraStandin(kdirs[0], NODE, api_client=apiserver.client())
    await k.start()
    yield k
    await k.stop()


@pytest.fixture
def plugin(
    kdirs: tuple[str, str], apiserver: ApiServerStandin, tmp_path: Path
) -> Iterator[subprocess.Popen[str]]:
    host = dra_host(tmp_path / "root")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(DRA_CONFIG)
    proc = subprocess.Popen(
        [*vfioctl(), "dra-plugin", "--kubeconfig", apiserver.kubeconfig,
         "--kubelet-registry-dir", kdirs[0], "--kubelet-plugins-dir", kdirs[1],
         "--cdi-dir", str(tmp_path / "cdi"), "--config", str(cfg), "--root", str(host.root),
         "--resync", "0.5", "--metrics-port", "0"],
        env=dict(os.environ, NODE_NAME=NODE), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


async def test_prepare_answers_and_sigterm_stops_while_a_status_put_trickles(
    apiserver: ApiServerStandin,
    trickle: Trickle,
    kubelet: KubeletDraStandin,
    plugin: subprocess.Popen[str],
) -> None:
    await kubelet.wait_for("registration", lambda k: k.usable(DRIVER), timeout=30)
    # a VF already on vfio-pci (no bind): Prepare is the claim read and the files
    vf = {"request": "nic", "driver": DRIVER, "pool": NODE, "device": "pci-0000-af-00-1"}
    meta = apiserver.seed(CLAIMS, claim("vm-nic", [vf]))["metadata"]
    ref = (meta["namespace"], meta["uid"], meta["name"])
    start = time.monotonic()
    answer = await asyncio.wait_for(kubelet.prepare(DRIVER, [ref]), ANSWER_GUARD)
    answered = time.monotonic() - start
    assert answer[ref[1]].error == "" and answer[ref[1]].devices, answer
    # the status write began after the answer, and it is still trickling
    assert await asyncio.to_thread(trickle.started.wait, ANSWER_GUARD), "no status PUT"
    assert not trickle.stop.is_set()
    sigterm = time.monotonic()
    plugin.send_signal(signal.SIGTERM)
    try:
        rc = await asyncio.to_thread(plugin.wait, STOP_GUARD)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {STOP_GUARD:.0f} s after SIGTERM (status PUT trickling)")
    stopped = time.monotonic() - sigterm
    _, err = plugin.communicate()
    assert rc == 0, err
    assert "claim status write(s) not done" in err  # said, not silently dropped
    print(f"Prepare answered in {answered:.2f} s; SIGTERM -> exit {stopped:.2f} s")
