"""``numVfs`` / ``vfDriver`` / ``sriov`` in selectors: validation and matching."""

from __future__ import annotations

import pytest

from vfio_dp.errors import ConfigError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text
from vfio_dp.model.device import PciDevice

PF = PciAddress.parse("0000:01:00.0")
VF = PciAddress.parse("0000:01:00.1")
# QEMU's NVMe: PF and VFs share 1b36:0010
PF_DEV = PciDevice(PF, "1b36", "0010", "010802", driver="nvme", sriov_numvfs=2)
VF_DEV = PciDevice(VF, "1b36", "0010", "010802", physfn=PF)


def test_num_vfs_selector_takes_the_vfs_not_the_pf() -> None:
    cfg = load_config_text(
        'selectors:\n- addresses: ["0000:01:00.0"]\n  numVfs: 2\n  resourceName: nvme-vf\n', "t"
    )
    sel = cfg.selectors[0]
    assert (sel.num_vfs, sel.vf_driver, sel.bind) == (2, "vfio-pci", True)
    assert cfg.select(VF_DEV) is sel and cfg.select(PF_DEV) is None
    assert cfg.wanted_vfs() == {PF: (2, sel)}
    none = load_config_text(
        'selectors:\n- addresses: ["0000:01:00.0"]\n  numVfs: 1\n  vfDriver: none\n', "t"
    )
    assert none.selectors[0].bind is False


def test_sriov_pf_vf_tells_them_apart_with_shared_ids() -> None:
    cfg = load_config_text(
        'selectors:\n- {vendor: "1b36", device: "0010", sriov: vf, resourceName: vf}\n'
        '- {vendor: "1b36", device: "0010", sriov: pf, resourceName: pf}\n',
        "t",
    )
    assert cfg.resource_for(VF_DEV) == "devices.kubevirt.io/vf"
    assert cfg.resource_for(PF_DEV) == "devices.kubevirt.io/pf"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('- {vendor: "1b36", numVfs: 2}', "needs addresses: the PFs to make VFs on"),
        ('- {addresses: ["0000:01:00.0"], numVfs: -1}', "must be a whole number"),
        ('- {addresses: ["0000:01:00.0"], numVfs: "2"}', "must be a whole number"),
        ('- {addresses: ["0000:01:00.0"], numVfs: 2, sriov: pf}', "drop sriov: pf"),
        ('- {addresses: ["0000:01:00.0"], numVfs: 2, vfDriver: igb}', "vfio-pci or none"),
        ('- {addresses: ["0000:01:00.0"], vfDriver: none}', "only with numVfs"),
        ('- {vendor: "1b36", sriov: both}', r"must be pf \(SR-IOV PFs\) or vf"),
        ('- {addresses: ["0000:01:00.0"], numVfs: 2, vfDriver: none, bind: true}', "drop bind"),
    ],
)
def test_bad_sriov_fields_are_named(body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config_text("selectors:\n" + body + "\n", "t")
