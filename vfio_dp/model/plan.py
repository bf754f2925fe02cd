"""Pure planning for ``vfioctl bind``, ``unbind`` and ``check``: what each would do, and
every reason to refuse, decided from the scanned state.

Input is an :class:`~vfio_dp.model.device.Inventory` (with ``in_use`` filled where it
matters), the durable records of the drivers devices had before ``bind`` and, for operator
commands, the kernel's verdict on the groups' ``/dev/vfio/<N>`` nodes (open = a VM has it).
No I/O here: :class:`vfio_dp.host.Host` reads the state, calls these, and executes the plan.
Each rule is decided here once: whether a device exists, whether it is already on vfio-pci,
whether it may be passed through at all, and the messages that say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from vfio_dp.errors import DeviceNotFoundError, no_iommu_group
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import (
    GroupStatus,
    Inventory,
    PciDevice,
    dma_safe,
)


def group_in_use(number: int, fix: str) -> str:
    """The one message for a group whose ``/dev/vfio/<N>`` a process holds open."""
    return f"IOMMU group {number} is in use: /dev/vfio/{number} is held open (a VM has it); {fix}"


def not_passable(dev: PciDevice) -> str | None:
    """Why ``dev`` can never be given to a VM (a bridge), or None."""
    if dev.is_bridge:
        return (
            f"{dev.describe()} is a PCI bridge; bridges are never given to a VM and stay on "
            "pcieport or no driver — pass the devices behind it instead"
        )
    if dev.mdev_parent:
        return (
            f"{dev.describe()} is a mediated-device parent (it offers mdev_supported_types); "
            "the parent stays on its driver and is never given to a VM itself — create and "
            "pass its mediated devices instead"
        )
    if dev.is_host_bridge:
        return (
            f"{dev.describe()} is the host bridge (the CPU's side of the PCI tree); it cannot "
            "be passed through — pick another device"
        )
    return None


def mdev_parent_wanted(dev: PciDevice, mdev: Sequence[MdevEntry]) -> str | None:
    """Why ``dev`` may not go to a VFIO driver: the config's ``mdev:`` entry that wants
    instances of it (a parent keeps its vendor driver, which is what offers
    ``<root>/sys/class/mdev_bus/<bdf>/mdev_supported_types``), or None. The one rule for
    ``vfioctl bind --config``, ``bind: true`` and ``bind: onPrepare`` alike."""
    for entry in mdev:
        if entry.names(dev):
            return (
                f"{dev.describe()} is the parent of the config's mdev entry {{parent: "
                f"{entry.parent or 'a PCI selector'}, type: {entry.type_id}, path: {entry.path}}}: "
                "a parent stays on its vendor driver while instances of it are wanted, so it "
                "is never bound to a VFIO driver; remove that entry from the config's mdev: "
                "section (or pass its mediated devices instead)"
            )
    return None


def _device(inv: Inventory, addr: PciAddress, root_display: str) -> PciDevice:
    dev = inv.devices.get(addr)
    if dev is None:
        raise DeviceNotFoundError(str(addr), root_display)
    return dev


# -- bind ------------------------------------------------------------------------------
# Plans are NamedTuples (built ~7x faster than dataclasses when the module loads: `vfioctl
# unbind` is timed against driverctl in the guest, bench/compare_tools.py).
class BindPlan(NamedTuple):
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
    mdev_entries: Sequence[MdevEntry] = (),
) -> BindPlan:
    """Plan ``vfioctl bind [--group] [--force] ADDR...``.

    Refuses: unknown addresses (raises), bridges, devices without an IOMMU group, a bind
    that would leave a group half on host drivers (fix: ``--group``), a group with a bridge
    on a DMA-capable driver, a parent the config's ``mdev_entries`` want instances of
    (:func:`mdev_parent_wanted`, even with ``force``), and — unless ``force`` — devices the
    host is using and groups a process holds open.
    """
    refusals: list[str] = []
    forced: list[str] = []
    wanted: dict[PciAddress, None] = {}
    for addr in requested:
        dev = _device(inv, addr, root_display)
        why = not_passable(dev)
        if why is not None:
            refusals.append(why)
            continue
        if dev.iommu_group is None or dev.iommu_group not in inv.groups:
            refusals.append(no_iommu_group(dev.describe()))
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
                if not dma_safe(mdev):
                    refusals.append(
                        f"IOMMU group {grp.number} also holds bridge {mdev.describe()}, whose "
                        "driver does kernel DMA, so the group can never be viable; unbind the "
                        f"bridge from {mdev.driver} or move the card to a slot with its own group"
                    )
                continue
            if group:
                wanted[member] = None
            elif not dma_safe(mdev):
                refusals.append(
                    f"{mdev.describe()} shares IOMMU group {grp.number} with {addr}; binding "
                    f"{addr} alone leaves the group not viable. Bind it too: "
                    f"vfioctl bind --group {addr}"
                )
        if groups_in_use and groups_in_use.get(grp.number):
            msg = group_in_use(grp.number, "stop that VM first")
            (forced if force else refusals).append(msg)

    targets: list[PciAddress] = []
    already: list[PciAddress] = []
    for addr in wanted:
        dev = inv.devices[addr]
        if dev.on_vfio:
            already.append(addr)
            continue
        if mdev_entries and (why := mdev_parent_wanted(dev, mdev_entries)) is not None:
            refusals.append(why)
            continue
        for use in dev.in_use:
            msg = f"{dev.describe()} is in use by the host: {use}"
            if force:
                forced.append(msg)
            else:
                refusals.append(
                    f"{msg}; {use.fix}"
                    + ("" if use.critical else " (or pass --force to take it from the host)")
                )
        targets.append(addr)
    return BindPlan(tuple(targets), tuple(already), tuple(refusals), tuple(forced))


# -- unbind ----------------------------------------------------------------------------
if TYPE_CHECKING:  # a type only: no Protocol class is built when `vfioctl unbind` starts
    from typing import Protocol

    from vfio_dp.model.mdev_config import MdevEntry
    from vfio_dp.model.vfio_driver import VfioChoice

    class Recorded(Protocol):
        """What ``bind`` recorded about a device before its first write (the host's record)."""

        @property
        def driver(self) -> str | None: ...
        @property
        def driver_override(self) -> str | None: ...
        @property
        def vendor(self) -> str: ...
        @property
        def device(self) -> str: ...


class Restore(NamedTuple):
    """Give ``address`` back: put back ``override`` and bind ``driver`` (None: let the kernel
    probe)."""

    address: PciAddress
    driver: str | None
    override: str | None


class UnbindPlan(NamedTuple):
    restores: tuple[Restore, ...]  # in the order requested
    already: tuple[PciAddress, ...]  # off vfio-pci already: nothing to do
    forget: tuple[PciAddress, ...]  # records that are done with (the device is back)
    refusals: tuple[str, ...]  # non-empty: do nothing
    missing: tuple[PciAddress, ...] = ()  # with ``skip_missing``: records of absent devices


def plan_unbind(
    inv: Inventory,
    records: Mapping[PciAddress, Recorded],
    requested: Sequence[PciAddress],
    *,
    driver: str | None = None,
    force: bool = False,
    groups_in_use: Mapping[int, bool] | None = None,
    root_display: str = "/",
    skip_missing: bool = False,
) -> UnbindPlan:
    """Plan ``vfioctl unbind [--driver D] [--force] ADDR...`` (and ``--all``).

    Each device goes back to ``driver``, else the driver recorded before ``bind``, else the
    kernel probes (like ``driverctl unset-override``). A device already off vfio-pci with no
    override is done (its record is forgotten once it is back on the recorded driver).
    Refuses, before any write: a group a process holds open unless ``force`` (the unbind
    would block until the VM lets go), and a record that no longer describes the hardware at
    its address. Unknown addresses raise, or with ``skip_missing`` (``--all``: the records
    name the devices) are listed in ``missing`` while the rest go ahead.
    """
    refusals: list[str] = []
    missing: list[PciAddress] = []
    present: list[PciDevice] = []
    for addr in requested:
        if skip_missing and addr not in inv.devices:
            missing.append(addr)
        else:
            present.append(_device(inv, addr, root_display))
    busy = sorted(n for n, b in (groups_in_use or {}).items() if b)
    for n in busy:
        if not force and any(d.iommu_group == n for d in present):
            refusals.append(
                group_in_use(n, "stop the VM first (or --force, and the unbind waits for it)")
            )
    restores: list[Restore] = []
    already: list[PciAddress] = []
    forget: list[PciAddress] = []
    for dev in present:
        a = dev.address
        rec = records.get(a)
        if (
            not dev.on_vfio
            and dev.driver_override is None
            and (driver is None or dev.driver == driver)
        ):
            already.append(a)
            if rec is not None and dev.driver == rec.driver:
                forget.append(a)
            continue
        if rec is not None and (rec.vendor, rec.device) != (dev.vendor, dev.device):
            refusals.append(
                f"{a} is now {dev.ids} but the record says {rec.vendor}:{rec.device} "
                f"(hardware changed?); restore explicitly: vfioctl unbind --driver NAME {a}"
            )
            continue
        target = driver or (rec.driver if rec else None)
        override = None if driver else (rec.driver_override if rec else None)
        restores.append(Restore(a, target, override))
    return UnbindPlan(
        tuple(restores), tuple(already), tuple(forget), tuple(refusals), tuple(missing)
    )


# -- check -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class CheckReport:
    address: PciAddress
    ready: bool
    reasons: tuple[str, ...]  # each says the fix
    vfio_driver: str | None = None  # the VFIO driver it is on now
    #: the driver a bind would write and why (``mlx5_vfio_pci (modules.alias: alias ...)``)
    would_bind: str | None = None


def plan_check(
    inv: Inventory,
    addresses: Sequence[PciAddress],
    kernel: Mapping[int, GroupStatus],
    *,
    root_display: str = "/",
    choices: Mapping[PciAddress, VfioChoice] | None = None,
) -> list[CheckReport]:
    """``vfioctl check ADDR...``: is each device ready for passthrough now? Every reason,
    each with the fix that really applies (``bind`` is suggested only where binding is the
    fix, and for a device the host uses only with what ``--force`` takes from it).

    ``kernel`` is the verdict for each group whose ``/dev/vfio/<N>`` exists (a group left
    out has no node). ``choices``: the VFIO driver a bind would choose for each device (a
    choice that cannot be served is a reason).
    """
    out = []
    for a in addresses:
        dev = _device(inv, a, root_display)
        reasons: list[str] = []
        grp = inv.group_of(a)
        never = not_passable(dev)
        if never is not None:
            reasons.append(never)
        if grp is None:
            reasons.append(no_iommu_group(str(a)))
        for use in dev.in_use:
            reasons.append(f"the host is using {a}: {use}; fix: {use.fix}")
        if not dev.on_vfio and never is None:
            many = grp is not None and len(grp.endpoints(inv.devices)) > 1
            fix = f"vfioctl bind --group {a}" if many else f"vfioctl bind {a}"
            if any(u.critical for u in dev.in_use):
                reasons.append(
                    f"{dev.describe()} is not on vfio-pci and must stay the host's (see above)"
                )
            elif dev.in_use:
                reasons.append(
                    f"{dev.describe()} is not on vfio-pci; free it as above, then: {fix} "
                    f"(or {fix.replace('bind', 'bind --force', 1)} takes it from the host "
                    "while it is in use)"
                )
            else:
                reasons.append(f"{dev.describe()} is not on vfio-pci; fix: {fix}")
        if grp is not None:
            for p in grp.problems:
                if p.address != a:
                    reasons.append(p.reason)
            if dev.on_vfio:
                status = kernel.get(grp.number)
                if status is None:
                    reasons.append(
                        f"/dev/vfio/{grp.node} does not exist although {a} is on "
                        "vfio-pci; check `dmesg` and that udev/devtmpfs created it"
                    )
                elif status.in_use:
                    reasons.append(group_in_use(grp.number, "stop that VM or pick another device"))
                elif status.viable is False:
                    reasons.append(
                        f"the kernel reports IOMMU group {grp.number} not viable "
                        "(VFIO_GROUP_GET_STATUS); bind every member: "
                        f"vfioctl bind --group {a}"
                    )
        choice = (choices or {}).get(a)
        if choice is not None and choice.problem is not None and not dev.on_vfio:
            reasons.append(choice.problem)
        would = None if choice is None else f"{choice.driver} ({choice.why})"
        out.append(
            CheckReport(a, not reasons, tuple(dict.fromkeys(reasons)), dev.vfio_driver, would)
        )
    return out
