"""The values sysfs holds, as the kernel writes them: each read value checked, pure.

``<root>/sys/bus/pci/devices/<bdf>/``'s ``vendor``/``device``/``class`` (``0x10de``,
``0x030000``: hex of a fixed width), ``numa_node`` (``-1``) and counts (decimal), driver names
(the ``driver`` link's basename, ``DRIVER=``, ``driver_override`` with ``(null)`` for none).
A value no kernel writes (binary, a sign where none belongs, too long, a path) raises
:class:`Garbage` naming the file and the value; :mod:`vfio_dp.host.sysfs` turns it into the
device's :class:`~vfio_dp.errors.SysfsValueError`.
"""

from __future__ import annotations

HEX_DIGITS = frozenset("0123456789abcdefABCDEF")
DEC_DIGITS = frozenset("0123456789")
# what a kernel driver name (or a vfio cdev name) can be: never a path, never binary
NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-")


class Garbage(Exception):
    """A value no kernel writes; carries the file (relative to the device dir) and value."""

    def __init__(self, name: str, value: object, why: str) -> None:
        self.name, self.value, self.why = name, value, why


def hex_value(text: str | None, width: int, name: str) -> str:
    """``0x10de`` / ``10DE`` / ``20000`` → ``10de`` / ``020000``: 1..``width`` hex digits
    after an optional ``0x``, left-padded; anything else raises (binary, a sign, too long)."""
    if text and len(text) <= width and HEX_DIGITS.issuperset(text):  # uevent's form
        return text.lower().rjust(width, "0")
    if text is None:
        raise Garbage(name, text, "missing")
    t = text[2:] if text[:2] in ("0x", "0X") else text
    if not t or len(t) > width or not HEX_DIGITS.issuperset(t):
        raise Garbage(name, text, f"not a hex number of at most {width} digits")
    return t.lower().rjust(width, "0")


def int_value(text: str | None, name: str, *, signed: bool = False) -> int | None:
    """A decimal sysfs number (``numa_node`` may be ``-1``); None when the file is absent."""
    if text is None:
        return None
    digits = text[1:] if signed and text[:1] == "-" else text
    if not digits or len(digits) > 10 or not DEC_DIGITS.issuperset(digits):
        raise Garbage(name, text, "not a decimal number")
    return int(text)


def name_value(text: str | None, name: str) -> str | None:
    """A driver name (``driver`` link, ``DRIVER=``, ``driver_override``); None when absent."""
    if text is None or text == "":
        return None
    if len(text) > 64 or not NAME_CHARS.issuperset(text) or text in (".", ".."):
        raise Garbage(name, text, "not a kernel driver name")
    return text


def override_value(text: str | None) -> str | None:
    return None if text in (None, "", "(null)") else name_value(text, "driver_override")
