"""The daemon's (and the webhook's) configuration: resource domain and device selectors.

YAML, usually a ConfigMap mounted at ``/etc/vfio_dp/config.yaml``::

    resourceDomain: devices.kubevirt.io     # optional, this is the default
    selectors:                              # evaluated in order; first match wins
      - vendor: "10de"                      # a string or a list; 4 hex digits
        device: ["1eb8", "1db6"]
        resourceName: gpu                   # optional; bare names get resourceDomain
        bind: true                          # bind matched devices (and group siblings)
        path: devicePlugin                  # who serves it: devicePlugin (default) or dra
      - vendor: "15b3"
        path: dra                           # published as ResourceSlices by vfioctl dra-plugin
        bind: onPrepare                     # stays on its host driver until a claim is prepared
      - class: "0108"                       # hex prefix of the 6-digit class (NVMe)
        addresses: ["0000:65:00.0"]          # explicit PCI addresses
        resourceName: example.com/nvme-a
      - subsystemVendor: "15d9"
        subsystemDevice: "0a01"
      - drivers: [vfio-pci]                 # current driver (recorded original one with bind)
      - vendor: "10de"
        path: dra
        nodes: ["node-a", "gpu-*"]          # only on these nodes (names, shell globs)
      - addresses: ["0000:01:00.0"]          # SR-IOV PFs, named one by one
        numVfs: 2                           # make 2 VFs on each; this selector takes the VFs
        resourceName: nvme-vf               # (vfDriver: vfio-pci, the default, binds them)
      - vendor: "1b36"
        sriov: pf                           # only SR-IOV PFs (vf: only VFs)

Within one selector every given field must match (a list matches any of its values).
``path`` says which node process serves what the selector takes: ``devicePlugin`` (the
device-plugin daemon, ``vfioctl plugin``; the default) or ``dra`` (``vfioctl dra-plugin``).
``bind``: ``false`` (default), ``true`` (bound to vfio-pci at start and on hotplug by the
process of the selector's path) or ``onPrepare`` (only with ``path: dra``: bound when a claim
is prepared). ``nodes`` limits a selector to the nodes whose name matches one of its
patterns (``fnmatch``, case-sensitive), so one ConfigMap can move a cluster from one path to
the other node by node; a process that does not know its node name (``--node-name``,
``NODE_NAME``) skips such selectors, and so does every offline reader except where it says
otherwise (the webhook's names, :mod:`vfio_dp.model.routes`). With no configuration at all
(or no ``selectors``) every device already on vfio-pci is served by whichever process runs —
run only one of them that way.

SR-IOV (the habits of the SR-IOV network operator): ``numVfs`` asks a number of VFs of each
PF named in ``addresses`` (never a broad match: only named PFs are ever changed); such a
selector takes the VFs of those PFs -- never the PFs themselves -- and ``vfDriver``
(``vfio-pci``, the default, or ``none``) says where they go (``vfio-pci`` implies ``bind:
true`` unless ``bind`` says otherwise). ``sriov: pf`` / ``sriov: vf`` tells a PF from its VFs
where they share vendor:device (QEMU's NVMe does).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vfio_dp.errors import AddressError, ConfigError
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import VFIO_PCI, PciDevice

_HEX_PREFIX = re.compile(r"(?:0x)?([0-9a-fA-F]{2}|[0-9a-fA-F]{4}|[0-9a-fA-F]{6})")
_DRIVER = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NODE_PATTERN = re.compile(r"[a-z0-9.*?\[\]!-]{1,253}")

_SELECTOR_KEYS = {
    "vendor",
    "device",
    "class",
    "subsystemVendor",
    "subsystemDevice",
    "addresses",
    "drivers",
    "resourceName",
    "bind",
    "path",
    "nodes",
    "taintEffect",
    "sriov",
    "numVfs",
    "vfDriver",
}
_TOP_KEYS = {"resourceDomain", "selectors"}

#: The two node processes a selector can give its devices to.
DEVICE_PLUGIN = "devicePlugin"
DRA = "dra"
PATHS = (DEVICE_PLUGIN, DRA)
ON_PREPARE = "onPrepare"
#: the effect of the taint the DRA plugin puts on a prepared device that goes bad
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"  # evicts the running pod (a VM dies): only when a selector asks
TAINT_EFFECTS = (NO_SCHEDULE, NO_EXECUTE)
SRIOV_KINDS = ("pf", "vf")
VF_DRIVERS = (VFIO_PCI, "none")


@dataclass(frozen=True, slots=True)
class Selector:
    """One entry of ``selectors``; empty tuples mean "any"."""

    vendors: tuple[str, ...] = ()
    devices: tuple[str, ...] = ()
    classes: tuple[str, ...] = ()  # lowercase hex prefixes of the 6-digit class
    subsystem_vendors: tuple[str, ...] = ()
    subsystem_devices: tuple[str, ...] = ()
    addresses: tuple[PciAddress, ...] = ()
    drivers: tuple[str, ...] = ()
    resource_name: str | None = None  # fully qualified when set
    bind: bool = False  # bound to vfio-pci at start / hotplug
    path: str = DEVICE_PLUGIN  # DEVICE_PLUGIN or DRA
    bind_on_prepare: bool = False  # ``bind: onPrepare`` (only with path: dra)
    nodes: tuple[str, ...] = ()  # node-name patterns; empty = every node

    def on_node(self, node: str | None) -> bool:
        """Does this selector apply on ``node`` (None: a process that does not know it)?"""
        if not self.nodes:
            return True
        return node is not None and any(fnmatch.fnmatchcase(node, p) for p in self.nodes)
    taint_effect: str = NO_SCHEDULE  # ``taintEffect`` (only with path: dra)
    sriov: str | None = None  # "pf" | "vf": only SR-IOV PFs / only VFs
    num_vfs: int | None = None  # ``numVfs``: the VFs each PF in ``addresses`` should have
    vf_driver: str = VFIO_PCI  # ``vfDriver``: where made VFs go (vfio-pci | none)

    @property
    def binds(self) -> bool:
        """Does vfio_dp move this selector's devices to vfio-pci (now or at Prepare)?"""
        return self.bind or self.bind_on_prepare

    def matches(self, dev: PciDevice) -> bool:
        """Does this selector take ``dev``? With ``bind``, ``drivers`` is checked against the
        driver recorded before the bind, so a device keeps its selection once it is moved."""
        if self.vendors and dev.vendor not in self.vendors:
            return False
        if self.devices and dev.device not in self.devices:
            return False
        if self.classes and not any(dev.class_code.startswith(c) for c in self.classes):
            return False
        if self.subsystem_vendors and dev.subsystem_vendor not in self.subsystem_vendors:
            return False
        if self.subsystem_devices and dev.subsystem_device not in self.subsystem_devices:
            return False
        if self.num_vfs is not None:  # takes the VFs of the PFs it names, never the PFs
            if dev.physfn is None or dev.physfn not in self.addresses:
                return False
        elif self.addresses and dev.address not in self.addresses:
            return False
        if self.sriov == "pf" and dev.sriov_numvfs is None:
            return False
        if self.sriov == "vf" and dev.physfn is None:
            return False
        if self.drivers:
            driver = dev.driver
            if self.binds and dev.original_driver is not None:
                driver = dev.original_driver
            if driver not in self.drivers:
                return False
        return True

    def admits_ids(self, vendor: str, device: str) -> bool:
        """Could a device with these IDs match (fields not knowable from IDs are ignored)?"""
        return (not self.vendors or vendor in self.vendors) and (
            not self.devices or device in self.devices
        )

    @property
    def ids_only(self) -> bool:
        """True when nothing but vendor/device IDs constrains the selector."""
        return not (
            self.classes
            or self.subsystem_vendors
            or self.subsystem_devices
            or self.addresses
            or self.drivers
            or self.sriov
            or self.num_vfs is not None
        )


