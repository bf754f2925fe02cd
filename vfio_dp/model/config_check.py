"""Checking a decoded config document field by field: every problem listed, with its place.

The document (from :mod:`vfio_dp.model.config_yaml`) becomes a :class:`~vfio_dp.model.config.Config`
or a :class:`~vfio_dp.errors.ConfigError` naming each wrong value, where it is and the fix::

    invalid configuration /etc/vfio_dp/config.yaml:
      selectors[0].vendor: 8086: YAML reads the unquoted 8086 as a number, not as the hex ID
        8086; quote it: vendor: "8086"
      selectors[1].bind: 'onPrepare': onPrepare needs path: dra (the device plugin has no
        Prepare step); use bind: true, or add path: dra

What the fields mean is :mod:`vfio_dp.model.config`'s docstring; the way in is
:func:`vfio_dp.model.config.load_config_text` and friends. The keys known and the parser each
value goes through come from the fields' one declaration (:mod:`vfio_dp.model.config_fields`):
one parser per kind of value (``_PARSERS``), then the rules between fields (``_relations``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from vfio_dp.errors import AddressError, ConfigError
from vfio_dp.model import config_yaml, naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import (
    DEFAULT_SELECTOR,
    DEVICE_PLUGIN,
    DRA,
    ON_PREPARE,
    Config,
    Selector,
)
from vfio_dp.model.config_fields import MATCH, Kind, yaml_fields
from vfio_dp.model.device import VFIO_PCI
from vfio_dp.model.mdev_config import parse_mdev
from vfio_dp.model.personality import Personality

_HEX_PREFIX = re.compile(r"(?:0x)?([0-9a-fA-F]{2}|[0-9a-fA-F]{4}|[0-9a-fA-F]{6})")
_DRIVER = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_NODE_PATTERN = re.compile(r"[a-z0-9.*?\[\]!-]{1,253}")

#: the keys each level knows, from the fields' one declaration (:mod:`vfio_dp.model.config_fields`)
_SELECTOR_FIELDS = yaml_fields(Selector)
_SELECTOR_KEYS = {f.key for f in _SELECTOR_FIELDS}
_TOP_KEYS = {f.key for f in yaml_fields(Config)}


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
    mdev = parse_mdev(data.get("mdev"), domain, problems, _parse_selector)
    if problems:
        raise ConfigError(source, problems)
    return Config(
        resource_domain=domain,
        selectors=tuple(selectors),
        mdev=mdev,
        any_path=raw_selectors is None,
    )


@dataclass(slots=True)
class _Field:
    """Where a value is (``selectors[2].vendor``), for its parser's problems."""

    where: str
    key: str
    domain: str
    problems: list[tuple[str, object, str]]

    def problem(self, value: object, why: str) -> None:
        self.problems.append((f"{self.where}.{self.key}", value, why))


def _hex_list(value: object, at: _Field, width: int | None) -> tuple[str, ...]:
    values = _as_list(value)
    if not values:
        at.problem(value, "must be a hex string or a non-empty list")
        return ()
    out: list[str] = []
    for v in values:
        if not isinstance(v, str):
            at.problem(v, _quote_it(at.key, v, "hex ID"))
            continue
        m = _HEX_PREFIX.fullmatch(v)
        if not m or (width is not None and len(m.group(1)) != width):
            want = f"{width} hex digits" if width else "2, 4 or 6 hex digits"
            at.problem(v, f"must be {want}")
            continue
        out.append(m.group(1).lower())
    return tuple(out)


def _hex4(value: object, at: _Field, kind: Kind) -> tuple[str, ...]:
    return _hex_list(value, at, 4)


def _hex_prefix(value: object, at: _Field, kind: Kind) -> tuple[str, ...]:
    return _hex_list(value, at, None)


