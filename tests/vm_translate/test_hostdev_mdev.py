"""Mediated devices in ``vfioctl hostdev``: ``MDEV_PCI_RESOURCE_*`` (the device-plugin contract)
and ``mdevUUID`` in DRA metadata (it wins over ``pciBusID``) become
``<hostdev type='mdev' model='vfio-pci'>``, checked against a golden file, libvirt's real
``test:///default`` parser and its RelaxNG schema."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.vm_translate.test_hostdev import (
    DATA,
    accepted_by_libvirt,
    conn,  # noqa: F401 (a fixture)
    golden,
    schema_valid,
)
from vfio_dp.model import dra_metadata, naming
from vfio_dp.model.address import PciAddress
from vm_translate import hostdev
from vm_translate.allocation import Hostdev, Layout, MdevSource, assign
from vm_translate.dra import address_from
from vm_translate.entries import ClaimEntry, DeviceEntry
from vm_translate.errors import DomainXmlError, HostdevError

VGPU = "nvidia.com/GRID_T4-1Q"
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
ENV = {naming.kubevirt_mdev_env_var(VGPU): f"{U1},{U2}"}


def test_the_env_var_is_kubevirts() -> None:
    assert naming.kubevirt_mdev_env_var(VGPU) == "MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"


def test_mdev_uuids_are_handed_out_in_order() -> None:
    entries = [DeviceEntry("vgpu1", VGPU, kind="gpu"), DeviceEntry("vgpu2", VGPU, kind="gpu")]
    got = [(h.alias, h.source) for h in assign(entries, ENV)]
    assert got == [("ua-gpu-vgpu1", MdevSource(U1)), ("ua-gpu-vgpu2", MdevSource(U2))]


def test_pci_resource_wins_when_both_are_set() -> None:
    """KubeVirt's launcher reads PCI_RESOURCE_* first."""
    env = {**ENV, naming.kubevirt_env_var(VGPU): "0000:3b:00.0"}
    (h,) = assign([DeviceEntry("g", VGPU, kind="gpu")], env)
    assert h.source == PciAddress.parse("0000:3b:00.0")


@pytest.mark.parametrize("value", ["not-a-uuid", U1.upper(), f"{U1},{U1}"])
def test_bad_mdev_values_are_named(value: str) -> None:
    env = {naming.kubevirt_mdev_env_var(VGPU): value}
    with pytest.raises(HostdevError, match="MDEV_PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q"):
        assign([DeviceEntry("g", VGPU, kind="gpu"), DeviceEntry("h", VGPU, kind="gpu")], env)


def test_neither_variable_names_both() -> None:
    with pytest.raises(
        HostdevError, match=re.escape("PCI_RESOURCE_NVIDIA_COM_GRID_T4-1Q is not set (nor MDEV_")
    ):
        assign([DeviceEntry("g", VGPU, kind="gpu")], {})


def test_mdev_hostdevs_golden_accepted_by_libvirt_and_schema_valid(
    conn: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    entries = [DeviceEntry("vgpu1", VGPU, kind="gpu"), DeviceEntry("vgpu2", VGPU, kind="gpu")]
    base = (DATA / "domain_base.xml").read_text()
    _, merged = hostdev.build(entries, ENV, domain_xml=base, layout=Layout())
    golden("domain_mdev.xml", merged)
    _, again = hostdev.build(entries, ENV, domain_xml=merged, layout=Layout())
    assert again == merged  # merging twice changes nothing
    out = accepted_by_libvirt(conn, merged)
    assert out.count("type='mdev'") == 2
    assert f"<address uuid='{U1}'/>" in out and "model='vfio-pci'" in out
    schema_valid(tmp_path, merged)


def test_merge_refuses_the_same_mdev_under_another_alias() -> None:
    base = (DATA / "domain_base.xml").read_text()
    first = hostdev.merge(base, [Hostdev("ua-gpu-a", VGPU, MdevSource(U1))])
    with pytest.raises(DomainXmlError, match=f"already passes mdev {U1} through"):
        hostdev.merge(first, [Hostdev("ua-gpu-b", VGPU, MdevSource(U1))])


def _metadata(attrs: dict[str, Any]) -> str:
    meta = dra_metadata.build(
        claim_name="vgpu", namespace="vms", uid="u-1", request="gpu",
        devices=[dra_metadata.MetadataDevice(
            "vfio.dra.vfio-dp.io", "node-a", "mdev-83b8f4f2",
            {k: dra_metadata.attribute(v) for k, v in attrs.items()})],
    )  # fmt: skip
    return dra_metadata.render(meta)


def test_dra_metadata_mdev_uuid_wins_over_pci_bus_id() -> None:
    entry = ClaimEntry("vgpu", "vgpu", "gpu", kind="gpu")
    text = _metadata({"mdevUUID": {"string": U1},
                      "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}})  # fmt: skip
    assert address_from(entry, [("/m/x-metadata.json", text)], "/m") == MdevSource(U1)
    pci_only = _metadata({"resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}})
    assert address_from(entry, [("/m/x-metadata.json", pci_only)], "/m") == PciAddress.parse(
        "0000:3b:00.0"
    )
    bad = _metadata({"mdevUUID": {"string": "nope"}})
    with pytest.raises(HostdevError, match="is not an mdev UUID"):
        address_from(entry, [("/m/x-metadata.json", bad)], "/m")