DEFAULT_SELECTOR = Selector(drivers=(VFIO_PCI,))
_DEFAULT_SELECTORS: tuple[Selector, ...] = (DEFAULT_SELECTOR,)


@dataclass(frozen=True, slots=True)
class Config:
    resource_domain: str = naming.DEFAULT_DOMAIN
    selectors: tuple[Selector, ...] = field(default_factory=lambda: _DEFAULT_SELECTORS)
    #: True without a config (or without ``selectors``): every path serves what is selected
    any_path: bool = False
    #: the node this config is read on (:meth:`for_node`); None: unknown (offline readers)
    node: str | None = None

    def for_node(self, node: str | None) -> Config:
        """This config as read on ``node``: selectors whose ``nodes`` do not match are skipped."""
        return self if node == self.node else dataclasses.replace(self, node=node)

    @property
    def node_limited(self) -> bool:
        """Does any selector apply only on some nodes?"""
        return any(s.nodes for s in self.selectors)

    def selector_serves(self, sel: Selector, path: str) -> bool:
        """Is ``sel``'s device served by the process of ``path``?"""
        return self.any_path or sel.path == path

    def select_for(self, dev: PciDevice, path: str) -> Selector | None:
        """The first matching selector if it gives ``dev`` to ``path``, else None."""
        sel = self.select(dev)
        if sel is None or not self.selector_serves(sel, path):
            return None
        return sel

    def path_of(self, dev: PciDevice) -> str | None:
        """The path of the selector that takes ``dev`` (None: nobody serves it).
        Without a config this is :data:`DEVICE_PLUGIN` (any process would serve it)."""
        sel = self.select(dev)
        return None if sel is None else sel.path

    def select(self, dev: PciDevice) -> Selector | None:
        """The first selector that matches ``dev``, or None."""
        for sel in self.selectors:
            if sel.on_node(self.node) and sel.matches(dev):
                return sel
        return None

    def resource_for(self, dev: PciDevice, path: str | None = None) -> str | None:
        """The resource name ``dev`` is advertised under, or None when no selector takes it
        (or, with ``path``, when the selector gives it to the other path)."""
        sel = self.select(dev) if path is None else self.select_for(dev, path)
        if sel is None:
            return None
        return self.name_for(sel, dev)

    def name_for(self, sel: Selector, dev: PciDevice) -> str:
        if sel.resource_name:
            return sel.resource_name
        return naming.default_resource_name(dev.vendor, dev.device, self.resource_domain)

    def would_name(self, dev: PciDevice) -> str:
        """What ``vfioctl list`` shows: the selected name, else the default name for its IDs."""
        return self.resource_for(dev) or naming.default_resource_name(
            dev.vendor, dev.device, self.resource_domain
        )

    def resources_for_ids(self, vendor: str, device: str) -> list[str]:
        """Every resource a ``vendor:device`` pair could be advertised under (for the webhook).

        Selectors that name IDs (``vendor``/``device``) and admit the pair are the
        candidates, in order; one constrained by nothing but IDs shadows everything after it
        (first match wins). Only when no ID-naming selector admits the pair do selectors
        without IDs (``class``, ``drivers``, the default) count — so address selectors
        should name the IDs of the devices they split. Selectors of both paths give names:
        a ``path: dra`` resource is requested by the same name through its DeviceClass's
        ``extendedResourceName`` (KEP-5004; ``vfioctl deviceclasses``).
        """
        vendor, device = vendor.lower(), device.lower()
        found: dict[str, None] = {}
        fallback: dict[str, None] = {}
        for sel in self.selectors:
            if not sel.admits_ids(vendor, device):
                continue
            name = sel.resource_name or naming.default_resource_name(
                vendor, device, self.resource_domain
            )
            if not (sel.vendors or sel.devices):
                fallback.setdefault(name, None)
                continue
            found.setdefault(name, None)
            if sel.ids_only:
                break
        return list(found or fallback)

    def wanted_vfs(self) -> dict[PciAddress, tuple[int, Selector]]:
        """Each PF a ``numVfs`` selector names: the VF count asked, and the selector (the
        first selector naming a PF wins, like every match)."""
        out: dict[PciAddress, tuple[int, Selector]] = {}
        for sel in self.selectors:
            if sel.num_vfs is not None:
                for pf in sel.addresses:
                    out.setdefault(pf, (sel.num_vfs, sel))
        return out

    @property
    def resource_names(self) -> list[str]:
        """Explicitly configured resource names (default-named ones depend on devices)."""
        return [s.resource_name for s in self.selectors if s.resource_name]