def _addresses(value: object, at: _Field, kind: Kind) -> tuple[PciAddress, ...]:
    values = _as_list(value)
    if not values:
        at.problem(value, "must be a non-empty list")
    out: list[PciAddress] = []
    for v in values or []:
        if not isinstance(v, str):
            at.problem(v, _quote_it(at.key, v, "PCI address"))
            continue
        try:
            out.append(PciAddress.parse(v))
        except AddressError as e:
            at.problem(v, e.why + "; expected DDDD:BB:SS.F")
    return tuple(out)


def _drivers(value: object, at: _Field, kind: Kind) -> tuple[str, ...]:
    values = _as_list(value)
    if not values:
        at.problem(value, "must be a non-empty list")
    out: list[str] = []
    for v in values or []:
        if not isinstance(v, str) or not _DRIVER.fullmatch(v):
            at.problem(v, "must be a kernel driver name")
        else:
            out.append(v)
    return tuple(out)


def _node_patterns(value: object, at: _Field, kind: Kind) -> tuple[str, ...]:
    values = _as_list(value)
    if not values:
        at.problem(value, "must be a non-empty list")
    out: list[str] = []
    for v in values or []:
        if not isinstance(v, str) or not _NODE_PATTERN.fullmatch(v):
            at.problem(
                v,
                "must be a node name or a shell pattern of one (lowercase "
                "a-z, 0-9, '-', '.', with * ? [ ]), e.g. node-a or gpu-*",
            )
        else:
            out.append(v)
    return tuple(out)


def _resource_name(value: object, at: _Field, kind: Kind) -> str | None:
    if not isinstance(value, str) or not value:
        at.problem(value, "must be a string")
        return None
    name = naming.qualify(value, at.domain)
    why = naming.resource_name_problem(name)
    if why:
        at.problem(value, why)
    return name


def _choice(value: object, at: _Field, kind: Kind) -> object:
    if value not in kind.values:
        at.problem(value, f"must be {kind.must_be}")
        return _NOT_SET
    return value


def _bind(value: object, at: _Field, kind: Kind) -> object:
    """``true`` | ``false`` | ``onPrepare``; :func:`_relations` splits it in two fields."""
    if value == ON_PREPARE or isinstance(value, bool):
        return value
    at.problem(value, f"must be true, false or {ON_PREPARE}")
    return _NOT_SET


def _vfio_driver(value: object, at: _Field, kind: Kind) -> object:
    """``auto``, ``vfio-pci`` or a kernel driver's name; never checked against a node (one
    config serves nodes with different kernels: a node that cannot serve it says so)."""
    if not isinstance(value, str) or not _DRIVER.fullmatch(value):
        at.problem(value, "must be auto, vfio-pci or a kernel driver's name (e.g. mlx5_vfio_pci)")
        return _NOT_SET
    return value


def _count(value: object, at: _Field, kind: Kind) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        at.problem(value, "must be a whole number, 0 or more")
        return None
    return value


def _personalities(value: object, at: _Field, kind: Kind) -> object:
    """``[vm]``, ``[container]`` or ``[vm, container]`` (in the order written; no repeats)."""
    known = [p.value for p in Personality]
    values = _as_list(value)
    if not values:
        at.problem(
            value, f"must be a non-empty list of {' and '.join(known)}, e.g. [vm, container]"
        )
        return _NOT_SET
    out: list[Personality] = []
    for v in values:
        if v not in known:
            at.problem(v, f"must be {' or '.join(known)}")
            return _NOT_SET
        p = Personality(v)
        if p in out:
            at.problem(value, f"names {v} twice: list each once, e.g. [vm, container]")
            return _NOT_SET
        out.append(p)
    return tuple(out)


