"""Fixtures for daemon tests: a short kubelet dir (unix socket paths are limited to 107
bytes), a started kubelet stand-in, and a factory for in-process daemons on temp trees."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.sysfs_tree import SysfsTree
from vfio_dp.deviceplugin.app import Daemon, Options
from vfio_dp.host import Host

NIC = "devices.kubevirt.io/8086_10d3"
NIC_ID = "0000:65:00.0"  # gpu_host's lone NIC on vfio-pci, IOMMU group 50, NUMA 1


@pytest.fixture
def kdir() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="kdp", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def kubelet(kdir: str) -> AsyncIterator[KubeletStandin]:
    k = KubeletStandin(kdir)
    await k.start()
    yield k
    await k.stop()


StartDaemon = Callable[..., Awaitable[Daemon]]


@pytest.fixture
async def start_daemon(tree: SysfsTree, kdir: str) -> AsyncIterator[StartDaemon]:
    started: list[Daemon] = []

    async def start(
        *,
        config: str | Path | None = None,
        host: Host | None = None,
        resync: float = 0.2,
        cdi_dir: str | Path | None = None,
    ) -> Daemon:
        d = Daemon(
            Options(
                root=str(tree.root),
                kubelet_dir=kdir,
                config_path=str(config) if config else None,
                resync=resync,
                metrics_port=0,
                uevents=False,
                cdi_dir=str(cdi_dir) if cdi_dir else None,
            ),
            host=host,
        )
        started.append(d)
        await d.start()
        return d

    yield start
    for d in started:
        with contextlib.suppress(Exception):
            await d.stop()
