"""Where each PCI device hangs in the hierarchy: its PCIe root (``pci<domain>:<bus>``).

Read from the device's link under the root, as upstream DRA's ``deviceattribute`` does::

    <root>/sys/bus/pci/devices/0000:3b:00.0 -> ../../../devices/pci0000:00/0000:00:1c.0/0000:3b:00.0
                                                              ^^^^^^^^^^ the PCIe root

The link is resolved inside the root (:meth:`Root.resolve`); a device whose path has no
``pci<DDDD>:<BB>`` component (or cannot be read) simply has no entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from vfio_dp.errors import HostError
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress

_ROOT_COMPONENT = re.compile(r"pci[0-9a-f]{4}:[0-9a-f]{2}")


def pcie_roots(fs: Root, addresses: Iterable[PciAddress]) -> dict[PciAddress, str]:
    """``{address: "pci0000:00"}`` for every address whose sysfs path shows its root.

    Each link on the way is read once per call (:meth:`Root.resolve`'s ``links``): the
    directories every device shares (``sys/bus/pci/devices``, ``sys/devices/pci0000:00``
    and the bridges') were read again for every device, ~9 ``readlink`` calls a device."""
    out: dict[PciAddress, str] = {}
    links: dict[str, str | None] = {}
    for addr in addresses:
        try:
            resolved = fs.resolve(fs.path("sys", "bus", "pci", "devices", str(addr)), links)
        except HostError:
            continue
        for part in resolved.split("/"):
            if _ROOT_COMPONENT.fullmatch(part):
                out[addr] = part
                break
    return out
