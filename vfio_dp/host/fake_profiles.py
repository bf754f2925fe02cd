"""Realistic fake nodes to try vfio-dp without hardware (``vfioctl fake-node DIR --profile P``).

Each profile builds a :class:`~vfio_dp.host.fake_node.SysfsTree` under a directory, to use
as ``--root`` of every command and of the two node processes::

    gpu-host    a GPU with its audio function (one IOMMU group), a NIC already on vfio-pci,
                an SR-IOV PF with 2 VFs, two NICs sharing a group behind a PCIe-to-PCI bridge,
                and the host's own boot GPU, virtio disk and NIC (in use: never offered)
    nic-host    four ports of two Intel NICs (a dual-port 82599 in one group, two lone I350
                ports, one already on vfio-pci), the host's NVMe root disk and its uplink
    sriov-host  a ConnectX-6 PF with 4 VFs enabled (of 8), each VF its own group, one VF on
                vfio-pci, and an Intel E810 PF without VFs

Like every fake node it does not react to writes (see :mod:`vfio_dp.host.fake_node`).
"""

from __future__ import annotations

from pathlib import Path

from vfio_dp.host.fake_node import Dev, SysfsTree


def gpu_host(base: Path) -> SysfsTree:
    """A realistic node: root ports, a GPU + audio function in one group, a lone NIC, an
    SR-IOV PF with 2 VFs, a shared group behind a PCIe-to-PCI bridge, a virtio disk and NIC
    the host uses, a boot VGA, NUMA nodes."""
    t = SysfsTree(base)
    # Host's own virtio disk and NIC (like this very machine)
    t.add(Dev("0000:00:00.0", "8086", "29c0", "060000", group=0))  # host bridge, no driver
    t.add(Dev("0000:00:01.0", "1234", "1111", "030000", driver="bochs-drm", group=1, boot_vga=True))
    t.add(Dev("0000:00:02.0", "1af4", "1001", "010000", driver="virtio-pci", group=2))
    t.add_block("0000:00:02.0", "virtio1/block/vda", devno="254:0")
    t.add_block("0000:00:02.0", "virtio1/block/vda/vda1", devno="254:1")
    t.add(Dev("0000:00:03.0", "1af4", "1000", "020000", driver="virtio-pci", group=3))
    t.add_net("0000:00:03.0", "eth0", up=True, via="virtio2")
    # GPU behind a root port, with its audio function: one group
    t.add(Dev("0000:00:1c.0", "8086", "a110", "060400", driver="pcieport", group=4))
    t.add(
        Dev(
            "0000:3b:00.0",
            "10de",
            "1eb8",
            "030200",
            driver="nvidia",
            group=45,
            parent="0000:00:1c.0",
            numa=0,
            subsystem_vendor="10de",
            subsystem_device="12a2",
        )
    )
    t.add(
        Dev(
            "0000:3b:00.1",
            "10de",
            "10f8",
            "040300",
            driver="snd_hda_intel",
            group=45,
            parent="0000:00:1c.0",
            numa=0,
        )
    )
    # A lone NIC on vfio-pci already
    t.add(Dev("0000:00:1d.0", "8086", "a111", "060400", driver="pcieport", group=5))
    t.add(
        Dev(
            "0000:65:00.0",
            "8086",
            "10d3",
            "020000",
            driver="vfio-pci",
            group=50,
            parent="0000:00:1d.0",
            numa=1,
            native_driver="e1000e",
        )
    )
    # SR-IOV PF with 2 VFs enabled, VFs each in own group
    t.add(Dev("0000:00:1e.0", "8086", "a112", "060400", driver="pcieport", group=6))
    t.add(
        Dev(
            "0000:af:00.0",
            "15b3",
            "101b",
            "020000",
            driver="mlx5_core",
            group=60,
            parent="0000:00:1e.0",
            numa=1,
            sriov_totalvfs=8,
            sriov_numvfs=2,
        )
    )
    t.add(
        Dev(
            "0000:af:00.1",
            "15b3",
            "101c",
            "020000",
            driver="mlx5_core",
            group=61,
            parent="0000:00:1e.0",
            numa=1,
            physfn="0000:af:00.0",
        )
    )
    t.add(
        Dev(
            "0000:af:00.2",
            "15b3",
            "101c",
            "020000",
            driver="mlx5_core",
            group=62,
            parent="0000:00:1e.0",
            numa=1,
            physfn="0000:af:00.0",
        )
    )
    # PCIe-to-PCI bridge with two conventional NICs sharing its group
    t.add(Dev("0000:00:1f.0", "1b36", "000e", "060400", group=7))
    t.add(
        Dev(
            "0000:03:01.0", "8086", "100e", "020000", driver="e1000", group=7, parent="0000:00:1f.0"
        )
    )
    t.add(
        Dev(
            "0000:03:02.0", "8086", "100e", "020000", driver="e1000", group=7, parent="0000:00:1f.0"
        )
    )
    t.set_proc(mounts=[("254:1", "/", "/dev/vda1")], routes=["eth0"])
    return t


