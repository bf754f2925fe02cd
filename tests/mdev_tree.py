"""Mediated devices on a :class:`tests.sysfs_tree.SysfsTree`, laid out as the kernel does
(``../shared/reference/vfio-kernel.md``; seen with the sample ``mtty`` in the guest rig)::

    sys/class/mdev_bus/<parent> -> ../../devices/<…>/<parent>
    <parent dir>/mdev_supported_types/<type>/{name,available_instances,device_api,description,devices/}
    <parent dir>/<uuid>/{mdev_type -> ../mdev_supported_types/<type>, iommu_group, driver}
    sys/bus/mdev/devices/<uuid> -> <parent dir>/<uuid>;  dev/vfio/<N>

Named for what it is: a fake tree. The tree itself does not react to writes;
:class:`MdevKernel` (a :class:`tests.kernel_sim.SimulatedKernel`) applies the kernel's
reaction to ``create`` and ``remove`` as ``drivers/vfio/mdev/mdev_sysfs.c`` does:

- ``<type>/create`` with a UUID: ``EEXIST`` when an instance with that UUID exists,
  ``EUSERS`` when the type's ``available_instances`` is 0, ``EINVAL`` for a value that is not
  a UUID; else the instance appears (``sys/bus/mdev/devices/<uuid>``, a new IOMMU group and
  its ``/dev/vfio/<N>``) and ``available_instances`` goes down by one.
- ``<uuid>/remove`` with ``1``: the instance goes (its group and node too) and
  ``available_instances`` goes up by one.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from tests.kernel_sim import SimulatedKernel, shown
from tests.sysfs_tree import SysfsTree
from vfio_dp.model.mdev import is_uuid


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


def _available(type_dir: Path, delta: int) -> int:
    """``available_instances`` moved by ``delta``, replaced whole: a sysfs attribute is read in
    one ``show()``, so a reader never sees it half written (``write_text`` truncates first: a
    reader in between read "" -- no slots -- and the DRA plugin's pool lost them)."""
    f = type_dir / "available_instances"
    now = int(f.read_text().strip())
    shown(f, f"{now + delta}\n")
    return now


def remove_instance(tree: SysfsTree, uuid: str) -> None:
    """Take the instance away as the kernel does (its group and node go with it)."""
    link = tree.sys("bus/mdev/devices", uuid)
    inst = Path(os.path.realpath(link))
    type_dir = Path(os.path.realpath(inst / "mdev_type"))
    group = Path(os.path.realpath(inst / "iommu_group"))
    link.unlink()
    (type_dir / "devices" / uuid).unlink(missing_ok=True)
    shutil.rmtree(inst)
    shutil.rmtree(group)
    (tree.root / "dev/vfio" / group.name).unlink(missing_ok=True)
    _available(type_dir, +1)


class MdevKernel(SimulatedKernel):
    """The kernel simulator plus the mdev core's ``create`` and ``remove`` (module
    docstring); every other write goes to :class:`SimulatedKernel`."""

    def _react(self, path: str, data: str) -> None:
        parts = self._rel(path)
        value = data.strip()
        if parts[:3] == ["sys", "class", "mdev_bus"] and parts[-1] == "create" and len(parts) == 7:
            parent, type_id = parts[3], parts[5]
            if not is_uuid(value):
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
            if os.path.lexists(self.tree.sys("bus/mdev/devices", value)):
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), path)
            type_dir = parent_dir(self.tree, parent) / "mdev_supported_types" / type_id
            if _available(type_dir, 0) <= 0:
                raise OSError(errno.EUSERS, os.strerror(errno.EUSERS), path)
            groups = self.tree.sys("kernel/iommu_groups")
            used = [int(g.name) for g in groups.iterdir()] if groups.is_dir() else []
            add_instance(self.tree, parent, type_id, value, group=max(used, default=0) + 1)
            _available(type_dir, -1)
            return
        if parts[:4] == ["sys", "bus", "mdev", "devices"] and parts[-1] == "remove":
            if value != "1":
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), path)
            if not os.path.lexists(self.tree.sys("bus/mdev/devices", parts[4])):
                raise OSError(errno.ENOENT, os.strerror(errno.ENOENT), path)
            remove_instance(self.tree, parts[4])
            return
        super()._react(path, data)
