"""The bind policy is pure: which groups each path's process binds by itself."""

from __future__ import annotations

from tests.model.test_config import dev
from tests.model.test_paths import cfg, inventory
from vfio_dp.core.policy import autobind_groups, newly_bound
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEFAULT_CONFIG, DEVICE_PLUGIN, DRA

A = PciAddress.parse


def test_each_path_binds_only_its_own_bind_true_groups() -> None:
    gpu = dev("0000:3b:00.0", "10de", "1eb8", "030200", driver="nvidia", iommu_group=45)
    audio = dev("0000:3b:00.1", "10de", "10f8", "040300", driver="snd_hda_intel", iommu_group=45)
    nic = dev("0000:65:00.0", "8086", "10d3", "020000", driver="e1000e", iommu_group=50)
    mlx = dev("0000:af:00.1", "15b3", "101c", "020000", driver="mlx5_core", iommu_group=61)
    bridge = dev("0000:00:1c.0", "8086", "a110", "060400", driver="pcieport", iommu_group=45)
    inv = inventory(gpu, audio, nic, mlx, bridge)
    c = cfg(
        """
selectors:
  - vendor: "10de"
    bind: true
  - vendor: "8086"
    path: dra
    bind: true
  - vendor: "15b3"
    path: dra
    bind: onPrepare
"""
    )
    everything = list(inv.devices)
    assert autobind_groups(inv, c, everything, DEVICE_PLUGIN) == [[gpu.address, audio.address]]
    # onPrepare devices stay on their host drivers; the bridge is never bound
    assert autobind_groups(inv, c, everything, DRA) == [[nic.address]]
    assert autobind_groups(inv, c, [audio.address], DEVICE_PLUGIN) == [[audio.address]]
    assert autobind_groups(inv, DEFAULT_CONFIG, everything, DEVICE_PLUGIN) == []


def test_a_reload_binds_what_became_bind_true_for_this_path() -> None:
    nic = dev("0000:65:00.0", "8086", "10d3", "020000", driver="e1000e", iommu_group=50)
    inv = inventory(nic)
    old = cfg('selectors:\n- vendor: "8086"\n')
    new = cfg('selectors:\n- vendor: "8086"\n  bind: true\n')
    assert newly_bound(inv, old, new, DEVICE_PLUGIN) == {nic.address}
    assert newly_bound(inv, old, new, DRA) == set()
    assert newly_bound(inv, new, new, DEVICE_PLUGIN) == set()


def test_each_device_is_bound_with_its_selectors_vfio_driver() -> None:
    """``vfioDriver`` (issue 34) reaches the host per device: the selector's value, ``auto``
    where no selector takes the device (a group sibling)."""
    from vfio_dp.core.policy import vfio_drivers_wanted

    mlx = dev("0000:af:00.1", "15b3", "101e", "020000", driver="mlx5_core", iommu_group=61)
    gpu = dev("0000:3b:00.0", "10de", "1eb8", "030200", driver="nvidia", iommu_group=45)
    audio = dev("0000:3b:00.1", "1234", "10f8", "040300", driver="snd_hda_intel", iommu_group=45)
    inv = inventory(mlx, gpu, audio)
    c = cfg(
        """
selectors:
  - vendor: "15b3"
    bind: true
  - vendor: "10de"
    bind: true
    vfioDriver: vfio-pci
"""
    )
    assert vfio_drivers_wanted(inv, c, inv.devices) == {
        mlx.address: "auto", gpu.address: "vfio-pci", audio.address: "auto",
    }  # fmt: skip
