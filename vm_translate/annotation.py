"""Reading the ``devices.kubevirt.io/passthrough`` annotation of a Pod (pure).

The value is a JSON or YAML list, one entry per device group the Pod's containers want::

    [{"name": "gpu", "vendor": "10de", "device": "1eb8", "count": 2},
     {"name": "nvme", "resource": "example.com/nvme-a"}]

Each entry names a ``vendor`` + ``device`` (4 hex digits each, resolved through the config's
selectors: :func:`vm_translate.entries.resolve_ids`) or a ``resource`` name
(:func:`vm_translate.entries.resolve_device_name`), and a ``count`` (default 1). Every
problem is listed with its place (``metadata.annotations[...][i].vendor``); the
KubeVirt objects' entries are read by :mod:`vm_translate.spec`, which also picks the source
of an object (:func:`vm_translate.spec.entries_of`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from vfio_dp.model import naming
from vfio_dp.model.config import Config
from vm_translate.entries import DeviceEntry, alias_conflicts, resolve_device_name, resolve_ids
from vm_translate.errors import Problem, Unresolvable

_ENTRY_KEYS = ("name", "vendor", "device", "resource", "count")


def parse_passthrough(
    text: object, config: Config, where: str
) -> tuple[list[DeviceEntry], list[Problem]]:
    """Decode and resolve a ``devices.kubevirt.io/passthrough`` annotation value."""
    if not isinstance(text, str):
        return [], [Problem(where, text, "must be a string holding a JSON or YAML list")]
    data: object
    try:
        data = json.loads(text)
    except ValueError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            return [], [Problem(where, text, f"is neither JSON nor YAML: {e}")]
    if not isinstance(data, list) or not data:
        return [], [
            Problem(
                where,
                data,
                'must be a non-empty list, e.g. [{"name": "gpu", "vendor": "10de", '
                '"device": "1eb8"}] or [{"name": "nvme", "resource": "example.com/nvme-a"}]',
            )
        ]
    out: list[DeviceEntry] = []
    problems: list[Problem] = []
    for i, raw in enumerate(data):
        entry = _parse_annotation_entry(raw, config, f"{where}[{i}]", problems)
        if entry is not None:
            out.append(entry)
    problems.extend(alias_conflicts(out, where))
    return out, problems


def _parse_annotation_entry(
    raw: object, config: Config, where: str, problems: list[Problem]
) -> DeviceEntry | None:
    if not isinstance(raw, Mapping):
        problems.append(
            Problem(where, raw, "must be a mapping with name and vendor/device or resource")
        )
        return None
    before = len(problems)
    name = raw.get("name")
    if isinstance(name, str) and name:
        where = f"{where} (name {name!r})"
    else:
        problems.append(Problem(f"{where}.name", name, "every entry needs a non-empty name"))
    for key in raw:
        if key not in _ENTRY_KEYS:
            problems.append(
                Problem(f"{where}.{key}", raw[key], f"unknown key; known: {list(_ENTRY_KEYS)}")
            )
    count = raw.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        problems.append(
            Problem(f"{where}.count", count, "count must be a whole number >= 1; remove it for 1")
        )
    has_ids = "vendor" in raw or "device" in raw
    resource: str | None = None
    if has_ids and "resource" in raw:
        problems.append(
            Problem(where, dict(raw), "give either vendor+device or resource, not both")
        )
    elif has_ids:
        vendor, device = raw.get("vendor"), raw.get("device")
        bad = False
        for key, val in (("vendor", vendor), ("device", device)):
            if not isinstance(val, str) or not naming.is_valid_id(val):
                problems.append(
                    Problem(
                        f"{where}.{key}",
                        val,
                        f"{key} must be 4 hex digits as a string, e.g. '10de'",
                    )
                )
                bad = True
        if not bad:
            assert isinstance(vendor, str) and isinstance(device, str)
            try:
                resource = resolve_ids(vendor, device, config)
            except Unresolvable as why:
                problems.append(Problem(where, f"{vendor}:{device}", str(why)))
    elif "resource" in raw:
        try:
            resource = resolve_device_name(raw["resource"], config)
        except Unresolvable as why:
            problems.append(Problem(f"{where}.resource", raw["resource"], str(why)))
    else:
        problems.append(Problem(where, dict(raw), "needs vendor and device, or resource"))
    if len(problems) != before or resource is None:
        return None
    assert isinstance(name, str) and isinstance(count, int)
    return DeviceEntry(name=name, resource=resource, kind="hostdevice", count=count)
