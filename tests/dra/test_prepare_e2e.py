"""Prepare/Unprepare end to end: the kubelet DRA stand-in (v1 and v1beta1, over the real unix
sockets) calls the DRA plugin, which reads ResourceClaims from the API-server stand-in with the
real kubernetes client and binds on a temp sysfs tree through the kernel simulator."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import CLAIMS, ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import SERVICES, KubeletDraStandin
from tests.dra.topologies import DRA_CONFIG, dra_host
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from tests.waiting import wait_until_async
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host
from vfio_dp.model import dra_metadata as md

DRIVER = "vfio.dra.vfio-dp.io"
GPU, AUDIO = "0000:3b:00.0", "0000:3b:00.1"


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return dra_host(tmp_path / "host")


@pytest.fixture
def kernel(tree: SysfsTree) -> SimulatedKernel:
    return SimulatedKernel(tree)


def claim(
    name: str,
    results: list[dict[str, Any]],
    *,
    namespace: str = "vms",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = annotations
    requests = sorted({md.request_base(r["request"]) for r in results})
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": meta,
        "spec": {
            "devices": {
                "requests": [{"name": r, "exactly": {"deviceClassName": DRIVER}} for r in requests]
            }
        },
        "status": {"allocation": {"devices": {"results": results}}},
    }


def gpu_result(**kw: Any) -> dict[str, Any]:
    return {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "pci-0000-3b-00-0", **kw}


class Rig:
    def __init__(self, api: ApiServerStandin, kubelet: KubeletDraStandin, plugin: DraPlugin,
                 cdi_dir: str) -> None:  # fmt: skip
        self.api, self.kubelet, self.plugin, self.cdi_dir = api, kubelet, plugin, cdi_dir

    def seed(self, obj: dict[str, Any]) -> tuple[str, str, str]:
        stored = self.api.seed(CLAIMS, obj)
        m = stored["metadata"]
        return m["namespace"], m["uid"], m["name"]


@pytest.fixture(params=list(SERVICES))
async def rig(
    request: pytest.FixtureRequest,
    tree: SysfsTree,
    kernel: SimulatedKernel,
    apiserver: ApiServerStandin,
    kdirs: tuple[str, str],
    tmp_path: Path,
) -> AsyncIterator[Rig]:
    """One rig per kubelet service version (v1.DRAPlugin, v1beta1.DRAPlugin)."""
    registry, plugins = kdirs
    config = tmp_path / "config.yaml"
    config.write_text(DRA_CONFIG)
    cdi_dir = str(tmp_path / "cdi")
    kubelet = KubeletDraStandin(
        registry, NODE, api_client=apiserver.client(), versions=(request.param,)
    )
    await kubelet.start()
    plugin = DraPlugin(
        DraOptions(
            node_name=NODE, driver_name=DRIVER, registry_dir=registry, plugins_dir=plugins,
            cdi_dir=cdi_dir, config_path=str(config), root=str(tree.root), resync=0.2,
            metrics_port=0, uevents=False,
        ),
        apiserver.client(),
        host=Host(tree.root, kernel=kernel),
    )  # fmt: skip
    await plugin.start()
    await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
    assert kubelet.plugins[DRIVER].version == request.param
    try:
        yield Rig(apiserver, kubelet, plugin, cdi_dir)
    finally:
        await plugin.stop()
        await kubelet.stop()


async def test_prepare_binds_unprepare_restores(rig: Rig, tree: SysfsTree) -> None:
    ref = rig.seed(claim("vm-gpu", [gpu_result()]))
    _ns, uid, name = ref
    answer = (await rig.kubelet.prepare(DRIVER, [ref]))[uid]
    assert answer.error == ""
    (dev,) = answer.devices
    assert list(dev.request_names) == ["gpu"] and dev.pool_name == NODE
    assert dev.device_name == "pci-0000-3b-00-0"
    assert list(dev.cdi_device_ids) == [
        f"{DRIVER}/vfio={uid}-pci-0000-3b-00-0",
        f"{DRIVER}/vfio={uid}-metadata-gpu",
    ]
    assert tree.driver_of(GPU) == "vfio-pci" and tree.driver_of(AUDIO) == "vfio-pci"
    spec = json.loads(Path(rig.cdi_dir, f"{DRIVER}-{uid}.json").read_text())
    mount = spec["devices"][1]["containerEdits"]["mounts"][0]
    assert mount["containerPath"].endswith(f"/resourceclaims/{name}/gpu/{DRIVER}-metadata.json")
    assert md.parse(Path(mount["hostPath"]).read_text()).devices_for("gpu")[0].pci_bus_id == GPU
    # kubelet re-sends after a restart: same answer, nothing bound twice
    again = (await rig.kubelet.prepare(DRIVER, [ref]))[uid]
    assert list(again.devices[0].cdi_device_ids) == list(dev.cdi_device_ids)
    assert await rig.kubelet.unprepare(DRIVER, [ref]) == {uid: ""}
    assert tree.driver_of(GPU) == "nvidia" and tree.driver_of(AUDIO) == "snd_hda_intel"
    assert not os.path.exists(Path(rig.cdi_dir, f"{DRIVER}-{uid}.json"))
    assert not os.path.exists(mount["hostPath"])


async def test_template_generated_claim_and_admin_access(rig: Rig, tree: SysfsTree) -> None:
    ref = rig.seed(
        claim(
            "virt-launcher-vm1-gpu-7xk2q",
            [gpu_result(adminAccess=True)],
            annotations={md.POD_CLAIM_NAME_ANNOTATION: "gpu"},
        )
    )
    uid = ref[1]
    answer = (await rig.kubelet.prepare(DRIVER, [ref]))[uid]
    assert answer.error == ""
    assert list(answer.devices[0].cdi_device_ids) == [f"{DRIVER}/vfio={uid}-metadata-gpu"]
    assert tree.driver_of(GPU) == "nvidia"  # adminAccess never binds
    spec = json.loads(Path(rig.cdi_dir, f"{DRIVER}-{uid}.json").read_text())
    (only,) = spec["devices"]
    assert only["containerEdits"]["mounts"][0]["containerPath"] == (
        f"{md.CONTAINER_BASE}/resourceclaimtemplates/gpu/gpu/{DRIVER}-metadata.json"
    )
    assert await rig.kubelet.unprepare(DRIVER, [ref]) == {uid: ""}


async def test_per_claim_errors_in_one_pod(rig: Rig, tree: SysfsTree) -> None:
    good = rig.seed(
        claim("vm-nvme", [{**gpu_result(), "device": "pci-0000-07-00-0", "request": "disk"}])
    )
    other_node = rig.seed(claim("vm-far", [gpu_result(pool="node-b")]))
    ns, real_uid, name = rig.seed(claim("vm-old", [gpu_result()]))
    stale = (ns, "uid-of-a-deleted-claim", name)
    missing = ("vms", "uid-missing", "nope")
    out = await rig.kubelet.prepare(DRIVER, [good, other_node, stale, missing])
    assert out[good[1]].error == ""
    assert "device pci-0000-3b-00-0: allocated from pool 'node-b'" in out[other_node[1]].error
    assert f"now has uid '{real_uid}'" in out["uid-of-a-deleted-claim"].error
    assert (
        "vms/nope (uid uid-missing): the ResourceClaim vms/nope does not exist"
        in out["uid-missing"].error
    )
    assert tree.driver_of(GPU) == "nvidia"  # nothing bound for the refused claims
    answers = await rig.kubelet.unprepare(DRIVER, [good, other_node, stale, missing])
    assert set(answers.values()) == {""}


async def test_a_retry_after_the_deadline_waits_for_the_running_bind(
    rig: Rig, tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """kubelet's call times out while the GPU driver takes its time to let go; kubelet re-sends
    the claim; the retry waits for the bind that is still running and answers from it."""
    import threading

    import grpc

    # the GPU driver lets go when the test says (a fixed 1 s hang could end before the retry
    # came on a loaded machine, or the 0.3 s deadline pass before the bind began)
    let_go = threading.Event()
    kernel.gates["nvidia/unbind"] = let_go
    ref = rig.seed(claim("vm-gpu", [gpu_result()]))
    try:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await rig.kubelet.prepare(DRIVER, [ref], timeout=0.3)
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_until_async(
            lambda: any(p.endswith("nvidia/unbind") for p, _ in kernel.writes),
            what="the first call's bind letting the GPU driver go",
        )
        retry = asyncio.ensure_future(rig.kubelet.prepare(DRIVER, [ref]))
        await wait_until_async(  # the first call's handler still runs, the retry's too
            lambda: len(rig.plugin.kubelet._running) >= 2, what="the retry in the plugin"
        )
        assert not retry.done()
        let_go.set()
        answer = (await retry)[ref[1]]
    finally:
        let_go.set()
    assert answer.error == "" and tree.driver_of(GPU) == "vfio-pci"
    overrides = [d for p, d in kernel.writes if p.endswith(f"{GPU}/driver_override")]
    assert overrides == ["vfio-pci"]


async def test_claim_deleted_while_prepared_is_restored_by_reconcile(
    rig: Rig, tree: SysfsTree
) -> None:
    ref = rig.seed(claim("vm-gpu", [gpu_result()]))
    assert (await rig.kubelet.prepare(DRIVER, [ref]))[ref[1]].error == ""
    await asyncio.to_thread(_delete_claim, rig.api, ref)

    def done() -> bool:  # drivers back, then the claim forgotten (in that order)
        drivers = (tree.driver_of(GPU), tree.driver_of(AUDIO))
        return drivers == ("nvidia", "snd_hda_intel") and (
            rig.plugin.claims.checkpoint.get(ref[1]) is None
        )

    # resync is 0.2 s; the machine is shared
    await wait_until_async(done, what="reconcile to restore the drivers", timeout=15)


def _delete_claim(api: ApiServerStandin, ref: tuple[str, str, str]) -> None:
    from kubernetes import client

    c = api.client()
    try:
        client.ResourceV1Api(c).delete_namespaced_resource_claim(ref[2], ref[0])
    finally:
        c.close()
