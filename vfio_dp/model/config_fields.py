"""The config file's fields, each declared once: the dataclass field that holds it says its
YAML key, the kind of value it takes and its docs text.

A field of :class:`~vfio_dp.model.selector.Selector` (or :class:`~vfio_dp.model.config.Config`)
that the YAML file sets is declared where the dataclass declares it, with :func:`yaml_field`::

    vendors: tuple[str, ...] = yaml_field((), "vendor", HEX4, MATCH, "the PCI vendor ID")

The attribute name, Python type and default are the dataclass's own; :func:`yaml_field` adds
the YAML key (``vendor``), the kind of value (:class:`Kind`: what the file may write there and
which parser of :mod:`vfio_dp.model.config_check` reads it), the role (:data:`MATCH`: narrows
which devices the selector takes; :data:`WHERE`: on which nodes; :data:`ACTION`: what happens
to what it took) and one line of docs text. From that one declaration come:

- the checker's known keys (an unknown key is refused naming the known ones) and the parser
  each value goes through (:func:`yaml_fields`, ``config_check._PARSERS``);
- "selects nothing" (a selector with no :data:`MATCH` field set is refused);
- the field table of ``docs/configuration.md`` (:func:`markdown_table`), which
  ``tests/model/test_config_fields.py`` holds equal to this, so a field missing from the docs,
  or documented but unknown, fails the tests.

There is no config YAML writer: the shipped ConfigMaps (``deploy/**/config.yaml``) are written
by hand and loaded by the tests.

How to add a selector field (say ``vfioDriver``), all in one place plus what is new:

1. In :class:`~vfio_dp.model.selector.Selector`, add the attribute with :func:`yaml_field`:
   its default, YAML key, kind, role and docs text, e.g.
   ``vfio_driver: str = yaml_field("auto", "vfioDriver", VFIO_DRIVER, ACTION, "...")``.
2. If no existing :class:`Kind` fits its values, declare one here (its ``text`` is the docs'
   "takes" column) and give it a parser in ``config_check._PARSERS`` (a test fails while a
   kind has none). A value that refers to another field (``taintEffect`` only with
   ``path: dra``) is checked in ``config_check._relations``.
3. Run ``python scripts/config_docs.py`` to rewrite the table in ``docs/configuration.md``;
   add prose there if the field needs more than its line.

A top-level key (beside ``selectors``) is declared the same way on
:class:`~vfio_dp.model.config.Config` and read in ``config_check.parse_config``. A field the
file does not set directly (``bind_on_prepare``, from ``bind: onPrepare``) is a plain
dataclass field.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, NamedTuple, TypeVar

T = TypeVar("T")

Role = Literal["match", "where", "action"]
#: narrows which devices a selector takes; a selector must set one of these
MATCH: Role = "match"
#: narrows on which nodes the selector applies
WHERE: Role = "where"
#: says what happens to the devices taken (name, path, binding, VFs)
ACTION: Role = "action"

_META = "vfio_dp.yaml"


class Kind(NamedTuple):
    """What a field's value may be: ``name`` picks the parser (``config_check._PARSERS``),
    ``text`` is what the docs say it takes; a choice lists its ``choices`` (value, meaning).

    (This and :class:`YamlField` are NamedTuples, not frozen dataclasses: every ``vfioctl``
    command that reads a config defines them at start-up, and a NamedTuple costs about a
    sixth of a frozen slotted dataclass to define.)"""

    name: str
    text: str
    choices: tuple[tuple[str, str], ...] = ()

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.choices)

    @property
    def must_be(self) -> str:
        """``pf (SR-IOV PFs) or vf (their VFs)``: the checker's "must be ..." and the docs'."""
        return " or ".join(f"{v} ({m})" if m else v for v, m in self.choices)


def one_of(*values: str, meanings: Mapping[str, str] | None = None) -> Kind:
    """A field that takes one of ``values`` (each optionally with its meaning)."""
    notes = meanings or {}
    pairs = tuple((v, notes.get(v, "")) for v in values)
    text = " or ".join(f"`{v}` ({m})" if m else f"`{v}`" for v, m in pairs)
    return Kind("choice", text, pairs)


HEX4 = Kind("hex4", 'a 4-digit hex ID, quoted (`"10de"`), or a list of them')
HEX_PREFIX = Kind("hexPrefix", 'a 2, 4 or 6-digit hex prefix of the class (`"0108"`), or a list')
ADDRESSES = Kind("addresses", 'a list of PCI addresses (`["0000:65:00.0"]`)')
DRIVERS = Kind("drivers", "a list of kernel driver names (`[vfio-pci]`)")
NODE_PATTERNS = Kind("nodePatterns", 'a list of node names or shell globs (`[node-a, "gpu-*"]`)')
RESOURCE_NAME = Kind("resourceName", "a resource name; a bare name gets `resourceDomain`")
BIND = Kind("bind", "`false`, `true` or `onPrepare`")
COUNT = Kind("count", "a whole number, 0 or more")
DOMAIN = Kind("domain", "a DNS subdomain, lowercase")
SELECTORS = Kind("selectors", "a list of selectors, in order: the first match wins")
PERSONALITIES = Kind(
    "personalities",
    "a list of `vm` (its VFIO driver, for a VM) and `container` (its native driver's device "
    "nodes, for a container)",
)
VFIO_DRIVER = Kind("vfioDriver", "`auto`, `vfio-pci` or a kernel driver's name (`mlx5_vfio_pci`)")
#: the top-level ``mdev:`` list (its entries' own fields: :mod:`vfio_dp.model.mdev_config`,
#: loaded only where one is parsed or used)
MDEV_ENTRIES = Kind("mdevEntries", "a list of mdev entries ([below](#mediated-devices))")


class YamlField(NamedTuple):
    """One YAML key of a config dataclass: the attribute it fills and what
    :func:`yaml_field` declared with it."""

    attr: str
    key: str
    kind: Kind
    role: Role
    doc: str
    default: Any
    default_text: str | None

    @property
    def shown_default(self) -> str:
        """The default as the docs show it."""
        if self.default_text is not None:
            return self.default_text
        d = self.default
        if d is None or d == ():
            return "any" if self.role != ACTION else "—"
        if isinstance(d, bool):
            return f"`{str(d).lower()}`"
        return f"`{d}`"


def yaml_field(
    default: T, key: str, kind: Kind, role: Role, doc: str, *, default_text: str | None = None
) -> T:
    """A dataclass field the config file sets under ``key`` (see the module docstring)."""
    meta = {_META: (key, kind, role, doc, default_text)}
    return dataclasses.field(default=default, metadata=meta)


def yaml_fields(cls: type) -> tuple[YamlField, ...]:
    """The YAML fields of a config dataclass, in declaration order."""
    out: list[YamlField] = []
    for f in dataclasses.fields(cls):
        if _META in f.metadata:
            key, kind, role, doc, default_text = f.metadata[_META]
            out.append(YamlField(f.name, key, kind, role, doc, f.default, default_text))
    return tuple(out)


def markdown_table(fields: tuple[YamlField, ...]) -> str:
    """The docs' table of ``fields``: key, what it takes, its default, what it does."""
    rows = ["| key | takes | default | what it does |", "|---|---|---|---|"]
    for f in fields:
        role = {MATCH: "match: ", WHERE: "where: ", ACTION: ""}[f.role]
        rows.append(f"| `{f.key}` | {f.kind.text} | {f.shown_default} | {role}{f.doc} |")
    return "\n".join(rows) + "\n"
