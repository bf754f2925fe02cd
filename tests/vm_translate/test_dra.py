"""KubeVirt's claim-based host devices: admission checks, ``hostdev`` from device-metadata files
(resolved the way virt-launcher resolves them), and ``translate --dra``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from lxml import etree

from cli.main import vfioctl
from tests.vm_translate.conftest import CONFIG_YAML
from vfio_dp.model import dra_metadata
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vm_translate.allocation import assign
from vm_translate.errors import HostdevError, SpecError
from vm_translate.spec import ClaimEntry, DeviceEntry, entries_of
from vm_translate.translate import translate

DRIVER = "vfio.example.com"
GPU = "devices.kubevirt.io/10de_1eb8"


def vmi(host_devices: list[Any], claims: list[Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"domain": {"devices": {"hostDevices": host_devices}}}
    if claims is not None:
        spec["resourceClaims"] = claims
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns"},
        "spec": spec,
    }


NIC_CLAIMS = [
    {"name": "nics", "resourceClaimTemplateName": "vm1-nics"},
    {"name": "shared", "resourceClaimName": "gpu-claim"},
]


# --------------------------------------------------------------------------- admission


def test_claim_entries_admitted_next_to_device_plugin_entries(config: Config) -> None:
    obj = vmi(
        [
            {"name": "nic", "claimName": "nics", "requestName": "nic"},
            {"name": "gpu", "deviceName": "10DE:1EB8"},
            {"name": "gpu2", "claimName": "shared", "requestName": "gpu"},
        ],
        NIC_CLAIMS,
    )
    t = translate(obj, config)
    # only the deviceName entry is rewritten; claims are the scheduler's business
    assert [op["path"] for op in t.patch] == ["/spec/domain/devices/hostDevices/1/deviceName"]
    assert t.requests == {GPU: 1}
    entries, problems = entries_of(obj, config, "vm1")
    assert problems == []
    assert entries == [
        ClaimEntry("nic", "nics", "nic"),
        DeviceEntry("gpu", GPU),
        ClaimEntry("gpu2", "shared", "gpu"),
    ]
    assert entries[0].aliases() == ["ua-dra-hostdevice-nic"]


@pytest.mark.parametrize(
    ("entry", "claims", "expect"),
    [
        (
            {"name": "nic", "deviceName": "10de:1eb8", "claimName": "nics", "requestName": "n"},
            NIC_CLAIMS,
            "name either deviceName (a device-plugin resource) or claimName + requestName",
        ),
        (
            {"name": "nic", "claimName": "nope", "requestName": "nic"},
            NIC_CLAIMS,
            "no such claim in spec.resourceClaims (it has nics, shared)",
        ),
        (
            {"name": "nic", "claimName": "nics", "requestName": "nic"},
            None,
            "no such claim in spec.resourceClaims (it has none)",
        ),
        (
            {"name": "nic", "claimName": "nics"},
            NIC_CLAIMS,
            "a DRA entry needs both claimName",
        ),
        (
            {"name": "nic", "claimName": "nics", "requestName": "nic"},
            [{"name": "nics", "resourceClaimName": "a", "resourceClaimTemplateName": "b"}],
            "give exactly one of resourceClaimName",
        ),
    ],
)
def test_wrong_claim_entries_denied_with_fix(
    config: Config, entry: dict[str, Any], claims: list[Any] | None, expect: str
) -> None:
    with pytest.raises(SpecError) as exc:
        translate(vmi([entry], claims), config)
    assert expect in str(exc.value)


def test_vm_template_claims_are_read_beside_its_domain(config: Config) -> None:
    vm = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "vm1"},
        "spec": {"template": {"spec": vmi([{"name": "n", "claimName": "nics",
                                            "requestName": "nic"}], NIC_CLAIMS)["spec"]}},
    }  # fmt: skip
    assert translate(vm, config).patch == ()
    del vm["spec"]["template"]["spec"]["resourceClaims"]
    with pytest.raises(SpecError, match=r"spec\.template\.spec\.resourceClaims"):
        translate(vm, config)


# --------------------------------------------------------------------------- hostdev


def write_metadata(
    base: Path, subdir: str, name: str, request: str, text: str, driver: str = DRIVER
) -> Path:
    d = base / subdir / name / request
    d.mkdir(parents=True, exist_ok=True)
    f = d / f"{driver}{dra_metadata.FILE_SUFFIX}"
    f.write_text(text)
    return f


def metadata_text(bus_ids: list[str], request: str, pod_claim: str | None = None) -> str:
    devices = [
        dra_metadata.MetadataDevice(
            DRIVER,
            "node-1",
            f"pci-{i}",
            {dra_metadata.PCI_BUS_ID: dra_metadata.Attribute("string", b)},
        )
        for i, b in enumerate(bus_ids)
    ]
    meta = dra_metadata.build(
        claim_name="c", namespace="ns", uid="u1", request=request, devices=devices,
        pod_claim_name=pod_claim,
    )  # fmt: skip
    return dra_metadata.render(meta)


def hostdev_run(tmp_path: Path, obj: dict[str, Any], *args: str) -> tuple[int, str, str]:
    spec = tmp_path / "vmi.yaml"
    spec.write_text(yaml.safe_dump(obj))
    (tmp_path / "config.yaml").write_text(CONFIG_YAML)
    env = {"PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_1EB8": "0000:65:00.0"}
    result = CliRunner().invoke(
        vfioctl,
        ["hostdev", str(spec), "--config", str(tmp_path / "config.yaml"),
         "--dra-metadata-dir", str(tmp_path / "meta"), *args],
        env=env,
    )  # fmt: skip
    return result.exit_code, result.stdout, result.stderr


MIXED = vmi(
    [
        {"name": "nic", "claimName": "nics", "requestName": "nic"},
        {"name": "gpu", "deviceName": "10de:1eb8"},
        {"name": "gpu2", "claimName": "shared", "requestName": "gpu"},
    ],
    NIC_CLAIMS,
)


def test_hostdev_reads_metadata_like_virt_launcher(tmp_path: Path) -> None:
    meta = tmp_path / "meta"
    # template claim: resourceclaimtemplates/<VMI claim name>/<request>/
    write_metadata(meta, "resourceclaimtemplates", "nics", "nic",
                   metadata_text(["0000:01:00.0"], "nic", pod_claim="nics"))  # fmt: skip
    # a claim by name: resourceclaims/<resourceClaimName>/<request>/; a newer unknown version
    # comes first in the stream and is skipped; the request is named <request>/<subrequest>
    newer = json.dumps({"apiVersion": "metadata.resource.k8s.io/v9", "kind": "DeviceMetadata"})
    write_metadata(meta, "resourceclaims", "gpu-claim", "gpu",
                   newer + "\n" + metadata_text(["0000:3b:00.0"], "gpu/big"))  # fmt: skip
    code, out, err = hostdev_run(tmp_path, MIXED)
    assert code == 0, err
    root = etree.fromstring(f"<devices>{out}</devices>".encode())
    got = {
        h.find("alias").get("name"): (
            h.get("managed"),
            "{domain}:{bus}:{slot}.{function}".format(**h.find("source/address").attrib),
        )
        for h in root.iter("hostdev")
    }
    assert got == {
        "ua-dra-hostdevice-nic": ("no", "0x0000:0x01:0x00.0x0"),
        "ua-hostdevice-gpu": ("no", "0x0000:0x65:0x00.0x0"),
        "ua-dra-hostdevice-gpu2": ("no", "0x0000:0x3b:0x00.0x0"),
    }


@pytest.mark.parametrize(
    ("files", "expect"),
    [
        ({}, "no *-metadata.json in"),
        (
            {"a": metadata_text(["0000:01:00.0"], "nic"), "b": metadata_text(["0000:02:00.0"], "nic")},
            "2 metadata files",
        ),
        ({"a": metadata_text(["0000:01:00.0", "0000:02:00.0"], "nic")}, "lists 2 devices"),
        ({"a": metadata_text([], "other")}, "lists 0 devices"),
        ({"a": '{"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata"'},
         "not a KEP-5304 device-metadata stream"),
        ({"a": metadata_text(["0000:zz:00.0"], "nic")}, "pciBusID"),
    ],
)  # fmt: skip
def test_hostdev_metadata_errors_name_claim_request_and_path(
    tmp_path: Path, files: dict[str, str], expect: str
) -> None:
    for driver, text in files.items():
        write_metadata(tmp_path / "meta", "resourceclaimtemplates", "nics", "nic", text,
                       driver=f"{driver}.example.com")  # fmt: skip
    obj = vmi([{"name": "nic", "claimName": "nics", "requestName": "nic"}], NIC_CLAIMS)
    code, _, err = hostdev_run(tmp_path, obj)
    assert code == 1
    assert expect in err
    assert "entry 'nic' (claim nics, request nic)" in err
    assert str(tmp_path / "meta" / "resourceclaimtemplates" / "nics" / "nic") in err


def test_hostdev_refuses_a_fifo_instead_of_blocking(tmp_path: Path) -> None:
    import os

    d = tmp_path / "meta" / "resourceclaimtemplates" / "nics" / "nic"
    d.mkdir(parents=True)
    os.mkfifo(d / f"{DRIVER}{dra_metadata.FILE_SUFFIX}")
    obj = vmi([{"name": "nic", "claimName": "nics", "requestName": "nic"}], NIC_CLAIMS)
    code, _, err = hostdev_run(tmp_path, obj)
    assert code == 1 and "is not a regular file" in err


def test_one_host_device_cannot_go_to_two_slots() -> None:
    entries = [DeviceEntry("gpu", GPU), ClaimEntry("dup", "shared", "gpu")]
    env = {"PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_1EB8": "0000:65:00.0"}
    with pytest.raises(
        HostdevError, match="given to both ua-hostdevice-gpu and ua-dra-hostdevice-dup"
    ):
        assign(entries, env, {("shared", "gpu"): PciAddress.parse("0000:65:00.0")})


def test_hostdev_defines_dra_and_plugin_devices_in_libvirt_test_driver(tmp_path: Path) -> None:
    pytest.importorskip("libvirt", reason="libvirt-python is installed by scripts/setup.sh")
    meta = tmp_path / "meta"
    write_metadata(meta, "resourceclaimtemplates", "nics", "nic",
                   metadata_text(["0000:01:00.0"], "nic"))  # fmt: skip
    write_metadata(meta, "resourceclaims", "gpu-claim", "gpu",
                   metadata_text(["0000:3b:00.0"], "gpu"))  # fmt: skip
    base = Path(__file__).parent / "data" / "domain_base.xml"
    code, out, err = hostdev_run(
        tmp_path, MIXED, "--domain-xml", str(base), "--connect", "test:///default"
    )
    assert code == 0, err
    assert (
        out.strip()
        == "defined vm1: ua-dra-hostdevice-nic, ua-hostdevice-gpu, ua-dra-hostdevice-gpu2"
    )
