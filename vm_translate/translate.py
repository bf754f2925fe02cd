"""VM specs and annotated Pods → JSONPatch + the mutated object (pure: no I/O, no clock).

KubeVirt VMI / VM template — only ``deviceName`` is rewritten (KubeVirt itself turns the
entries into the launcher pod's requests)::

    {"kind": "VirtualMachineInstance", "spec": {"domain": {"devices": {
        "gpus": [{"name": "gpu1", "deviceName": "10DE:1EB8"}]}}}}
    →  [{"op": "replace", "path": "/spec/domain/devices/gpus/0/deviceName",
         "value": "devices.kubevirt.io/10de_1eb8"}]

Pod with ``devices.kubevirt.io/passthrough`` — each entry adds ``count`` to BOTH requests and
limits of its resource in the target container (``devices.kubevirt.io/passthrough-container``,
else the first), adding to what is already there, and records what it applied::

    metadata.annotations["devices.kubevirt.io/passthrough-applied"] =
        '{"container":"compute","resources":{"devices.kubevirt.io/10de_1eb8":2}}'

A second translation subtracts the recorded amounts before adding, so it changes nothing
(idempotent — the API server may call a webhook twice with ``reinvocationPolicy: IfNeeded``).
Kubernetes requires requests == limits for extended resources; both are always written equal.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vfio_dp.model.config import Config
from vm_translate.annotation import parse_passthrough
from vm_translate.entries import DeviceEntry
from vm_translate.errors import Problem, SpecError
from vm_translate.patch import JsonPatchOp, apply_patch, pointer
from vm_translate.spec import (
    APPLIED_ANNOTATION,
    CONTAINER_ANNOTATION,
    PASSTHROUGH_ANNOTATION,
    POD_KIND,
    describe,
    devices_path,
    dig,
    vm_object_entries_raw,
)

_WHOLE = re.compile(r"[0-9]+")


@dataclass(frozen=True, slots=True)
class Translation:
    """The outcome for one object: the patch, the object with the patch applied, and the
    device resources it ends up requesting (for the optional node-capacity check)."""

    subject: str
    patch: tuple[JsonPatchOp, ...]
    source: Mapping[str, Any]  # the object as given
    requests: Mapping[str, int] = field(default_factory=dict)

    @property
    def obj(self) -> Mapping[str, Any]:
        """The object with the patch applied (a deep copy, made on each use: the webhook
        answers with the patch alone and never needs it)."""
        return apply_patch(self.source, list(self.patch)) if self.patch else self.source

    @property
    def changed(self) -> bool:
        return bool(self.patch)


def translate(obj: Mapping[str, Any], config: Config) -> Translation:
    """Translate a VMI, VM or Pod; other kinds (and Pods without the annotation) pass unchanged.

    Raises :class:`~vm_translate.errors.SpecError` listing every wrong entry.
    """
    subject = describe(obj)
    path = devices_path(obj)
    if path is not None:
        ops, requests = _vm_ops(obj, path, config, subject)
    elif obj.get("kind") == POD_KIND:
        ops, requests = _pod_ops(obj, config, subject)
    else:
        return Translation(subject, (), obj)
    return Translation(subject, tuple(ops), obj, requests)


def _vm_ops(
    obj: Mapping[str, Any], path: tuple[str, ...], config: Config, subject: str
) -> tuple[list[JsonPatchOp], dict[str, int]]:
    raw, resolved, problems = vm_object_entries_raw(obj, path, config)
    if problems:
        raise SpecError(subject, problems)
    ops: list[JsonPatchOp] = []
    requests: Counter[str] = Counter()
    # without problems every raw entry resolved to exactly one entry, in order
    for entry, done in zip(raw, resolved, strict=True):
        if not isinstance(done, DeviceEntry):
            continue  # a DRA claim entry: the scheduler allocates it, nothing to rewrite
        requests[done.resource] += 1
        if entry.device_name != done.resource:
            where = pointer(*path, entry.list_key, entry.index, "deviceName")
            ops.append({"op": "replace", "path": where, "value": done.resource})
    return ops, dict(requests)


# --------------------------------------------------------------------------- Pods


def _pod_ops(
    obj: Mapping[str, Any], config: Config, subject: str
) -> tuple[list[JsonPatchOp], dict[str, int]]:
    annotations = dig(obj, ("metadata", "annotations"))
    if not isinstance(annotations, Mapping) or PASSTHROUGH_ANNOTATION not in annotations:
        return [], {}
    where = f"metadata.annotations[{PASSTHROUGH_ANNOTATION}]"
    entries, problems = parse_passthrough(annotations[PASSTHROUGH_ANNOTATION], config, where)
    containers = dig(obj, ("spec", "containers"))
    if not isinstance(containers, list) or not containers:
        problems.append(
            Problem("spec.containers", containers, "a pod needs at least one container")
        )
        raise SpecError(subject, problems)
    odd = [(ci, c) for ci, c in enumerate(containers) if not isinstance(c, Mapping)]
    if odd:
        problems += [
            Problem(f"spec.containers[{ci}]", c, "a container is an object with a name")
            for ci, c in odd
        ]
        raise SpecError(subject, problems)
    names = [c.get("name") for c in containers]
    target = _target_container(annotations, names, problems)
    previous = _previous(annotations, problems)
    wanted: dict[str, int] = {}
    for e in entries:
        wanted[e.resource] = wanted.get(e.resource, 0) + e.count
    if problems:
        raise SpecError(subject, problems)
    assert target is not None

    # New totals per container index: base (current minus what we applied before) + wanted.
    updates: dict[int, dict[str, int]] = {}
    prev_container, prev_resources = previous if previous else (None, {})
    for name, amount in prev_resources.items():
        if prev_container in names:
            ci = names.index(prev_container)
            cur = _current(containers[ci], ci, name, problems)
            updates.setdefault(ci, {})[name] = max(0, cur - amount)
    for name, amount in wanted.items():
        slot = updates.setdefault(target, {})
        base = slot[name] if name in slot else _current(containers[target], target, name, problems)
        slot[name] = base + amount
    if problems:
        raise SpecError(subject, problems)

    ops: list[JsonPatchOp] = []
    for ci in sorted(updates):
        ops += _container_ops(containers[ci], ci, updates[ci])
    record = json.dumps(
        {"container": names[target], "resources": wanted}, sort_keys=True, separators=(",", ":")
    )
    if annotations.get(APPLIED_ANNOTATION) != record:
        path = pointer("metadata", "annotations", APPLIED_ANNOTATION)
        ops.append({"op": "add", "path": path, "value": record})
    return ops, {name: updates[target][name] for name in wanted}


def _target_container(
    annotations: Mapping[str, Any], names: list[object], problems: list[Problem]
) -> int | None:
    chosen = annotations.get(CONTAINER_ANNOTATION)
    if chosen is None:
        return 0
    if chosen in names:
        return names.index(chosen)
    listed = ", ".join(repr(n) for n in names)
    problems.append(
        Problem(
            f"metadata.annotations[{CONTAINER_ANNOTATION}]",
            chosen,
            f"no such container; the pod has {listed}: name one of them or drop the annotation "
            "to use the first",
        )
    )
    return None


def _previous(
    annotations: Mapping[str, Any], problems: list[Problem]
) -> tuple[str, dict[str, int]] | None:
    """What an earlier translation applied (from :data:`APPLIED_ANNOTATION`), if any."""
    text = annotations.get(APPLIED_ANNOTATION)
    if text is None:
        return None
    fix = "it is written by the vfio_dp webhook; delete it and let the webhook set it"
    try:
        data = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        data = None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("container"), str)
        or not isinstance(data.get("resources"), dict)
        or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in data["resources"].items()
        )
    ):
        problems.append(Problem(f"metadata.annotations[{APPLIED_ANNOTATION}]", text, fix))
        return None
    return data["container"], dict(data["resources"])


def _whole(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and _WHOLE.fullmatch(value):
        return int(value)
    return None


def _current(container: object, ci: int, name: str, problems: list[Problem]) -> int:
    """The count of ``name`` a container already asks for (limits, else requests)."""
    values: dict[str, int | None] = {}
    for section in ("requests", "limits"):
        raw = dig(container, ("resources", section, name))
        if raw is None:
            values[section] = None
            continue
        parsed = _whole(raw)
        if parsed is None:
            problems.append(
                Problem(
                    f"spec.containers[{ci}].resources.{section}[{name}]",
                    raw,
                    "a device resource is a whole number of devices, e.g. '1'",
                )
            )
        values[section] = parsed
    req, lim = values["requests"], values["limits"]
    if req is not None and lim is not None and req != lim:
        problems.append(
            Problem(
                f"spec.containers[{ci}].resources[{name}]",
                {"requests": req, "limits": lim},
                "Kubernetes requires requests == limits for extended resources; make them equal",
            )
        )
    return lim if lim is not None else (req or 0)


def _container_ops(container: Mapping[str, Any], ci: int, new: dict[str, int]) -> list[JsonPatchOp]:
    ops: list[JsonPatchOp] = []
    base = ("spec", "containers", ci, "resources")
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        values = {k: str(v) for k, v in new.items() if v > 0}
        if values:
            value = {"requests": dict(values), "limits": dict(values)}
            ops.append({"op": "add", "path": pointer(*base), "value": value})
        return ops
    for section in ("requests", "limits"):
        current = resources.get(section)
        if not isinstance(current, Mapping):
            values = {k: str(v) for k, v in new.items() if v > 0}
            if values:
                ops.append({"op": "add", "path": pointer(*base, section), "value": values})
            continue
        for name, amount in new.items():
            path = pointer(*base, section, name)
            if amount == 0:
                if name in current:
                    ops.append({"op": "remove", "path": path})
            elif _whole(current.get(name)) != amount or name not in current:
                ops.append({"op": "add", "path": path, "value": str(amount)})
    return ops
