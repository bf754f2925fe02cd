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
from dataclasses import dataclass

from vfio_dp.model.address import PciAddress

VERSION = 1
RULES_NAME = "05-vfio-dp-persist.rules"
_HEX4 = re.compile(r"[0-9a-f]{4}")
_FIELDS = ("vendor", "device", "subsystemVendor", "subsystemDevice")


@dataclass(frozen=True, slots=True)
class PersistedBind:
    """One device to put on vfio-pci at boot, with the IDs it must still have."""

    address: PciAddress
    vendor: str  # 4 lowercase hex, no 0x (as :class:`vfio_dp.model.device.PciDevice`)
    device: str
    subsystem_vendor: str
    subsystem_device: str

    def __post_init__(self) -> None:
        for name in ("vendor", "device", "subsystem_vendor", "subsystem_device"):
            value = getattr(self, name)
            if not isinstance(value, str) or not _HEX4.fullmatch(value):
                raise ValueError(f"{name} {value!r} is not 4 lowercase hex digits")

    @property
    def ids(self) -> str:
        return f"{self.vendor}:{self.device} (subsystem {self.subsystem_vendor}:{self.subsystem_device})"

    def udev_rule(self) -> str:
        return (
            f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{self.address}", '
            f'ATTR{{vendor}}=="0x{self.vendor}", ATTR{{device}}=="0x{self.device}", '
            f'ATTR{{subsystem_vendor}}=="0x{self.subsystem_vendor}", '
            f'ATTR{{subsystem_device}}=="0x{self.subsystem_device}", '
            'ATTR{driver_override}="vfio-pci", RUN{builtin}+="kmod load vfio-pci"'
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


def udev_rules(records: Iterable[PersistedBind]) -> str:
    """The whole rules file for ``records`` (see the module docstring)."""
    lines = [
        "# Written by `vfioctl bind --persist`; `vfioctl unbind` removes its devices.",
        "# Each line puts one device back on vfio-pci when the kernel adds it, only while",
        "# the same vendor/device/subsystem IDs are at that address. Do not edit.",
    ]
    lines += [r.udev_rule() for r in sorted(records, key=lambda r: r.address)]
    return "\n".join(lines) + "\n"
