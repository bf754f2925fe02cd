"""The kernel's facts about VFIO drivers other than vfio-pci, read under a :class:`Root`.

Two questions, each answered here once:

1. **Is this device on VFIO?** (:func:`mark_on_vfio`, after every scan) -- per DEVICE, never
   per driver name: its driver is ``vfio-pci`` (the device's own fact, no file read); or
   ``<bdf>/vfio-dev/vfioN`` exists (kernels with VFIO cdev, whose ``/dev/vfio/devices/``
   exists); or its IOMMU group's ``/dev/vfio/<N>`` exists (the kernel makes that node only
   once a device of the group is registered with VFIO) and either its driver's module
   (``/sys/bus/pci/drivers/<d>/module`` →) is named by a ``vfio_pci:`` line of
   ``modules.alias`` (a variant driver), or no member of the group is on VFIO otherwise (then
   the node is a vendor provider's, e.g. ``nvidia`` with vGPU: every bound member not on
   ``pci-stub``/``pcieport`` is taken as registered). A device listed in
   ``/sys/class/mdev_bus/`` is an mdev parent: never on VFIO, never a unit. A normal host
   pays two ``listdir`` per scan; ``modules.alias`` is read only when a group has a node that
   vfio-pci does not explain.
2. **Which driver should a bind write?** (:func:`choose_for`): the rule of
   :mod:`vfio_dp.model.vfio_driver` over ``/lib/modules/<release>/modules.alias`` (release
   from ``/proc/sys/kernel/osrelease``) and the device's modalias, built from the IDs the
   scan read (:func:`vfio_dp.model.vfio_driver.modalias_of`: the kernel's ``modalias_show``
   and the ``uevent`` the scan reads print the same cached ``pci_dev`` fields, so
   ``<bdf>/modalias`` is not read again per device); the module's driver name from
   ``/sys/module/<module>/drivers/pci:<driver>`` once loaded.

``modules.alias`` is read once per process and root and kept (:func:`vfio_aliases`); when it
is missing or unreadable every choice falls back to vfio-pci, and that is said once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping

from vfio_dp.errors import AddressError, PathEscapeError
from vfio_dp.host.mdev import parent_names
from vfio_dp.host.root import Root, read_text, safe_component
from vfio_dp.host.warn import warning
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import DMA_SAFE_DRIVERS, VFIO_PCI, Inventory, PciDevice
from vfio_dp.model.vfio_driver import (
    AUTO,
    VfioAlias,
    VfioChoice,
    choose,
    driver_guess,
    modalias_of,
    parse_vfio_aliases,
)

#: a modules.alias larger than this is not read (real ones are ~1.5 MB)
MAX_ALIASES_BYTES = 64 << 20
_lock = threading.Lock()
#: (root prefix, release) -> (the vfio_pci: aliases or None, why they are None)
_CACHE: dict[tuple[str, str], tuple[tuple[VfioAlias, ...] | None, str]] = {}


def kernel_release(root: Root) -> str:
    """``<root>/proc/sys/kernel/osrelease`` (``6.1.0-56-amd64``); ``""`` when unreadable."""
    return read_text(root.path("proc", "sys", "kernel", "osrelease")) or ""


def aliases_path(root: Root, release: str) -> str:
    return root.path("lib", "modules", safe_component(release or "unknown"), "modules.alias")


def _read_all(root: Root, path: str) -> bytes:
    fd = root.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_ALIASES_BYTES:
                raise OSError(f"larger than {MAX_ALIASES_BYTES} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def vfio_aliases(root: Root) -> tuple[tuple[VfioAlias, ...] | None, str]:
    """The ``vfio_pci:`` lines of the running kernel's ``modules.alias``, read once per
    process and root and kept; ``(None, why)`` when the file is missing or unreadable (said
    once, as a warning: every bind then falls back to vfio-pci)."""
    release = kernel_release(root)
    key = (root.prefix, release)
    with _lock:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    path = aliases_path(root, release)
    try:
        text = _read_all(root, path).decode("utf-8", "replace")
        found: tuple[tuple[VfioAlias, ...] | None, str] = (parse_vfio_aliases(text), "")
    except (OSError, PathEscapeError) as e:
        why = getattr(e, "strerror", None) or str(e)
        found = (None, f"{path} cannot be read ({why}): vfio-pci is used for every device")
        warning(found[1])
    with _lock:
        _CACHE[key] = found
    return found


def variant_modules(root: Root) -> frozenset[str]:
    """The modules named by a ``vfio_pci:`` line (``vfio_pci``, ``mlx5_vfio_pci``...)."""
    aliases, _ = vfio_aliases(root)
    return frozenset(a.module for a in aliases or ())


def driver_module(root: Root, driver: str) -> str | None:
    """The module of a loaded PCI driver: ``/sys/bus/pci/drivers/<driver>/module`` →
    ``../../../../module/<m>`` (None: built in without one, or not loaded)."""
    return root.link_name(
        root.path("sys", "bus", "pci", "drivers", safe_component(driver), "module")
    )


def registered_driver(root: Root, module: str) -> str | None:
    """The PCI driver a loaded module registers: ``/sys/module/<m>/drivers/pci:<driver>``."""
    try:
        dfd = root.open_dir("sys", "module", safe_component(module), "drivers")
    except (OSError, PathEscapeError):
        return None
    try:
        names = sorted(os.listdir(dfd))
    except OSError:
        return None
    finally:
        os.close(dfd)
    return next((n[4:] for n in names if n.startswith("pci:") and len(n) > 4), None)


def driver_loaded(root: Root, driver: str) -> bool:
    """``/sys/bus/pci/drivers/<driver>`` exists."""
    return os.path.isdir(root.path("sys", "bus", "pci", "drivers", safe_component(driver)))


def choose_for(
    root: Root,
    dev: PciDevice,
    wanted: str = AUTO,
    registered: dict[str, str | None] | None = None,
    known: tuple[tuple[VfioAlias, ...] | None, str] | None = None,
) -> VfioChoice:
    """The VFIO driver a bind of ``dev`` writes (see :func:`vfio_dp.model.vfio_driver.choose`),
    its driver name read from the module once loaded (``registered``: those names already
    read, by module, filled in as read: one listing per module, not per device; ``known``:
    :func:`vfio_aliases` already looked up, for a batch)."""
    aliases, unread = known if known is not None else vfio_aliases(root)
    loaded = frozenset({wanted}) if wanted != AUTO and driver_loaded(root, wanted) else frozenset()
    choice = choose(dev, modalias_of(dev), aliases, wanted, unread=unread, loaded=loaded)
    if choice.problem is None and wanted == AUTO:
        names = {} if registered is None else registered
        if choice.module not in names:
            names[choice.module] = registered_driver(root, choice.module)
        driver = names[choice.module]
        if driver is not None and driver != choice.driver:
            return VfioChoice(driver, choice.module, choice.why)
    return choice


def choices_for(
    root: Root,
    inv: Inventory,
    addresses: Iterable[PciAddress],
    wanted: str | Mapping[PciAddress, str] = AUTO,
) -> dict[PciAddress, VfioChoice]:
    """:func:`choose_for` each of ``addresses`` that could be bound (bridges and mdev parents
    left out); ``wanted`` for all, or per address (left out: ``auto``)."""
    out = {}
    registered: dict[str, str | None] = {}
    known = vfio_aliases(root)  # one osrelease read per batch, not per device
    # devices alike in everything the rule reads (the IDs of their modalias and what is
    # wanted) get the same choice: 1,024 VFs of one PF are one choice, not 1,024
    alike: dict[tuple[str, ...], VfioChoice] = {}
    for a in addresses:
        dev = inv.devices.get(a)
        if dev is None or dev.is_bridge or dev.is_host_bridge or dev.mdev_parent:
            continue
        want = wanted if isinstance(wanted, str) else wanted.get(a, AUTO)
        key = (dev.vendor, dev.device, dev.subsystem_vendor, dev.subsystem_device,
               dev.class_code, want)  # fmt: skip
        choice = alike.get(key)
        if choice is None:
            choice = choose_for(root, dev, want, registered, known)
            if choice.problem is None:  # a problem names its device: never shared
                alike[key] = choice
        out[a] = choice
    return out


def after_load(root: Root, choice: VfioChoice) -> VfioChoice:
    """``choice`` with the driver name its module registered now that it is loaded."""
    driver = registered_driver(root, choice.module)
    if driver is None or driver == choice.driver or choice.driver != driver_guess(choice.module):
        return choice
    return VfioChoice(driver, choice.module, choice.why, choice.problem)


def _listdir(root: Root, *parts: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(root.path(*parts)))
    except OSError:
        return frozenset()


def _has_cdev(root: Root, address: PciAddress) -> str | None:
    """``<bdf>/vfio-dev/vfioN`` (the lowest N), or None."""
    names = _listdir(root, "sys", "bus", "pci", "devices", str(address), "vfio-dev")
    found = [n for n in names if n.startswith("vfio") and n[4:].isascii() and n[4:].isdigit()]
    return min(found, key=lambda n: int(n[4:])) if found else None


def mark_on_vfio(root: Root, devices: dict[PciAddress, PciDevice]) -> None:
    """Set each device's ``vfio_registered`` and ``mdev_parent`` from the kernel's facts (see
    the module docstring), in place; devices whose facts did not change are kept as they
    are. One pass over the devices (a big host has thousands), then work only for the few
    bound to a driver that is neither vfio-pci nor DMA-safe in a group with a node."""
    parents = parent_names(root)
    explained: set[int] = set()  # groups a member on VFIO otherwise accounts for
    candidates: list[PciDevice] = []
    before: list[PciAddress] = []  # marked by an earlier scan: judged again
    for dev in devices.values():
        if dev.vfio_registered or dev.mdev_parent:
            before.append(dev.address)
        driver = dev.driver
        if driver is None or driver in DMA_SAFE_DRIVERS:
            continue
        if driver == VFIO_PCI:
            if dev.iommu_group is not None:
                explained.add(dev.iommu_group)
            continue
        candidates.append(dev)
    if not candidates and not before and not parents:
        return  # the usual host: nothing to mark (nor /dev/vfio listed: a DRA Prepare's
        # group on vfio-pci among thousands of nodes)
    nodes = _listdir(root, "dev", "vfio")
    cdevs = "devices" in nodes  # the kernel has VFIO cdev: /dev/vfio/devices/vfioN
    registered: dict[PciAddress, str | None] = {}  # address -> its cdev
    pending: dict[int, list[PciDevice]] = {}  # group with a node -> members to judge
    for dev in candidates:
        if parents and str(dev.address) in parents:
            continue
        cdev = dev.vfio_cdev or (_has_cdev(root, dev.address) if cdevs else None)
        group = dev.iommu_group
        if cdev is not None:
            registered[dev.address] = cdev
            if group is not None:
                explained.add(group)
        elif group is not None and (str(group) in nodes or f"noiommu-{group}" in nodes):
            pending.setdefault(group, []).append(dev)
    if pending:
        variants = variant_modules(root)
        modules: dict[str, str | None] = {}
        for group, bound in pending.items():
            for d in bound:
                assert d.driver is not None
                if d.driver not in modules:
                    modules[d.driver] = driver_module(root, d.driver)
                if modules[d.driver] in variants:
                    registered[d.address] = d.vfio_cdev
                    explained.add(group)
        for group, bound in pending.items():
            if group not in explained:  # the node is a vendor provider's
                for d in bound:
                    registered[d.address] = d.vfio_cdev
    _apply(devices, registered, parents, before)


def _apply(
    devices: dict[PciAddress, PciDevice],
    registered: dict[PciAddress, str | None],
    parents: frozenset[str],
    before: list[PciAddress],
) -> None:
    import dataclasses

    touched = {*registered, *before}
    for name in parents:
        try:
            touched.add(PciAddress.parse(name))
        except AddressError:
            continue
    for addr in touched:
        dev = devices.get(addr)
        if dev is None:
            continue
        on = addr in registered
        cdev = registered[addr] if on else dev.vfio_cdev
        parent = str(addr) in parents
        if (on, cdev, parent) != (dev.vfio_registered, dev.vfio_cdev, dev.mdev_parent):
            devices[addr] = dataclasses.replace(
                dev, vfio_registered=on, vfio_cdev=cdev, mdev_parent=parent
            )