DEFAULT_CONFIG = Config(any_path=True)


def _as_list(value: object) -> list[object] | None:
    if isinstance(value, list):
        return value
    if isinstance(value, str | int | float):
        return [value]
    return None


def _quote_it(key: str, value: object, what: str) -> str:
    """The fix for an unquoted ID or address that YAML read as a number or a boolean
    (``vendor: 8086`` is the decimal 8086, not the hex ID; ``vendor: true`` is a boolean)."""
    example = '"8086"' if what == "hex ID" else '"0000:65:00.0"'
    if isinstance(value, bool):
        return f"YAML reads it as a boolean, not a {what}; write the {what} quoted, e.g. {key}: {example}"
    if not isinstance(value, int | float):
        return f"must be a {what} string, not a {type(value).__name__}"
    text = _unquoted_text(value)
    return (
        f"YAML reads the unquoted {text} as a number, not as the {what} {text}; "
        f'quote it: {key}: "{text}"'
    )


def parse_config(data: object, source: str = "<config>") -> Config:
    """Validate a decoded YAML/JSON document; raise :class:`ConfigError` listing EVERY problem."""
    problems: list[tuple[str, object, str]] = []
    if data is None:
        return DEFAULT_CONFIG
    if not isinstance(data, Mapping):
        raise ConfigError(source, [("(top)", data, "must be a mapping with 'selectors'")])
    for key in data:
        if key not in _TOP_KEYS:
            problems.append((str(key), data[key], f"unknown key; known: {sorted(_TOP_KEYS)}"))
    domain = data.get("resourceDomain", naming.DEFAULT_DOMAIN)
    if not isinstance(domain, str) or naming.resource_name_problem(f"{domain}/x"):
        problems.append(("resourceDomain", domain, "must be a DNS subdomain, not kubernetes.io"))
        domain = naming.DEFAULT_DOMAIN
    raw_selectors = data.get("selectors")
    selectors: list[Selector] = []
    if raw_selectors is None:
        selectors = [DEFAULT_SELECTOR]
    elif not isinstance(raw_selectors, list):
        problems.append(("selectors", raw_selectors, "must be a list of selectors"))
    else:
        for i, raw in enumerate(raw_selectors):
            sel = _parse_selector(raw, f"selectors[{i}]", domain, problems)
            if sel is not None:
                selectors.append(sel)
    if problems:
        raise ConfigError(source, problems)
    return Config(
        resource_domain=domain, selectors=tuple(selectors), any_path=raw_selectors is None
    )


