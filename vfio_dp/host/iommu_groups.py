"""IOMMU groups read from sysfs under a :class:`Root`, each with its viability verdict.

::

    <root>/sys/kernel/iommu_groups/<N>/                      one directory per group
    <root>/sys/kernel/iommu_groups/<N>/name                  "vfio-noiommu" for no-IOMMU groups
    <root>/sys/module/vfio/parameters/enable_unsafe_noiommu_mode   "Y" when no-IOMMU mode is on

Membership comes from each device's ``iommu_group`` link, already read with the device by
:mod:`vfio_dp.host.sysfs`; the verdict is :func:`vfio_dp.model.device.analyse_group` (pure).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from vfio_dp.host.root import Root, read_text
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import IommuGroup, PciDevice, analyse_group


def noiommu_enabled(root: Root) -> bool:
    """``<root>/sys/module/vfio/parameters/enable_unsafe_noiommu_mode`` is ``Y``."""
    flag = read_text(root.path("sys", "module", "vfio", "parameters", "enable_unsafe_noiommu_mode"))
    return flag == "Y"


def read_groups(
    root: Root, devices: dict[PciAddress, PciDevice], numbers: Iterable[int] | None = None
) -> dict[int, IommuGroup]:
    """Groups from ``<root>/sys/kernel/iommu_groups/<N>`` and each device's ``iommu_group``
    link (the kernel keeps both in step), with the viability verdict.

    Group numbers come from the directory listing (so an empty group still shows), or are
    ``numbers`` (the groups of :func:`read_group_devices`: not listed);
    membership from the devices' links (one readlink per device was already done, instead
    of one listdir per group). ``<N>/name`` (``vfio-noiommu``) is read only when the vfio
    module's unsafe no-IOMMU mode is on.
    """
    base = root.path("sys", "kernel", "iommu_groups")
    if numbers is None:
        try:
            names = os.listdir(base)
        except OSError:
            return {}
        numbers = (int(n) for n in names if n.isascii() and n.isdigit() and len(n) < 10)
    members: dict[int, list[PciDevice]] = {n: [] for n in numbers}
    for dev in devices.values():
        if dev.iommu_group is not None and dev.iommu_group in members:
            members[dev.iommu_group].append(dev)
    noiommu = noiommu_enabled(root)
    groups: dict[int, IommuGroup] = {}
    for number in sorted(members):
        is_noiommu = noiommu and read_text(f"{base}/{number}/name") == "vfio-noiommu"
        groups[number] = analyse_group(number, members[number], noiommu=is_noiommu)
    return groups