_NOT_SET = object()  # a parser's "refused: keep the default"
_Parser = Callable[[object, _Field, Kind], object]
#: one parser per kind of value (:class:`vfio_dp.model.config_fields.Kind`); a problem is
#: listed with its place and the fix, and the field keeps its default
_PARSERS: dict[str, _Parser] = {
    "hex4": _hex4,
    "hexPrefix": _hex_prefix,
    "addresses": _addresses,
    "drivers": _drivers,
    "nodePatterns": _node_patterns,
    "resourceName": _resource_name,
    "choice": _choice,
    "bind": _bind,
    "count": _count,
    "vfioDriver": _vfio_driver,
    "personalities": _personalities,
}


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
    values: dict[str, Any] = {}
    for f in _SELECTOR_FIELDS:
        # an explicit null leaves an optional field (default None) unset; elsewhere it is a
        # value like any other, and refused
        if f.key not in raw or (raw[f.key] is None and f.default is None):
            continue
        value = _PARSERS[f.kind.name](raw[f.key], _Field(where, f.key, domain, problems), f.kind)
        if value is not _NOT_SET:
            values[f.attr] = value
    _relations(raw, values, where, problems)
    if len(problems) == before and not any(
        values.get(f.attr, f.default) != f.default for f in _SELECTOR_FIELDS if f.role == MATCH
    ):
        problems.append((where, dict(raw), "selects nothing: give at least one match field"))
    return Selector(**values) if len(problems) == before else None


def _relations(
    raw: Mapping[str, Any],
    values: dict[str, Any],
    where: str,
    problems: list[tuple[str, object, str]],
) -> None:
    """The rules between fields of one selector (each field's own value is already checked)."""
    path = values.get("path", DEVICE_PLUGIN)
    if values.get("bind") == ON_PREPARE:
        values["bind"], values["bind_on_prepare"] = False, True
        if path != DRA:
            problems.append(
                (
                    f"{where}.bind",
                    ON_PREPARE,
                    f"{ON_PREPARE} needs path: {DRA} (the device plugin has no Prepare step); "
                    f"use bind: true, or add path: {DRA}",
                )
            )
    if Personality.CONTAINER in values.get("personalities", ()):
        if path != DRA or not values.get("bind_on_prepare"):
            problems.append(
                (
                    f"{where}.personalities",
                    [p.value for p in values["personalities"]],
                    f"container needs path: {DRA} and bind: {ON_PREPARE} (the device moves "
                    "between its native driver and its VFIO driver as claims are prepared); "
                    f"add path: {DRA} and bind: {ON_PREPARE}, or remove container",
                )
            )
    elif "personalities" in values and path != DRA:
        problems.append(
            (
                f"{where}.personalities",
                [p.value for p in values["personalities"]],
                f"only the DRA plugin offers personalities: add path: {DRA} or remove it",
            )
        )
    if "taint_effect" in values and path != DRA:
        problems.append(
            (
                f"{where}.taintEffect",
                values["taint_effect"],
                f"only the DRA plugin taints devices: add path: {DRA} or remove it",
            )
        )
    num_vfs = values.get("num_vfs")
    if num_vfs is not None:
        if not values.get("addresses"):
            problems.append(
                (
                    f"{where}.numVfs",
                    num_vfs,
                    "needs addresses: the PFs to make VFs on, named one by one (never a broad "
                    'match), e.g. addresses: ["0000:01:00.0"]',
                )
            )
            num_vfs = values["num_vfs"] = None
        elif values.get("sriov") == "pf":
            problems.append(
                (f"{where}.sriov", "pf", "a numVfs selector takes the PFs' VFs: drop sriov: pf")
            )
    vf_driver = values.get("vf_driver", VFIO_PCI)
    if "vf_driver" in values and num_vfs is None:
        problems.append((f"{where}.vfDriver", vf_driver, "only with numVfs"))
    if num_vfs is not None and "bind" not in raw and vf_driver == VFIO_PCI:
        values["bind"] = True  # made VFs go to vfio-pci unless the selector says otherwise
    if vf_driver == "none" and values.get("bind"):
        problems.append(
            (f"{where}.vfDriver", vf_driver, "none leaves the VFs driverless: drop bind")
        )