def _hex_list(
    raw: Mapping[str, Any],
    key: str,
    where: str,
    problems: list[tuple[str, object, str]],
    *,
    width: int | None,
) -> tuple[str, ...]:
    if key not in raw:
        return ()
    values = _as_list(raw[key])
    if not values:
        problems.append((f"{where}.{key}", raw[key], "must be a hex string or a non-empty list"))
        return ()
    out: list[str] = []
    for v in values:
        if not isinstance(v, str):
            problems.append((f"{where}.{key}", v, _quote_it(key, v, "hex ID")))
            continue
        m = _HEX_PREFIX.fullmatch(v)
        if not m or (width is not None and len(m.group(1)) != width):
            want = f"{width} hex digits" if width else "2, 4 or 6 hex digits"
            problems.append((f"{where}.{key}", v, f"must be {want}"))
            continue
        out.append(m.group(1).lower())
    return tuple(out)


def _parse_selector(
    raw: object, where: str, domain: str, problems: list[tuple[str, object, str]]
) -> Selector | None:
    if not isinstance(raw, Mapping):
        problems.append((where, raw, "must be a mapping"))
        return None
    before = len(problems)
    for key in raw:
        if key not in _SELECTOR_KEYS:
            problems.append(
                (f"{where}.{key}", raw[key], f"unknown key; known: {sorted(_SELECTOR_KEYS)}")
            )
    addresses: list[PciAddress] = []
    if "addresses" in raw:
        values = _as_list(raw["addresses"])
        if not values:
            problems.append((f"{where}.addresses", raw["addresses"], "must be a non-empty list"))
        for v in values or []:
            if not isinstance(v, str):
                problems.append((f"{where}.addresses", v, _quote_it("addresses", v, "PCI address")))
                continue
            try:
                addresses.append(PciAddress.parse(v))
            except AddressError as e:
                problems.append((f"{where}.addresses", v, e.why + "; expected DDDD:BB:SS.F"))
    drivers: list[str] = []
    if "drivers" in raw:
        values = _as_list(raw["drivers"])
        if not values:
            problems.append((f"{where}.drivers", raw["drivers"], "must be a non-empty list"))
        for v in values or []:
            if not isinstance(v, str) or not _DRIVER.fullmatch(v):
                problems.append((f"{where}.drivers", v, "must be a kernel driver name"))
            else:
                drivers.append(v)
    resource_name = raw.get("resourceName")
    if resource_name is not None:
        if not isinstance(resource_name, str) or not resource_name:
            problems.append((f"{where}.resourceName", resource_name, "must be a string"))
            resource_name = None
        else:
            resource_name = naming.qualify(resource_name, domain)
            why = naming.resource_name_problem(resource_name)
            if why:
                problems.append((f"{where}.resourceName", raw.get("resourceName"), why))
    path = raw.get("path", DEVICE_PLUGIN)
    if path not in PATHS:
        problems.append((f"{where}.path", path, f"must be {DEVICE_PLUGIN} or {DRA}"))
        path = DEVICE_PLUGIN
    raw_bind = raw.get("bind", False)
    bind, on_prepare = False, False
    if raw_bind == ON_PREPARE:
        on_prepare = True
        if path != DRA:
            problems.append(
                (
                    f"{where}.bind",
                    raw_bind,
                    f"{ON_PREPARE} needs path: {DRA} (the device plugin has no Prepare step); "
                    f"use bind: true, or add path: {DRA}",
                )
            )
    elif isinstance(raw_bind, bool):
        bind = raw_bind
    else:
        problems.append((f"{where}.bind", raw_bind, f"must be true, false or {ON_PREPARE}"))
    nodes: list[str] = []
    if "nodes" in raw:
        values = _as_list(raw["nodes"])
        if not values:
            problems.append((f"{where}.nodes", raw["nodes"], "must be a non-empty list"))
        for v in values or []:
            if not isinstance(v, str) or not _NODE_PATTERN.fullmatch(v):
                problems.append(
                    (
                        f"{where}.nodes",
                        v,
                        "must be a node name or a shell pattern of one (lowercase "
                        "a-z, 0-9, '-', '.', with * ? [ ]), e.g. node-a or gpu-*",
                    )
                )
            else:
                nodes.append(v)
    taint_effect = raw.get("taintEffect", NO_SCHEDULE)
    if taint_effect not in TAINT_EFFECTS:
        problems.append(
            (f"{where}.taintEffect", taint_effect, f"must be {' or '.join(TAINT_EFFECTS)}")
        )
        taint_effect = NO_SCHEDULE
    elif "taintEffect" in raw and path != DRA:
        problems.append(
            (
                f"{where}.taintEffect",
                taint_effect,
                f"only the DRA plugin taints devices: add path: {DRA} or remove it",
            )
        )
    sriov, num_vfs, vf_driver = _parse_sriov(raw, where, bool(addresses), problems)
    if num_vfs is not None and "bind" not in raw and vf_driver == VFIO_PCI:
        bind = True  # made VFs go to vfio-pci unless the selector says otherwise
    sel = Selector(
        vendors=_hex_list(raw, "vendor", where, problems, width=4),
        devices=_hex_list(raw, "device", where, problems, width=4),
        classes=_hex_list(raw, "class", where, problems, width=None),
        subsystem_vendors=_hex_list(raw, "subsystemVendor", where, problems, width=4),
        subsystem_devices=_hex_list(raw, "subsystemDevice", where, problems, width=4),
        addresses=tuple(addresses),
        drivers=tuple(drivers),
        resource_name=resource_name,
        bind=bind,
        path=path,
        bind_on_prepare=on_prepare,
        nodes=tuple(nodes),
        taint_effect=taint_effect,
        sriov=sriov,
        num_vfs=num_vfs,
        vf_driver=vf_driver,
    )
    if vf_driver == "none" and bind:
        problems.append(
            (f"{where}.vfDriver", vf_driver, "none leaves the VFs driverless: drop bind")
        )
    bare = Selector(
        bind=bind,
        resource_name=resource_name,
        path=path,
        bind_on_prepare=on_prepare,
        nodes=tuple(nodes),
        taint_effect=taint_effect,
        vf_driver=vf_driver,
    )
    if sel == bare and len(problems) == before:
        problems.append((where, dict(raw), "selects nothing: give at least one match field"))
    return sel if len(problems) == before else None


