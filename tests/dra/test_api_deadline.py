"""A hanging API server (issue 20 item 1): a stand-in that accepts TCP connections and never
answers. Each ResourceClaim GET gets a deadline and a per-claim error naming it, and the GETs
run on threads of their own: an Unprepare of a never-prepared claim answers while ten GETs
hang on the (two, as in the node core) host-I/O threads' loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.dra.test_prepare import CONFIG, _boot
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.apiserver.publisher import claim_reader
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text

#: a liveness guard so that the old code fails instead of hanging; never a performance target
GUARD = 60.0


class SilentServer:
    """Accepts every connection, reads nothing, answers nothing."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.accepted = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.accepted:
                self.conns.append(conn)
                self.accepted.notify_all()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._thread.join(timeout=GUARD)
        self.sock.close()
        with self.accepted:
            for c in self.conns:
                c.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    s = SilentServer()
    yield s
    s.close()


def test_hanging_gets_fail_their_claims_at_the_deadline_and_starve_nothing(
    tree: SysfsTree, kernel: SimulatedKernel, silent: SilentServer, tmp_path: Path
) -> None:
    import kubernetes.client

    cfg = kubernetes.client.Configuration()
    cfg.host = f"http://127.0.0.1:{silent.port}"
    _boot(tree, "boot-1")
    config = load_config_text(CONFIG, "test")
    prep = ClaimPreparer(
        host=Host(tree.root, kernel=kernel), driver="vfio.example.com", node="node-a",
        cdi_dir=str(tmp_path / "cdi"), plugins_dir=str(tmp_path / "plugins"),
        read_claim=claim_reader(kubernetes.client.ApiClient(cfg), timeout=2.0),
        config=lambda: config,
    )  # fmt: skip
    hanging = [ClaimRef("default", f"uid-{i}", f"c{i}") for i in range(10)]

    async def scenario() -> tuple[bool, object, object]:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(2))  # the node core's host-I/O threads
        await prep.loaded()
        gets = asyncio.ensure_future(prep.prepare(hanging))
        # the GETs are in flight: the server has accepted their connections
        with ThreadPoolExecutor(1) as own:  # not the host threads the old code starved
            ok = await loop.run_in_executor(own, _wait_for_connections, silent, 2)
        assert ok, "no GET reached the stand-in"
        never = ClaimRef("default", "uid-never", "never")
        try:
            un = await asyncio.wait_for(prep.unprepare([never]), GUARD)
        except TimeoutError:
            silent.close()  # let the stuck threads end so that the failure is reported
            raise
        answered_while_hanging = not gets.done()
        out = await asyncio.wait_for(gets, GUARD)
        return answered_while_hanging, un, out

    answered_while_hanging, un, out = asyncio.run(scenario())
    assert un == {"uid-never": ""}
    assert answered_while_hanging
    assert isinstance(out, dict) and set(out) == {c.uid for c in hanging}
    for c in hanging:
        err = out[c.uid].error
        assert err.startswith(f"claim default/{c.name} (uid {c.uid}): "), err
        assert f"reading ResourceClaim default/{c.name}" in err, err
        assert "did not answer within 2 s" in err, err


def _wait_for_connections(server: SilentServer, n: int) -> bool:
    with server.accepted:
        return server.accepted.wait_for(lambda: len(server.conns) >= n, timeout=GUARD)
