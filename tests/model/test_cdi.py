"""The pure CDI format shared by both kubelet front-ends (:mod:`vfio_dp.model.cdi`)."""

from __future__ import annotations

import pytest

from vfio_dp.dra import cdi as dra_cdi
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


def test_the_dra_front_ends_format_is_this_one() -> None:
    """``vfio_dp.dra.cdi`` (owned by the DRA branch) still builds its specs itself; until it
    imports these names, both must produce the same objects, so the move changes nothing."""
    nodes = ("/dev/vfio/vfio", "/dev/vfio/45", "/dev/vfio/devices/vfio3", "/dev/iommu")
    mount = ("/var/lib/kubelet/plugins/d/m.json", "/var/run/kubernetes.io/x/m.json")
    ours = cdi.build_spec(
        DRIVER,
        [
            cdi.CdiDevice("uid-1-pci-0000-3b-00-0", device_nodes=nodes),
            cdi.CdiDevice("uid-1-metadata-nic", mounts=(cdi.Mount(*mount),)),
        ],
    )
    theirs = dra_cdi.build_spec(
        DRIVER,
        [
            dra_cdi.CdiDevice("uid-1-pci-0000-3b-00-0", device_nodes=nodes),
            dra_cdi.CdiDevice("uid-1-metadata-nic", mounts=(dra_cdi.Mount(*mount),)),
        ],
    )
    assert ours == theirs
    assert cdi.kind(DRIVER) == dra_cdi.kind(DRIVER)
    assert cdi.device_id(DRIVER, "x-1") == dra_cdi.device_id(DRIVER, "x-1")
    assert cdi.CDI_VERSION == dra_cdi.CDI_VERSION
