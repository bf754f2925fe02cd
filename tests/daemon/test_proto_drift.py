"""The committed generated code is exactly what the pinned generator makes from ``proto/``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = "vfio_dp/daemon/_pb/deviceplugin/v1beta1"


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
        n
        for n in names
        if (tmp_path / GENERATED / n).read_bytes() != (REPO / GENERATED / n).read_bytes()
    ]
    assert not drifted, f"{drifted} drifted from proto/; run: python3 scripts/gen_proto.py"


def test_proto_dir_is_not_a_package() -> None:
    assert not list((REPO / "proto").rglob("__init__.py")), "proto/ must not be importable"


def test_wire_names_and_fields_match_the_kubelet() -> None:
    from vfio_dp.daemon._pb.deviceplugin.v1beta1 import api_pb2

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


def test_runtime_floors_match_the_generator() -> None:
    import tomllib

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    gen = (REPO / GENERATED / "api_pb2.py").read_text()
    grpc_gen = (REPO / GENERATED / "api_pb2_grpc.py").read_text()
    pb_version = gen.split("Protobuf Python Version: ")[1].split()[0]
    grpc_version = grpc_gen.split("GRPC_GENERATED_VERSION = '")[1].split("'")[0]
    assert f"protobuf>={pb_version}" in deps
    assert f"grpcio>={grpc_version}" in deps