def _parse_sriov(
    raw: Mapping[str, Any], where: str, named: bool, problems: list[tuple[str, object, str]]
) -> tuple[str | None, int | None, str]:
    """``sriov``, ``numVfs`` and ``vfDriver`` of one selector (see the module docstring)."""
    sriov = raw.get("sriov")
    if sriov is not None and sriov not in SRIOV_KINDS:
        problems.append((f"{where}.sriov", sriov, "must be pf (SR-IOV PFs) or vf (their VFs)"))
        sriov = None
    num_vfs = raw.get("numVfs")
    if num_vfs is not None:
        if isinstance(num_vfs, bool) or not isinstance(num_vfs, int) or num_vfs < 0:
            problems.append((f"{where}.numVfs", num_vfs, "must be a whole number, 0 or more"))
            num_vfs = None
        elif not named:
            problems.append(
                (
                    f"{where}.numVfs",
                    num_vfs,
                    "needs addresses: the PFs to make VFs on, named one by one (never a broad "
                    'match), e.g. addresses: ["0000:01:00.0"]',
                )
            )
            num_vfs = None
        elif sriov == "pf":
            problems.append(
                (f"{where}.sriov", sriov, "a numVfs selector takes the PFs' VFs: drop sriov: pf")
            )
    vf_driver = raw.get("vfDriver", VFIO_PCI)
    if vf_driver not in VF_DRIVERS:
        problems.append((f"{where}.vfDriver", vf_driver, "must be vfio-pci or none"))
        vf_driver = VFIO_PCI
    elif "vfDriver" in raw and num_vfs is None:
        problems.append((f"{where}.vfDriver", vf_driver, "only with numVfs"))
    return sriov, num_vfs, vf_driver


