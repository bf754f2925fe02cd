"""Binds that survive a reboot: the record of them and the udev rule that re-applies them.

``vfioctl bind --persist`` records each device it bound (``<root>/var/lib/vfio_dp/persist.json``)::

    {"version": 1, "devices": [{"address": "0000:01:00.0", "vendor": "8086",
      "device": "10d3", "subsystemVendor": "8086", "subsystemDevice": "0000"}]}

and writes the udev rule that puts it back on vfio-pci at the next boot BEFORE a host driver
can take it (``<root>/etc/udev/rules.d/05-vfio-dp-persist.rules``), one line per device::

    ACTION=="add", SUBSYSTEM=="pci", KERNEL=="0000:01:00.0", ATTR{vendor}=="0x8086",
      ATTR{device}=="0x10d3", ATTR{subsystem_vendor}=="0x8086",
      ATTR{subsystem_device}=="0x0000", ATTR{driver_override}="vfio-pci",
      RUN{builtin}+="kmod load vfio-pci"

A device bound to a VFIO driver other than vfio-pci (a variant such as ``mlx5_vfio_pci``)
gets that driver and its module in its line (``ATTR{driver_override}="mlx5_vfio_pci",
RUN{builtin}+="kmod load mlx5_vfio_pci"``); the choice is kept in a file of its own,
``<root>/var/lib/vfio_dp/persist-drivers.json`` (``persist.json`` keeps its exact fields: the
previous release still reads it after a rollback)::

    {"version": 1, "drivers": {"0000:af:00.1": {"driver": "mlx5_vfio_pci",
                                                "module": "mlx5_vfio_pci"}}}

udev runs it when the kernel announces the device (coldplug at boot, or hotplug): the
``ATTR{...}=="..."`` matches make it apply only while the same card sits at that address (a
different card moved into the slot is left to its own driver), the ``driver_override`` write
happens while the rules are processed -- before ``80-drivers.rules`` loads the host driver's
module -- and loading vfio-pci binds it. No program starts at boot. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import VFIO_PCI

VERSION = 1
RULES_NAME = "05-vfio-dp-persist.rules"
_HEX4 = re.compile(r"[0-9a-f]{4}")
#: a driver or module name that may stand inside a udev rule's quotes
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
PLAIN_MODULE = "vfio-pci"  # what the rule's kmod loads for vfio-pci (as it always did)
_FIELDS = ("vendor", "device", "subsystemVendor", "subsystemDevice")


@dataclass(frozen=True, slots=True)
class PersistedBind:
    """One device to put on vfio-pci at boot, with the IDs it must still have."""

    address: PciAddress
    vendor: str  # 4 lowercase hex, no 0x (as :class:`vfio_dp.model.device.PciDevice`)
    device: str
    subsystem_vendor: str
    subsystem_device: str
    driver: str = VFIO_PCI  # what driver_override gets at boot
    module: str = PLAIN_MODULE  # what udev loads

    def __post_init__(self) -> None:
        for name in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _HEX4.fullmatch(value):
                raise ValueError(f"{name} {value!r} is not 4 lowercase hex digits")
        for name in ("driver", "module"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _NAME.fullmatch(value):
                raise ValueError(f"{name} {value!r} is not a kernel driver or module name")

    @property
    def ids(self) -> str:
        return f"{self.vendor}:{self.device} (subsystem {self.subsystem_vendor}:{self.subsystem_device})"

    def udev_rule(self) -> str:
        return (
            f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{self.address}", '
            f'ATTR{{vendor}}=="0x{self.vendor}", ATTR{{device}}=="0x{self.device}", '
            f'ATTR{{subsystem_vendor}}=="0x{self.subsystem_vendor}", '
            f'ATTR{{subsystem_device}}=="0x{self.subsystem_device}", '
            f'ATTR{{driver_override}}="{self.driver}", RUN{{builtin}}+="kmod load {self.module}"'
        )


def to_json(records: Iterable[PersistedBind]) -> bytes:
    devices = [
        {
            "address": str(r.address),
            "vendor": r.vendor,
            "device": r.device,
            "subsystemVendor": r.subsystem_vendor,
            "subsystemDevice": r.subsystem_device,
        }
        for r in sorted(records, key=lambda r: r.address)
    ]
    return (json.dumps({"version": VERSION, "devices": devices}, indent=1) + "\n").encode()


def from_json(raw: bytes) -> dict[PciAddress, PersistedBind]:
    """Parse and validate the record; ``ValueError`` saying what is wrong (nothing applied)."""
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version-{VERSION} record of persistent binds")
    devices = data.get("devices")
    if not isinstance(devices, list):
        raise ValueError("field devices must be a list")
    out: dict[PciAddress, PersistedBind] = {}
    for i, d in enumerate(devices):
        if not isinstance(d, dict) or set(d) != {"address", *_FIELDS}:
            raise ValueError(f"devices[{i}] must have exactly address, {', '.join(_FIELDS)}")
        if not isinstance(d["address"], str):
            raise ValueError(f"devices[{i}].address must be a string")
        rec = PersistedBind(
            PciAddress.parse(d["address"]),
            d["vendor"],
            d["device"],
            d["subsystemVendor"],
            d["subsystemDevice"],
        )
        out[rec.address] = rec
    return out


def drivers_to_json(records: Iterable[PersistedBind]) -> bytes | None:
    """``persist-drivers.json`` for the records not on plain vfio-pci (None: there are none)."""
    drivers = {
        str(r.address): {"driver": r.driver, "module": r.module}
        for r in sorted(records, key=lambda r: r.address)
        if (r.driver, r.module) != (VFIO_PCI, PLAIN_MODULE)
    }
    if not drivers:
        return None
    return (json.dumps({"version": VERSION, "drivers": drivers}, indent=1) + "\n").encode()


def with_drivers(
    records: dict[PciAddress, PersistedBind], raw: bytes
) -> dict[PciAddress, PersistedBind]:
    """``records`` with the VFIO drivers ``persist-drivers.json`` (``raw``) names; entries
    for devices the record does not hold are ignored. ``ValueError`` saying what is wrong."""
    data = json.loads(raw)
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ValueError(f"not a version-{VERSION} record of persistent VFIO drivers")
    drivers = data.get("drivers")
    if not isinstance(drivers, dict):
        raise ValueError("field drivers must be an object")
    out = dict(records)
    for key, d in drivers.items():
        if not isinstance(d, dict) or set(d) != {"driver", "module"}:
            raise ValueError(f"drivers[{key!r}] must have exactly driver, module")
        addr = PciAddress.parse(key)
        rec = out.get(addr)
        if rec is not None:
            out[addr] = replace(rec, driver=d["driver"], module=d["module"])
    return out


def udev_rules(records: Iterable[PersistedBind]) -> str:
    """The whole rules file for ``records`` (see the module docstring)."""
    lines = [
        "# Written by `vfioctl bind --persist`; `vfioctl unbind` removes its devices.",
        "# Each line puts one device back on its VFIO driver when the kernel adds it, only while",
        "# the same vendor/device/subsystem IDs are at that address. Do not edit.",
    ]
    lines += [r.udev_rule() for r in sorted(records, key=lambda r: r.address)]
    return "\n".join(lines) + "\n"
