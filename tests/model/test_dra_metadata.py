"""The KEP-5304 device-metadata format: render, parse (round trip and hostile input), paths."""

from __future__ import annotations

import json

import pytest

from vfio_dp.errors import MetadataFormatError
from vfio_dp.model import dra_metadata as md
from vfio_dp.model.address import PciAddress
from vfio_dp.model.naming import dra_device_address, dra_device_name

DRIVER = "vfio.example.com"


def _dev(bdf: str = "0000:3b:00.0") -> md.MetadataDevice:
    return md.MetadataDevice(
        driver=DRIVER,
        pool="node-1",
        name=dra_device_name(PciAddress.parse(bdf)),
        attributes={
            md.PCI_BUS_ID: md.Attribute("string", bdf),
            f"{DRIVER}/iommuGroup": md.Attribute("int", 45),
        },
    )


def test_render_is_the_documented_stream() -> None:
    meta = md.build(
        claim_name="vm-nic-abc12",
        namespace="default",
        uid="u-1",
        request="nic",
        devices=[_dev()],
        pod_claim_name="nic",
    )
    text = md.render(meta)
    assert text.endswith("\n") and text.count("\n") == len(md.SUPPORTED_VERSIONS)
    obj = json.loads(text.splitlines()[0])
    assert obj == {
        "apiVersion": "metadata.resource.k8s.io/v1alpha1",
        "kind": "DeviceMetadata",
        "metadata": {"name": "vm-nic-abc12", "namespace": "default", "uid": "u-1", "generation": 1},
        "podClaimName": "nic",
        "requests": [
            {
                "name": "nic",
                "devices": [
                    {
                        "driver": DRIVER,
                        "pool": "node-1",
                        "name": "pci-0000-3b-00-0",
                        "attributes": {
                            "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
                            f"{DRIVER}/iommuGroup": {"int": 45},
                        },
                    }
                ],
            }
        ],
    }


def test_no_pod_claim_name_for_a_named_claim() -> None:
    meta = md.build(claim_name="c", namespace="ns", uid="u", request="r", devices=[_dev()])
    assert "podClaimName" not in json.loads(md.render(meta))


def test_round_trip() -> None:
    meta = md.build(
        claim_name="c",
        namespace="ns",
        uid="u",
        request="gpu/big",
        devices=[_dev()],
        pod_claim_name="p",
    )
    back = md.parse(md.render(meta))
    assert back == meta
    # a reader accepts both the base request name and the subrequest form
    assert md.pci_bus_ids(back, "gpu") == ["0000:3b:00.0"]
    assert md.pci_bus_ids(back, "gpu/big") == ["0000:3b:00.0"]
    assert md.pci_bus_ids(back, "gpu", driver="other.example.com") == []
    assert md.pci_bus_ids(back, "nic") == []


def test_reader_skips_unknown_newer_versions_and_extra_fields() -> None:
    newer = {"apiVersion": "metadata.resource.k8s.io/v1", "kind": "DeviceMetadata", "x": 1}
    known = json.loads(
        md.render(md.build(claim_name="c", namespace="ns", uid="u", request="r", devices=[_dev()]))
    )
    known["requests"][0]["devices"][0]["networkData"] = {"ipAddresses": ["10.0.0.1/24"]}
    text = json.dumps(newer) + "\n" + json.dumps(known, indent=2)
    assert md.parse(text.encode()).uid == "u"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("{", "invalid JSON"),
        ("[1]", "JSON object"),
        (
            '{"apiVersion": "metadata.resource.k8s.io/v9", "kind": "DeviceMetadata"}',
            "no known version",
        ),
        (
            '{"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata"}',
            "metadata must be",
        ),
        (
            '{"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata", '
            '"metadata": {"name": "c", "namespace": "n", "uid": "u"}, "requests": [{"name": "r", '
            '"devices": [{"driver": "d", "pool": "p", "name": "x", "attributes": {"a": {"string": "s", "int": 1}}}]}]}',
            "exactly one",
        ),
        (
            '{"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata", '
            '"metadata": {"name": "c", "namespace": "n", "uid": "u"}, "requests": [{"name": "r", '
            '"devices": [{"driver": "d", "pool": "p", "name": "x", "attributes": {"a": {"int": true}}}]}]}',
            "wrong type",
        ),
        (
            '{"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata", '
            '"metadata": {"name": "c", "namespace": "n", "uid": "u"}, "requests": [{"devices": []}]}',
            "requests[0].name",
        ),
    ],
)
def test_bad_input_names_the_source_and_why(text: str, why: str) -> None:
    with pytest.raises(MetadataFormatError) as e:
        md.parse(text, source="/x/drv-metadata.json")
    assert "/x/drv-metadata.json" in str(e.value) and why in str(e.value)


def test_oversized_and_non_utf8_refused() -> None:
    with pytest.raises(MetadataFormatError, match="larger than"):
        md.parse(b" " * (md.MAX_BYTES + 1))
    with pytest.raises(MetadataFormatError, match="not UTF-8"):
        md.parse(b"\xff\xfe")


def test_container_paths() -> None:
    assert md.container_path("vm-nic", "nic", DRIVER) == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-nic/nic/"
        "vfio.example.com-metadata.json"
    )
    assert md.container_path("virt-launcher-x-nic-8kq2p", "nic/fast", DRIVER, "nic") == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/nic/nic/"
        "vfio.example.com-metadata.json"
    )
    assert md.pod_claim_name({md.POD_CLAIM_NAME_ANNOTATION: "nic"}) == "nic"
    assert md.pod_claim_name(None) is None


@pytest.mark.parametrize(
    ("claim", "request_", "driver"),
    [
        ("..", "r", DRIVER),
        ("c", "..", DRIVER),
        ("c", "r", "../etc"),
        ("a/b", "r", DRIVER),
        ("c", "R", DRIVER),
        ("c", "r", ""),
    ],
)
def test_hostile_path_components_refused(claim: str, request_: str, driver: str) -> None:
    with pytest.raises(MetadataFormatError, match="not a valid Kubernetes name"):
        md.container_path(claim, request_, driver)


def test_dra_device_names() -> None:
    a = PciAddress.parse("0000:3b:01.0")
    assert dra_device_name(a) == "pci-0000-3b-01-0"
    assert dra_device_address("pci-0000-3b-01-0") == a
    for bad in (
        "pci-0000-3B-01-0",
        "pci-0000-3b-20-0",
        "gpu-0",
        "pci-0000-3b-01-0-1",
        "pci-00-3b-01-0",
    ):
        assert dra_device_address(bad) is None
