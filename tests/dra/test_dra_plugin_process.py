"""``vfioctl dra-plugin`` as a real subprocess between the two stand-ins: the kubelet DRA
stand-in (registration, DRAPlugin calls, slice wiping) and the API-server stand-in (the real
``kubernetes`` client over HTTP, strict validation). What kubelet and the API server see."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import NODES, SLICES, ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.test_grpcurl_dra import _near_python
from tests.dra.topologies import DRA_CONFIG, PUBLISHED, dra_host
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.apiserver.client import TIMEOUT
from vfio_dp.model.naming import DEFAULT_DRA_DRIVER as DEFAULT_DRIVER

GRACE = 4.0  # kubelet's 30 s, shortened (long enough for a loaded 2-CPU machine)
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


def vfioctl() -> list[str]:
    exe = _near_python("vfioctl")
    return [exe] if exe else [sys.executable, "-c", "from cli.main import main; main()"]


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[ApiServerStandin]:
    """Over HTTPS, as a real API server: the plugin must trust the kubeconfig's CA."""
    api = ApiServerStandin(str(tmp_path / "api"), tls=True)
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    yield api
    api.stop()


@pytest.fixture
def host(tmp_path: Path) -> SysfsTree:
    return dra_host(tmp_path / "root")


@pytest.fixture
async def kubelet(
    kdirs: tuple[str, str], apiserver: ApiServerStandin
) -> AsyncIterator[KubeletDraStandin]:
    k = KubeletDraStandin(kdirs[0], NODE, api_client=apiserver.client(), wipe_grace=GRACE)
    await k.start()
    yield k
    await k.stop()