#: Bounds on a config file (a hostile ConfigMap must be refused fast, before anything grows):
#: its size (a real one with hundreds of selectors is a few KiB; a ConfigMap holds 1 MiB),
#: how deep it nests (a valid one is 5 deep), and how many nodes it would have with every
#: YAML alias expanded (a 372-byte "billion laughs" file expands to 10**9).
MAX_CONFIG_BYTES = 256 * 1024
MAX_CONFIG_DEPTH = 20
MAX_CONFIG_NODES = 20_000


def load_config_bytes(data: bytes, source: str) -> Config:
    """Decode a config file's bytes (UTF-8, at most :data:`MAX_CONFIG_BYTES`) and parse it."""
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            source,
            [("(file)", None, f"{len(data)} bytes: larger than the {MAX_CONFIG_BYTES} allowed")],
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(
            source,
            [
                (
                    "(file)",
                    None,
                    f"not UTF-8 text (byte {e.start} is {data[e.start]:#04x}); save it as UTF-8",
                )
            ],
        ) from None
    return load_config_text(text, source)


def load_config_text(text: str, source: str) -> Config:
    """Parse YAML text (a ConfigMap file) into a :class:`Config`, within the bounds above."""
    if len(text) > MAX_CONFIG_BYTES:
        raise ConfigError(
            source,
            [
                (
                    "(file)",
                    None,
                    f"{len(text)} characters: larger than the {MAX_CONFIG_BYTES} allowed",
                )
            ],
        )
    return parse_config(_bounded_yaml(text, source), source)


