"""The pure CDI format shared by both kubelet front-ends (:mod:`vfio_dp.model.cdi`)."""

from __future__ import annotations

import pytest

from vfio_dp.dra.claimpath import cdi as dra_cdi
from vfio_dp.errors import CdiError
from vfio_dp.model import cdi

DRIVER = "vfio.dra.vfio-dp.io"


def test_kind_and_device_id_for_both_front_ends() -> None:
    assert cdi.kind(DRIVER) == "vfio.dra.vfio-dp.io/vfio"
    assert cdi.device_id(DRIVER, "uid-1-pci-0000-3b-00-0") == (
        "vfio.dra.vfio-dp.io/vfio=uid-1-pci-0000-3b-00-0"
    )
    assert cdi.device_id(cdi.DEVICE_PLUGIN_VENDOR, "pci-0000-65-00-0") == (
        "deviceplugin.vfio-dp.io/vfio=pci-0000-65-00-0"
    )
    assert cdi.kind(DRIVER, "metadata") == "vfio.dra.vfio-dp.io/metadata"


def test_build_spec_lays_out_nodes_and_mounts() -> None:
    spec = cdi.build_spec(
        DRIVER,
        [
            cdi.CdiDevice("g45", device_nodes=("/dev/vfio/vfio", "/dev/vfio/45", "/dev/iommu")),
            cdi.CdiDevice("meta", mounts=(cdi.Mount("/var/lib/x.json", "/var/run/x.json"),)),
        ],
    )
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "vfio.dra.vfio-dp.io/vfio",
        "devices": [
            {
                "name": "g45",
                "containerEdits": {
                    "deviceNodes": [
                        {"path": "/dev/vfio/vfio"},
                        {"path": "/dev/vfio/45"},
                        {"path": "/dev/iommu"},
                    ]
                },
            },
            {
                "name": "meta",
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": "/var/lib/x.json",
                            "containerPath": "/var/run/x.json",
                            "options": ["ro", "bind"],
                        }
                    ]
                },
            },
        ],
    }


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: cdi.CdiDevice("g1"), "no edits"),
        (lambda: cdi.CdiDevice("-g1", device_nodes=("/dev/vfio/1",)), "'-g1'"),
        (lambda: cdi.CdiDevice("a/b", device_nodes=("/dev/vfio/1",)), "'a/b'"),
        (lambda: cdi.CdiDevice("g1", device_nodes=("dev/vfio/1",)), "not absolute"),
        (lambda: cdi.kind("9vendor"), "'9vendor'"),
        (lambda: cdi.kind("v", "a/b"), "class 'a/b'"),
        (lambda: cdi.kind("1vfio.example.com"), "'1vfio.example.com'"),
        (lambda: cdi.device_id("v", "x=y"), "'x=y'"),
        (lambda: cdi.build_spec("v", []), "at least one device"),
        (
            lambda: cdi.build_spec(
                "v", [cdi.CdiDevice("a", ("/dev/a",)), cdi.CdiDevice("a", ("/dev/b",))]
            ),
            "repeat",
        ),
        (lambda: cdi.spec_file_name("v", "../x"), "'../x'"),
    ],
)
def test_invalid_cdi_is_refused_with_the_value_named(call: object, needle: str) -> None:
    with pytest.raises(CdiError) as err:
        call()  # type: ignore[operator]
    assert needle in str(err.value)


def test_names_cdi_accepts() -> None:
    assert cdi.check_name("0000:65:00.0") == "0000:65:00.0"
    assert cdi.spec_file_name(DRIVER, "pci-0000-65-00-0") == (
        "vfio.dra.vfio-dp.io_pci-0000-65-00-0.json"
    )


def test_the_dra_front_end_uses_this_format() -> None:
    """One format for both front-ends: the DRA side adds only its names and file handling,
    and refuses a driver name that is a DNS subdomain but no CDI vendor (starts with a digit)."""
    from vfio_dp.errors import DraError

    assert dra_cdi.CdiDevice is cdi.CdiDevice and dra_cdi.Mount is cdi.Mount
    nodes = ("/dev/vfio/vfio", "/dev/vfio/45")
    devices = [cdi.CdiDevice("uid-1-pci-0000-3b-00-0", device_nodes=nodes)]
    assert dra_cdi.build_spec(DRIVER, devices) == cdi.build_spec(DRIVER, devices)
    assert dra_cdi.device_id(DRIVER, "x-1") == cdi.device_id(DRIVER, "x-1")
    with pytest.raises(DraError, match="cannot be a CDI vendor"):
        dra_cdi.kind("9vfio.example.com")
