"""The start/stop lifecycle both front-ends share (vfio_dp.core.frontend), over a real node
core on a temp sysfs tree."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from dataclasses import fields

import pytest

from tests.sysfs_tree import SysfsTree
from vfio_dp.core.frontend import FrontEnd, serve
from vfio_dp.core.node import NodeCore
from vfio_dp.core.options import CoreFlags, CoreOptions, FrontEndOptions
from vfio_dp.deviceplugin.options import Options
from vfio_dp.dra.options import DraOptions
from vfio_dp.model.config import DEVICE_PLUGIN, DRA

log = logging.getLogger("vfio_dp.test")


def test_both_front_ends_map_the_core_options_the_same_way() -> None:
    shared = {f.name for f in fields(FrontEndOptions)}
    assert shared == {f.name for f in fields(CoreOptions)} - {"path", "usage", "front_end"}
    assert shared == {f.name for f in fields(CoreFlags)}
    given = {
        "root": "/host",
        "config_path": "/etc/vfio_dp/config.yaml",
        "resync": 2.5,
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "uevents": False,
        "node_name": "node-a",
    }
    dp = Options(kubelet_dir="/k", **given).core()  # type: ignore[arg-type]
    dra = DraOptions(**given).core()  # type: ignore[arg-type]
    assert dp == CoreOptions(**given, path=DEVICE_PLUGIN, usage=False, front_end="device-plugin")  # type: ignore[arg-type]
    assert dra == CoreOptions(**given, path=DRA, usage=True, front_end="dra-plugin")  # type: ignore[arg-type]
    # each front-end keeps its own metrics port by default (both run on one host network)
    assert (Options().metrics_port, DraOptions(node_name="n").metrics_port) == (9109, 9110)


class Recorder(FrontEnd):
    """A third front-end, as a newcomer would write one: start and withdraw only."""

    def __init__(self, core: NodeCore) -> None:
        super().__init__(core, log)
        self.events: list[str] = []
        self.checks = 0

    async def start(self) -> None:
        await self.core.start()
        self.events.append("started")
        self.repeat(0.01, self._check, "check")

    async def _check(self) -> None:
        self.checks += 1
        if self.checks == 1:
            raise RuntimeError("a failing check is logged and the loop goes on")

    async def withdraw(self) -> None:
        self.events.append("withdrawn")


def _core(tree: SysfsTree) -> NodeCore:
    return NodeCore(CoreOptions(root=str(tree.root), metrics_port=0, uevents=False))


async def test_sigterm_stops_a_front_end_cleanly_and_stop_runs_once(
    tree: SysfsTree, caplog: pytest.LogCaptureFixture
) -> None:
    front = Recorder(_core(tree))
    runner = asyncio.ensure_future(serve(front))
    for _ in range(500):
        if front.checks >= 3:
            break
        await asyncio.sleep(0.01)
    assert front.events == ["started"] and front.checks >= 3
    assert "a failing check is logged" in caplog.text
    os.kill(os.getpid(), signal.SIGTERM)  # serve's handler: request_stop
    assert await asyncio.wait_for(runner, 10) == 0
    assert front.events == ["started", "withdrawn"]
    assert front.core.stopping and front.core.health() == "stopping"
    await asyncio.gather(*front._tasks, return_exceptions=True)
    assert all(t.cancelled() for t in front._tasks)  # the loops ended with the stop
    await front.stop()  # a second stop does nothing
    assert front.events == ["started", "withdrawn"]
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
        loop.remove_signal_handler(sig)


#: a liveness guard so that the old code fails instead of hanging; never a performance target
GUARD = 30.0


class SlowStart(Recorder):
    """A front-end whose start waits for an answer that does not come (an API server that
    holds its list)."""

    def __init__(self, core: NodeCore) -> None:
        super().__init__(core)
        self.waiting = asyncio.Event()

    async def start(self) -> None:
        await self.core.start()
        self.events.append("starting")
        self.waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.events.append("start cut off")
            raise


async def test_a_stop_requested_while_starting_cuts_the_start_off(tree: SysfsTree) -> None:
    front = SlowStart(_core(tree))
    runner = asyncio.ensure_future(serve(front))
    try:
        await asyncio.wait_for(front.waiting.wait(), GUARD)
        os.kill(os.getpid(), signal.SIGTERM)  # serve's handler: request_stop
        assert await asyncio.wait_for(runner, GUARD) == 0
        assert front.events == ["starting", "start cut off", "withdrawn"]
        assert front.core.stopping
    finally:
        runner.cancel()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            loop.remove_signal_handler(sig)


async def test_a_stop_that_meets_a_kick_ends_the_resync_loop(tree: SysfsTree) -> None:
    """The stop cancels the resync loop; a kick in the same turn of the event loop (a
    uevent, a health confirmation) must not swallow that cancel (Python 3.11's
    ``asyncio.wait_for`` did: the loop went on scanning after the stop)."""
    core = _core(tree)
    await core.start()
    try:
        (resync,) = [t for t in core._tasks if t.get_name() == "resync"]
        await asyncio.sleep(0)  # the loop now waits for a kick or its interval
        assert not core._dirty.is_set()
        core.kick("a uevent")  # its wait ends ...
        core.begin_stop()  # ... as the stop cancels it
        done, _ = await asyncio.wait({resync}, timeout=GUARD)
        assert resync in done and resync.cancelled()
    finally:
        await core.close()