def nic_host(base: Path) -> SysfsTree:
    """A network node: NICs to hand to VMs, the host's NVMe root disk and uplink in use."""
    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "2020", "060000", group=0))
    t.add(Dev("0000:00:01.0", "8086", "2030", "060400", driver="pcieport", group=1))
    t.add(Dev("0000:00:02.0", "8086", "2031", "060400", driver="pcieport", group=2))
    t.add(Dev("0000:00:03.0", "8086", "2032", "060400", driver="pcieport", group=3))
    # the host's root disk and uplink
    t.add(Dev("0000:01:00.0", "144d", "a808", "010802", driver="nvme", group=10,
              parent="0000:00:01.0", numa=0))  # fmt: skip
    t.add_block("0000:01:00.0", "nvme/nvme0/nvme0n1", devno="259:0")
    t.add_block("0000:01:00.0", "nvme/nvme0/nvme0n1/nvme0n1p2", devno="259:2")
    t.add(Dev("0000:02:00.0", "8086", "1521", "020000", driver="igb", group=20,
              parent="0000:00:02.0", numa=0, subsystem_vendor="8086", subsystem_device="0001"))  # fmt: skip
    t.add_net("0000:02:00.0", "eno1", up=True)
    # a dual-port 82599: both ports in one group (no ACS between functions)
    for fn in (0, 1):
        t.add(Dev(f"0000:18:00.{fn}", "8086", "10fb", "020000", driver="ixgbe", group=30,
                  parent="0000:00:03.0", numa=1, subsystem_vendor="8086",
                  subsystem_device="000c"))  # fmt: skip
    # two more I350 ports, each its own group; one already on vfio-pci
    t.add(Dev("0000:02:00.1", "8086", "1521", "020000", driver="igb", group=21,
              parent="0000:00:02.0", numa=0))  # fmt: skip
    t.add(Dev("0000:02:00.2", "8086", "1521", "020000", driver="vfio-pci", group=22,
              parent="0000:00:02.0", numa=0, native_driver="igb"))  # fmt: skip
    t.set_proc(mounts=[("259:2", "/", "/dev/nvme0n1p2")], routes=["eno1"])
    return t


def sriov_host(base: Path) -> SysfsTree:
    """An SR-IOV node: a PF with VFs made (each VF its own group), and a PF without."""
    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "09a2", "060000", group=0))
    t.add(Dev("0000:00:02.0", "1af4", "1001", "010000", driver="virtio-pci", group=2))
    t.add_block("0000:00:02.0", "virtio1/block/vda", devno="254:0")
    t.add_block("0000:00:02.0", "virtio1/block/vda/vda1", devno="254:1")
    t.add(Dev("0000:00:03.0", "8086", "347a", "060400", driver="pcieport", group=3))
    t.add(Dev("0000:00:04.0", "8086", "347b", "060400", driver="pcieport", group=4))
    t.add(Dev("0000:3b:00.0", "15b3", "101b", "020000", driver="mlx5_core", group=40,
              parent="0000:00:03.0", numa=0, sriov_totalvfs=8, sriov_numvfs=4))  # fmt: skip
    for n in range(4):
        t.add(Dev(f"0000:3b:00.{n + 2}", "15b3", "101c", "020000",
                  driver="vfio-pci" if n == 0 else "mlx5_core", group=41 + n,
                  parent="0000:00:03.0", numa=0, physfn="0000:3b:00.0",
                  native_driver="mlx5_core"))  # fmt: skip
    t.add(Dev("0000:5e:00.0", "8086", "1592", "020000", driver="ice", group=50,
              parent="0000:00:04.0", numa=1, sriov_totalvfs=16, sriov_numvfs=0))  # fmt: skip
    t.add_net("0000:5e:00.0", "ens1f0", up=True)
    t.set_proc(mounts=[("254:1", "/", "/dev/vda1")], routes=["ens1f0"])
    return t


#: ``vfioctl fake-node --profile`` → the builder
PROFILES = {"gpu-host": gpu_host, "nic-host": nic_host, "sriov-host": sriov_host}
#: a device of each profile that a ``bind --dry-run --group`` takes (the others are the host's,
#: already on vfio-pci, or bridges)
TRY_BIND = {"gpu-host": "0000:3b:00.0", "nic-host": "0000:18:00.0", "sriov-host": "0000:3b:00.3"}
