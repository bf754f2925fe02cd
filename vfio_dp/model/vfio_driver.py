"""Which VFIO driver a device should be bound to: the rule of kernel commit cc6711b0
("PCI / VFIO: Add 'override_only' support for VFIO PCI sub system"), as libvirt follows it.

Variant drivers (``mlx5_vfio_pci``, ``nvgrace_gpu_vfio_pci``...) declare their devices with
``PCI_DRIVER_OVERRIDE_DEVICE_VFIO``, which kbuild writes to
``/lib/modules/<release>/modules.alias`` as ``vfio_pci:`` lines; vfio-pci has the catch-all::

    alias vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i* mlx5_vfio_pci
    alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci

User space takes the device's ``modalias`` (``<bdf>/modalias``,
``pci:v000015B3d0000101Esv000015B3sd00000001bc02sc00i00``), prefixes it with ``vfio_``,
matches it against those patterns (``fnmatch``, case-sensitive, as modprobe does) and prefers
the most specific match: the fewest wildcards. An alias names a MODULE (``vfio_pci``);
``driver_override`` needs the DRIVER it registers (``vfio-pci``), which the host reads from
``/sys/module/<module>/drivers/pci:<driver>`` once the module is loaded.

The operator may force the choice per selector (``vfioDriver``) or per command
(``vfioctl bind --vfio-driver``), as libvirt's ``<driver model='...'/>``: ``auto`` (the rule
above), ``vfio-pci``, or a driver's name. Pure: no I/O (:mod:`vfio_dp.host.vfio_drivers`
reads the files).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from typing import NamedTuple

from vfio_dp.model.device import VFIO_PCI, PciDevice

AUTO = "auto"
VFIO_PCI_MODULE = "vfio_pci"
_PREFIX = "alias vfio_pci:"


class VfioAlias(NamedTuple):
    """One ``alias vfio_pci:<pattern> <module>`` line of ``modules.alias``.

    (This and :class:`VfioChoice` are NamedTuples, not frozen dataclasses: ``vfioctl list``
    and ``check`` define them at start-up, and a NamedTuple costs about a sixth of a frozen
    slotted dataclass to define.)"""

    pattern: str  # "vfio_pci:v000015B3d0000101Esv*sd*bc*sc*i*"
    module: str  # "mlx5_vfio_pci"

    @property
    def line(self) -> str:
        return f"alias {self.pattern} {self.module}"

    @property
    def wildcards(self) -> int:
        """How unspecific the pattern is: its ``*`` and ``?`` count."""
        return self.pattern.count("*") + self.pattern.count("?")


class VfioChoice(NamedTuple):
    """The VFIO driver a bind writes to ``driver_override`` for one device, and why.

    ``problem`` set: the device cannot be served as asked (nothing is bound; the message
    says why and the fix)."""

    driver: str  # what driver_override gets: "vfio-pci", "mlx5_vfio_pci"
    module: str  # what modprobe loads: "vfio_pci", "mlx5_vfio_pci"
    why: str  # "modules.alias: alias vfio_pci:v... mlx5_vfio_pci", "vfioDriver: vfio-pci"
    problem: str | None = None


def parse_vfio_aliases(text: str) -> tuple[VfioAlias, ...]:
    """The ``alias vfio_pci:... <module>`` lines of a ``modules.alias`` text, in file order
    (every other line, comments included, is skipped)."""
    out: list[VfioAlias] = []
    start = text.find(_PREFIX)
    while start != -1:
        end = text.find("\n", start)
        line = text[start : end if end != -1 else len(text)]
        if start == 0 or text[start - 1] == "\n":
            parts = line.split()
            if len(parts) == 3:
                out.append(VfioAlias(parts[1], parts[2]))
        start = text.find(_PREFIX, start + len(_PREFIX))
    return tuple(out)


def module_of(driver: str) -> str:
    """The module a driver's name suggests (``vfio-pci`` → ``vfio_pci``): the kernel's module
    names use ``_`` where driver names may use ``-``."""
    return driver.replace("-", "_")


def driver_guess(module: str) -> str:
    """The driver a not yet loaded module will register: ``vfio_pci`` registers ``vfio-pci``;
    the variant drivers register their module's name (``KBUILD_MODNAME``)."""
    return VFIO_PCI if module == VFIO_PCI_MODULE else module


def modalias_of(dev: PciDevice) -> str:
    """The kernel's ``modalias`` for ``dev`` (``pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X``,
    drivers/pci/pci-driver.c), for when ``<bdf>/modalias`` cannot be read."""
    c = dev.class_code.upper()
    return (
        f"pci:v0000{dev.vendor.upper()}d0000{dev.device.upper()}"
        f"sv0000{dev.subsystem_vendor.upper()}sd0000{dev.subsystem_device.upper()}"
        f"bc{c[0:2]}sc{c[2:4]}i{c[4:6]}"
    )


def matching(aliases: Sequence[VfioAlias], modalias: str) -> list[VfioAlias]:
    """The aliases ``vfio_`` + ``modalias`` matches, most specific first (fewest wildcards;
    ties keep the file's order)."""
    name = "vfio_" + modalias
    found = [a for a in aliases if fnmatch.fnmatchcase(name, a.pattern)]
    return sorted(found, key=lambda a: a.wildcards)


def choose(
    dev: PciDevice,
    modalias: str,
    aliases: Sequence[VfioAlias] | None,
    wanted: str = AUTO,
    *,
    unread: str = "",
    loaded: frozenset[str] = frozenset(),
) -> VfioChoice:
    """The driver to bind ``dev`` to. ``aliases``: the ``vfio_pci:`` lines (None: the file
    could not be read, said in ``unread``); ``wanted``: ``auto``, ``vfio-pci`` or a driver's
    name; ``loaded``: the PCI drivers loaded now (``/sys/bus/pci/drivers/*``) that are
    wanted by name -- a driver the operator names that is loaded is trusted."""
    if wanted == VFIO_PCI:
        return VfioChoice(VFIO_PCI, VFIO_PCI_MODULE, f"vfioDriver: {VFIO_PCI}")
    found = matching(aliases or (), modalias)
    if wanted == AUTO:
        if aliases is None:
            return VfioChoice(VFIO_PCI, VFIO_PCI_MODULE, f"{unread}; vfio-pci")
        if not found:
            return VfioChoice(
                VFIO_PCI, VFIO_PCI_MODULE, f"no vfio_pci: line of modules.alias matches "
                f"vfio_{modalias}; vfio-pci",
            )  # fmt: skip
        best = found[0]
        return VfioChoice(driver_guess(best.module), best.module, f"modules.alias: {best.line}")
    module = module_of(wanted)
    for a in found:
        if a.module == module:
            return VfioChoice(wanted, module, f"vfioDriver: {wanted} (modules.alias: {a.line})")
    if wanted in loaded:
        return VfioChoice(wanted, module, f"vfioDriver: {wanted} (loaded)")
    return VfioChoice(
        wanted,
        module,
        f"vfioDriver: {wanted}",
        problem=(
            f"vfioDriver {wanted} cannot serve {dev.describe()}: no vfio_pci: line of "
            f"modules.alias names module {module} for vfio_{modalias}"
            + (f" ({unread})" if aliases is None else "")
            + f" and no driver {wanted} is loaded; install that module on this node, or "
            "use vfioDriver: auto or vfio-pci"
        ),
    )
