"""Mediated devices on a :class:`tests.sysfs_tree.SysfsTree`, laid out as the kernel does
(``../shared/reference/vfio-kernel.md``; seen with the sample ``mtty`` in the guest rig)::

    sys/class/mdev_bus/<parent> -> ../../devices/<…>/<parent>
    <parent dir>/mdev_supported_types/<type>/{name,available_instances,device_api,description,devices/}
    <parent dir>/<uuid>/{mdev_type -> ../mdev_supported_types/<type>, iommu_group, driver}
    sys/bus/mdev/devices/<uuid> -> <parent dir>/<uuid>;  dev/vfio/<N>

Named for what it is: a fake tree; it does not react to ``create`` or ``remove`` writes.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.sysfs_tree import SysfsTree


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def parent_dir(tree: SysfsTree, parent: str) -> Path:
    """A PCI parent's device dir, or ``sys/devices/virtual/<p>/<p>`` for a virtual one."""
    if parent in tree.devs:
        return tree.dev_dir(parent)
    return tree.sys("devices/virtual", parent, parent)


def add_parent(
    tree: SysfsTree,
    parent: str,
    types: dict[str, tuple[str, int | str, str]],
    *,
    driver: str | None = None,
) -> Path:
    """``types``: type id -> (name, available_instances, device_api)."""
    d = parent_dir(tree, parent)
    d.mkdir(parents=True, exist_ok=True)
    if driver and parent not in tree.devs:
        drv = tree.sys("bus/platform/drivers", driver)  # a virtual parent's driver dir
        drv.mkdir(parents=True, exist_ok=True)
        _link(d / "driver", drv)
    _link(tree.sys("class/mdev_bus", parent), d)
    for type_id, (name, available, api) in types.items():
        t = d / "mdev_supported_types" / type_id
        (t / "devices").mkdir(parents=True)
        (t / "name").write_text(f"{name}\n")
        (t / "available_instances").write_text(f"{available}\n")
        (t / "device_api").write_text(f"{api}\n")
        (t / "description").write_text(f"{name}, made by tests/mdev_tree.py\n")
        (t / "create").write_text("")
    return d


def add_instance(tree: SysfsTree, parent: str, type_id: str, uuid: str, group: int) -> Path:
    d = parent_dir(tree, parent)
    inst = d / uuid
    inst.mkdir()
    (inst / "remove").write_text("")
    _link(inst / "mdev_type", d / "mdev_supported_types" / type_id)
    g = tree.sys("kernel/iommu_groups", str(group))
    (g / "devices").mkdir(parents=True, exist_ok=True)
    _link(g / "devices" / uuid, inst)
    _link(inst / "iommu_group", g)
    drv = tree.sys("bus/mdev/drivers/vfio_mdev")
    drv.mkdir(parents=True, exist_ok=True)
    _link(inst / "driver", drv)
    _link(tree.sys("bus/mdev/devices", uuid), inst)
    types_dir = d / "mdev_supported_types" / type_id / "devices"
    if types_dir.is_dir():
        _link(types_dir / uuid, inst)
    (tree.root / "dev/vfio" / str(group)).write_text("")
    return inst
