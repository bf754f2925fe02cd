"""Typed facts about PCI devices and IOMMU groups, and the kernel's group-viability rule.

These are plain values read by :mod:`vfio_dp.host` from sysfs, e.g. for one device::

    /sys/bus/pci/devices/0000:65:00.0/{vendor,device,class,numa_node,driver->,iommu_group->}

Viability (kernels >= 5.19, the rule VFIO_GROUP_GET_STATUS applies): every member of the
IOMMU group must be driverless or bound to a driver that does no kernel DMA — a vfio
driver, ``pci-stub`` or ``pcieport``. One member on any other driver makes the whole group
unusable for a VM ("group N is not viable").

"On VFIO" is decided per DEVICE, never per driver name (a vendor driver such as ``nvidia``
drives VFIO-registered VFs and host GPUs alike): :attr:`PciDevice.on_vfio` is true on
``vfio-pci``, or when the host layer found the device registered with VFIO by another
driver (``vfio_registered``, set by :func:`vfio_dp.host.vfio_drivers.mark_on_vfio` from the
kernel's facts: a variant driver named by a ``vfio_pci:`` line of ``modules.alias``,
``<bdf>/vfio-dev/``, or the group's ``/dev/vfio/<N>``). An mdev parent
(``/sys/class/mdev_bus/<bdf>``) is never on VFIO and never a unit itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vfio_dp.model.address import PciAddress

VFIO_PCI = "vfio-pci"
#: Drivers that declare they do no kernel DMA, besides the vfio drivers themselves.
DMA_SAFE_DRIVERS = frozenset({"pci-stub", "pcieport"})
#: PCI class of a PCI-to-PCI bridge (``class`` = 0x0604xx).
BRIDGE_CLASS_PREFIX = 0x0604
#: PCI class of a host bridge (``class`` = 0x0600xx): the CPU's side of the PCI tree.
HOST_BRIDGE_CLASS_PREFIX = 0x0600


def dma_safe(dev: PciDevice) -> bool:
    """True when this member does not make its group non-viable: driverless, on VFIO
    (:attr:`PciDevice.on_vfio`), or on a driver that declares it does no kernel DMA."""
    return dev.driver is None or dev.on_vfio or dev.driver in DMA_SAFE_DRIVERS


class HostUse(str):
    """One use the host makes of a device (found by :mod:`vfio_dp.host.usage`): the string
    itself is the use, e.g. ``network interface eth0 is up``, as listed and joined everywhere;
    ``fix`` says what frees it (``bring it down first: ip link set eth0 down``).

    ``critical``: the host cannot do without it (its root disk, its only interface that is up,
    its boot GPU): no message ever suggests ``--force`` for it."""

    fix: str
    critical: bool

    def __new__(cls, what: str, fix: str, critical: bool = False) -> HostUse:
        self = super().__new__(cls, what)
        self.fix = fix
        self.critical = critical
        return self

    def __reduce__(self) -> tuple[type[HostUse], tuple[str, str, bool]]:
        return (HostUse, (str(self), self.fix, self.critical))

    def __repr__(self) -> str:
        return f"HostUse({str(self)!r}, fix={self.fix!r}, critical={self.critical!r})"


@dataclass(frozen=True, slots=True)
class GroupStatus:
    """The kernel's verdict on ``/dev/vfio/<N>`` (``VFIO_GROUP_GET_STATUS``, or EBUSY)."""

    viable: bool | None  # None: unknown (no node, or busy)
    in_use: bool | None  # True: EBUSY; None: no node


@dataclass(frozen=True, slots=True)
class PciDevice:
    """One PCI function as sysfs shows it (``/sys/bus/pci/devices/<address>/``)."""

    address: PciAddress
    vendor: str  # 4 lowercase hex, no 0x
    device: str
    class_code: str  # 6 lowercase hex
    subsystem_vendor: str = "0000"
    subsystem_device: str = "0000"
    driver: str | None = None
    driver_override: str | None = None
    iommu_group: int | None = None
    numa_node: int | None = None
    physfn: PciAddress | None = None  # set on SR-IOV VFs
    sriov_numvfs: int | None = None  # set on SR-IOV PFs
    boot_vga: bool = False
    vfio_cdev: str | None = None  # e.g. "vfio3" from <bdf>/vfio-dev/vfio3
    #: registered with VFIO by a driver other than vfio-pci (a variant, a vendor provider):
    #: set by the host layer from the kernel's facts (see the module docstring)
    vfio_registered: bool = False
    mdev_parent: bool = False  # listed in /sys/class/mdev_bus: its mdevs are the units
    in_use: tuple[HostUse, ...] = ()  # what the host uses it for (filled by host.usage)
    original_driver: str | None = None  # recorded before vfioctl bound it, if any

    @property
    def ids(self) -> str:
        """``vendor:device`` as in lspci -n, e.g. ``10de:1eb8``."""
        return f"{self.vendor}:{self.device}"

    @property
    def is_bridge(self) -> bool:
        return int(self.class_code[:4], 16) == BRIDGE_CLASS_PREFIX

    @property
    def is_host_bridge(self) -> bool:
        return int(self.class_code[:4], 16) == HOST_BRIDGE_CLASS_PREFIX

    @property
    def on_vfio(self) -> bool:
        """Is this device on a VFIO driver (vfio-pci, a variant, a vendor VFIO provider)?
        The one answer every rule uses (viability, health, publication, list, check)."""
        return not self.mdev_parent and (self.driver == VFIO_PCI or self.vfio_registered)

    @property
    def vfio_driver(self) -> str | None:
        """The VFIO driver the device is on (``vfio-pci``, ``mlx5_vfio_pci``, ``nvidia``), or
        None when it is not on VFIO."""
        return self.driver if self.on_vfio else None

    def describe(self) -> str:
        """``0000:3b:00.1 (10de:10f8, snd_hda_intel)`` — the form used in every message."""
        return f"{self.address} ({self.ids}, {self.driver or 'no driver'})"


