"""Hidden-like node topologies for the DRA tests, as real temp sysfs trees.

``dra_host``: SR-IOV VFs on vfio-pci, a PCIe switch with two NVMe drives in ONE IOMMU group,
a GPU with its audio function (on their host drivers), a host-used NIC, and a device-plugin
NIC — with :data:`DRA_CONFIG` assigning paths the way the shipped manifests do.
"""

from __future__ import annotations

from pathlib import Path

from tests.sysfs_tree import Dev, SysfsTree

DRA_CONFIG = """
selectors:
  - vendor: "15b3"
    device: "101c"
    path: dra
    resourceName: mlx-vf
  - class: "0108"
    path: dra
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "1af4"
    device: "1000"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "10d3"
"""

#: what DRA_CONFIG publishes on dra_host, by device name → (pciBusID, group, functions)
PUBLISHED = {
    "pci-0000-07-00-0": ("0000:07:00.0", 9, 2),
    "pci-0000-3b-00-0": ("0000:3b:00.0", 45, 2),
    "pci-0000-af-00-1": ("0000:af:00.1", 61, 1),
    "pci-0000-af-00-2": ("0000:af:00.2", 62, 1),
}


def dra_host(base: Path) -> SysfsTree:
    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "29c0", "060000", group=0))  # host bridge
    # the host's own NIC, up with a route: host-used (selected with bind: onPrepare)
    t.add(Dev("0000:00:03.0", "1af4", "1000", "020000", driver="virtio-pci", group=3))
    t.add_net("0000:00:03.0", "eth0", up=True, via="virtio2")
    # GPU + audio behind a root port, one group, on their host drivers
    t.add(Dev("0000:00:1c.0", "8086", "a110", "060400", driver="pcieport", group=4))
    for addr, dev, cls, drv in (
        ("0000:3b:00.0", "1eb8", "030200", "nvidia"),
        ("0000:3b:00.1", "10f8", "040300", "snd_hda_intel"),
    ):
        t.add(
            Dev(
                addr,
                "10de",
                dev,
                cls,
                driver=drv,
                group=45,
                parent="0000:00:1c.0",
                numa=0,
                subsystem_vendor="10de",
                subsystem_device="12a2",
            )
        )
    # a device-plugin NIC on vfio-pci
    t.add(Dev("0000:00:1d.0", "8086", "a111", "060400", driver="pcieport", group=5))
    t.add(Dev("0000:65:00.0", "8086", "10d3", "020000", driver="vfio-pci", group=50,
              parent="0000:00:1d.0", numa=1))  # fmt: skip
    # SR-IOV PF (host driver, not selected) with 2 VFs on vfio-pci, each in its own group
    t.add(Dev("0000:00:1e.0", "8086", "a112", "060400", driver="pcieport", group=6))
    t.add(Dev("0000:af:00.0", "15b3", "101b", "020000", driver="mlx5_core", group=60,
              parent="0000:00:1e.0", numa=1, sriov_totalvfs=8, sriov_numvfs=2))  # fmt: skip
    for fn, g in ((1, 61), (2, 62)):
        t.add(Dev(f"0000:af:00.{fn}", "15b3", "101c", "020000", driver="vfio-pci", group=g,
                  parent="0000:00:1e.0", numa=1, physfn="0000:af:00.0"))  # fmt: skip
    # a PCIe switch without ACS: both NVMe drives share group 9, on vfio-pci
    t.add(Dev("0000:00:1f.0", "8086", "a113", "060400", driver="pcieport", group=8))
    for addr, parent in (
        ("0000:05:00.0", "0000:00:1f.0"),
        ("0000:06:00.0", "0000:05:00.0"),
        ("0000:06:01.0", "0000:05:00.0"),
    ):
        t.add(Dev(addr, "10b5", "8747", "060400", driver="pcieport", group=9, parent=parent))
    t.add(Dev("0000:07:00.0", "144d", "a808", "010802", driver="vfio-pci", group=9,
              parent="0000:06:00.0"))  # fmt: skip
    t.add(Dev("0000:08:00.0", "144d", "a808", "010802", driver="vfio-pci", group=9,
              parent="0000:06:01.0"))  # fmt: skip
    t.set_proc(routes=["eth0"])
    return t
