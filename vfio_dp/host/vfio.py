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
from collections.abc import Iterable

from vfio_dp.errors import PathEscapeError
from vfio_dp.host.root import Root
from vfio_dp.model.device import GroupStatus, IommuGroup, PciDevice

VFIO_GROUP_GET_STATUS = 0x3B67
VFIO_GROUP_FLAGS_VIABLE = 1
VFIO_GROUP_FLAGS_CONTAINER_SET = 2
_STATUS_ARG = struct.pack("<II", 8, 0)  # struct vfio_group_status {argsz = 8, flags = 0}


UNKNOWN = GroupStatus(viable=None, in_use=None)  # no node
_BUSY = GroupStatus(viable=None, in_use=True)
_NOT_A_GROUP = GroupStatus(viable=None, in_use=False)  # opens, but no VFIO ioctl (test tree)
_VIABLE = GroupStatus(viable=True, in_use=False)
_NOT_VIABLE = GroupStatus(viable=False, in_use=False)


def probe_groups(root: Root, groups: Iterable[IommuGroup]) -> dict[int, GroupStatus]:
    """Open ``<root>/dev/vfio/<N>`` briefly and ask the kernel (``VFIO_GROUP_GET_STATUS``),
    for each group with a node there; groups without one are left out (one directory listing, not one failed open each; nodes are opened
    relative to the directory)."""
    try:  # inside the root: a planted `dev` link must not lead the ioctl elsewhere
        dfd = root.open(root.path("dev", "vfio"), os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, PathEscapeError):
        return {}
    try:
        nodes = set(os.listdir(dfd))
        out = {}
        for group in groups:
            name = group.node
            if name in nodes:
                out[group.number] = _probe_at(dfd, name)
        return out
    finally:
        os.close(dfd)


def _probe_at(dfd: int, name: str) -> GroupStatus:
    try:
        fd = os.open(name, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError as e:
        return _BUSY if e.errno == errno.EBUSY else UNKNOWN
    try:
        buf = bytearray(_STATUS_ARG)
        try:
            fcntl.ioctl(fd, VFIO_GROUP_GET_STATUS, buf, True)
        except OSError:
            return _NOT_A_GROUP
        _, flags = struct.unpack("<II", buf)
        return _VIABLE if flags & VFIO_GROUP_FLAGS_VIABLE else _NOT_VIABLE
    finally:
        os.close(fd)


def device_nodes(root: Root, group: IommuGroup, devices: list[PciDevice]) -> list[str]:
    """HOST paths (never prefixed with the root) a container needs for ``group``::

    /dev/vfio/vfio, /dev/vfio/<N> (or /dev/vfio/noiommu-<N>),
    /dev/vfio/devices/vfioN (per device with a cdev), /dev/iommu (when present)
    """
    out = ["/dev/vfio/vfio", f"/dev/vfio/{group.node}"]
    for dev in devices:
        if dev.vfio_cdev and os.path.exists(root.path("dev", "vfio", "devices", dev.vfio_cdev)):
            out.append(f"/dev/vfio/devices/{dev.vfio_cdev}")
    if any(d.vfio_cdev for d in devices) and os.path.exists(root.path("dev", "iommu")):
        out.append("/dev/iommu")
    return out


def group_nodes_present(root: Root, groups: Iterable[IommuGroup]) -> dict[int, bool]:
    """Does ``<root>/dev/vfio/<N>`` exist, per group (one directory listing, never an open:
    the DRA plugin's health check runs on every scan, and a VM may be opening the node)."""
    try:
        dfd = root.open(root.path("dev", "vfio"), os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, PathEscapeError):
        return {g.number: False for g in groups}
    try:
        nodes = set(os.listdir(dfd))
    finally:
        os.close(dfd)
    return {g.number: g.node in nodes for g in groups}
