"""A DaemonSet roll, at process level: the previous release's daemons replaced by this one's on
the same node state (``maxSurge: 0``: the old pod is gone before the new one starts), and back.

The previous release is the main this round started from (``3ab829d``), taken from this
checkout's history with ``git archive`` and run from its own tree (``PYTHONPATH``), as the old
image would. On a temp sysfs tree (the ``dra_host`` topology): the mlx VFs already on vfio-pci
with bind records, a claim prepared by the running release, and a VM-style holder of the
claim's ``/dev/vfio/61`` (a ``proc/<pid>/fd`` link, as /proc shows it). Then:

- the DRA plugin is stopped (SIGTERM) and the other release's started on the same state: it
  registers, publishes the same devices, reports them healthy on the kubelet's health stream,
  touches no sysfs file (no unbind, no re-bind: every ``driver`` link, ``driver_override`` and
  bind record is byte-for-byte what it was), keeps the claim prepared (its checkpoint), answers
  Unprepare for it, and prepares a new claim;
- the device plugin likewise: the kubelet stand-in sees the same devices healthy after the
  roll, and Allocate answers.

A temp tree has no kernel behind it, so a roll in the middle of a bind (the kernel's part) is
the guest rig's to show; here every group is already where the claims need it.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.dra.apiserver_standin import CLAIMS, SLICES, ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.test_held_groups import hold
from tests.dra.topologies import DRA_CONFIG, PUBLISHED, dra_host
from tests.releases import PREVIOUS_MAIN, REPO, archive
from tests.sysfs_tree import SysfsTree
from tests.waiting import wait_until_async

DRIVER = "vfio.dra.vfio-dp.io"
VF = "pci-0000-af-00-1"  # group 61, on vfio-pci in dra_host
VF2 = "pci-0000-af-00-2"  # group 62
DP_RESOURCE = "devices.kubevirt.io/8086_10d3"


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's Python packages, as its image has them."""
    out = archive(PREVIOUS_MAIN, tmp_path_factory.mktemp("previous-main"))
    # the old layout, not this checkout's: one flat dra/ with driver.py
    assert (out / "vfio_dp/dra/driver.py").is_file()
    return out


def _vfioctl(tree: Path, *args: str, cwd: Path) -> subprocess.Popen[str]:
    """``vfioctl ARGS`` from ``tree`` (its packages first on the path, nothing else of ours)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "NODE_NAME": NODE}
    return subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", *args],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


async def _stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM, as the kubelet does at a roll: the daemon must exit 0 within the grace."""
    proc.send_signal(signal.SIGTERM)
    _out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 0, err[-3000:]
    return err


def _reap(proc: subprocess.Popen[str]) -> None:
    """After a failure: no process left running, its pipes closed (a leaked one fails the
    next test with ResourceWarnings)."""
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


def _state(tree: SysfsTree) -> dict[str, str]:
    """Every file a bind or unbind would change, by content hash: driver links, overrides,
    bind records, sysfs write files."""
    seen: dict[str, str] = {}
    for base in ("sys/bus/pci/devices", "var/lib/vfio_dp/original"):
        top = tree.root / base
        if not top.exists():
            continue
        for entry in sorted(top.iterdir()):
            if entry.is_symlink() and base.startswith("sys"):
                d = entry.resolve()
                drv = d / "driver"
                seen[f"{entry.name}/driver"] = os.readlink(drv) if drv.is_symlink() else "-"
                for f in ("driver_override",):
                    p = d / f
                    if p.exists():
                        seen[f"{entry.name}/{f}"] = p.read_text()
            elif entry.is_file():
                seen[str(entry.relative_to(tree.root))] = hashlib.sha256(
                    entry.read_bytes()
                ).hexdigest()
    return seen


def _claim(name: str, device: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "vms"},
        "spec": {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": DRIVER}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "vf", "driver": DRIVER, "pool": NODE, "device": device}]}}},
    }  # fmt: skip


class Node:
    def __init__(self, tmp: Path, api: ApiServerStandin, kdirs: tuple[str, str]) -> None:
        self.tmp, self.api = tmp, api
        self.tree = dra_host(tmp / "root")
        self.config = tmp / "config.yaml"
        self.config.write_text(DRA_CONFIG)
        self.registry, self.plugins = kdirs
        self.cdi = tmp / "cdi"

    def dra(self, tree: Path) -> subprocess.Popen[str]:
        return _vfioctl(
            tree, "dra-plugin", "--kubeconfig", self.api.kubeconfig,
            "--kubelet-registry-dir", self.registry, "--kubelet-plugins-dir", self.plugins,
            "--cdi-dir", str(self.cdi), "--config", str(self.config), "--root", str(self.tree.root),
            "--resync", "0.3", "--metrics-port", "0", cwd=self.tmp,
        )  # fmt: skip

    def claim(self, name: str, device: str) -> tuple[str, str, str]:
        m = self.api.seed(CLAIMS, _claim(name, device))["metadata"]
        return m["namespace"], m["uid"], m["name"]

    def published(self) -> set[str]:
        return {
            d["name"]
            for s in self.api.objects(SLICES)
            if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
            for d in s["spec"].get("devices") or []
        }


@pytest.fixture
async def kubelet(
    kdirs: tuple[str, str], apiserver: ApiServerStandin
) -> AsyncIterator[KubeletDraStandin]:
    k = KubeletDraStandin(kdirs[0], NODE, api_client=apiserver.client(), wipe_grace=30)
    await k.start()
    yield k
    await k.stop()


