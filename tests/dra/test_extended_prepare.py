"""A VM that keeps ``deviceName`` served by DRA (KEP-5004), end to end on the stand-ins: the
classes ``vfioctl deviceclasses`` makes, a launcher-shaped pod asking for the names, the
API-server stand-in's scheduler making and allocating the claim, the kubelet DRA stand-in
preparing it through the real plugin (temp sysfs tree, kernel simulator) and giving each
container the CDI devices its requestMappings name. Each container's environment is then
computed from the CDI specs on disk as a runtime applies them (in order, last wins)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from tests.dra.apiserver_standin import (
    CLAIMS,
    PODS,
    ApiServerStandin,
    schedule_extended_resources,
)
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.topologies import DRA_CONFIG, dra_host
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.deviceclasses import device_classes
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text
from vfio_dp.model.naming import kubevirt_env_var, sriov_env_var

DRIVER = "vfio.dra.vfio-dp.io"
GPU = "devices.kubevirt.io/10de_1eb8"
VF = "devices.kubevirt.io/mlx-vf"
NVME = "devices.kubevirt.io/144d_a808"


def container_env(cdi_dir: str, ids: list[str]) -> dict[str, str]:
    """What a runtime puts in the container's environment from these CDI devices."""
    edits: dict[str, dict[str, Any]] = {}
    for spec_file in Path(cdi_dir).glob("*.json"):
        spec = json.loads(spec_file.read_text())
        for dev in spec["devices"]:
            edits[f"{spec['kind']}={dev['name']}"] = dev["containerEdits"]
    env: dict[str, str] = {}
    for i in ids:
        for e in edits[i].get("env", []):
            name, _, value = e.partition("=")
            env[name] = value  # last wins
    return env


class Rig:
    def __init__(self, api: ApiServerStandin, kubelet: KubeletDraStandin, cdi_dir: str) -> None:
        self.api, self.kubelet, self.cdi_dir = api, kubelet, cdi_dir


@pytest.fixture
async def rig(
    tmp_path: Path, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> AsyncIterator[tuple[Rig, SysfsTree]]:
    tree = dra_host(tmp_path / "host")
    registry, plugins = kdirs
    config = tmp_path / "config.yaml"
    config.write_text(DRA_CONFIG)
    cdi_dir = str(tmp_path / "cdi")
    kubelet = KubeletDraStandin(registry, NODE, api_client=apiserver.client())
    await kubelet.start()
    plugin = DraPlugin(
        DraOptions(
            node_name=NODE, driver_name=DRIVER, registry_dir=registry, plugins_dir=plugins,
            cdi_dir=cdi_dir, config_path=str(config), root=str(tree.root), resync=0.2,
            metrics_port=0, uevents=False,
        ),
        apiserver.client(),
        host=Host(tree.root, kernel=SimulatedKernel(tree)),
    )  # fmt: skip
    await plugin.start()
    await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
    await kubelet.wait_for(
        "the slices", lambda k: bool(apiserver.objects_of_plural("resourceslices"))
    )
    rapi = k8s.ResourceV1Api(apiserver.client())
    cfg = load_config_text(DRA_CONFIG, "dra")
    for c in device_classes(cfg, DRIVER, [("10de", "1eb8"), ("144d", "a808")]):
        rapi.create_device_class(c)
    try:
        yield Rig(apiserver, kubelet, cdi_dir), tree
    finally:
        await plugin.stop()
        await kubelet.stop()


def launcher() -> dict[str, Any]:
    def ctr(name: str, limits: dict[str, int]) -> dict[str, Any]:
        res = {k: str(v) for k, v in limits.items()}
        return {"name": name, "image": "x", "resources": {"limits": res, "requests": dict(res)}}

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "virt-launcher-vm1", "namespace": "vms"},
        "spec": {"containers": [ctr("compute", {GPU: 1, VF: 2}), ctr("hook", {NVME: 1})]},
    }