def start_plugin(
    host: SysfsTree, kdirs: tuple[str, str], apiserver: ApiServerStandin, tmp_path: Path
) -> subprocess.Popen[str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(DRA_CONFIG)
    return subprocess.Popen(
        [
            *vfioctl(),
            "dra-plugin",
            "--kubeconfig",
            apiserver.kubeconfig,
            "--kubelet-registry-dir",
            kdirs[0],
            "--kubelet-plugins-dir",
            kdirs[1],
            "--cdi-dir",
            str(tmp_path / "cdi"),
            "--config",
            str(cfg),
            "--root",
            str(host.root),
            "--resync",
            "0.2",
            "--metrics-port",
            "0",
        ],
        env=dict(os.environ, NODE_NAME=NODE),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture
def plugin(
    host: SysfsTree, kdirs: tuple[str, str], apiserver: ApiServerStandin, tmp_path: Path
) -> Iterator[subprocess.Popen[str]]:
    proc = start_plugin(host, kdirs, apiserver, tmp_path)
    yield proc
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def published(api: ApiServerStandin) -> dict[str, dict[str, Any]]:
    """device name -> device, over every slice of this node and driver."""
    out = {}
    for s in api.objects(SLICES):
        if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DEFAULT_DRIVER:
            for d in s["spec"].get("devices") or []:
                out[d["name"]] = d
    return out


async def wait_api(api: ApiServerStandin, what: str, pred: Any, timeout: float = 20) -> None:
    await asyncio.to_thread(api.wait_for, what, pred, timeout)


async def test_registers_publishes_survives_a_kubelet_restart_and_stops_cleanly(
    apiserver: ApiServerStandin,
    kubelet: KubeletDraStandin,
    plugin: subprocess.Popen[str],
    kdirs: tuple[str, str],
) -> None:
    registry, plugins = kdirs
    # a liveness guard: an interpreter, the kubernetes client's import and a scan before the
    # first registration take tens of seconds on a loaded 2-CPU machine (30 s ran out)
    await kubelet.wait_for("registration", lambda k: k.usable(DEFAULT_DRIVER), timeout=60)
    view = kubelet.plugins[DEFAULT_DRIVER]
    assert [a.socket for a in kubelet.attempts] == [f"{DEFAULT_DRIVER}-reg.sock"]
    assert view.version == "v1.DRAPlugin"
    assert view.endpoint == f"{plugins}/{DEFAULT_DRIVER}/dra.sock"

    await wait_api(apiserver, "the slices", lambda a: set(published(a)) == set(PUBLISHED))
    node_uid = apiserver.objects(NODES)[0]["metadata"]["uid"]
    for s in apiserver.objects(SLICES):
        assert s["spec"]["pool"]["name"] == NODE
        assert [o["uid"] for o in s["metadata"].get("ownerReferences", [])] == [node_uid]
    for name, (bdf, _group, _functions) in PUBLISHED.items():
        attrs = published(apiserver)[name]["attributes"]
        assert attrs["resource.kubernetes.io/pciBusID"] == {"string": bdf}
    generation = max(s["spec"]["pool"]["generation"] for s in apiserver.objects(SLICES))

    # a kubelet restart deletes every slice of the node; the plugin publishes them again
    await kubelet.restart()
    assert kubelet.wipes[-1] == f"spec.nodeName={NODE}"
    await wait_api(apiserver, "republished", lambda a: set(published(a)) == set(PUBLISHED))
    await kubelet.wait_for("registration again", lambda k: k.usable(DEFAULT_DRIVER), timeout=10)
    assert max(s["spec"]["pool"]["generation"] for s in apiserver.objects(SLICES)) > generation

    # every claim gets an answer: an error per claim while Prepare is not implemented
    claims = [("default", "u-1", "vm-a"), ("default", "u-2", "vm-b")]
    answer = await kubelet.prepare(DEFAULT_DRIVER, claims)
    assert set(answer) == {"u-1", "u-2"}
    assert all(a.error and not a.devices for a in answer.values())
    assert await kubelet.unprepare(DEFAULT_DRIVER, claims) == {"u-1": "", "u-2": ""}

    # SIGTERM: both sockets removed, exit 0; the plugin deletes none of its slices — they go
    # only when kubelet's grace has passed without the driver (its DeleteCollection)
    sigterm = time.monotonic()
    plugin.send_signal(signal.SIGTERM)
    rc = await asyncio.to_thread(plugin.wait, 15)
    _, err = plugin.communicate()
    assert rc == 0, err
    assert not os.path.exists(f"{registry}/{DEFAULT_DRIVER}-reg.sock")
    assert not os.path.exists(f"{plugins}/{DEFAULT_DRIVER}/dra.sock")
    await kubelet.wait_for("the driver is gone", lambda k: DEFAULT_DRIVER not in k.plugins)
    driver_wipe = f"spec.nodeName={NODE},spec.driver={DEFAULT_DRIVER}"
    await kubelet.wait_for("kubelet's wipe", lambda k: driver_wipe in k.wipes, timeout=GRACE + 10)
    assert published(apiserver) == {}
    deletes = [
        (r.path, r.query.get("fieldSelector"))
        for r in apiserver.requests
        if r.at > sigterm and r.method == "DELETE"
    ]
    # kubelet's, and nobody else's
    assert deletes == [(SLICES_PATH, driver_wipe)], "\n".join(
        f"{t - sigterm:+.2f} s {e}" for t, e in kubelet.events
    )
    refused = [r for r in apiserver.requests if r.code >= 400 and r.code != 404]
    assert refused == [], refused  # nothing the plugin sent was refused by the strict server


async def test_sigterm_while_the_start_waits_for_the_slice_list_stops_at_once(
    apiserver: ApiServerStandin, host: SysfsTree, kdirs: tuple[str, str], tmp_path: Path
) -> None:
    """The start reads this node's slices (to adopt them unchanged); a SIGTERM while the API
    server takes its time over that list cuts the list off and ends the process -- it does
    not wait for the list's own deadline (TIMEOUT), nor go on to scan and serve."""
    apiserver.hold_lists("resourceslices")  # the start's list and the slice watch's
    proc = start_plugin(host, kdirs, apiserver, tmp_path)
    try:
        await wait_api(apiserver, "both lists held", lambda a: a.lists_held >= 2, timeout=60)
        sigterm = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 60)
        _, err = proc.communicate()
        await wait_api(apiserver, "both held lists hung up", lambda a: len(a.held_hangups) >= 2)
    finally:
        apiserver.release_lists()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert rc == 0, err
    assert "the start is cut off" in err
    assert "could not read the published slices" not in err  # not ended by its deadline
    assert not os.path.exists(f"{kdirs[0]}/{DEFAULT_DRIVER}-reg.sock")
    # the plugin hung up on both lists at the stop, not at the list's own deadline (TIMEOUT
    # after it began: a thread left in the list, which the exit then waited for); measured at
    # the server, so the interpreter's own exit on a loaded machine does not count
    took = max(apiserver.held_hangups) - sigterm
    assert took < TIMEOUT / 2, (took, err)
