"""Vendor and device names from the ``pci.ids`` database (package ``pci.ids`` / ``hwdata``).

The file is the host tool's own data, not the node's state, so it is looked up in the
usual places of the filesystem vfioctl runs on. Only the vendors asked for are kept.
"""

from __future__ import annotations

import os

PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")


def find_pci_ids() -> str | None:
    for p in PCI_IDS_PATHS:
        if os.path.exists(p):
            return p
    return None


def load_names(
    wanted: set[tuple[str, str]], path: str | None = None
) -> dict[tuple[str, str | None], str]:
    """Names for ``(vendor, device)`` pairs: keys ``(v, None)`` for vendors, ``(v, d)`` for devices."""
    path = path or find_pci_ids()
    out: dict[tuple[str, str | None], str] = {}
    if path is None or not wanted:
        return out
    vendors = {v for v, _ in wanted}
    current: str | None = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if not line or line[0] == "#" or line == "\n":
                continue
            if line[0] != "\t":
                if line.startswith("C "):  # class section: no more vendors after it
                    break
                vid = line[:4]
                current = vid if vid in vendors else None
                if current:
                    out[(vid, None)] = line[6:].strip()
            elif current and line[1] != "\t":
                did = line[1:5]
                if (current, did) in wanted:
                    out[(current, did)] = line[7:].strip()
    return out
