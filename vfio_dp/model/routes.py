"""Which path serves a ``vendor:device`` pair or a resource name, from the configuration alone.

Pure. Used where no node's inventory is at hand: ``vfioctl translate --dra`` (convert exactly
the VM entries the config sends to DRA) and ``vfioctl deviceclasses`` (one DeviceClass per
resource the DRA path serves). A VM spec names a device by its IDs (``10de:1eb8``) or by a
resource name (``devices.kubevirt.io/10de_1eb8``, ``example.com/nvme-b``); what else a
selector may constrain (class, subsystem IDs, address, driver) is unknown offline, unless the
caller knows the class (``--pci-class 10de:1eb8=030200``).

So each selector that admits the IDs is tried against every combination of the unknowns
that the configuration distinguishes (each driver, address, subsystem ID and class prefix
it names, plus "none of them"), and the first match of each combination is a possible
:class:`Route`::

    selectors: [{vendor: "10de", path: dra}, {class: "0108", drivers: [vfio-pci], path: dra},
                {drivers: [vfio-pci], path: devicePlugin}]
    10de:1eb8           → (dra, devices.kubevirt.io/10de_1eb8, selectors[0])
    8086:10d3           → (dra, …/8086_10d3, selectors[1]) or (devicePlugin, …, selectors[2])
    8086:10d3 class 020000 → (devicePlugin, devices.kubevirt.io/8086_10d3, selectors[2])

One path among the routes: that path serves it. Both: the device's other properties decide
(each route says on which). None: no selector takes it. Without a configuration (no
``selectors``) every path serves the default selector's devices: the route's path is
:data:`ANY`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config, Selector
from vfio_dp.model.device import PciDevice

#: The path of a route under a config without selectors: whichever process runs serves it.
ANY = "any"
#: Beyond this many combinations of unknowns the search stops (a config listing hundreds of
#: addresses AND drivers AND subsystem IDs); the routes found so far are returned.
MAX_COMBINATIONS = 50_000

_NONE_OF_THEM = "zzzz"  # matches no hex ID, no class prefix, no driver name
_OTHER_ADDRESS = PciAddress(0xFFFF, 0xFF, 0x1F, 7)
_DEFAULT_SHORT = re.compile(r"([0-9a-f]{4})_([0-9a-f]{4})")


@dataclass(frozen=True, slots=True)
class Route:
    """One way a device may be served: by ``path`` under ``resource``, through the selector
    at ``index`` (its ``condition``: what besides the IDs it requires, "" for nothing)."""

    path: str
    resource: str
    index: int
    condition: str

    def describe(self) -> str:
        """``selectors[1] (class 0108, driver vfio-pci) → dra as devices.kubevirt.io/…``."""
        cond = f" ({self.condition})" if self.condition else ""
        return f"selectors[{self.index}]{cond} → {self.path} as {self.resource}"


def selector_condition(sel: Selector) -> str:
    """What a selector requires besides vendor/device IDs, in words ("" for nothing)."""
    parts: list[str] = []
    for label, values in (
        ("class", sel.classes),
        ("subsystem vendor", sel.subsystem_vendors),
        ("subsystem device", sel.subsystem_devices),
        ("address", tuple(str(a) for a in sel.addresses)),
        ("driver", sel.drivers),
        ("on nodes", sel.nodes),
    ):
        if values:
            parts.append(f"{label} {' or '.join(values)}")
    return ", ".join(parts)


def _values(selectors: Sequence[Selector], field: str) -> list[str]:
    seen: dict[str, None] = {}
    for sel in selectors:
        for v in getattr(sel, field):
            seen.setdefault(v, None)
    return [*seen, _NONE_OF_THEM]


def _candidates(
    selectors: Sequence[Selector], vendor: str, device: str, class_code: str | None
) -> Iterator[PciDevice]:
    """A device with these IDs for every combination of the unknowns the selectors name."""
    if class_code is not None:
        classes = [class_code]
    else:
        classes = [c.ljust(6, "0") for c in _values(selectors, "classes")[:-1]] + ["zzzzzz"]
    addresses: dict[PciAddress, None] = {a: None for s in selectors for a in s.addresses}
    address_list = [*addresses, _OTHER_ADDRESS]
    drivers = [*_values(selectors, "drivers")[:-1], None]
    for n, (cls, sv, sd, addr, drv) in enumerate(
        itertools.product(
            classes,
            _values(selectors, "subsystem_vendors"),
            _values(selectors, "subsystem_devices"),
            address_list,
            drivers,
        )
    ):
        if n >= MAX_COMBINATIONS:
            return
        yield PciDevice(
            address=addr,
            vendor=vendor,
            device=device,
            class_code=cls,
            subsystem_vendor=sv,
            subsystem_device=sd,
            driver=drv,
            original_driver=drv,
        )


def routes_for_ids(
    config: Config, vendor: str, device: str, class_code: str | None = None
) -> list[Route]:
    """Every route a device with these IDs (and ``class_code``, when known) may take, in
    selector order."""
    vendor, device = vendor.lower(), device.lower()
    admitting = [s for s in config.selectors if s.admits_ids(vendor, device)]
    # the node is an unknown too: each pattern a selector names (as a node name), and a
    # node none of them names (None: node-limited selectors do not apply)
    nodes: list[str | None] = [None, *dict.fromkeys(p for s in admitting for p in s.nodes)]
    if config.node is not None:
        nodes = [config.node]  # read on a known node
    found: dict[int, Route] = {}
    for node in nodes:
        on_node = config.for_node(node)
        for dev in _candidates(admitting, vendor, device, class_code):
            sel = on_node.select(dev)
            if sel is None:
                continue
            index = config.selectors.index(sel)
            if index not in found:
                path = ANY if config.any_path else sel.path
                name = config.name_for(sel, dev)
                found[index] = Route(path, name, index, selector_condition(sel))
    return [found[i] for i in sorted(found)]


def routes_for_name(
    config: Config, resource: str, classes: dict[tuple[str, str], str] | None = None
) -> list[Route]:
    """Every route that gives a device the resource name ``resource``: the selectors that
    name it explicitly, and for ``<resourceDomain>/<vendor>_<device>`` the routes of those
    IDs that keep the default name. ``classes`` maps (vendor, device) to a known class."""
    folded = resource.lower()
    out: dict[int, Route] = {}
    for index, sel in enumerate(config.selectors):
        if not (config.node is None or sel.on_node(config.node)):
            continue
        if sel.resource_name and sel.resource_name.lower() == folded:
            path = ANY if config.any_path else sel.path
            out[index] = Route(path, sel.resource_name, index, selector_condition(sel))
    domain, _, short = folded.partition("/")
    m = _DEFAULT_SHORT.fullmatch(short)
    if m and domain == config.resource_domain:
        cls = (classes or {}).get((m.group(1), m.group(2)))
        for route in routes_for_ids(config, m.group(1), m.group(2), cls):
            if route.resource == naming.default_resource_name(m.group(1), m.group(2), domain):
                out.setdefault(route.index, route)
    return [out[i] for i in sorted(out)]


def paths_of(routes: Sequence[Route]) -> set[str]:
    return {r.path for r in routes}
