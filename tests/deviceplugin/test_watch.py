"""The kubelet-dir watch is told by the kernel (inotify), not a poll: an idle daemon does
not look at the kubelet dir between changes, and a change is acted on at once."""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.deviceplugin.conftest import NIC, NIC_ID
from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.sysfs_tree import SysfsTree
from tests.waiting import wait_until_async
from vfio_dp.core import frontend
from vfio_dp.deviceplugin.app import Daemon, Options


async def test_an_idle_daemon_looks_at_the_kubelet_dir_only_when_it_changes(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the safety look (every WATCH_SAFETY = 5 s, in case a change escaped inotify) is by
    # design; on a loaded machine one fell into the idle window below. Out of the way here:
    # what this test proves is that nothing polls in between.
    monkeypatch.setattr(frontend, "WATCH_SAFETY", 600.0)
    daemon = Daemon(Options(root=str(tree.root), kubelet_dir=kdir, metrics_port=0, uevents=False))
    looks = 0
    check = daemon._check_kubelet

    async def counted() -> bool:  # a spy around the daemon's own check
        nonlocal looks
        looks += 1
        return await check()

    daemon._check_kubelet = counted  # type: ignore[method-assign]
    await daemon.start()
    try:
        await kubelet.wait_for("the NIC listed", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"})
        await wait_until_async(
            lambda: (
                daemon.endpoints[NIC].registering is not None
                and daemon.endpoints[NIC].registering.done()
            ),
            what="registered",
        )
        await asyncio.sleep(0.5)  # the registration's own changes settle
        before = looks
        await asyncio.sleep(2.0)  # idle: a 0.25 s poll would look 8 times
        assert looks - before == 0, looks - before
        path = daemon.endpoints[NIC].path
        os.unlink(path)  # kubelet wiped our socket: acted on at once
        await wait_until_async(lambda: os.path.exists(path), what=f"{path} served again")
        assert looks > before
    finally:
        await daemon.stop()
