"""Checking a decoded config document field by field: every problem listed, with its place.

The document (from :mod:`vfio_dp.model.config_yaml`) becomes a :class:`~vfio_dp.model.config.Config`
or a :class:`~vfio_dp.errors.ConfigError` naming each wrong value, where it is and the fix::

    invalid configuration /etc/vfio_dp/config.yaml:
      selectors[0].vendor: 8086: YAML reads the unquoted 8086 as a number, not as the hex ID
        8086; quote it: vendor: "8086"
      selectors[1].bind: 'onPrepare': onPrepare needs path: dra (the device plugin has no
        Prepare step); use bind: true, or add path: dra

What the fields mean is :mod:`vfio_dp.model.config`'s docstring; the way in is
:func:`vfio_dp.model.config.load_config_text` and friends.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from vfio_dp.errors import AddressError, ConfigError
from vfio_dp.model import config_yaml, naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import (
    DEFAULT_SELECTOR,
    DEVICE_PLUGIN,
    DRA,
    NO_SCHEDULE,
    ON_PREPARE,
    PATHS,
    SRIOV_KINDS,
    TAINT_EFFECTS,
    VF_DRIVERS,
    Config,
    Selector,
)
from vfio_dp.model.device import VFIO_PCI

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
    quoted = f'["{text}"]' if key == "addresses" else f'"{text}"'  # addresses is a list
    return (
        f"YAML reads the unquoted {text} as a number, not as the {what} {text}; "
        f"quote it: {key}: {quoted}"
    )


def unknown_key(key: str, known: set[str]) -> str:
    """``unknown key "vendorID"; did you mean "vendor"? (known: ...)``."""
    import difflib

    lowered = {k.lower(): k for k in known}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1, cutoff=0.6)
    hint = f'; did you mean "{lowered[close[0]]}"?' if close else ""
    return f"unknown key{hint} (known: {', '.join(sorted(known))})"


def parse_config(data: object, source: str = "<config>") -> Config:
    """Validate a decoded YAML/JSON document; raise :class:`ConfigError` listing EVERY problem."""
    problems: list[tuple[str, object, str]] = []
    if data is None:  # an empty file is a mistake (a wrong mount, a half-made ConfigMap)
        raise ConfigError(
            source,
            [
                (
                    "(top)",
                    "",
                    "the file is empty (or only comments): give `selectors:`; to serve what "
                    "is already on vfio-pci, run without --config instead",
                )
            ],
        )
    if not isinstance(data, Mapping):
        raise ConfigError(source, [("(top)", data, "must be a mapping with 'selectors'")])
    for key in data:
        if key not in _TOP_KEYS:
            problems.append((str(key), data[key], unknown_key(str(key), _TOP_KEYS)))
    domain = data.get("resourceDomain", naming.DEFAULT_DOMAIN)
    if (
        isinstance(domain, str)
        and domain != domain.lower()
        and not naming.resource_name_problem(f"{domain.lower()}/x")
    ):
        problems.append(
            (
                "resourceDomain",
                domain,
                f"must be lowercase (a DNS subdomain; resource names are matched exactly): "
                f"resourceDomain: {domain.lower()}",
            )
        )
        domain = naming.DEFAULT_DOMAIN
    elif not isinstance(domain, str) or naming.resource_name_problem(f"{domain}/x"):
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
            problems.append((f"{where}.{key}", raw[key], unknown_key(str(key), _SELECTOR_KEYS)))
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
