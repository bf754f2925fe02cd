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

Within one selector every given field must match (a list matches any of its values).
``path`` says which node process serves what the selector takes: ``devicePlugin`` (the
device-plugin daemon, ``vfioctl plugin``; the default) or ``dra`` (``vfioctl dra-plugin``).
``bind``: ``false`` (default), ``true`` (bound to vfio-pci at start and on hotplug by the
process of the selector's path) or ``onPrepare`` (only with ``path: dra``: bound when a claim
is prepared). With no configuration at all (or no ``selectors``) every device already on
vfio-pci is served by whichever process runs — run only one of them that way.

This module says what a configuration means (:class:`Config`, :class:`Selector`) and checks a
decoded document (:func:`parse_config`, every problem listed); reading the file's YAML within
bounds is :mod:`vfio_dp.model.config_yaml`'s job.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vfio_dp.errors import AddressError, ConfigError
from vfio_dp.model import config_yaml, naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config_yaml import MAX_CONFIG_BYTES as MAX_CONFIG_BYTES
from vfio_dp.model.config_yaml import MAX_CONFIG_DEPTH as MAX_CONFIG_DEPTH
from vfio_dp.model.config_yaml import MAX_CONFIG_NODES as MAX_CONFIG_NODES
from vfio_dp.model.device import VFIO_PCI, PciDevice

_HEX_PREFIX = re.compile(r"(?:0x)?([0-9a-fA-F]{2}|[0-9a-fA-F]{4}|[0-9a-fA-F]{6})")
_DRIVER = re.compile(r"[A-Za-z0-9_.-]{1,64}")

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
}
_TOP_KEYS = {"resourceDomain", "selectors"}

#: The two node processes a selector can give its devices to.
DEVICE_PLUGIN = "devicePlugin"
DRA = "dra"
PATHS = (DEVICE_PLUGIN, DRA)
ON_PREPARE = "onPrepare"


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
        if self.addresses and dev.address not in self.addresses:
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
        )


DEFAULT_SELECTOR = Selector(drivers=(VFIO_PCI,))
_DEFAULT_SELECTORS: tuple[Selector, ...] = (DEFAULT_SELECTOR,)


@dataclass(frozen=True, slots=True)
class Config:
    resource_domain: str = naming.DEFAULT_DOMAIN
    selectors: tuple[Selector, ...] = field(default_factory=lambda: _DEFAULT_SELECTORS)
    #: True without a config (or without ``selectors``): every path serves what is selected
    any_path: bool = False

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
            if sel.matches(dev):
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
        should name the IDs of the devices they split. Only ``path: devicePlugin`` selectors
        give names (DRA devices are not requested through resource names), but a ``path: dra``
        selector constrained by nothing but IDs still shadows the ones after it.
        """
        vendor, device = vendor.lower(), device.lower()
        found: dict[str, None] = {}
        fallback: dict[str, None] = {}
        for sel in self.selectors:
            if not sel.admits_ids(vendor, device):
                continue
            if not self.selector_serves(sel, DEVICE_PLUGIN):
                if sel.ids_only and (sel.vendors or sel.devices):
                    break
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
    text = config_yaml.unquoted_text(value)
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
    )
    bare = Selector(bind=bind, resource_name=resource_name, path=path, bind_on_prepare=on_prepare)
    if sel == bare and len(problems) == before:
        problems.append((where, dict(raw), "selects nothing: give at least one match field"))
    return sel if len(problems) == before else None


def load_config_bytes(data: bytes, source: str) -> Config:
    """Decode a config file's bytes (UTF-8, at most :data:`MAX_CONFIG_BYTES`) and parse it."""
    return load_config_text(config_yaml.decode(data, source), source)


def load_config_text(text: str, source: str) -> Config:
    """Parse YAML text (a ConfigMap file) into a :class:`Config`, within the bounds of
    :mod:`vfio_dp.model.config_yaml`."""
    return parse_config(config_yaml.load(text, source), source)
