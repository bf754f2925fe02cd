"""VFs vfio_dp made are published like any VF: one DRA device each, with their PF's address
(``pfPciBusID``) and ``resource.kubernetes.io/pcieRoot``; the PF itself is not (kernel
simulator on a temp tree; slices checked by the API-server stand-in's upstream validation)."""

from __future__ import annotations

from pathlib import Path

from tests.dra.apiserver_standin import validate_slice
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.slices import NodeRef, build_slices, published_devices
from vfio_dp.host import Host
from vfio_dp.host.sriov import Sriov
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text

PFS = ("0000:01:00.0", "0000:02:00.0")
CONFIG = f"""selectors:
- addresses: ["{PFS[0]}", "{PFS[1]}"]
  numVfs: 2
  path: dra
"""


def test_made_vfs_are_published_with_their_pf(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    for i, pf in enumerate(PFS):
        port = f"0000:00:{0x1B + i:02x}.0"
        tree.add(Dev(port, "8086", "a113", "060400", driver="pcieport", group=10 + i))
        tree.add(Dev(pf, "1b36", "0010", "010802", driver="nvme", group=20 + i, parent=port,
                     sriov_totalvfs=2, sriov_numvfs=0))  # fmt: skip
    host = Host(tree.root, kernel=SimulatedKernel(tree))
    config = load_config_text(CONFIG, "c.yaml")
    for pf, (n, _) in config.wanted_vfs().items():
        assert Sriov(host).set(pf, n).bound  # made and on vfio-pci
    inv = host.scan()
    devices = published_devices(inv, config, pcie_roots(host.fs, inv.devices))
    by_pf: dict[str, list[str]] = {}
    for d in devices:
        a = d.to_json()["attributes"]
        assert a["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
        by_pf.setdefault(a["pfPciBusID"]["string"], []).append(
            a["resource.kubernetes.io/pciBusID"]["string"]
        )
    assert by_pf == {
        PFS[0]: ["0000:01:00.1", "0000:01:00.2"],
        PFS[1]: ["0000:02:00.1", "0000:02:00.2"],
    }
    assert all(PciAddress.parse(pf) in inv.devices for pf in PFS)  # the PFs exist, unpublished
    (s,) = build_slices(devices, driver="vfio.dra.vfio-dp.io", node=NodeRef("n"), generation=1)
    assert validate_slice(s, None) == []
