"""PCI addresses: strict parsing and the one printed form.

Accepted: ``DDDD:BB:SS.F`` or ``BB:SS.F`` (domain 0000), hex in either case, slot <= 0x1f,
function 0-7. Printed: always the full lowercase form ``0000:65:00.0`` — the form sysfs
uses under ``/sys/bus/pci/devices/`` and the form KubeVirt validates in ``PCI_RESOURCE_*``.
Anything else (``../``, a path, a glob, whitespace) raises :class:`AddressError`, so a
string that reaches a path join has always passed through here first.

On the command line a function is also named as kubectl names objects, ``pci/0000:65:00.0``
(:func:`name_of`, what ``vfioctl list -o name`` prints); :func:`parse_given` (and
:func:`parse_many`) take either form, so ``vfioctl bind $(vfioctl list -o name ...)`` works.
Files, env vars and the kernel's own names never carry the prefix: they use
:meth:`PciAddress.parse`.
"""

from __future__ import annotations

from dataclasses import dataclass

from vfio_dp.errors import AddressError

_HEX = frozenset("0123456789abcdefABCDEF")


def _hex_field(part: str, width: int) -> int | None:
    """``part`` as an int if it is exactly ``width`` hex digits, else None.

    (Plain string checks, not a regex: `vfioctl bind` parses addresses at every start, and
    compiling patterns costs real time under emulation.)
    """
    if len(part) != width or not _HEX.issuperset(part):
        return None
    return int(part, 16)


@dataclass(frozen=True, slots=True, order=True)
class PciAddress:
    """A PCI function address; orders by (domain, bus, slot, function)."""

    domain: int
    bus: int
    slot: int
    function: int

    def __post_init__(self) -> None:
        if not (0 <= self.domain <= 0xFFFF and 0 <= self.bus <= 0xFF):
            raise AddressError(str((self.domain, self.bus)), "domain or bus out of range")
        if not 0 <= self.slot <= 0x1F:
            raise AddressError(f"{self.slot:x}", "slot must be 00-1f")
        if not 0 <= self.function <= 7:
            raise AddressError(f"{self.function:x}", "function must be 0-7")

    @classmethod
    def parse(cls, text: str) -> PciAddress:
        """Parse ``DDDD:BB:SS.F`` or ``BB:SS.F``; raise :class:`AddressError` otherwise."""
        if not isinstance(text, str):
            raise AddressError(repr(text), "not a string")
        head, dot, fn_text = text.rpartition(".")
        parts = head.split(":") if dot else []
        if len(parts) == 3:
            dom: int | None = _hex_field(parts[0], 4)
        elif len(parts) == 2:
            dom, parts = 0, ["", *parts]
        else:
            raise AddressError(text, "wrong shape")
        bus, slot, fn = _hex_field(parts[1], 2), _hex_field(parts[2], 2), _hex_field(fn_text, 1)
        if dom is None or bus is None or slot is None or fn is None:
            raise AddressError(text, "wrong shape")
        if slot > 0x1F:
            raise AddressError(text, "slot must be 00-1f")
        if fn > 7:
            raise AddressError(text, "function must be 0-7")
        return cls(dom, bus, slot, fn)

    @property
    def physical(self) -> tuple[int, int, int]:
        """(domain, bus, slot): functions sharing it are one physical multifunction device."""
        return (self.domain, self.bus, self.slot)

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"


#: the kind in a function's name on the command line (``pci/0000:65:00.0``, kubectl's type/name)
NAME_KIND = "pci"


def name_of(address: PciAddress) -> str:
    """``pci/0000:65:00.0``: how ``-o name`` prints a function."""
    return f"{NAME_KIND}/{address}"


def parse_given(text: str) -> PciAddress:
    """An address a person gave: ``0000:65:00.0``, ``65:00.0`` or ``pci/0000:65:00.0``."""
    if isinstance(text, str) and text.startswith(NAME_KIND + "/"):
        return PciAddress.parse(text[len(NAME_KIND) + 1 :])
    return PciAddress.parse(text)


def parse_many(texts: list[str] | tuple[str, ...]) -> list[PciAddress]:
    """Parse several addresses as a person gives them (:func:`parse_given`), keeping order
    and dropping repeats."""
    seen: dict[PciAddress, None] = {}
    for t in texts:
        seen.setdefault(parse_given(t), None)
    return list(seen)
