"""Discovery: read PCI devices and IOMMU groups from sysfs under a :class:`Root`.

Per device (``<root>/sys/bus/pci/devices/<bdf>/``)::

    vendor device class subsystem_vendor subsystem_device   0x10de / 0x030000 ...
    numa_node            -1 = none
    driver ->            ../../../bus/pci/drivers/<name>      (absent = no driver)
    driver_override      "(null)" = none
    iommu_group ->       ../../../kernel/iommu_groups/<N>
    physfn -> / sriov_numvfs / boot_vga / vfio-dev/vfioN

Per group: ``<root>/sys/kernel/iommu_groups/<N>/devices/<bdf>`` and ``.../<N>/name``
(``vfio-noiommu`` for no-IOMMU groups). Only link *names* are read here (the basename of a
``readlink``); nothing is followed, so nothing can lead out of the root.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from vfio_dp.errors import AddressError, HostError
from vfio_dp.host.root import Root, read_text
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import IommuGroup, PciDevice, analyse_group


def _hex(text: str | None, width: int) -> str:
    if not text:
        return "0" * width
    t = text.lower()
    if t.startswith("0x"):
        t = t[2:]
    return t.rjust(width, "0")[-width:]


def _int(text: str | None) -> int | None:
    if text is None or text == "":
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def pci_devices_dir(root: Root) -> str:
    return root.path("sys", "bus", "pci", "devices")


def list_addresses(root: Root) -> list[PciAddress]:
    """Every ``<root>/sys/bus/pci/devices/<bdf>`` entry, sorted; odd names are ignored."""
    try:
        names = os.listdir(pci_devices_dir(root))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        try:
            out.append(PciAddress.parse(name))
        except AddressError:
            continue
    out.sort()
    return out


def read_device(root: Root, address: PciAddress) -> PciDevice | None:
    """Read one device's sysfs directory; None if it is gone (hot-unplugged)."""
    d = root.path("sys", "bus", "pci", "devices", str(address))
    vendor = read_text(d + "/vendor")
    if vendor is None:
        return None
    numa = _int(read_text(d + "/numa_node"))
    override = read_text(d + "/driver_override")
    physfn = root.link_name(d + "/physfn")
    group = root.link_name(d + "/iommu_group")
    numvfs = read_text(d + "/sriov_numvfs")
    cdev: str | None = None
    try:
        entries = os.listdir(d + "/vfio-dev")
        cdev = min(entries) if entries else None
    except OSError:
        cdev = None
    try:
        physfn_addr = PciAddress.parse(physfn) if physfn else None
    except AddressError:
        physfn_addr = None
    return PciDevice(
        address=address,
        vendor=_hex(vendor, 4),
        device=_hex(read_text(d + "/device"), 4),
        class_code=_hex(read_text(d + "/class"), 6),
        subsystem_vendor=_hex(read_text(d + "/subsystem_vendor"), 4),
        subsystem_device=_hex(read_text(d + "/subsystem_device"), 4),
        driver=root.link_name(d + "/driver"),
        driver_override=None if override in (None, "", "(null)") else override,
        iommu_group=_int(group) if group is not None else None,
        numa_node=None if numa is None or numa < 0 else numa,
        physfn=physfn_addr,
        sriov_numvfs=_int(numvfs),
        boot_vga=read_text(d + "/boot_vga") == "1",
        vfio_cdev=cdev,
    )


def read_devices(
    root: Root, addresses: Iterable[PciAddress] | None = None
) -> dict[PciAddress, PciDevice]:
    out: dict[PciAddress, PciDevice] = {}
    for addr in list_addresses(root) if addresses is None else addresses:
        dev = read_device(root, addr)
        if dev is not None:
            out[addr] = dev
    return out


def iommu_present(root: Root) -> bool:
    """True when ``<root>/sys/kernel/iommu_groups`` has at least one group."""
    try:
        return bool(os.listdir(root.path("sys", "kernel", "iommu_groups")))
    except OSError:
        return False


def read_groups(root: Root, devices: dict[PciAddress, PciDevice]) -> dict[int, IommuGroup]:
    """Group membership from ``<root>/sys/kernel/iommu_groups/<N>/devices/`` and the verdict.

    Members come from the group directory (the kernel's list), not from the devices' links,
    so a device missing from ``devices`` (it vanished mid-scan) is simply not analysed.
    """
    base = root.path("sys", "kernel", "iommu_groups")
    try:
        names = os.listdir(base)
    except OSError:
        return {}
    groups: dict[int, IommuGroup] = {}
    for name in names:
        if not name.isdigit():
            continue
        number = int(name)
        try:
            member_names = os.listdir(f"{base}/{name}/devices")
        except OSError:
            member_names = []
        members: list[PciDevice] = []
        for m in member_names:
            try:
                addr = PciAddress.parse(m)
            except AddressError:
                continue
            dev = devices.get(addr)
            if dev is not None:
                members.append(dev)
        noiommu = read_text(f"{base}/{name}/name") == "vfio-noiommu"
        groups[number] = analyse_group(number, members, noiommu=noiommu)
    return dict(sorted(groups.items()))


def device_dir(root: Root, address: PciAddress) -> str:
    """The device's real directory in ``/sys/devices/...`` (links resolved inside the root)."""
    link = root.path("sys", "bus", "pci", "devices", str(address))
    if not os.path.lexists(link):
        raise HostError(f"no PCI device {address} under {root.display}sys/bus/pci/devices")
    return root.resolve(link)
