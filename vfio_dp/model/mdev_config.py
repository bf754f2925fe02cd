"""The config's ``mdev:`` section: which mediated-device instances a node makes, and how.

::

    mdev:
      - parent: mtty                   # a parent name (/sys/class/mdev_bus/<name>),
        type: mtty-2                   #   a PCI address ("0000:3b:00.0"), or a PCI
        count: 2                       #   selector: {vendor: "10de", device: "1eb8"}
      - parent: {vendor: "10de", device: "1eb8"}
        type: nvidia-222               # a type id (mdev_supported_types/<type>)
        count: all                     # as many as available_instances allows
        resourceName: t4-1q            # optional
        create: static                 # static (default): made by the node process
                                       # onPrepare (path: dra): made at a claim's Prepare

One type per parent, as KubeVirt's ``mediatedDevicesConfiguration`` has it: two entries that
name the same parent (by the same text) are refused. ``path`` says which node process makes
them (``devicePlugin``, the default, or ``dra``), like a selector's. The node core's
:mod:`vfio_dp.core.mdev_reconcile` makes and removes the instances; each field is declared
once here (:mod:`vfio_dp.model.config_fields`), checked by :func:`parse_mdev`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config_fields import ACTION, MATCH, RESOURCE_NAME, Kind, one_of, yaml_field

if TYPE_CHECKING:
    from vfio_dp.model.config import Selector
    from vfio_dp.model.device import PciDevice

STATIC = "static"
ON_PREPARE = "onPrepare"
ALL = "all"
MDEV_PARENT = Kind(
    "mdevParent",
    'a parent name (`mtty`), a PCI address (`"0000:3b:00.0"`) or a PCI selector '
    '(`{vendor: "10de", device: "1eb8"}`)',
)
MDEV_TYPE = Kind("mdevType", "a type id under `mdev_supported_types` (`mtty-2`, `nvidia-222`)")
MDEV_COUNT = Kind("mdevCount", "a whole number, or `all`")
CREATE_KIND = one_of(
    STATIC, ON_PREPARE, meanings={STATIC: "by the node process", ON_PREPARE: "at Prepare"}
)
PATH_KIND = one_of("devicePlugin", "dra")

_NAME = re.compile(r"[A-Za-z0-9_.:-]{1,128}")


@dataclass(frozen=True, slots=True)
class MdevEntry:
    """One entry of ``mdev:`` (see the module docstring). ``parent`` is a parent's name or
    PCI address; ``parent_selector`` a PCI selector instead (then ``parent`` is None)."""

    parent: str | None = yaml_field(
        None, "parent", MDEV_PARENT, MATCH, "the parent(s)", default_text="required"
    )
    type_id: str = yaml_field(
        "", "type", MDEV_TYPE, MATCH, "the type to make instances of", default_text="required"
    )
    count: int | None = yaml_field(
        1, "count", MDEV_COUNT, ACTION, "instances per parent; `all`: as many as it has room for"
    )
    create: str = yaml_field(
        STATIC,
        "create",
        CREATE_KIND,
        ACTION,
        "when instances are made: `static` at start, reload and resync; `onPrepare` (only "
        "with `path: dra`) one per claim",
    )
    path: str = yaml_field(
        "devicePlugin", "path", PATH_KIND, ACTION, "the node process that makes and serves them"
    )
    resource_name: str | None = yaml_field(
        None,
        "resourceName",
        RESOURCE_NAME,
        ACTION,
        "the name its instances are advertised under",
        default_text="from the type's `name`",
    )
    parent_selector: Selector | None = None

    def describe(self) -> str:
        return f"{self.type_id} on {self.parent or 'the PCI parents its selector takes'}"

    def names(self, dev: PciDevice) -> bool:
        """Does this entry want instances made on ``dev`` (its PCI address, or a selector
        that takes it: ``<root>/sys/bus/pci/devices/<bdf>``'s ids, whatever its driver)?"""
        if self.parent is not None:
            return self.parent == str(dev.address)
        return self.parent_selector is not None and self.parent_selector.matches(dev)

    def resource_for(self, type_name: str | None, domain: str) -> str:
        """The resource a ``path: devicePlugin`` entry's instances are advertised under: its
        ``resourceName``, else the default made from the type's ``name`` file
        (:func:`vfio_dp.model.naming.default_mdev_resource_name`)."""
        if self.resource_name:
            return self.resource_name
        return naming.default_mdev_resource_name(type_name, self.type_id, domain)


SelectorParser = Callable[[object, str, str, list[tuple[str, object, str]]], "Selector | None"]


def _str(value: object, where: str, problems: list[tuple[str, object, str]], fix: str) -> str:
    if isinstance(value, str) and _NAME.fullmatch(value) and value not in (".", ".."):
        return value
    problems.append((where, value, fix))
    return ""


def _entry(
    raw: object,
    where: str,
    domain: str,
    problems: list[tuple[str, object, str]],
    parse_selector: SelectorParser,
) -> MdevEntry | None:
    from vfio_dp.model.config_check import unknown_key
    from vfio_dp.model.config_fields import yaml_fields

    if not isinstance(raw, Mapping):
        problems.append((where, raw, "must be a mapping with parent and type"))
        return None
    before = len(problems)
    keys = {f.key for f in yaml_fields(MdevEntry)}
    for key in raw:
        if key not in keys:
            problems.append((f"{where}.{key}", raw[key], unknown_key(str(key), keys)))
    values: dict[str, Any] = {}
    parent = raw.get("parent")
    if isinstance(parent, Mapping):
        values["parent_selector"] = parse_selector(parent, f"{where}.parent", domain, problems)
    elif parent is None:
        problems.append((f"{where}.parent", None, "missing: name the parent (mtty, a PCI address)"))
    else:
        text = _str(parent, f"{where}.parent", problems,
                    'must be a parent name (mtty), a PCI address ("0000:3b:00.0", quoted) '
                    'or a PCI selector ({vendor: "10de", device: "1eb8"})')  # fmt: skip
        try:
            values["parent"] = str(PciAddress.parse(text))
        except ValueError:
            values["parent"] = text
    if "type" not in raw:
        problems.append(
            (f"{where}.type", None, "missing: give a type id (vfioctl mdev lists them)")
        )
    else:
        values["type_id"] = _str(raw["type"], f"{where}.type", problems,
                                 "must be a type id as vfioctl mdev lists it (e.g. mtty-2)")  # fmt: skip
    count = raw.get("count", 1)
    if count == ALL:
        values["count"] = None
    elif isinstance(count, bool) or not isinstance(count, int) or count < 0:
        problems.append((f"{where}.count", count, "must be a whole number, 0 or more, or all"))
    else:
        values["count"] = count
    for key, attr, kind in (("create", "create", CREATE_KIND), ("path", "path", PATH_KIND)):
        if key in raw:
            if raw[key] in kind.values:
                values[attr] = raw[key]
            else:
                problems.append((f"{where}.{key}", raw[key], f"must be {kind.must_be}"))
    if values.get("create") == ON_PREPARE and values.get("path") != "dra":
        problems.append((f"{where}.create", ON_PREPARE,
                         "onPrepare needs path: dra (the device plugin has no Prepare step)"))  # fmt: skip
    if (name := raw.get("resourceName")) is not None:
        qualified = naming.qualify(name, domain) if isinstance(name, str) and name else ""
        why = naming.resource_name_problem(qualified) if qualified else "must be a string"
        if why:
            problems.append((f"{where}.resourceName", name, why))
        values["resource_name"] = qualified
    return MdevEntry(**values) if len(problems) == before else None


def parse_mdev(
    raw: object,
    domain: str,
    problems: list[tuple[str, object, str]],
    parse_selector: SelectorParser,
) -> tuple[MdevEntry, ...]:
    """The ``mdev:`` section, every problem appended to ``problems`` (place, value, fix)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        problems.append(("mdev", raw, "must be a list of {parent, type, count} entries"))
        return ()
    out: list[MdevEntry] = []
    seen: dict[str, tuple[int, str]] = {}
    for i, item in enumerate(raw):
        entry = _entry(item, f"mdev[{i}]", domain, problems, parse_selector)
        if entry is None:
            continue
        key = entry.parent if entry.parent is not None else repr(entry.parent_selector)
        if key in seen:
            j, other = seen[key]
            problems.append((f"mdev[{i}].parent", item.get("parent") if isinstance(item, Mapping) else item,
                             f"mdev[{j}] names this parent already (type {other}): one type per "
                             "parent, as KubeVirt's mediatedDevicesConfiguration; drop one"))  # fmt: skip
            continue
        seen[key] = (i, entry.type_id)
        out.append(entry)
    return tuple(out)
