"""Vendor and device names from the ``pci.ids`` database (package ``pci.ids`` / ``hwdata``).

The file is the host tool's own data, not the node's state, so it is looked up in the
usual places of the filesystem vfioctl runs on. Only the vendors asked for are kept.
"""

from __future__ import annotations

import os
import re

PCI_IDS_PATHS = ("/usr/share/misc/pci.ids", "/usr/share/hwdata/pci.ids", "/usr/share/pci.ids")


def find_pci_ids() -> str | None:
    for p in PCI_IDS_PATHS:
        if os.path.exists(p):
            return p
    return None


def load_names(
    wanted: set[tuple[str, str]], path: str | None = None
) -> dict[tuple[str, str | None], str]:
    """Names for ``(vendor, device)`` pairs: keys ``(v, None)`` for vendors, ``(v, d)`` for devices.

    The database (~1.3 MB, ~40,000 lines)::

        8086  Intel Corporation
        \t10d3  82574L Gigabit Network Connection
        \t\t8086 a01f  Gigabit CT Desktop Adapter

    is searched, not parsed: each wanted vendor's line is found with one ``bytes.find``, and
    each of its wanted devices within that vendor's block (up to the next line that starts
    with neither a tab nor ``#``: the next vendor, or the class section ``C 02  ...``); only
    the names found are decoded. The database lists vendors, and devices within a vendor, in
    ascending order, so the wanted ones are looked for in that order, each from where the one
    before it was found: one pass over the file in all (an ID out of order is still found,
    by a second search from the start)."""
    path = path or find_pci_ids()
    out: dict[tuple[str, str | None], str] = {}
    if path is None or not wanted:
        return out
    data = _read(path)
    end = len(data)  # no line of the class section at the end looks like a vendor/device
    by_vendor: dict[str, list[str]] = {}
    for v, d in wanted:
        by_vendor.setdefault(v, []).append(d)
    at = 0
    for vendor in sorted(by_vendor):
        at = _find(data, b"\n" + vendor.encode("ascii", "replace") + b"  ", at, 0, end)
        if at < 0:
            at = 0
            continue
        line_end = data.find(b"\n", at + 1)
        line_end = end if line_end < 0 else line_end
        out[(vendor, None)] = _text(data[at + 7 : line_end])
        block_end = _block_end(data, line_end, end)
        d_at = line_end
        for device in sorted(by_vendor[vendor]):
            key = b"\n\t" + device.encode("ascii", "replace") + b"  "
            d_at = _find(data, key, d_at, line_end, block_end)
            if d_at < 0:
                d_at = line_end
                continue
            d_end = data.find(b"\n", d_at + 1)
            out[(vendor, device)] = _text(data[d_at + 8 : block_end if d_end < 0 else d_end])
        at = line_end
    return out


def _find(data: bytearray, key: bytes, hint: int, start: int, end: int) -> int:
    """``key`` in ``data[start:end]``, looked for from ``hint`` first (IDs in order), then
    from ``start`` (an ID out of order)."""
    found = data.find(key, hint, end)
    if found < 0 and hint > start:
        found = data.find(key, start, hint + len(key))
    return found


def _read(path: str) -> bytearray:
    """The file after a ``\\n`` (every vendor line then starts with one), read into one
    buffer (no second copy of 1.3 MB)."""
    with open(path, "rb", buffering=0) as f:
        size = min(os.fstat(f.fileno()).st_size, _MAX_BYTES)
        data = bytearray(size + 1)
        data[0] = 0x0A
        got = f.readinto(memoryview(data)[1:]) or 0
    del data[got + 1 :]  # the file shrank meanwhile
    return data


_MAX_BYTES = 64 << 20  # pci.ids is ~1.3 MB: anything past this is not the database


def _text(raw: bytes | bytearray) -> str:
    return raw.decode("utf-8", "replace").strip()


#: the start of a line that is no device line (tab), comment or blank: a vendor, a class
_NOT_IN_BLOCK = re.compile(rb"\n[^\t#\n]")


def _block_end(data: bytearray, start: int, end: int) -> int:
    """Where the vendor block whose first line ends at ``start`` ends."""
    m = _NOT_IN_BLOCK.search(data, start, end)
    return end if m is None else m.start()