class _IdInt(int):
    """An int YAML read from an unquoted scalar, remembering the text (``8086``, ``0x10de``)
    so the error can show what to quote."""

    text = ""


class _IdFloat(float):
    """A float YAML read from an unquoted scalar (``1.0``, or ``0000:05:00.0``, which YAML 1.1
    reads as a base-60 number), remembering the text."""

    text = ""


def _unquoted_text(value: object) -> str:
    if isinstance(value, _IdInt | _IdFloat):
        return value.text
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _bounded_yaml(text: str, source: str) -> object:
    """``yaml.safe_load`` that refuses, before building any Python object, a document nested
    deeper than :data:`MAX_CONFIG_DEPTH`, one whose aliases would expand it past
    :data:`MAX_CONFIG_NODES` nodes, a recursive alias, and more than one document.

    PyYAML composes a node graph first (an alias is a second reference to the anchored node,
    nothing is copied), so the graph's expanded size is counted there, each node once.
    """
    import yaml

    def too_much(why: str, mark: Any) -> ConfigError:
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        return ConfigError(source, [("(file)", None, f"refused{where}: {why}")])

    class Loader(yaml.SafeLoader):
        depth = 0
        nodes = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self.depth += 1
            self.nodes += 1
            try:
                if self.depth > MAX_CONFIG_DEPTH or self.nodes > MAX_CONFIG_NODES:
                    mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                    if self.depth > MAX_CONFIG_DEPTH:
                        raise too_much(f"nested deeper than {MAX_CONFIG_DEPTH} levels", mark)
                    raise too_much(f"more than {MAX_CONFIG_NODES} values", mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    def construct_int(loader: Any, node: Any) -> _IdInt:
        v = _IdInt(yaml.SafeLoader.construct_yaml_int(loader, node))
        v.text = str(node.value)
        return v

    def construct_float(loader: Any, node: Any) -> _IdFloat:
        v = _IdFloat(yaml.SafeLoader.construct_yaml_float(loader, node))
        v.text = str(node.value)
        return v

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_constructor("tag:yaml.org,2002:float", construct_float)

    loader = None
    try:
        loader = Loader(text)  # the reader refuses control characters (NUL) right here
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, too_much)
        return loader.construct_document(node)  # safe constructors only: unknown tags raise
    except yaml.YAMLError as e:
        raise ConfigError(source, [("(file)", None, f"not valid YAML: {e}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def _expanded_size(top: Any, too_much: Any) -> int:
    """Nodes the document would have with every alias expanded; raise past the bound or on a
    cycle. Iterative and memoised: each distinct node is visited once."""
    import yaml

    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(top, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node, yaml)
            total = 1 + sum(sizes[id(c)] for c in children)
            sizes[key] = min(total, MAX_CONFIG_NODES + 1)
            if total > MAX_CONFIG_NODES:
                raise too_much(
                    f"more than {MAX_CONFIG_NODES} values once its YAML aliases (*name) are "
                    "expanded; write the values out instead of repeating anchors",
                    node.start_mark,
                )
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise too_much("a YAML alias refers to itself", node.start_mark)
        on_path.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node, yaml) if id(c) not in sizes)
    return sizes[id(top)]


def _children(node: Any, yaml: Any) -> list[Any]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []
