"""The ``bind: true`` policy as pure functions of an inventory and a configuration.

Which devices a node process moves to their VFIO driver by itself: endpoints a selector of
ITS path takes with ``bind: true`` that are not on VFIO yet (:attr:`PciDevice.on_vfio`: a
device on a variant or a vendor VFIO provider is ready as it is, never rebound), grouped by IOMMU group (the
host layer binds a whole group at once, group siblings included). Bridges are never bound,
and nothing is ever unbound. ``bind: onPrepare`` devices are NOT bound here: they stay on
their host drivers until a DRA claim is prepared.

No I/O: :class:`vfio_dp.core.node.NodeCore` calls these and hands the result to
:meth:`vfio_dp.host.Host.bind`.
"""

from __future__ import annotations

from collections.abc import Iterable

from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vfio_dp.model.device import Inventory


def autobind_groups(
    inventory: Inventory, config: Config, candidates: Iterable[PciAddress], path: str
) -> list[list[PciAddress]]:
    """The ``bind: true`` endpoints among ``candidates``, one list per IOMMU group (devices
    without a group alone), in address order."""
    by_group: dict[object, list[PciAddress]] = {}
    for addr in sorted(set(candidates)):
        dev = inventory.devices.get(addr)
        if dev is None or dev.is_bridge or dev.on_vfio:
            continue
        sel = config.select(dev)
        if sel is None or not sel.bind or not config.selector_serves(sel, path):
            continue
        key = dev.iommu_group if dev.iommu_group is not None else addr
        by_group.setdefault(key, []).append(addr)
    return list(by_group.values())


def vfio_drivers_wanted(
    inventory: Inventory, config: Config, addresses: Iterable[PciAddress]
) -> dict[PciAddress, str]:
    """The ``vfioDriver`` of the selector taking each of ``addresses`` (``auto`` where
    none does): what the host layer chooses the VFIO driver with."""
    out = {}
    for a in addresses:
        dev = inventory.devices.get(a)
        sel = config.select(dev) if dev is not None else None
        out[a] = sel.vfio_driver if sel is not None else "auto"
    return out


def newly_bound(inventory: Inventory, old: Config, new: Config, path: str) -> set[PciAddress]:
    """Devices a config reload turns into ``bind: true`` ones of ``path`` (bound right away)."""
    out: set[PciAddress] = set()
    for addr, dev in inventory.devices.items():
        sel, before = new.select(dev), old.select(dev)
        if sel is None or not sel.bind or not new.selector_serves(sel, path):
            continue
        if before is None or not before.bind or not old.selector_serves(before, path):
            out.add(addr)
    return out
