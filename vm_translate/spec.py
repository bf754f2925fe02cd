"""Reading passthrough entries out of VMs, VMIs and annotated Pods (pure).

Two sources, one typed result (:class:`DeviceEntry`):

- KubeVirt ``VirtualMachineInstance`` (``spec.domain.devices``) and ``VirtualMachine``
  (``spec.template.spec.domain.devices``)::

      hostDevices: [{name: nic1, deviceName: 8086:10d3}]           # vendor:device, either case
      gpus:        [{name: gpu1, deviceName: devices.kubevirt.io/10de_1eb8}]
      hostDevices: [{name: nic2, claimName: nics, requestName: nic}]  # DRA (KubeVirt >= 1.8.3)
      resourceClaims: [{name: nics, resourceClaimTemplateName: vm1-nics}]  # beside domain


- a Pod annotation ``devices.kubevirt.io/passthrough``, a JSON or YAML list::

      [{"name": "gpu", "vendor": "10de", "device": "1eb8", "count": 2},
       {"name": "nvme", "resource": "example.com/nvme-a"}]

A DRA entry (``claimName`` + ``requestName``, no ``deviceName``) is a :class:`ClaimEntry`:
its device comes from the claim, so nothing is resolved here; the claim must be one of the
object's ``resourceClaims``. An entry naming both ``deviceName`` and ``claimName`` is refused.

A ``deviceName`` / ``resource`` value becomes a resource name through
:func:`vm_translate.entries.resolve_device_name` (the typed entries live there too); this
module reads the entries out of the objects and lists every problem with its place. The
annotation's entries are parsed by :func:`vm_translate.annotation.parse_passthrough`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.model import naming
from vfio_dp.model.config import Config
from vm_translate.alias import Kind
from vm_translate.annotation import parse_passthrough
from vm_translate.entries import (
    ClaimEntry,
    DeviceEntry,
    Entry,
    VmClaim,
    alias_conflicts,
    claim_request_limits,
    resolve_device_name,
)
from vm_translate.errors import Problem, Unresolvable

PASSTHROUGH_ANNOTATION = "devices.kubevirt.io/passthrough"
CONTAINER_ANNOTATION = "devices.kubevirt.io/passthrough-container"
APPLIED_ANNOTATION = "devices.kubevirt.io/passthrough-applied"

VMI_KIND = "VirtualMachineInstance"
VM_KIND = "VirtualMachine"
POD_KIND = "Pod"

#: (list key in ``domain.devices``, alias kind), in the order KubeVirt's launcher hands out
#: addresses: generic host devices first, then GPUs.
DEVICE_LISTS: tuple[tuple[str, Kind], ...] = (("hostDevices", "hostdevice"), ("gpus", "gpu"))

#: a DRA entry's name (it becomes the alias ``ua-dra-<kind>-<name>`` unchanged)
_ENTRY_NAME = re.compile(r"[A-Za-z0-9_-]{1,63}")


# --------------------------------------------------------------------------- KubeVirt VMs


def devices_path(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
    """Key path to ``domain.devices`` for a VMI or VM object, None for other kinds."""
    kind = obj.get("kind")
    if kind == VMI_KIND:
        return ("spec", "domain", "devices")
    if kind == VM_KIND:
        return ("spec", "template", "spec", "domain", "devices")
    return None


def dig(obj: object, path: Sequence[str]) -> object:
    """``obj[path[0]][path[1]]...``, or None when a step is missing or not a mapping."""
    cur = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


@dataclass(frozen=True, slots=True)
class VmEntry:
    """A ``hostDevices[]`` / ``gpus[]`` entry as written, with its place in the object."""

    list_key: str  # "hostDevices" | "gpus"
    index: int
    kind: Kind
    name: object
    device_name: object
    claim_name: object = None
    request_name: object = None
    has_device_name: bool = False
    has_claim: bool = False

    def where(self, prefix: str) -> str:
        named = f" (name {self.name!r})" if isinstance(self.name, str) else ""
        return f"{prefix}.{self.list_key}[{self.index}]{named}"


def vm_entries(devices: object, prefix: str) -> tuple[list[VmEntry], list[Problem]]:
    """The raw entries of ``hostDevices`` then ``gpus`` (KubeVirt's launcher order)."""
    entries: list[VmEntry] = []
    problems: list[Problem] = []
    if devices is None:
        return entries, problems
    if not isinstance(devices, Mapping):
        return entries, [Problem(prefix, devices, "must be a mapping")]
    for key, kind in DEVICE_LISTS:
        items = devices.get(key)
        if items is None:
            continue
        if not isinstance(items, list):
            problems.append(Problem(f"{prefix}.{key}", items, "must be a list"))
            continue
        for i, item in enumerate(items):
            if not isinstance(item, Mapping):
                problems.append(Problem(f"{prefix}.{key}[{i}]", item, "must be a mapping"))
                continue
            entries.append(
                VmEntry(
                    key,
                    i,
                    kind,
                    item.get("name"),
                    item.get("deviceName"),
                    item.get("claimName"),
                    item.get("requestName"),
                    has_device_name="deviceName" in item,
                    has_claim="claimName" in item or "requestName" in item,
                )
            )
    return entries, problems


def claims_path(devices_at: Sequence[str]) -> tuple[str, ...]:
    """Key path to ``resourceClaims`` beside ``domain`` (``spec`` of a VMI or VM template)."""
    return (*devices_at[:-2], "resourceClaims")


def vm_claims(raw: object, prefix: str) -> tuple[dict[str, VmClaim], list[Problem]]:
    """``spec.resourceClaims`` by name; each names a claim or a template, exactly one."""
    out: dict[str, VmClaim] = {}
    problems: list[Problem] = []
    if raw is None:
        return out, problems
    if not isinstance(raw, list):
        return out, [Problem(prefix, raw, "must be a list")]
    for i, item in enumerate(raw):
        where = f"{prefix}[{i}]"
        name = item.get("name") if isinstance(item, Mapping) else None
        if not isinstance(item, Mapping) or not isinstance(name, str) or not name:
            problems.append(Problem(where, item, "each resource claim needs a name"))
            continue
        claim = item.get("resourceClaimName")
        template = item.get("resourceClaimTemplateName")
        if (claim is None) == (template is None) or not isinstance(claim or template, str):
            problems.append(
                Problem(
                    where,
                    dict(item),
                    "give exactly one of resourceClaimName (an existing ResourceClaim) or "
                    "resourceClaimTemplateName (one claim per VM from a template)",
                )
            )
            continue
        if name in out:
            problems.append(Problem(where, name, "resource claim names must be unique"))
            continue
        bad = _claim_name_problems(where, name, claim, template)
        if bad:
            problems.extend(bad)
            continue
        out[name] = VmClaim(name, claim, template)
    return out, problems


def _claim_name_problems(
    where: str, name: str, claim: str | None, template: str | None
) -> list[Problem]:
    """The names a claim's metadata path is built from (``<claims|templates>/<name>/``):
    the pod-level name a DNS label, an object's name a DNS subdomain (what the API server
    and virt-launcher accept; anything else can never be prepared or found)."""
    out: list[Problem] = []
    if not naming.is_dns_label(name):
        out.append(
            Problem(
                f"{where}.name",
                name[:100],
                "must be a DNS label (at most 63 of a-z, 0-9 and '-', alphanumeric at both "
                "ends): it names the claim in the pod and in its device-metadata path",
            )
        )
    for key, value in (("resourceClaimName", claim), ("resourceClaimTemplateName", template)):
        if value is not None and not naming.is_dns_subdomain(value):
            out.append(
                Problem(
                    f"{where}.{key}",
                    value[:100],
                    "must be a Kubernetes object name (DNS subdomain: at most 253 of a-z, "
                    "0-9, '-' and '.', alphanumeric at both ends)",
                )
            )
    return out


def resolve_vm_entries(
    entries: Sequence[VmEntry],
    config: Config,
    prefix: str,
    claims: Mapping[str, VmClaim] | None = None,
    claims_where: str = "spec.resourceClaims",
) -> tuple[list[Entry], list[Problem]]:
    """Resolve each entry's ``deviceName`` (device plugin) or check its claim (DRA); check
    names are present and aliases unique."""
    out: list[Entry] = []
    problems: list[Problem] = []
    known = claims or {}
    requests: dict[tuple[str, str], str] = {}  # (claim, request) → the entry that has it
    for e in entries:
        ok = True
        if not isinstance(e.name, str) or not e.name:
            problems.append(Problem(f"{e.where(prefix)}.name", e.name, "every entry needs a name"))
            ok = False
        if e.has_claim:
            where = e.where(prefix)
            claim = _claim_entry(e, where, known, claims_where, problems)
            if claim is not None and (claim.claim_name, claim.request_name) in requests:
                # a request's metadata names ONE device per entry: hostdev would refuse both
                problems.append(
                    Problem(
                        where,
                        claim.name,
                        f"claim {claim.claim_name!r} request {claim.request_name!r} is "
                        f"already the entry {requests[claim.claim_name, claim.request_name]!r}: "
                        "one entry per request (give the claim a request per device)",
                    )
                )
            elif ok and claim is not None:
                requests[claim.claim_name, claim.request_name] = claim.name
                out.append(claim)
            continue
        try:
            resource = resolve_device_name(e.device_name, config)
        except Unresolvable as why:
            problems.append(Problem(f"{e.where(prefix)}.deviceName", e.device_name, str(why)))
            continue
        if ok:
            assert isinstance(e.name, str)
            out.append(DeviceEntry(name=e.name, resource=resource, kind=e.kind))
    problems.extend(alias_conflicts(out, prefix))
    problems.extend(claim_request_limits(out, claims_where))
    return out, problems


def _claim_entry(
    e: VmEntry,
    where: str,
    known: Mapping[str, VmClaim],
    claims_where: str,
    problems: list[Problem],
) -> ClaimEntry | None:
    if e.has_device_name:
        problems.append(
            Problem(
                where,
                {"deviceName": e.device_name, "claimName": e.claim_name},
                "name either deviceName (a device-plugin resource) or claimName + requestName "
                "(a DRA claim), not both; drop one",
            )
        )
        return None
    bad = False
    for key, val in (("claimName", e.claim_name), ("requestName", e.request_name)):
        if not isinstance(val, str) or not val:
            problems.append(
                Problem(
                    f"{where}.{key}",
                    val,
                    "a DRA entry needs both claimName (an entry of spec.resourceClaims) and "
                    "requestName (a request of that claim)",
                )
            )
            bad = True
    if bad:
        return None
    assert isinstance(e.claim_name, str) and isinstance(e.request_name, str)
    request_problem = naming.request_name_problem(e.request_name)
    if request_problem is not None:
        problems.append(Problem(f"{where}.requestName", e.request_name[:100], request_problem))
        return None
    if isinstance(e.name, str) and not _ENTRY_NAME.fullmatch(e.name):
        problems.append(
            Problem(
                f"{where}.name",
                e.name[:100],
                "a DRA entry's name becomes the device alias ua-dra-<kind>-<name>: at most 63 "
                "of A-Z, a-z, 0-9, '_' and '-'",
            )
        )
        return None
    if e.claim_name not in known:
        listed = ", ".join(sorted(known)) or "none"
        problems.append(
            Problem(
                f"{where}.claimName",
                e.claim_name,
                f"no such claim in {claims_where} (it has {listed}); add "
                f"{{name: {e.claim_name}, resourceClaimTemplateName: ...}} (or "
                "resourceClaimName) there, or fix the name",
            )
        )
        return None
    assert isinstance(e.name, str)
    return ClaimEntry(e.name, e.claim_name, e.request_name, e.kind)


# --------------------------------------------------------------------------- any object


def entries_of(
    obj: Mapping[str, Any], config: Config, subject: str
) -> tuple[list[Entry], list[Problem]]:
    """Every passthrough entry of a VMI, VM or annotated Pod, in address-assignment order."""
    path = devices_path(obj)
    if path is not None:
        return vm_object_entries(obj, path, config)
    annotations = dig(obj, ("metadata", "annotations"))
    if isinstance(annotations, Mapping) and PASSTHROUGH_ANNOTATION in annotations:
        where = f"metadata.annotations[{PASSTHROUGH_ANNOTATION}]"
        found, problems = parse_passthrough(annotations[PASSTHROUGH_ANNOTATION], config, where)
        return list(found), problems
    return [], []


def vm_object_entries(
    obj: Mapping[str, Any], path: Sequence[str], config: Config
) -> tuple[list[Entry], list[Problem]]:
    """The resolved entries of a VMI or VM (``path`` from :func:`devices_path`)."""
    _, resolved, problems = vm_object_entries_raw(obj, path, config)
    return resolved, problems


def vm_object_entries_raw(
    obj: Mapping[str, Any], path: Sequence[str], config: Config
) -> tuple[list[VmEntry], list[Entry], list[Problem]]:
    """:func:`vm_object_entries` with the raw entries they were resolved from (read once:
    the webhook needs both for every review)."""
    prefix = ".".join(path)
    raw, problems = vm_entries(dig(obj, path), prefix)
    cpath = claims_path(path)
    claims, more = vm_claims(dig(obj, cpath), ".".join(cpath))
    resolved, most = resolve_vm_entries(raw, config, prefix, claims, ".".join(cpath))
    return raw, resolved, problems + more + most


def describe(obj: Mapping[str, Any]) -> str:
    """``VirtualMachineInstance default/vm1`` — how errors name the object."""
    kind = obj.get("kind") or "object"
    ns = dig(obj, ("metadata", "namespace"))
    name = dig(obj, ("metadata", "name")) or dig(obj, ("metadata", "generateName")) or "<unnamed>"
    return f"{kind} {ns}/{name}" if isinstance(ns, str) and ns else f"{kind} {name}"
