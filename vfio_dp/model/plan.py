"""Pure bind planning: which devices a ``bind`` would move, and every reason to refuse.

Input is an :class:`~vfio_dp.model.device.Inventory` (with ``in_use`` filled) and, for
operator commands, which groups the kernel reports open (EBUSY). No I/O here: the host
layer executes the plan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from vfio_dp.errors import DeviceNotFoundError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory, is_dma_safe_driver


@dataclass(frozen=True, slots=True)
class BindPlan:
    targets: tuple[PciAddress, ...]  # devices to move to vfio-pci, in order
    already: tuple[PciAddress, ...]  # requested or sibling devices already on a vfio driver
    refusals: tuple[str, ...]  # non-empty: do nothing
    forced: tuple[str, ...] = ()  # in-use reasons overridden by --force (for the log)


def plan_bind(
    inv: Inventory,
    requested: Sequence[PciAddress],
    *,
    group: bool = False,
    force: bool = False,
    groups_in_use: Mapping[int, bool] | None = None,
    root_display: str = "/",
) -> BindPlan:
    """Plan ``vfioctl bind [--group] [--force] ADDR...``.

    Refuses: unknown addresses (raises), bridges, devices without an IOMMU group, a bind
    that would leave a group half on host drivers (fix: ``--group``), a group with a bridge
    on a DMA-capable driver, and — unless ``force`` — devices the host is using and groups a
    process holds open.
    """
    refusals: list[str] = []
    forced: list[str] = []
    wanted: dict[PciAddress, None] = {}
    for addr in requested:
        dev = inv.devices.get(addr)
        if dev is None:
            raise DeviceNotFoundError(str(addr), root_display)
        if dev.is_bridge:
            refusals.append(
                f"{dev.describe()} is a PCI bridge; bridges are never given to a VM and stay on "
                "pcieport or no driver — pass the devices behind it instead"
            )
            continue
        if dev.iommu_group is None or dev.iommu_group not in inv.groups:
            refusals.append(
                f"{dev.describe()} has no IOMMU group: the IOMMU is off or absent; enable "
                "VT-d/AMD-Vi and boot with intel_iommu=on (or amd_iommu=on)"
            )
            continue
        wanted[addr] = None

    seen_groups: set[int] = set()
    for addr in list(wanted):
        dev = inv.devices[addr]
        assert dev.iommu_group is not None
        if dev.iommu_group in seen_groups:
            continue
        seen_groups.add(dev.iommu_group)
        grp = inv.groups[dev.iommu_group]
        for member in grp.devices:
            mdev = inv.devices.get(member)
            if mdev is None or member in wanted:
                continue
            if mdev.is_bridge:
                if not is_dma_safe_driver(mdev.driver):
                    refusals.append(
                        f"IOMMU group {grp.number} also holds bridge {mdev.describe()}, whose "
                        "driver does kernel DMA, so the group can never be viable; unbind the "
                        f"bridge from {mdev.driver} or move the card to a slot with its own group"
                    )
                continue
            if group:
                wanted[member] = None
            elif not is_dma_safe_driver(mdev.driver):
                refusals.append(
                    f"{mdev.describe()} shares IOMMU group {grp.number} with {addr}; binding "
                    f"{addr} alone leaves the group not viable. Bind it too: "
                    f"vfioctl bind --group {addr}"
                )
        if groups_in_use and groups_in_use.get(grp.number):
            msg = (
                f"IOMMU group {grp.number} is in use: /dev/vfio/{grp.number} is held open "
                "(a VM has it); stop that VM first"
            )
            (forced if force else refusals).append(msg)

    targets: list[PciAddress] = []
    already: list[PciAddress] = []
    for addr in wanted:
        dev = inv.devices[addr]
        if dev.on_vfio:
            already.append(addr)
            continue
        for why in dev.in_use:
            msg = f"{dev.describe()} is in use by the host: {why}"
            if force:
                forced.append(msg)
            else:
                refusals.append(msg + " (pass --force to take it anyway)")
        targets.append(addr)
    return BindPlan(tuple(targets), tuple(already), tuple(refusals), tuple(forced))
