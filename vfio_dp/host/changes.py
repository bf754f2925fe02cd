"""The cheap look a daemon's resync takes at what can change while it idles.

A resync must notice what a missed uevent would hide -- a device's driver or IOMMU group
link changed, a device or a VFIO node gone -- without re-reading every attribute of every
device. :func:`fingerprint` reads a handful of directories, one listing each, never one
system call per device::

    <root>/sys/bus/pci/devices/<bdf>        the names and inode numbers of the entries (a
                                            device removed and added again at one address,
                                            e.g. with another IOMMU group, is a new entry
                                            with a new inode number)
    <root>/sys/bus/pci/drivers/<drv>/<bdf>  the devices each driver holds (the kernel makes
                                            and removes this link together with
                                            <bdf>/driver; a rebind re-makes it)
    <root>/sys/kernel/iommu_groups/<N>      the group numbers (a test tree's filesystem may
                                            give a re-made entry its old inode number; a
                                            group that came or went shows it there)
    <root>/dev/vfio/<N>, <root>/dev/vfio/devices/vfioN   the VFIO nodes

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


def fingerprint(root: Root) -> Fingerprint:
    """What a resync compares (see the module docstring); cheap: one listing per directory."""
    drivers = _listing(root, "sys", "bus", "pci", "drivers")
    held = {}
    if isinstance(drivers, frozenset):
        for name in drivers:  # a name that is no safe path component lists as None
            held[name] = _listing(root, "sys", "bus", "pci", "drivers", name)
    return (
        _listing(root, "sys", "bus", "pci", "devices", inodes=True),
        held,
        _listing(root, "sys", "kernel", "iommu_groups"),
        _listing(root, "dev", "vfio"),
        _listing(root, "dev", "vfio", "devices"),
    )


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
