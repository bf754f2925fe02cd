"""The variables Prepare gives an extended-resource claim's container (pure rules), and the
DeviceClass reader against the API-server stand-in (a class created after start is used at
once; a missing one names the class)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from tests.dra.apiserver_standin import ApiServerStandin
from tests.dra.topologies import DRA_CONFIG, dra_host
from vfio_dp.dra.apiserver.publisher import class_reader
from vfio_dp.dra.claimpath.extended import (
    EXTENDED_RESOURCE_CLAIM,
    is_extended,
    request_classes,
    request_env,
    request_resources,
    resource_endpoints,
)
from vfio_dp.dra.deviceclasses import IMPLICIT_PREFIX
from vfio_dp.errors import ClaimError
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text
from vfio_dp.model.serving import dra_units

NIC = "devices.kubevirt.io/8086_10d3"


def claim(annotated: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "vm1-extended-resources-x7k2p", "namespace": "vms"}
    if annotated:
        meta["annotations"] = {EXTENDED_RESOURCE_CLAIM: "true"}
    return {
        "metadata": meta,
        "spec": {"devices": {"requests": [
            {"name": "container-0-request-0", "exactly": {"deviceClassName": "nic", "count": 2}},
            {"name": "container-1-request-0", "exactly": {"deviceClassName": "plain", "count": 1}},
        ]}},
    }  # fmt: skip


def test_the_annotation_decides() -> None:
    assert is_extended(claim())
    assert not is_extended(claim(annotated=False))
    bad = claim()
    bad["metadata"]["annotations"][EXTENDED_RESOURCE_CLAIM] = "yes"
    assert not is_extended(bad)


def test_variables_list_every_endpoint_primary_first_under_kubevirts_name() -> None:
    a, b, c = (PciAddress.parse(x) for x in ("0000:66:00.0", "0000:65:00.1", "0000:65:00.0"))
    env = request_env({"r0": NIC}, {"r0": [a, b, c]})
    value = "0000:65:00.0,0000:66:00.0,0000:65:00.1"
    assert env == {
        "r0": [
            f"PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3={value}",
            f"PCIDEVICE_DEVICES_KUBEVIRT_IO_8086_10D3={value}",
        ]
    }


def test_companions_are_not_listed(tmp_path: Path) -> None:
    config = load_config_text(DRA_CONFIG, "dra")
    inv = Host(dra_host(tmp_path).root).scan()
    units = {u.name: u for u in dra_units(inv, config)}
    gpu = units["pci-0000-3b-00-0"]  # GPU + audio, one selector: the audio is a companion
    assert [str(a) for a in resource_endpoints(gpu, inv, config)] == ["0000:3b:00.0"]
    nvme = units["pci-0000-07-00-0"]  # two NVMe in one group, both the resource's
    assert [str(a) for a in resource_endpoints(nvme, inv, config)] == [
        "0000:07:00.0",
        "0000:08:00.0",
    ]


async def test_resources_come_through_the_classes_never_the_request_names() -> None:
    asked: list[str] = []

    async def read(name: str) -> str:
        asked.append(name)
        if name == "plain":
            return IMPLICIT_PREFIX + name
        return NIC

    classes = request_classes(claim())
    got = await request_resources(
        classes, ["container-0-request-0", "container-1-request-0"], read, "c"
    )
    assert got == {"container-0-request-0": NIC, "container-1-request-0": IMPLICIT_PREFIX + "plain"}
    assert asked == ["nic", "plain"]

    async def missing(name: str) -> str:
        raise LookupError(f"DeviceClass {name} does not exist")

    with pytest.raises(ClaimError, match="DeviceClass nic of request container-0-request-0"):
        await request_resources(classes, ["container-0-request-0"], missing, "c")
    with pytest.raises(ClaimError, match="names no deviceClassName"):
        await request_resources(classes, ["other"], read, "c")


async def test_class_reader_reads_classes_made_after_start(apiserver: ApiServerStandin) -> None:
    client = apiserver.client()
    read = class_reader(client)
    with pytest.raises(LookupError, match="DeviceClass nic does not exist"):
        await read("nic")
    rapi = k8s.ResourceV1Api(client)
    selectors = [{"cel": {"expression": 'device.driver == "vfio.example.com"'}}]
    rapi.create_device_class(
        {"metadata": {"name": "nic"}, "spec": {"extendedResourceName": NIC, "selectors": selectors}}
    )
    rapi.create_device_class({"metadata": {"name": "plain"}, "spec": {"selectors": selectors}})
    assert await asyncio.wait_for(read("nic"), 1.0) == NIC
    assert await read("plain") == IMPLICIT_PREFIX + "plain"
    gets = [r for r in apiserver.requests if r.path.endswith("/deviceclasses/nic")]
    assert [r.method for r in gets] == ["GET", "GET"]
