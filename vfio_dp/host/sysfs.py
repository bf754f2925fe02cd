"""Discovery: read PCI devices (and the members of given devices' IOMMU groups) from sysfs.

Per device (``<root>/sys/bus/pci/devices/<bdf>/``)::

    vendor device class subsystem_vendor subsystem_device   0x10de / 0x030000 ...
    numa_node            -1 = none
    driver ->            ../../../bus/pci/drivers/<name>      (absent = no driver)
    driver_override      "(null)" = none
    iommu_group ->       ../../../kernel/iommu_groups/<N>
    physfn -> / sriov_numvfs / boot_vga / vfio-dev/vfioN

Per group: ``<root>/sys/kernel/iommu_groups/<N>/devices/<bdf>`` (the members of the groups
of given devices: :func:`read_group_devices`); the groups themselves and their verdict are
:mod:`vfio_dp.host.iommu_groups`. Device directories are opened inside the root (see
:class:`_DevicesDir`); otherwise only link *names* are read (the basename of a ``readlink``).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from collections.abc import Callable, Iterable

from vfio_dp.errors import AddressError, PathEscapeError, SysfsValueError
from vfio_dp.host.root import Root
from vfio_dp.host.sysfs_values import Garbage as _Garbage
from vfio_dp.host.sysfs_values import hex_value as _hex
from vfio_dp.host.sysfs_values import int_value as _int
from vfio_dp.host.sysfs_values import name_value as _name
from vfio_dp.host.sysfs_values import override_value as _override
from vfio_dp.host.warn import warning
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import VFIO_PCI, PciDevice

_SAID: set[str] = set()  # skip reasons already logged by this process (bounded below)


def _skip(e: SysfsValueError) -> None:
    """Say why a device is left out (:func:`vfio_dp.host.warn.warning`: through ``logging``
    where a process set it up, else on stderr). The daemon rescans every few seconds: each
    reason is logged once per process, not at every rescan."""
    text = str(e)
    if text in _SAID:
        return
    if len(_SAID) < 4096:
        _SAID.add(text)
    warning(text)


def skipped(e: SysfsValueError) -> None:
    """Say why a device is left out of a listing (:func:`_skip`: logged once per process)."""
    _skip(e)


def read_number(root: Root, address: PciAddress, dfd: int, name: str) -> int | None:
    """``<root>/sys/bus/pci/devices/<bdf>/<name>`` (e.g. ``sriov_totalvfs``; ``dfd`` is the
    device's open directory) as a decimal number, None when absent. A value no kernel writes
    (not decimal, more than 10 digits) raises :class:`SysfsValueError` naming file and value."""
    try:
        return _int(_read_at(dfd, name), name)
    except _Garbage as e:
        raise _value_error(pci_devices_dir(root), address, e) from None


def pci_devices_dir(root: Root) -> str:
    return root.path("sys", "bus", "pci", "devices")


def list_addresses(root: Root) -> list[PciAddress]:
    """Every ``<root>/sys/bus/pci/devices/<bdf>`` entry, sorted; odd names are ignored."""
    return list(_named_addresses(root).values())


def _named_addresses(root: Root) -> dict[str, PciAddress]:
    """:func:`list_addresses` keyed by the entries' names (in address order)."""
    try:
        names = os.listdir(pci_devices_dir(root))
    except FileNotFoundError:
        return {}
    out = {}
    # full lowercase addresses are fixed-width hex: string order is address order
    for name in sorted(names):
        addr = _canonical(name)
        if addr is None:
            try:
                addr = PciAddress.parse(name)
            except AddressError:
                continue
        out[name] = addr
    return out


_LOWER_HEX = frozenset("0123456789abcdef")


def _canonical(name: str) -> PciAddress | None:
    """``dddd:bb:ss.f`` exactly as the kernel names devices (lowercase), made without the
    general parser (a big host lists thousands); None for any other shape. The range
    checks (slot <= 1f, function <= 7) are :class:`PciAddress`'s own."""
    if (
        len(name) != 12
        or name[4] != ":"
        or name[7] != ":"
        or name[10] != "."
        or not _LOWER_HEX.issuperset(name[:4] + name[5:7] + name[8:10] + name[11])
    ):
        return None
    try:
        return PciAddress(
            int(name[:4], 16), int(name[5:7], 16), int(name[8:10], 16), int(name[11], 16)
        )
    except AddressError:
        return None


_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY


def _read_at(dfd: int, name: str) -> str | None:
    """:func:`read_text` of a file in the directory ``dfd`` (sysfs attributes and uevent are
    at most one page), written out: the scan reads three per device."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dfd)
    except OSError:
        return None
    try:
        return os.read(fd, 4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)


def _link_at(dfd: int, name: str) -> str | None:
    try:
        return posixpath.basename(os.readlink(name, dir_fd=dfd))
    except OSError:
        return None


class _DevicesDir:
    """``<root>/sys/bus/pci/devices/`` opened once: every device is reached relative to it.

    Each entry is a link into ``/sys/devices`` (``../../../devices/pci0000:00/...``). Under a
    root other than ``/`` the device directory is opened with :meth:`Root.open` (``openat2``
    with ``RESOLVE_BENEATH`` from the root: one system call), so neither the entry nor any
    directory on its way (``sys/devices/pci0000:00``, ``sys`` itself) can lead discovery out
    of the root; an entry that would is skipped. Files are then read relative to the device's
    own dir fd (one path walk per device instead of one per file).
    """

    __slots__ = ("fd", "path", "rel", "root")

    def __init__(self, root: Root) -> None:
        self.root = root
        self.path = pci_devices_dir(root)
        self.rel = self.path[len(root.prefix) + 1 :] + "/"  # sys/bus/pci/devices/
        self.fd = root.open(self.path, os.O_RDONLY | os.O_DIRECTORY)

    def close(self) -> None:
        os.close(self.fd)

    def open_device(self, name: str) -> int | None:
        """A dir fd for ``<name>`` (a validated address string), None if gone or escaping."""
        try:
            if self.root.prefix:
                return self.root.open_relative(self.rel + name, os.O_RDONLY | os.O_DIRECTORY)
            return os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=self.fd)
        except (OSError, PathEscapeError):
            return None


def open_device_dir(root: Root, address: PciAddress) -> int | None:
    """Open ``<root>/sys/bus/pci/devices/<bdf>`` as a dir fd (see :class:`_DevicesDir`)."""
    try:
        devices = _DevicesDir(root)
    except (OSError, PathEscapeError):
        return None
    try:
        return devices.open_device(str(address))
    finally:
        devices.close()


def read_device(root: Root, address: PciAddress) -> PciDevice | None:
    """Read one device's sysfs directory; None if it is gone (hot-unplugged). Raises
    :class:`SysfsValueError` naming the file when a value is garbage."""
    dfd = open_device_dir(root, address)
    if dfd is None:
        return None
    try:
        return _read_device_at(dfd, address)
    except _Garbage as e:
        raise _value_error(pci_devices_dir(root), address, e) from None
    finally:
        os.close(dfd)


def read_driver(root: Root, address: PciAddress) -> tuple[bool, str | None]:
    """``(present, driver)``: whether ``<root>/sys/bus/pci/devices/<bdf>`` is there, and the
    name its ``driver`` link points at (None: no driver) -- one link read, where a bind
    checks what the kernel did (not the whole device: 1,024 VFs bound)."""
    dfd = open_device_dir(root, address)
    if dfd is None:
        return False, None
    try:
        return True, _link_at(dfd, "driver")
    finally:
        os.close(dfd)


def _value_error(devices_dir: str, address: PciAddress, e: _Garbage) -> SysfsValueError:
    return SysfsValueError(f"{devices_dir}/{address}/{e.name}", e.value, e.why)


def _ids_from_uevent(text: str) -> tuple[str, str, str, str, str, str | None] | None:
    """(vendor, device, class, subsystem vendor, subsystem device, driver) from ``<bdf>/uevent``::

        DRIVER=e1000e
        PCI_CLASS=20000
        PCI_ID=8086:10D3
        PCI_SUBSYS_ID=8086:A01F
        PCI_SLOT_NAME=0000:01:00.0

    One read instead of six: the kernel builds it from the same cached values as the
    ``vendor``/``device``/``class``/``subsystem_*`` files and the ``driver`` link (never from
    config space, so it does not wake a suspended device). None if a field is missing (the
    files are read instead); a field that is there but not what the kernel writes raises.
    """
    fields = {}
    for line in text.split("\n"):
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    ids, cls, sub = fields.get("PCI_ID"), fields.get("PCI_CLASS"), fields.get("PCI_SUBSYS_ID")
    if not ids or not cls or not sub or ":" not in ids or ":" not in sub:
        return None
    vendor, _, device = ids.partition(":")
    svendor, _, sdevice = sub.partition(":")
    return (
        _hex(vendor, 4, "uevent (PCI_ID)"),
        _hex(device, 4, "uevent (PCI_ID)"),
        _hex(cls, 6, "uevent (PCI_CLASS)"),
        _hex(svendor, 4, "uevent (PCI_SUBSYS_ID)"),
        _hex(sdevice, 4, "uevent (PCI_SUBSYS_ID)"),
        _name(fields.get("DRIVER"), "uevent (DRIVER)"),
    )


def _read_device_at(
    dfd: int, address: PciAddress, known: dict[str, PciAddress] | None = None
) -> PciDevice | None:
    """Read the device whose directory is ``dfd``. ``known`` maps address strings already
    parsed (the directory listing) so a VF's ``physfn`` is looked up, not parsed again.
    Every value is checked (raises :class:`_Garbage` naming the file)."""
    uevent = _read_at(dfd, "uevent")
    parsed = _ids_from_uevent(uevent) if uevent else None
    if parsed is not None:
        vendor, device, class_code, svendor, sdevice, driver = parsed
    else:  # no uevent (or an odd one): the individual files
        raw_vendor = _read_at(dfd, "vendor")
        if raw_vendor is None:
            return None  # gone
        vendor, device = _hex(raw_vendor, 4, "vendor"), _hex(_read_at(dfd, "device"), 4, "device")
        class_code = _hex(_read_at(dfd, "class"), 6, "class")
        svendor = _hex(_read_at(dfd, "subsystem_vendor"), 4, "subsystem_vendor")
        sdevice = _hex(_read_at(dfd, "subsystem_device"), 4, "subsystem_device")
        driver = _name(_link_at(dfd, "driver"), "driver")
    numa = _int(_read_at(dfd, "numa_node"), "numa_node", signed=True)
    override = _override(_read_at(dfd, "driver_override"))
    group = _link_at(dfd, "iommu_group")
    physfn = _link_at(dfd, "physfn")
    physfn_addr = None
    if physfn:
        physfn_addr = known.get(physfn) if known else None
        if physfn_addr is None:
            try:
                physfn_addr = PciAddress.parse(physfn)
            except AddressError:
                raise _Garbage("physfn", physfn, "links to no PCI address") from None
    # a VF never has sriov_* files: skip the failing open (thousands of VFs on big hosts)
    numvfs = None if physfn else _read_at(dfd, "sriov_numvfs")
    cdev = _vfio_cdev_at(dfd) if driver == VFIO_PCI else None
    return PciDevice(
        address=address,
        vendor=vendor,
        device=device,
        class_code=class_code,
        subsystem_vendor=svendor,
        subsystem_device=sdevice,
        driver=driver,
        driver_override=override,
        iommu_group=_int(group, "iommu_group"),
        numa_node=None if numa is None or numa < 0 else numa,
        physfn=physfn_addr,
        sriov_numvfs=_int(numvfs, "sriov_numvfs"),
        boot_vga=class_code.startswith("03") and _read_at(dfd, "boot_vga") == "1",
        vfio_cdev=cdev,
    )


def refresh_devices(
    root: Root, previous: dict[PciAddress, PciDevice]
) -> dict[PciAddress, PciDevice]:
    """Every device now present: new addresses read in full, known ones re-read only for what
    changes while a device stays present -- ``driver``, ``driver_override`` and the VFIO cdev
    (``vfio-dev/vfioN``). IDs, class, NUMA node and IOMMU group are fixed for the life of a
    device at an address (a hot swap at the same address is a remove + add; the daemon's
    periodic full scan covers a missed pair). Gone devices are left out.
    """

    def read(dfd: int, addr: PciAddress, known: dict[str, PciAddress]) -> PciDevice | None:
        old = previous.get(addr)
        return _refresh_at(dfd, old) if old else _read_device_at(dfd, addr, known)

    return _read_each(root, _named_addresses(root), read)


def reread_devices(
    root: Root, previous: dict[PciAddress, PciDevice], addresses: Iterable[PciAddress]
) -> dict[PciAddress, PciDevice]:
    """``previous`` with the devices of ``addresses`` re-read for what a bind or an unbind
    changes (``driver``, ``driver_override``, the VFIO cdev, as :func:`refresh_devices`), and
    left out when gone; no other device is read (after a bind: its groups' members only)."""
    named = {str(a): a for a in addresses if a in previous}
    fresh = _read_each(root, named, lambda dfd, addr, _known: _refresh_at(dfd, previous[addr]))
    out = dict(previous)
    for addr in named.values():
        dev = fresh.get(addr)
        if dev is None:
            out.pop(addr, None)
        else:
            out[addr] = dev
    return out


def _refresh_at(dfd: int, old: PciDevice) -> PciDevice | None:
    driver = _name(_link_at(dfd, "driver"), "driver")
    raw_override = _read_at(dfd, "driver_override")
    if raw_override is None and _read_at(dfd, "vendor") is None:
        return None
    cdev = _vfio_cdev_at(dfd) if driver == VFIO_PCI else None
    override = _override(raw_override)
    if driver == old.driver and override == old.driver_override and cdev == old.vfio_cdev:
        return old
    return dataclasses.replace(old, driver=driver, driver_override=override, vfio_cdev=cdev)


def _vfio_cdev_at(dfd: int) -> str | None:
    """``vfio-dev/vfioN``: the VFIO cdev's name. Entries that are not ``vfio<digits>`` are
    not the kernel's and are ignored (one would otherwise reach ``/dev/vfio/devices/``)."""
    try:
        sub = os.open("vfio-dev", os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
    except OSError:
        return None
    try:
        entries = [
            e
            for e in os.listdir(sub)
            if e.startswith("vfio") and e[4:].isascii() and e[4:].isdigit() and len(e) < 16
        ]
    finally:
        os.close(sub)
    return min(entries, key=lambda e: int(e[4:])) if entries else None


def read_devices(
    root: Root, addresses: Iterable[PciAddress] | None = None, *, workers: int = 1
) -> dict[PciAddress, PciDevice]:
    """Every device (or those of ``addresses``) by address, in order; gone ones are left out.

    With ``workers`` > 1 (the CLI passes the CPUs it may use) a big host's scan is split
    across that many processes (:mod:`vfio_dp.host.parallel_scan`); never from a process
    with other threads: the daemon reads in one process.
    """
    named = _named_addresses(root) if addresses is None else {str(a): a for a in addresses}
    if workers > 1:
        from vfio_dp.host.parallel_scan import read_split

        addrs = list(named.values())
        return read_split(addrs, lambda run: read_devices(root, run), processes=workers)
    return _read_each(root, named, _read_device_at)


def _read_each(
    root: Root,
    known: dict[str, PciAddress],
    read: Callable[[int, PciAddress, dict[str, PciAddress]], PciDevice | None],
) -> dict[PciAddress, PciDevice]:
    """``read(dir_fd, address, known)`` for each address (``known``: by its name) whose
    directory opens, in order."""
    out: dict[PciAddress, PciDevice] = {}
    try:
        devices = _DevicesDir(root)
    except (OSError, PathEscapeError):
        return out
    try:
        for name, addr in known.items():
            dfd = devices.open_device(name)
            if dfd is None:
                continue
            try:
                dev = read(dfd, addr, known)
            except _Garbage as e:  # never trusted, never fatal: left out, and said why
                _skip(_value_error(devices.path, addr, e))
                continue
            finally:
                os.close(dfd)
            if dev is not None:
                out[addr] = dev
    finally:
        devices.close()
    return out


def read_group_devices(root: Root, addresses: Iterable[PciAddress]) -> dict[PciAddress, PciDevice]:
    """The devices of the IOMMU groups of ``addresses``, read in full, and no other: each
    address's device, then the members its group lists
    (``<root>/sys/kernel/iommu_groups/<N>/devices/<bdf>``), in address order. A gone address
    is left out; one without a group comes alone. Judge them with :func:`vfio_dp.host.iommu_groups.read_groups`
    (``numbers``): what a full scan says of those groups, at the cost of a few devices (a
    claim's groups on a host of thousands)."""
    devices = read_devices(root, addresses)
    listed: dict[str, PciAddress] = {}
    for number in sorted({d.iommu_group for d in devices.values() if d.iommu_group is not None}):
        try:  # listed inside the root: a group dir that links out of it lists nothing
            dfd = root.open_dir("sys", "kernel", "iommu_groups", str(number), "devices")
        except (OSError, PathEscapeError):
            continue
        try:
            names = os.listdir(dfd)
        except OSError:
            continue
        finally:
            os.close(dfd)
        for name in names:
            addr = _canonical(name)
            if addr is not None and addr not in devices:
                listed[name] = addr
    devices.update(_read_each(root, listed, _read_device_at))
    return dict(sorted(devices.items()))  # address order, as a full scan's
