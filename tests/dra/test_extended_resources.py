"""KEP-5004 in the API-server stand-in: DeviceClasses and Pods served strictly, and the
scheduler's part (a pod's limit on a DRA-backed name → an annotated claim allocated on our
slices, the pod's extendedResourceClaimStatus), driven through the real ``kubernetes``
client with the classes ``vfioctl deviceclasses`` makes and the slices the slice builder
makes on a temp sysfs tree."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from kubernetes.client.exceptions import ApiException

from tests.dra.apiserver_standin import (
    CLAIMS,
    DEVICE_CLASSES,
    EXTENDED_RESOURCE_CLAIM,
    NODES,
    PODS,
    SLICES,
    ApiServerStandin,
    Unschedulable,
    schedule_extended_resources,
)
from tests.dra.conftest import NODE
from tests.dra.topologies import DRA_CONFIG, dra_host
from vfio_dp.dra.deviceclasses import device_classes
from vfio_dp.dra.slices import NodeRef, build_slices, published_devices
from vfio_dp.host import Host
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.config import load_config_text

DRIVER = "vfio.dra.vfio-dp.io"
VF = "devices.kubevirt.io/mlx-vf"
GPU = "devices.kubevirt.io/10de_1eb8"


def launcher(limits: dict[str, int], name: str = "virt-launcher-vm1") -> dict[str, Any]:
    """A launcher-shaped pod: the compute container asks for the devices, a sidecar not."""
    res = {k: str(v) for k, v in limits.items()}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "vms"},
        "spec": {
            "containers": [
                {"name": "compute", "image": "virt-launcher",
                 "resources": {"limits": res, "requests": dict(res)}},
                {"name": "sidecar", "image": "busybox"},
            ]
        },
    }  # fmt: skip


def setup(api: ApiServerStandin, tmp_path: Path) -> None:
    config = load_config_text(DRA_CONFIG, "dra")
    host = Host(dra_host(tmp_path / "host").root)
    inv = host.scan()
    devices = published_devices(inv, config, pcie_roots(host.fs, inv.devices))
    for s in build_slices(devices, driver=DRIVER, node=NodeRef(NODE), generation=1):
        api.seed(SLICES, s)
    rapi = k8s.ResourceV1Api(api.client())
    for c in device_classes(config, DRIVER, [("10de", "1eb8"), ("144d", "a808")]):
        rapi.create_device_class(c)


def test_device_classes_are_validated_like_the_real_server(
    apiserver: ApiServerStandin,
) -> None:
    rapi = k8s.ResourceV1Api(apiserver.client())
    ok = {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "nic"},
        "spec": {"extendedResourceName": "example.com/nic",
                 "selectors": [{"cel": {"expression": 'device.driver == "x.example.com"'}}]},
    }  # fmt: skip
    rapi.create_device_class(ok)
    for field, value, why in (
        ("extendedResourceName", "nic", "domain-prefixed"),
        ("extendedResourceName", "deviceclass.resource.kubernetes.io/nic", "reserved"),
        ("selectors", [{"cel": {"expression": "device.driver =="}}], "compilation failed"),
    ):
        bad = {**ok, "metadata": {"name": "bad"}, "spec": {**ok["spec"], field: value}}
        with pytest.raises(ApiException) as err:
            rapi.create_device_class(bad)
        assert err.value.status == 422 and why in err.value.body, err.value.body
    # the client refuses unknown fields itself: send the JSON as kubectl would
    req = urllib.request.Request(
        f"{apiserver.url}/apis/resource.k8s.io/v1/deviceclasses",
        data=json.dumps({**ok, "metadata": {"name": "c"}, "spec": {"extendedName": "x"}}).encode(),
        headers={"Authorization": f"Bearer {apiserver.token}", "Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as http:
        urllib.request.urlopen(req, timeout=10)
    assert http.value.code == 400
    assert 'unknown field "spec.extendedName"' in json.loads(http.value.read())["message"]


def test_the_scheduler_makes_the_claim_kep_5004_documents(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    setup(apiserver, tmp_path)
    k8s.CoreV1Api(apiserver.client()).create_namespaced_pod("vms", launcher({VF: 2, GPU: 1}))
    claim = schedule_extended_resources(apiserver, "vms", "virt-launcher-vm1", NODE)
    assert claim is not None
    meta = claim["metadata"]
    assert meta["name"].startswith("virt-launcher-vm1-extended-resources-")
    assert meta["annotations"] == {EXTENDED_RESOURCE_CLAIM: "true"}
    (pod,) = apiserver.objects(PODS, "vms")
    assert meta["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
    by_request = {r["name"]: r["exactly"] for r in claim["spec"]["devices"]["requests"]}
    assert {r: e["count"] for r, e in by_request.items()} == {
        "container-0-request-0": 2, "container-0-request-1": 1,
    }  # fmt: skip
    results = claim["status"]["allocation"]["devices"]["results"]
    assert sorted((r["request"], r["device"]) for r in results) == [
        ("container-0-request-0", "pci-0000-af-00-1"),
        ("container-0-request-0", "pci-0000-af-00-2"),
        ("container-0-request-1", "pci-0000-3b-00-0"),
    ]
    assert {r["driver"] for r in results} == {DRIVER} and {r["pool"] for r in results} == {NODE}
    assert pod["spec"]["nodeName"] == NODE
    status = pod["status"]["extendedResourceClaimStatus"]
    assert status["resourceClaimName"] == meta["name"]
    assert sorted((m["containerName"], m["resourceName"]) for m in status["requestMappings"]) == [
        ("compute", GPU), ("compute", VF),
    ]  # fmt: skip
    # the real client decodes what the stand-in stored (strict models)
    read = k8s.CoreV1Api(apiserver.client()).read_namespaced_pod("virt-launcher-vm1", "vms")
    assert read.status.extended_resource_claim_status.resource_claim_name == meta["name"]
    # both VFs are taken now: a second pod asking for one is unschedulable on this node
    k8s.CoreV1Api(apiserver.client()).create_namespaced_pod(
        "vms", launcher({VF: 1}, "virt-launcher-vm2")
    )
    with pytest.raises(Unschedulable, match="1 more device"):
        schedule_extended_resources(apiserver, "vms", "virt-launcher-vm2", NODE)
    assert len(apiserver.objects(CLAIMS, "vms")) == 1


def test_a_name_a_device_plugin_advertises_on_the_node_makes_no_claim(
    apiserver: ApiServerStandin, tmp_path: Path
) -> None:
    setup(apiserver, tmp_path)
    apiserver.seed(NODES, {"metadata": {"name": "node-b"}, "status": {"allocatable": {VF: "4"}}})
    k8s.CoreV1Api(apiserver.client()).create_namespaced_pod("vms", launcher({VF: 1}))
    assert schedule_extended_resources(apiserver, "vms", "virt-launcher-vm1", "node-b") is None
    assert apiserver.objects(CLAIMS, "vms") == []
    assert apiserver.objects(PODS, "vms")[0]["spec"]["nodeName"] == "node-b"
    assert len(apiserver.objects(DEVICE_CLASSES)) == 4
    # a stopped plugin's name, still listed at 0 during the kubelet's grace period: no claim
    apiserver.seed(NODES, {"metadata": {"name": "node-c"}, "status": {"allocatable": {VF: "0"}}})
    k8s.CoreV1Api(apiserver.client()).create_namespaced_pod(
        "vms", launcher({VF: 1}, "virt-launcher-vm3")
    )
    assert schedule_extended_resources(apiserver, "vms", "virt-launcher-vm3", "node-c") is None