@dataclass(frozen=True, slots=True)
class GroupProblem:
    address: PciAddress
    reason: str


@dataclass(frozen=True, slots=True)
class IommuGroup:
    """``/sys/kernel/iommu_groups/<number>/devices/*`` with the verdict on it."""

    number: int
    devices: tuple[PciAddress, ...]
    viable: bool
    problems: tuple[GroupProblem, ...] = ()
    noiommu: bool = False  # ``name`` file says vfio-noiommu

    @property
    def node(self) -> str:
        """``5`` or ``noiommu-5``: the name of the group's node under ``/dev/vfio``."""
        return f"noiommu-{self.number}" if self.noiommu else str(self.number)

    def endpoints(self, devices: dict[PciAddress, PciDevice]) -> list[PciAddress]:
        """Members that are not bridges (the ones a VM can be given)."""
        return [a for a in self.devices if a in devices and not devices[a].is_bridge]


@dataclass(frozen=True, slots=True)
class Inventory:
    """Everything discovered on a host at one moment: devices by address, groups by number."""

    devices: dict[PciAddress, PciDevice] = field(default_factory=dict)
    groups: dict[int, IommuGroup] = field(default_factory=dict)
    iommu_present: bool = True

    def group_of(self, address: PciAddress) -> IommuGroup | None:
        dev = self.devices.get(address)
        if dev is None or dev.iommu_group is None:
            return None
        return self.groups.get(dev.iommu_group)


def analyse_group(number: int, members: list[PciDevice], *, noiommu: bool = False) -> IommuGroup:
    """Apply the kernel's viability rule to one group's members.

    Bridges on ``pcieport`` or without a driver are members but not problems; a bridge on
    any other driver (e.g. ``shpchp``) is a problem like any endpoint.
    """
    problems: list[GroupProblem] = []
    for dev in sorted(members, key=lambda d: d.address):
        if dma_safe(dev):
            continue
        if dev.in_use and not dev.is_bridge:  # the host's, not a "bind the group" case
            problems.append(
                GroupProblem(
                    dev.address,
                    f"device {dev.describe()} is used by the host ({'; '.join(dev.in_use)}); "
                    + (
                        "this group cannot be passed through: "
                        + next(u.fix for u in dev.in_use if u.critical)
                        if any(u.critical for u in dev.in_use)
                        else f"free it first ({'; '.join(u.fix for u in dev.in_use)}), then "
                        f"vfioctl bind --group {dev.address}"
                    ),
                )
            )
            continue
        if dev.is_bridge:
            fix = (
                f"unbind the bridge from {dev.driver} (bridges stay on pcieport or no driver), "
                "or move the card to a slot with its own group"
            )
            kind = "bridge"
        else:
            fix = f"bind the group to vfio-pci: vfioctl bind --group {dev.address}"
            kind = "device"
        problems.append(
            GroupProblem(
                dev.address,
                f"{kind} {dev.describe()} is on host driver {dev.driver}, which does kernel "
                f"DMA; {fix}",
            )
        )
    return IommuGroup(
        number=number,
        devices=tuple(sorted(d.address for d in members)),
        viable=not problems,
        problems=tuple(problems),
        noiommu=noiommu,
    )


def primary_first(addresses: list[PciAddress]) -> list[PciAddress]:
    """Stable order for handing addresses to a pod: function 0 of each slot first, then the
    rest, each part in address order (``0000:65:00.0, 0000:66:00.0, 0000:65:00.1``)."""
    return sorted(addresses, key=lambda a: (a.function != 0, a))
