"""From a claim's allocation results to the IOMMU groups it gets, and the checks on them: pure.

Each result's ``device`` (``pci-0000-3b-00-0``) names one IOMMU group on this node
(:func:`vfio_dp.model.serving.dra_units`); :func:`resolve` pairs them (:class:`Chosen`),
:func:`to_bind` says which groups Prepare must bind (``bind: onPrepare``), :func:`verify`
checks what is handed over once bound, :func:`device_records` is what the checkpoint keeps.

"Is this group on VFIO?" is decided in one place, :func:`off_vfio`: every endpoint of the
group on a VFIO driver -- vfio-pci, a variant, or a vendor VFIO provider
(:attr:`vfio_dp.model.device.PciDevice.on_vfio`, the host's one per-device answer) -- as the
kernel requires before ``/dev/vfio/<N>`` can be used. A group already on a variant or a
provider is handed over as it is, never rebound.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from vfio_dp.dra.claimpath.checkpoint import DeviceRecord
from vfio_dp.dra.claimpath.claims import AllocationResult
from vfio_dp.dra.slices import Device
from vfio_dp.errors import ClaimError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory
from vfio_dp.model.naming import dra_entry
from vfio_dp.model.personality import Personality
from vfio_dp.model.serving import DraUnit
from vfio_dp.model.vfio_driver import AUTO, VfioChoice


@dataclass(frozen=True, slots=True)
class Chosen:
    """One allocation result of ours and the IOMMU group it stands for."""

    result: AllocationResult
    unit: DraUnit
    #: the entry the result names: the VFIO one (``pci-0000-3b-00-0``) or the container one
    #: (``pci-0000-3b-00-0-native``: the group on its native driver, its own device nodes)
    personality: Personality = Personality.VM

    @property
    def gets_group(self) -> bool:
        """``adminAccess`` results never bind and never get the VFIO group."""
        return not self.result.admin_access and self.personality == Personality.VM

    @property
    def gets_nodes(self) -> bool:
        """A container entry (not ``adminAccess``): the group goes on its native driver."""
        return not self.result.admin_access and self.personality == Personality.CONTAINER


def off_vfio(unit: DraUnit, inv: Inventory) -> list[PciAddress]:
    """The endpoints of ``unit``'s group not on a VFIO driver (gone ones included;
    :attr:`~vfio_dp.model.device.PciDevice.on_vfio`); empty: the group is ready to hand
    over."""
    return [a for a in unit.endpoints if (d := inv.devices.get(a)) is None or not d.on_vfio]


def resolve(
    who: str,
    results: Sequence[AllocationResult],
    units: Mapping[str, DraUnit],
    inv: Inventory,
    bound_by_claim: Callable[[DraUnit], bool],
) -> tuple[Chosen, ...]:
    """Pair each result with its group, or :class:`ClaimError`: no such group here, or a
    group not published (its reasons) -- unless this claim already bound it and it is still
    fully on vfio-pci (a repeat Prepare; binding it made it look "in use" to the slices)."""
    chosen: list[Chosen] = []
    for r in results:
        name, native = dra_entry(r.device)
        unit = units.get(name)
        if unit is None:
            raise ClaimError(
                who,
                "no such device on this node (no IOMMU group of that name is selected "
                "for path: dra); the ResourceSlices may be stale -- they are republished "
                "within one resync",
                r.device,
            )
        personality = Personality.CONTAINER if native else Personality.VM
        if personality not in unit.personalities:
            offered = ", ".join(p.value for p in unit.personalities)
            raise ClaimError(
                who,
                f"IOMMU group {unit.group} is not offered as {personality.value} here (its "
                f"selector's personalities: [{offered}]); the ResourceSlices may be stale",
                r.device,
            )
        repeat = not native and bound_by_claim(unit) and not off_vfio(unit, inv)
        if not r.admin_access and not unit.published and not repeat:
            raise ClaimError(who, "; ".join(unit.reasons), r.device)
        chosen.append(Chosen(r, unit, personality))
    return tuple(chosen)


def unservable(
    units: Sequence[DraUnit],
    inv: Inventory,
    choices: Callable[[list[PciAddress], str], Mapping[PciAddress, VfioChoice]],
) -> list[DraUnit]:
    """``units`` with each published ``bind: onPrepare`` group whose selectors name a
    ``vfioDriver`` this node cannot serve (``choices(endpoints, wanted)``: the host's
    choice for the endpoints not on VFIO yet) withdrawn, its reason the host's; the rest
    unchanged. ``auto`` always serves (vfio-pci at worst): only a named driver is asked."""
    out = []
    for u in units:
        if u.published and u.on_prepare and u.vfio_driver != AUTO:
            off = off_vfio(u, inv)
            problems = [c.problem for c in choices(off, u.vfio_driver).values() if c.problem]
            if problems:
                u = replace(u, reasons=tuple(problems))
        out.append(u)
    return out


def to_bind(chosen: Sequence[Chosen], inv: Inventory) -> list[PciAddress]:
    """The groups (by first endpoint) Prepare binds: ``bind: onPrepare``, not on VFIO."""
    return [
        c.unit.primary
        for c in chosen
        if c.gets_group and c.unit.on_prepare and off_vfio(c.unit, inv)
    ]


def handed_over(chosen: Sequence[Chosen]) -> list[PciAddress]:
    """Every endpoint of every group the claim gets on VFIO."""
    return [a for c in chosen if c.gets_group for a in c.unit.endpoints]


def verify(
    who: str,
    chosen: Sequence[Chosen],
    inv: Inventory,
    published: Mapping[str, Device] | None,
) -> None:
    """Each handed-over group is viable, fully on vfio-pci, and still has the number it was
    published with (``published``: the slice devices by name; None: not compared)."""
    for c in chosen:
        r, unit = c.result, c.unit
        if not c.gets_group:  # adminAccess, or a container entry (:mod:`.native`)
            continue
        group = inv.groups.get(unit.group)
        if group is None or unit.primary not in group.devices:
            raise ClaimError(who, f"IOMMU group {unit.group} is gone from sysfs", r.device)
        dev = inv.devices.get(unit.primary)
        if dev is None or dev.iommu_group != unit.group:
            raise ClaimError(
                who, f"{unit.primary} is no longer in IOMMU group {unit.group}", r.device
            )
        if not group.viable:
            reasons = "; ".join(p.reason for p in group.problems)
            raise ClaimError(who, f"IOMMU group {unit.group} is not viable: {reasons}", r.device)
        off = off_vfio(unit, inv)
        if off:
            raise ClaimError(
                who,
                f"{', '.join(map(str, off))} of IOMMU group {unit.group} not on vfio-pci; select "
                "the group with bind: onPrepare (or bind: true), or vfioctl bind --group "
                f"{unit.primary}",
                r.device,
            )
        if published is not None:
            seen = published.get(r.device)
            number = seen.iommu_group if seen is not None else None
            if number is None:
                raise ClaimError(who, "the device is not in the published slices", r.device)
            if number != unit.group:
                raise ClaimError(
                    who,
                    f"published as IOMMU group {number} but it is group {unit.group} now "
                    "(renumbered, e.g. after a reboot); the slice is being republished: "
                    "delete the pod so that the claim is allocated again",
                    r.device,
                )


def device_records(chosen: Sequence[Chosen], inv: Inventory) -> tuple[DeviceRecord, ...]:
    """What the checkpoint keeps of each device (its CDI IDs are added once written)."""
    return tuple(
        DeviceRecord(
            requests=(c.result.request,),
            pool=c.result.pool,
            device=c.result.device,
            # a container entry holds no VFIO group: health judges only those
            iommu_group=c.unit.group if c.gets_group else None,
            addresses=tuple(str(a) for a in c.unit.endpoints),
            ids=tuple(inv.devices[a].ids for a in c.unit.endpoints),
            admin_access=c.result.admin_access,
        )
        for c in chosen
    )
