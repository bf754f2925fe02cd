"""The committed generated code is exactly what the pinned generator makes from ``proto/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
GENERATED = "vfio_dp/deviceplugin/_pb/deviceplugin/v1beta1"
# the kubelet's PodResources API, vendored verbatim from kubernetes/kubelet pkg/apis/...
GENERATED_PODRESOURCES = "vfio_dp/deviceplugin/_pb/podresources/v1"
# kubelet plugin registration and DRA, vendored verbatim from kubernetes/kubelet pkg/apis/...
GENERATED_DRA = [
    "vfio_dp/dra/_pb/pluginregistration/v1",
    "vfio_dp/dra/_pb/dra/v1",
    "vfio_dp/dra/_pb/dra/v1beta1",
    "vfio_dp/dra/_pb/dra_health/v1",
    "vfio_dp/dra/_pb/dra_health/v1alpha1",
]


def test_generated_code_has_not_drifted(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_proto.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    names = ["api_pb2.py", "api_pb2_grpc.py", "api_pb2.pyi"]
    drifted = [
        f"{d}/{n}"
        for d in [GENERATED, GENERATED_PODRESOURCES, *GENERATED_DRA]
        for n in names
        if (tmp_path / d / n).read_bytes() != (REPO / d / n).read_bytes()
    ]
    assert not drifted, f"{drifted} drifted from proto/; run: python3 scripts/gen_proto.py"


def test_proto_dir_is_not_a_package() -> None:
    assert not list((REPO / "proto").rglob("__init__.py")), "proto/ must not be importable"


def test_wire_names_and_fields_match_the_kubelet() -> None:
    from vfio_dp.deviceplugin._pb.deviceplugin.v1beta1 import api_pb2

    fd = api_pb2.DESCRIPTOR
    assert fd.package == "v1beta1"
    assert set(fd.services_by_name) == {"Registration", "DevicePlugin"}
    numbers = {
        (m.name, f.name): f.number for m in fd.message_types_by_name.values() for f in m.fields
    }
    assert numbers[("NUMANode", "ID")] == 1
    assert numbers[("Device", "topology")] == 3
    assert numbers[("RegisterRequest", "options")] == 4
    assert numbers[("ContainerPreferredAllocationRequest", "allocation_size")] == 3
    assert numbers[("ContainerAllocateResponse", "cdi_devices")] == 5
    assert api_pb2.Device(ID="0000:65:00.0").ID == "0000:65:00.0"


def test_podresources_wire_names_match_the_kubelet() -> None:
    from vfio_dp.deviceplugin._pb.podresources.v1 import api_pb2

    fd = api_pb2.DESCRIPTOR
    assert fd.package == "v1"
    methods = fd.services_by_name["PodResourcesLister"].methods_by_name
    assert methods["List"].input_type.name == "ListPodResourcesRequest"
    numbers = {
        (m.name, f.name): f.number for m in fd.message_types_by_name.values() for f in m.fields
    }
    assert numbers[("ListPodResourcesResponse", "pod_resources")] == 1
    assert numbers[("PodResources", "containers")] == 3
    assert numbers[("ContainerResources", "devices")] == 2
    assert numbers[("ContainerDevices", "resource_name")] == 1
    assert numbers[("ContainerDevices", "device_ids")] == 2


def _numbers(fd: Any) -> dict[tuple[str, str], int]:
    return {(m.name, f.name): f.number for m in fd.message_types_by_name.values() for f in m.fields}


def test_registration_wire_names_and_fields_match_the_kubelet() -> None:
    from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2

    fd = api_pb2.DESCRIPTOR
    assert fd.package == "pluginregistration"
    assert set(fd.services_by_name) == {"Registration"}
    methods = fd.services_by_name["Registration"].methods_by_name
    assert set(methods) == {"GetInfo", "NotifyRegistrationStatus"}
    assert methods["GetInfo"].input_type.name == "InfoRequest"
    assert methods["GetInfo"].output_type.name == "PluginInfo"
    assert methods["NotifyRegistrationStatus"].input_type.name == "RegistrationStatus"
    assert _numbers(fd) == {
        ("PluginInfo", "type"): 1,
        ("PluginInfo", "name"): 2,
        ("PluginInfo", "endpoint"): 3,
        ("PluginInfo", "supported_versions"): 4,
        ("RegistrationStatus", "plugin_registered"): 1,
        ("RegistrationStatus", "error"): 2,
    }


def _dra_numbers(share_id: bool) -> dict[tuple[str, str], int]:
    numbers = {
        ("Claim", "namespace"): 1,
        ("Claim", "uid"): 2,
        ("Claim", "name"): 3,
        ("NodePrepareResourcesRequest", "claims"): 1,
        ("NodePrepareResourcesResponse", "claims"): 1,
        ("NodePrepareResourceResponse", "devices"): 1,
        ("NodePrepareResourceResponse", "error"): 2,
        ("Device", "request_names"): 1,
        ("Device", "pool_name"): 2,
        ("Device", "device_name"): 3,
        ("Device", "cdi_device_ids"): 4,
        ("NodeUnprepareResourcesRequest", "claims"): 1,
        ("NodeUnprepareResourcesResponse", "claims"): 1,
        ("NodeUnprepareResourceResponse", "error"): 1,
    }
    if share_id:
        numbers[("Device", "share_id")] = 5
    return numbers


def test_dra_wire_names_and_fields_match_the_kubelet() -> None:
    from vfio_dp.dra._pb.dra.v1 import api_pb2 as v1
    from vfio_dp.dra._pb.dra.v1beta1 import api_pb2 as v1beta1

    for mod, package, share_id in (
        (v1, "k8s.io.kubelet.pkg.apis.dra.v1", True),
        (v1beta1, "k8s.io.kubelet.pkg.apis.dra.v1beta1", False),
    ):
        fd = mod.DESCRIPTOR
        assert fd.package == package
        assert set(fd.services_by_name) == {"DRAPlugin"}
        service = fd.services_by_name["DRAPlugin"]
        assert service.full_name == f"{package}.DRAPlugin"
        assert set(service.methods_by_name) == {"NodePrepareResources", "NodeUnprepareResources"}
        # nested map entries are message types too; compare only the top-level messages
        assert _numbers(fd) == _dra_numbers(share_id)
        claims = fd.message_types_by_name["NodePrepareResourcesResponse"].fields_by_name["claims"]
        assert claims.message_type.GetOptions().map_entry
    # share_id is proto3 `optional` in v1: presence is tracked
    device = v1.Device(device_name="pci-0000-3b-00-0")
    assert not device.HasField("share_id")


def test_dra_health_wire_names_and_fields_match_the_kubelet() -> None:
    from vfio_dp.dra._pb.dra_health.v1 import api_pb2 as v1
    from vfio_dp.dra._pb.dra_health.v1alpha1 import api_pb2 as v1alpha1

    for mod, package in ((v1, "v1"), (v1alpha1, "v1alpha1")):
        fd = mod.DESCRIPTOR
        assert fd.package == package  # kubelet dials /v1.DRAResourceHealth/NodeWatchResources
        service = fd.services_by_name["DRAResourceHealth"]
        assert service.full_name == f"{package}.DRAResourceHealth"
        method = service.methods_by_name["NodeWatchResources"]
        assert method.server_streaming and not method.client_streaming
        assert _numbers(fd) == {
            ("DeviceIdentifier", "pool_name"): 1,
            ("DeviceIdentifier", "device_name"): 2,
            ("DeviceHealth", "device"): 1,
            ("DeviceHealth", "health"): 2,
            ("DeviceHealth", "last_updated_time"): 3,
            ("DeviceHealth", "health_check_timeout_seconds"): 4,
            ("DeviceHealth", "message"): 5,
            ("NodeWatchResourcesResponse", "devices"): 1,
        }
        health = fd.enum_types_by_name["HealthStatus"]
        assert {v.name: v.number for v in health.values} == {
            "UNKNOWN": 0,
            "HEALTHY": 1,
            "UNHEALTHY": 2,
        }


def test_runtime_floors_match_the_generator() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    gen = (REPO / GENERATED / "api_pb2.py").read_text()
    grpc_gen = (REPO / GENERATED / "api_pb2_grpc.py").read_text()
    pb_version = gen.split("Protobuf Python Version: ")[1].split()[0]
    grpc_version = grpc_gen.split("GRPC_GENERATED_VERSION = '")[1].split("'")[0]
    assert f"protobuf>={pb_version}" in deps
    assert f"grpcio>={grpc_version}" in deps
