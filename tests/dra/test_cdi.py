"""CDI specs and device-metadata files for a claim, on temp trees (tests/sysfs_tree.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath import cdi
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.errors import CdiError, DraError, MetadataFormatError
from vfio_dp.host import Host
from vfio_dp.model import dra_metadata as md
from vfio_dp.model.address import PciAddress

DRIVER = "vfio.example.com"
UID = "6f1c2f0e-8a4e-4a51-9d55-0c3b1e6f0a11"


def _nodes(tree: SysfsTree, bdf: str) -> list[str]:
    h = Host(tree.root)
    inv = h.scan(usage=False)
    grp = inv.group_of(PciAddress.parse(bdf))
    assert grp is not None
    return h.device_nodes(grp, [inv.devices[a] for a in grp.devices])


def test_nodes_without_cdev_kernel(tree: SysfsTree) -> None:
    """Kernel 6.1 (the guest's): no vfio-dev/, so only the legacy group nodes."""
    (tree.root / "dev/iommu").write_text("")  # iommufd alone (6.2-6.5) adds nothing usable
    assert _nodes(tree, "0000:65:00.0") == ["/dev/vfio/vfio", "/dev/vfio/50"]


def test_nodes_with_cdev_kernel(tree: SysfsTree) -> None:
    """Kernel >= 6.6: <bdf>/vfio-dev/vfioN and /dev/vfio/devices/vfioN, plus /dev/iommu."""
    (tree.dev_dir("0000:65:00.0") / "vfio-dev/vfio3").mkdir(parents=True)
    (tree.root / "dev/vfio/devices").mkdir()
    (tree.root / "dev/vfio/devices/vfio3").write_text("")
    (tree.root / "dev/iommu").write_text("")
    assert _nodes(tree, "0000:65:00.0") == [
        "/dev/vfio/vfio",
        "/dev/vfio/50",
        "/dev/vfio/devices/vfio3",
        "/dev/iommu",
    ]
    # a sysfs cdev whose node udev has not created (yet) is left out
    os.unlink(tree.root / "dev/vfio/devices/vfio3")
    assert _nodes(tree, "0000:65:00.0") == ["/dev/vfio/vfio", "/dev/vfio/50", "/dev/iommu"]


def test_spec_shape_ids_and_file(tmp_path: Path) -> None:
    cdi_dir = str(tmp_path / "cdi")
    group = cdi.CdiDevice(
        cdi.group_device_name(UID, "pci-0000-65-00-0"), ("/dev/vfio/vfio", "/dev/vfio/50")
    )
    meta = cdi.CdiDevice(
        cdi.metadata_device_name(UID, "nic"),
        mounts=(cdi.Mount("/var/lib/kubelet/plugins/x.json", "/var/run/y.json"),),
    )
    path = cdi.write_spec(cdi_dir, DRIVER, UID, [group, meta])
    assert path == f"{cdi_dir}/{DRIVER}-{UID}.json"
    spec = json.loads(Path(path).read_text())
    assert spec == {
        "cdiVersion": "0.5.0",
        "kind": "vfio.example.com/vfio",
        "devices": [
            {
                "name": f"{UID}-pci-0000-65-00-0",
                "containerEdits": {
                    "deviceNodes": [{"path": "/dev/vfio/vfio"}, {"path": "/dev/vfio/50"}]
                },
            },
            {
                "name": f"{UID}-metadata-nic",
                "containerEdits": {
                    "mounts": [
                        {
                            "hostPath": "/var/lib/kubelet/plugins/x.json",
                            "containerPath": "/var/run/y.json",
                            "options": ["ro", "bind"],
                        }
                    ]
                },
            },
        ],
    }
    assert "env" not in json.dumps(spec)  # never PCI_RESOURCE_* on the DRA path
    assert [f for f in os.listdir(cdi_dir)] == [os.path.basename(path)]  # no temp left
    assert cdi.device_id(DRIVER, group.name) == f"vfio.example.com/vfio={UID}-pci-0000-65-00-0"
    assert cdi.read_spec(cdi_dir, DRIVER, UID) == spec
    assert cdi.remove_spec(cdi_dir, DRIVER, UID) is True
    assert cdi.remove_spec(cdi_dir, DRIVER, UID) is False
    assert cdi.read_spec(cdi_dir, DRIVER, UID) is None


@pytest.mark.parametrize("uid", ["", "..", "../x", "a/b", "u id", "x" * 129])
def test_hostile_uid_never_reaches_a_path(tmp_path: Path, uid: str) -> None:
    with pytest.raises(DraError, match="not a Kubernetes UID"):
        cdi.spec_path(str(tmp_path), DRIVER, uid)
    with pytest.raises(DraError):
        mdfile.host_path(str(tmp_path), DRIVER, uid, "nic")


def test_bad_driver_and_empty_device_refused(tmp_path: Path) -> None:
    with pytest.raises(DraError, match="DNS subdomain"):
        cdi.spec_path(str(tmp_path), "../Evil", UID)
    with pytest.raises(CdiError, match="no edits"):
        cdi.CdiDevice("x")


def test_metadata_files_per_request(tmp_path: Path) -> None:
    plugins = str(tmp_path / "plugins")
    dev = md.MetadataDevice(
        DRIVER,
        "node-1",
        "pci-0000-65-00-0",
        {md.PCI_BUS_ID: md.Attribute("string", "0000:65:00.0")},
    )
    dev2 = md.MetadataDevice(
        DRIVER,
        "node-1",
        "pci-0000-03-01-0",
        {md.PCI_BUS_ID: md.Attribute("string", "0000:03:01.0")},
    )
    out = mdfile.write_claim(
        plugins,
        DRIVER,
        claim_name="virt-launcher-vm-nic-x2k4",
        namespace="vms",
        uid=UID,
        pod_claim_name="nic",
        devices_by_request={"nic": [("nic/fast", dev)], "gpu": [("gpu", dev2)]},
    )
    host, container = out["nic"]
    assert host == f"{plugins}/{DRIVER}/dra-device-metadata/{UID}/nic/{DRIVER}-metadata.json"
    assert container == (
        "/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/nic/nic/"
        f"{DRIVER}-metadata.json"
    )
    back = mdfile.read(host)
    assert (back.name, back.namespace, back.uid, back.pod_claim_name, back.generation) == (
        "virt-launcher-vm-nic-x2k4",
        "vms",
        UID,
        "nic",
        1,
    )
    assert [r.name for r in back.requests] == ["nic/fast"]
    assert md.pci_bus_ids(back, "nic") == ["0000:65:00.0"]
    assert md.pci_bus_ids(mdfile.read(out["gpu"][0]), "gpu") == ["0000:03:01.0"]
    assert mdfile.claim_uids(plugins, DRIVER) == [UID]
    assert mdfile.remove_claim(plugins, DRIVER, UID) is True
    assert mdfile.remove_claim(plugins, DRIVER, UID) is False
    assert mdfile.claim_uids(plugins, DRIVER) == []


def test_remove_claim_does_not_follow_symlinks(tmp_path: Path) -> None:
    plugins = tmp_path / "plugins"
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("x")
    top = plugins / DRIVER / "dra-device-metadata" / UID
    top.mkdir(parents=True)
    (top / "nic").symlink_to(victim)
    assert mdfile.remove_claim(str(plugins), DRIVER, UID)
    assert (victim / "keep").read_text() == "x" and not top.exists()


def test_read_names_the_file(tmp_path: Path) -> None:
    p = tmp_path / "m.json"
    p.write_text("{nope")
    with pytest.raises(MetadataFormatError, match=str(p)):
        mdfile.read(str(p))
    with pytest.raises(MetadataFormatError, match="cannot read"):
        mdfile.read(str(tmp_path / "missing.json"))