async def _serving(
    kubelet: KubeletDraStandin, node: Node, proc: subprocess.Popen[str], since: float = 0.0
) -> None:
    """Registered (a connection newer than any before), every device published and healthy
    -- healthy as reported after ``since`` (monotonic): once the previous release has
    stopped, its last health report is still "Healthy" for a second and says nothing of
    the new one."""

    def reported_healthy(device: str) -> bool:
        seen = kubelet.health.get(DRIVER, {}).get((NODE, device))
        return seen is not None and seen.received > since and seen.health == "Healthy"

    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"the plugin exited {proc.returncode}: {proc.stderr.read()[-3000:]}"
            )  # type: ignore[union-attr]
        return (
            kubelet.usable(DRIVER)
            and node.published() == set(PUBLISHED)
            and all(kubelet.health_of(DRIVER, NODE, d)[0] == "Healthy" for d in PUBLISHED)
            and all(reported_healthy(d) for d in PUBLISHED)
        )

    def state() -> str:  # what is missing, for the timeout's message
        return (
            f"usable={kubelet.usable(DRIVER)}, published={sorted(node.published())}, "
            f"health={kubelet.health.get(DRIVER, {})!r}"
        )

    await wait_until_async(ready, what="registered, published, healthy", timeout=60, state=state)


@pytest.mark.parametrize("direction", ["upgrade", "rollback"])
async def test_a_dra_plugin_roll_keeps_every_claim_and_binding(
    direction: str,
    previous: Path,
    tmp_path: Path,
    apiserver: ApiServerStandin,
    kubelet: KubeletDraStandin,
    kdirs: tuple[str, str],
) -> None:
    first, second = (previous, REPO) if direction == "upgrade" else (REPO, previous)
    node = Node(tmp_path, apiserver, kdirs)
    held = node.claim("vm-a", VF)

    old = node.dra(first)
    try:
        await _serving(kubelet, node, old)
        answer = await kubelet.prepare(DRIVER, [held])
        assert not answer[held[1]].error, answer[held[1]].error
        cdi_ids = list(answer[held[1]].devices[0].cdi_device_ids)
        hold(node.tree.root, 4242, "/dev/vfio/61")  # the claim's VM opens its group
        before = _state(node.tree)
        assert before["0000:af:00.1/driver"].endswith("vfio-pci"), before
        checkpoint = sorted((node.tree.root / "var/lib/vfio_dp").glob("dra-*.checkpoint.json"))
        assert checkpoint, "the running release wrote no checkpoint"
    except BaseException:
        _reap(old)
        raise
    await _stop(old)
    stopped = time.monotonic()  # what the kubelet hears from now on is the new release's
    kubelet_calls_before = len(kubelet.attempts)
    new = node.dra(second)
    try:
        await wait_until_async(
            lambda: len(kubelet.attempts) > kubelet_calls_before,
            what="the new release registers", timeout=60,
        )  # fmt: skip
        await _serving(kubelet, node, new, since=stopped)
        # nothing unbound or re-bound, no record rewritten: the same bytes everywhere
        assert _state(node.tree) == before
        # the claim prepared by the other release is still prepared here: the same answer
        again = await kubelet.prepare(DRIVER, [held])
        assert not again[held[1]].error, again[held[1]].error
        assert list(again[held[1]].devices[0].cdi_device_ids) == cdi_ids
        assert _state(node.tree) == before
        # a new claim prepares on the new process; the old claim unprepares there
        fresh = node.claim("vm-b", VF2)
        got = await kubelet.prepare(DRIVER, [fresh])
        assert not got[fresh[1]].error, got[fresh[1]].error
        gone = await kubelet.unprepare(DRIVER, [held, fresh])
        assert gone == {held[1]: "", fresh[1]: ""}
        assert not list(node.cdi.glob(f"*{held[1]}*")), "the claim's CDI spec is left"
    finally:
        await _stop(new)


@pytest.fixture
async def dp_kubelet(tmp_path: Path) -> AsyncIterator[KubeletStandin]:
    d = tempfile.mkdtemp(prefix="kdp", dir="/tmp")  # unix socket paths: <= 107 bytes
    k = KubeletStandin(d)
    await k.start()
    yield k
    await k.stop()
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.parametrize("direction", ["upgrade", "rollback"])
async def test_a_device_plugin_roll_keeps_its_devices_healthy(
    direction: str, previous: Path, tmp_path: Path, dp_kubelet: KubeletStandin
) -> None:
    first, second = (previous, REPO) if direction == "upgrade" else (REPO, previous)
    tree = dra_host(tmp_path / "root")
    config = tmp_path / "config.yaml"
    config.write_text(DRA_CONFIG)

    def plugin(release: Path) -> subprocess.Popen[str]:
        return _vfioctl(
            release, "plugin", "--config", str(config), "--root", str(tree.root),
            "--kubelet-dir", dp_kubelet.dir, "--resync", "0.3", "--metrics-port", "0",
            cwd=tmp_path,
        )  # fmt: skip

    async def healthy() -> dict[str, str]:
        await dp_kubelet.wait_for(
            "the device plugin's devices, healthy",
            lambda k: (
                bool(k.devices(DP_RESOURCE)) and set(k.devices(DP_RESOURCE).values()) == {"Healthy"}
            ),
            timeout=60,
        )
        return dp_kubelet.devices(DP_RESOURCE)

    old = plugin(first)
    try:
        seen = await healthy()
        allocated = await dp_kubelet.allocate(DP_RESOURCE, sorted(seen)[:1])
        before = _state(tree)
    except BaseException:
        _reap(old)
        raise
    await _stop(old)
    new = plugin(second)
    try:
        await dp_kubelet.wait_for(
            "re-registration", lambda k: len(k.registrations) >= 2, timeout=60
        )
        assert await healthy() == seen
        assert _state(tree) == before
        again = await dp_kubelet.allocate(DP_RESOURCE, sorted(seen)[:1])
        assert dict(again.envs) == dict(allocated.envs)
    finally:
        await _stop(new)
