"""The cheap look a daemon's resync takes at what can change while it idles.

A resync must notice what a missed uevent would hide -- a device's driver or IOMMU group
link changed, a device or a VFIO node gone -- without re-reading every attribute of every
device. :func:`fingerprint` reads two directories, one listing each, and looks at three
more with one ``stat`` each, never one system call per device::

    <root>/sys/bus/pci/devices/<bdf>        listed: the names and inode numbers of the
                                            entries (a device removed and added again at one
                                            address, e.g. with another IOMMU group, is a new
                                            entry: kernfs never gives a new node an old inode
                                            number)
    <root>/sys/bus/pci/drivers/<drv>/<bdf>  listed: the devices each driver holds (the kernel
                                            makes and removes this link together with
                                            <bdf>/driver; a rebind re-makes it)
    <root>/sys/kernel/iommu_groups          stat: its link count, 2 + the number of groups
                                            (kernfs, ext4 and tmpfs count subdirectories so).
                                            A PCI device's group comes and goes with the
                                            device (listed above); a group that came with no
                                            new entry there (an IOMMU driver that probes late)
                                            changes the count
    <root>/dev/vfio, <root>/dev/vfio/devices   stat: inode, link count, size, mtime and ctime.
                                            devtmpfs (tmpfs) sets the directory's mtime and
                                            ctime at every node made or removed and its size
                                            by 20 bytes a node (ext4 test trees: the times);
                                            since Linux 6.13 (multigrain timestamps) a change
                                            after our ``stat`` always gets a later ctime, and
                                            before it a single node made or removed still
                                            changes the size on devtmpfs. An mdev instance's
                                            group (not a PCI device) shows here too

Two equal fingerprints: no device came, went or was re-made, none changed driver, and no
group or VFIO node appeared or vanished. What changes with none of these (a
``driver_override`` written without a bind, the host's use of a device) is re-read by the
daemon's periodic full scan (and the host use, which needs no per-device read, by the DRA
plugin at every resync). Every directory is opened through the :class:`Root` (nothing is
followed out of the root); only names and inode numbers are read -- nothing here is trusted
as a value, a difference only makes the caller scan.
"""

from __future__ import annotations

import dataclasses
import os

from vfio_dp.errors import HostError, PathEscapeError
from vfio_dp.host.iommu_groups import read_groups
from vfio_dp.host.root import Root
from vfio_dp.model.device import Inventory

#: what :func:`fingerprint` returns: compare two with ``==``, nothing else
Fingerprint = tuple[object, ...]


def _listing(root: Root, *parts: str, inodes: bool = False) -> object:
    """The entries of ``<root>/<parts>`` (with their inode numbers when ``inodes``); None
    when the directory is absent or cannot be opened inside the root."""
    try:
        fd = root.open(root.path(*parts), os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, PathEscapeError, HostError):
        return None
    try:
        if inodes:
            with os.scandir(fd) as it:
                return {e.name: e.inode() for e in it}
        return frozenset(os.listdir(fd))
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(root: Root, *parts: str, full: bool = True) -> object:
    """What a ``stat`` of the directory ``<root>/<parts>`` says of its entries: its link
    count (and, when ``full``, its inode, size, mtime and ctime); None when absent or not
    openable inside the root."""
    try:
        fd = root.open(root.path(*parts), os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, PathEscapeError, HostError):
        return None
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not full:
        return st.st_nlink
    return (st.st_ino, st.st_nlink, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def fingerprint(root: Root) -> Fingerprint:
    """What a resync compares (see the module docstring); cheap: two listings, three stats."""
    drivers = _listing(root, "sys", "bus", "pci", "drivers")
    held = {}
    if isinstance(drivers, frozenset):
        for name in drivers:  # a name that is no safe path component lists as None
            held[name] = _listing(root, "sys", "bus", "pci", "drivers", name)
    return (
        _listing(root, "sys", "bus", "pci", "devices", inodes=True),
        held,
        _stat(root, "sys", "kernel", "iommu_groups", full=False),
        _stat(root, "dev", "vfio"),
        _stat(root, "dev", "vfio", "devices"),
    )


def devices_or_groups_changed(look: Fingerprint, before: Fingerprint) -> bool:
    """Do two fingerprints differ in the devices or the IOMMU groups (a device's group may
    differ: the caller reads every device in full), not only in drivers or VFIO nodes?"""
    return (look[0], look[2]) != (before[0], before[2])


def with_usage(root: Root, inv: Inventory) -> Inventory:
    """``inv`` with the host's use of its devices read again (``inv`` itself when nothing
    changed): the global files of :mod:`vfio_dp.host.usage`, no per-device read -- what the
    DRA plugin's resync re-reads when the :func:`fingerprint` is unchanged."""
    from vfio_dp.host.usage import host_usage

    used = host_usage(root, inv.devices)
    changed = {}
    for a, uses in used.items():  # the few devices in use now
        d = inv.devices.get(a)
        if d is not None and d.in_use != (now := tuple(uses)):
            changed[a] = dataclasses.replace(d, in_use=now)
    for a, d in inv.devices.items():  # the few in use before: no address hashed for the rest
        if d.in_use and a not in used:
            changed[a] = dataclasses.replace(d, in_use=())
    if not changed:
        return inv
    devices = {a: changed.get(a, d) for a, d in inv.devices.items()}
    groups = read_groups(root, devices)
    return Inventory(devices=devices, groups=groups, iommu_present=bool(groups))
