"""Mediated devices read from sysfs, through the root (read-only; no instance is made here).

::

    <root>/sys/class/mdev_bus/<parent>                      the parents (links to device dirs)
      …/driver                                              the parent's (vendor) driver
      …/mdev_supported_types/<type-id>/name                 "Dual port serial", "GRID T4-1Q"
      …/mdev_supported_types/<type-id>/available_instances  "11"
      …/mdev_supported_types/<type-id>/device_api           "vfio-pci"
      …/mdev_supported_types/<type-id>/description          free text
    <root>/sys/bus/mdev/devices/<uuid>                      the instances (links into a parent)
      …/mdev_type -> ../mdev_supported_types/<type-id>
      …/iommu_group -> …/kernel/iommu_groups/<N>
      …/driver -> …/bus/mdev/drivers/vfio_mdev
    <root>/dev/vfio/<N>                                     the instance's group node

A host without the ``mdev`` module has neither directory: an empty inventory, at the cost of
two failed ``open`` calls (``vfioctl list`` on a host with no mdevs pays nothing more). A parent
or instance that vanishes mid-read (a driver unloaded, an instance removed) is left out and
named in :attr:`MdevInventory.problems`.
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import replace
from typing import TYPE_CHECKING

from vfio_dp.errors import AddressError, PathEscapeError
from vfio_dp.host.root import Root, read_text
from vfio_dp.model.address import PciAddress

if TYPE_CHECKING:  # the values are made only by the readers below: the scan's parent marking
    # (:func:`parent_names`, every `vfioctl list`) does not load the mdev model
    from vfio_dp.model.mdev import MdevInstance, MdevInventory, MdevParent, MdevType

MDEV_BUS = ("sys", "class", "mdev_bus")
MDEV_DEVICES = ("sys", "bus", "mdev", "devices")
_MAX_ENTRIES = 4096  # types or instances read per directory: a planted huge dir is cut short


def _listdir(root: Root, *parts: str) -> list[str]:
    try:
        fd = root.open_dir(*parts)
    except (OSError, PathEscapeError):
        return []
    try:
        return sorted(os.listdir(fd))[:_MAX_ENTRIES]
    finally:
        os.close(fd)


def _link(root: Root, *parts: str) -> str | None:
    """The text of the link ``parts[-1]`` in its directory, opened inside the root."""
    try:
        fd = root.open_dir(*parts[:-1])
    except (OSError, PathEscapeError):
        return None
    try:
        return os.readlink(parts[-1], dir_fd=fd)
    except OSError:
        return None
    finally:
        os.close(fd)


def _exists(root: Root, *parts: str) -> bool:
    try:
        fd = root.open_dir(*parts[:-1])
    except (OSError, PathEscapeError):
        return False
    try:
        os.stat(parts[-1], dir_fd=fd, follow_symlinks=False)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _int(text: str | None) -> int | None:
    if text is None or not text.isdigit() or len(text) > 9:
        return None
    return int(text)


def _address(name: str) -> PciAddress | None:
    try:
        return PciAddress.parse(name)
    except AddressError:
        return None


def _read_type(root: Root, parent: str, type_id: str) -> MdevType:
    from vfio_dp.model.mdev import MdevType

    base = (*MDEV_BUS, parent, "mdev_supported_types", type_id)

    def attr(name: str) -> str | None:
        try:
            fd = root.open_dir(*base)
        except (OSError, PathEscapeError):
            return None
        try:
            return read_text(name, dir_fd=fd, size=4096)
        finally:
            os.close(fd)

    return MdevType(
        parent=parent,
        type_id=type_id,
        name=attr("name"),
        available=_int(attr("available_instances")),
        device_api=attr("device_api"),
        description=attr("description"),
    )


def _read_instance(root: Root, uuid: str) -> tuple[str | None, MdevInstance | None]:
    """(parent name, instance); (None, None) when it vanished or is not one."""
    from vfio_dp.model.mdev import MdevInstance

    target = _link(root, *MDEV_DEVICES, uuid)
    if target is None or posixpath.basename(target) != uuid:
        return None, None
    parent = posixpath.basename(posixpath.dirname(target))
    type_link = _link(root, *MDEV_DEVICES, uuid, "mdev_type")
    group_link = _link(root, *MDEV_DEVICES, uuid, "iommu_group")
    driver_link = _link(root, *MDEV_DEVICES, uuid, "driver")
    group = _int(posixpath.basename(group_link)) if group_link else None
    node = None
    if group is not None and _exists(root, "dev", "vfio", str(group)):
        node = f"/dev/vfio/{group}"
    return parent, MdevInstance(
        uuid=uuid,
        parent=parent,
        type_id=posixpath.basename(type_link) if type_link else None,
        iommu_group=group,
        driver=posixpath.basename(driver_link) if driver_link else None,
        vfio_node=node,
    )


def parent_names(root: Root) -> frozenset[str]:
    """The names under ``<root>/sys/class/mdev_bus`` -- the mdev parents (a PCI parent by its
    address, ``0000:00:02.0``), read inside the root; empty when the directory is absent (no
    mdev-capable driver loaded). The one reader of the bus: :func:`read_mdevs` and the
    parent marking of :func:`vfio_dp.host.vfio_drivers.mark_on_vfio` both use it."""
    return frozenset(_listdir(root, *MDEV_BUS))


def read_mdevs(root: Root) -> MdevInventory:
    """Every parent under ``<root>/sys/class/mdev_bus`` with its types and instances."""
    from vfio_dp.model.mdev import MdevInventory, MdevParent, is_uuid

    problems: list[str] = []
    by_parent: dict[str, list[MdevInstance]] = {}
    for uuid in _listdir(root, *MDEV_DEVICES):
        if not is_uuid(uuid):
            problems.append(f"/{'/'.join(MDEV_DEVICES)}/{uuid[:64]!r}: not an mdev UUID; left out")
            continue
        parent, inst = _read_instance(root, uuid)
        if inst is None or parent is None:
            problems.append(f"mdev {uuid}: gone while read (removed); left out")
            continue
        by_parent.setdefault(parent, []).append(inst)
    parents: list[MdevParent] = []
    for name in sorted(parent_names(root)):
        if _link(root, *MDEV_BUS, name) is None and not _exists(root, *MDEV_BUS, name):
            problems.append(f"mdev parent {name}: gone while read; left out")
            continue
        try:
            root.check_inside(root.path(*MDEV_BUS, name))
        except PathEscapeError as e:
            problems.append(f"mdev parent {name}: {e}; left out")
            continue
        type_ids = _listdir(root, *MDEV_BUS, name, "mdev_supported_types")
        types = tuple(_read_type(root, name, t) for t in type_ids)
        known = {t.type_id for t in types}
        instances = by_parent.pop(name, [])
        for inst in instances:
            if inst.type_id not in known:
                problems.append(
                    f"mdev {inst.uuid} on {name}: its type {inst.type_id or '(no mdev_type link)'} "
                    "is not one the parent lists; shown without a type"
                )
        instances = [
            inst if inst.type_id in known else replace(inst, type_id=None) for inst in instances
        ]
        driver = _link(root, *MDEV_BUS, name, "driver")
        parents.append(
            MdevParent(
                name=name,
                address=_address(name),
                driver=posixpath.basename(driver) if driver else None,
                types=types,
                instances=tuple(instances),
            )
        )
    for parent, orphans in sorted(by_parent.items()):
        problems.append(
            f"mdev {', '.join(i.uuid for i in orphans)}: parent {parent} is not under "
            f"/{'/'.join(MDEV_BUS)} (it went away); left out"
        )
    return MdevInventory(tuple(parents), tuple(problems))
