"""Mediated devices as typed values, pure: parents, their types, and instances (no I/O).

A parent (a PCI function on its vendor driver, or a virtual device such as the kernel sample
``mtty``) offers types; an instance of a type is a passthrough unit of its own (its own IOMMU
group and ``/dev/vfio/<N>``), never the parent (design.md, "What a passthrough unit is").
:mod:`vfio_dp.host.mdev` reads them from sysfs::

    /sys/class/mdev_bus/<parent>  -> …/<parent's device dir>
    …/mdev_supported_types/<type-id>/{name,description,available_instances,device_api,devices/}
    /sys/bus/mdev/devices/<uuid>  -> …/<parent's device dir>/<uuid>
    …/<uuid>/{mdev_type -> …/<type-id>, iommu_group -> …/iommu_groups/<N>, driver}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vfio_dp.model.address import PciAddress

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_uuid(text: str) -> bool:
    """An instance's name as the kernel accepts it in ``create``: a lowercase UUID."""
    return bool(_UUID.fullmatch(text))


@dataclass(frozen=True, slots=True)
class MdevType:
    """One ``mdev_supported_types/<type_id>`` of a parent. ``name`` is the vendor's text
    (``GRID T4-1Q``; may hold spaces or slashes); ``available`` is ``available_instances``
    (None: unreadable); counts move as instances of any type of the parent are made."""

    parent: str
    type_id: str
    name: str | None
    available: int | None
    device_api: str | None
    description: str | None


@dataclass(frozen=True, slots=True)
class MdevInstance:
    """One ``/sys/bus/mdev/devices/<uuid>``. ``type_id`` None: its ``mdev_type`` link is
    missing or names a type its parent does not list."""

    uuid: str
    parent: str
    type_id: str | None
    iommu_group: int | None
    driver: str | None
    vfio_node: str | None  # /dev/vfio/<N> when the node exists


@dataclass(frozen=True, slots=True)
class MdevParent:
    """A device under ``/sys/class/mdev_bus``: ``address`` when it is a PCI function (its
    ``name`` is then the address), None for a virtual parent such as ``mtty``."""

    name: str
    address: PciAddress | None
    driver: str | None
    types: tuple[MdevType, ...]
    instances: tuple[MdevInstance, ...]

    def type(self, type_id: str) -> MdevType | None:
        return next((t for t in self.types if t.type_id == type_id), None)


@dataclass(frozen=True, slots=True)
class MdevInventory:
    """Every mdev parent of a host, by name, and the problems met reading them (a parent
    that vanished mid-read, an instance with no parent): reported, never fatal."""

    parents: tuple[MdevParent, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def instances(self) -> tuple[MdevInstance, ...]:
        return tuple(i for p in self.parents for i in p.instances)

    def parent_addresses(self) -> frozenset[PciAddress]:
        """The PCI functions that are mdev parents: never units themselves."""
        return frozenset(p.address for p in self.parents if p.address is not None)


#: who made an instance, in its record (``<root>/var/lib/vfio_dp/mdev/<uuid>.json``):
#: ``operator`` (``vfioctl mdev create``), a front-end (``device-plugin``, ``dra-plugin``:
#: the config's ``mdev:`` section), or ``claim:<uid>`` (made at a DRA claim's Prepare)
CREATE = "create"
REMOVE = "remove"


@dataclass(frozen=True, slots=True)
class MdevRecord:
    """An instance vfio_dp made and answers for: re-made with this UUID while the record is
    kept (instances vanish at reboot), removed only by who ``by`` names or with ``--force``."""

    uuid: str
    parent: str
    type_id: str
    by: str


@dataclass(slots=True)
class MdevOp:
    """The journal of one create or remove, written before its sysfs write: ``previous``
    is the record before it (kept by an undo), ``record`` the one a create writes."""

    action: str  # CREATE | REMOVE
    uuid: str
    parent: str
    type_id: str
    runner: str
    pid: int
    started: float
    previous: MdevRecord | None = None
    record: MdevRecord | None = None

    def describe(self) -> str:
        return (
            f"mdev {self.action} of {self.uuid} ({self.type_id} on {self.parent}) by "
            f"{self.runner} (pid {self.pid})"
        )