async def test_each_container_gets_what_allocate_gives_and_nothing_else(
    rig: tuple[Rig, SysfsTree],
) -> None:
    r, tree = rig
    k8s.CoreV1Api(r.api.client()).create_namespaced_pod("vms", launcher())
    claim = schedule_extended_resources(r.api, "vms", "virt-launcher-vm1", NODE)
    assert claim is not None
    (pod,) = r.api.objects(PODS, "vms")
    ids = await r.kubelet.prepare_pod(pod, [claim])
    assert tree.driver_of("0000:3b:00.0") == "vfio-pci"  # bind: onPrepare
    compute = container_env(r.cdi_dir, ids["compute"])
    hook = container_env(r.cdi_dir, ids["hook"])
    vfs = "0000:af:00.1,0000:af:00.2"
    assert compute == {
        kubevirt_env_var(GPU): "0000:3b:00.0",  # the audio function is a companion: not listed
        sriov_env_var(GPU): "0000:3b:00.0",
        kubevirt_env_var(VF): vfs,
        sriov_env_var(VF): vfs,
    }
    assert kubevirt_env_var(GPU) == "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_1EB8"
    nvme = "0000:07:00.0,0000:08:00.0"  # two NVMe in one IOMMU group: both listed
    assert hook == {kubevirt_env_var(NVME): nvme, sriov_env_var(NVME): nvme}
    # the full value on EVERY device of a request, whatever order a runtime applies them in
    for i in ids["compute"]:
        one = container_env(r.cdi_dir, [i])
        if kubevirt_env_var(VF) in one:
            assert one[kubevirt_env_var(VF)] == vfs
    # the group nodes come with them
    edits = {}
    for spec_file in Path(r.cdi_dir).glob("*.json"):
        spec = json.loads(spec_file.read_text())
        edits.update({f"{spec['kind']}={d['name']}": d["containerEdits"] for d in spec["devices"]})
    nodes = {n["path"] for i in ids["compute"] for n in edits[i].get("deviceNodes", [])}
    assert {"/dev/vfio/vfio", "/dev/vfio/45", "/dev/vfio/61", "/dev/vfio/62"} <= nodes
    # unprepare gives the GPU back
    ref = ("vms", claim["metadata"]["uid"], claim["metadata"]["name"])
    assert await r.kubelet.unprepare(DRIVER, [ref]) == {ref[1]: ""}
    assert tree.driver_of("0000:3b:00.0") == "nvidia"


async def test_an_ordinary_claim_gets_no_variables(rig: tuple[Rig, SysfsTree]) -> None:
    r, _ = rig
    obj = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "plain", "namespace": "vms"},
        "spec": {"devices": {"requests": [
            {"name": "vf", "exactly": {"deviceClassName": "mlx-vf.devices.kubevirt.io"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "vf", "driver": DRIVER, "pool": NODE, "device": "pci-0000-af-00-1"}]}}},
    }  # fmt: skip
    stored = r.api.seed(CLAIMS, obj)
    uid = stored["metadata"]["uid"]
    answer = (await r.kubelet.prepare(DRIVER, [("vms", uid, "plain")]))[uid]
    assert answer.error == ""
    assert container_env(r.cdi_dir, list(answer.devices[0].cdi_device_ids)) == {}


async def test_a_missing_class_fails_the_claim_before_any_bind(
    rig: tuple[Rig, SysfsTree],
) -> None:
    r, tree = rig
    k8s.CoreV1Api(r.api.client()).create_namespaced_pod("vms", launcher())
    claim = schedule_extended_resources(r.api, "vms", "virt-launcher-vm1", NODE)
    assert claim is not None
    k8s.ResourceV1Api(r.api.client()).delete_device_class("10de-1eb8.devices.kubevirt.io")
    uid = claim["metadata"]["uid"]
    answer = (await r.kubelet.prepare(DRIVER, [("vms", uid, claim["metadata"]["name"])]))[uid]
    assert "DeviceClass 10de-1eb8.devices.kubevirt.io of request container-0-request-0" in (
        answer.error
    )
    assert "nothing was bound" in answer.error
    assert tree.driver_of("0000:3b:00.0") == "nvidia"
