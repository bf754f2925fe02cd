"""The VFIO device nodes: ``/dev/vfio/vfio``, ``/dev/vfio/<N>``, ``/dev/vfio/noiommu-<N>``,
``/dev/vfio/devices/vfioN`` and ``/dev/iommu`` — and the kernel's own verdict on a group.

``VFIO_GROUP_GET_STATUS`` = ``_IO(';', 100 + 3)`` = ``0x3b67`` with
``struct vfio_group_status { u32 argsz = 8; u32 flags; }``: ``flags & 1`` = viable,
``flags & 2`` = container set. Opening a group a VM holds fails with ``EBUSY`` (in use).
Only operator commands probe; the daemon never opens a group node (a VM starting at that
instant would get EBUSY).
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from dataclasses import dataclass

from vfio_dp.host.root import Root
from vfio_dp.model.device import IommuGroup, PciDevice

VFIO_GROUP_GET_STATUS = 0x3B67
VFIO_GROUP_FLAGS_VIABLE = 1
VFIO_GROUP_FLAGS_CONTAINER_SET = 2


@dataclass(frozen=True, slots=True)
class GroupStatus:
    viable: bool | None  # None: unknown (no node, or busy)
    in_use: bool | None  # True: EBUSY; None: no node


def group_node_name(group: IommuGroup) -> str:
    """``5`` or ``noiommu-5``: the name of the group's node under ``/dev/vfio``."""
    return f"noiommu-{group.number}" if group.noiommu else str(group.number)


def probe_group(root: Root, group: IommuGroup) -> GroupStatus:
    """Open ``<root>/dev/vfio/<N>`` briefly and ask the kernel (``VFIO_GROUP_GET_STATUS``)."""
    node = root.path("dev", "vfio", group_node_name(group))
    try:
        fd = os.open(node, os.O_RDWR | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.EBUSY:
            return GroupStatus(viable=None, in_use=True)
        return GroupStatus(viable=None, in_use=None)
    try:
        buf = bytearray(struct.pack("<II", 8, 0))
        try:
            fcntl.ioctl(fd, VFIO_GROUP_GET_STATUS, buf, True)
        except OSError:
            return GroupStatus(viable=None, in_use=False)  # not a real VFIO node (test tree)
        _, flags = struct.unpack("<II", buf)
        return GroupStatus(viable=bool(flags & VFIO_GROUP_FLAGS_VIABLE), in_use=False)
    finally:
        os.close(fd)


def device_nodes(root: Root, group: IommuGroup, devices: list[PciDevice]) -> list[str]:
    """HOST paths (never prefixed with the root) a container needs for ``group``::

    /dev/vfio/vfio, /dev/vfio/<N> (or /dev/vfio/noiommu-<N>),
    /dev/vfio/devices/vfioN (per device with a cdev), /dev/iommu (when present)
    """
    out = ["/dev/vfio/vfio", f"/dev/vfio/{group_node_name(group)}"]
    for dev in devices:
        if dev.vfio_cdev and os.path.exists(root.path("dev", "vfio", "devices", dev.vfio_cdev)):
            out.append(f"/dev/vfio/devices/{dev.vfio_cdev}")
    if any(d.vfio_cdev for d in devices) and os.path.exists(root.path("dev", "iommu")):
        out.append("/dev/iommu")
    return out
