"""A VMI/VM that names devices by ``vendor:device`` or resource name → its DRA form (pure).

``vfioctl translate --dra`` uses this to move a VM to claim-based host devices (KubeVirt ≥
1.8.3 with ``HostDevicesWithDRA`` / ``GPUsWithDRA``). It converts exactly the ``deviceName``
entries whose devices the configuration sends to DRA (:mod:`vfio_dp.model.routes`: the
selectors that may take them all say ``path: dra``), leaves the others as they are, and says
for every entry which path serves it and why (:class:`EntryVerdict`). The converted entries
become the requests of ONE ResourceClaimTemplate per VM, one device each (KubeVirt takes
exactly one device per request); more than the 32 requests a claim holds are refused
(:data:`vm_translate.entries.MAX_CLAIM_REQUESTS`)::

    spec.domain.devices.hostDevices: [{name: gpu, deviceName: 10de:1eb8},
                                      {name: nic, deviceName: 8086:10d3}]    # a device-plugin NIC
    →
    spec.domain.devices.hostDevices: [{name: gpu, claimName: vfio, requestName: gpu},
                                      {name: nic, deviceName: 8086:10d3}]    # left as it is
    spec.resourceClaims: [{name: vfio, resourceClaimTemplateName: vm1-vfio}]
    ---
    apiVersion: resource.k8s.io/v1
    kind: ResourceClaimTemplate
    metadata: {name: vm1-vfio, namespace: default}
    spec:
      spec:
        devices:
          requests:
          - name: gpu
            exactly:
              deviceClassName: <driver>
              count: 1
              selectors:
              - cel: {expression: '"resourceName" in device.attributes["<driver>"] &&
                  device.attributes["<driver>"].resourceName == "devices.kubevirt.io/10de_1eb8"
                  && device.attributes["<driver>"].vendorID == "10de" && …deviceID == "1eb8"'}

The DeviceClass named after the driver (``deploy/``) selects the driver's devices; the CEL
selector narrows to the resource: the DRA plugin publishes every device with the
``resourceName`` attribute its selector gives it — the same name the device plugin would
advertise — so the request matches exactly what the entry asked for, whatever the selector
matched on (IDs, class, address, driver). A resource name longer than the 64 characters an
attribute holds is refused with the reason (a vendor:device entry then selects on its IDs).
An entry whose path depends on what a VM spec does not say (the device's class, driver or
address) is left, with the routes it could take; ``classes`` (``--pci-class``) settles the
class.

An entry naming a mediated-device type an ``mdev:`` entry with ``path: dra`` serves (by its
``resourceName``, or its type id such as ``nvidia-222``) becomes a request of that type's
class, ``<type>.mdev.<driver>`` (:func:`vfio_dp.dra.deviceclasses.mdev_device_class`), with
no selector: one instance, static or made at Prepare::

    - name: vgpu
      exactly: {deviceClassName: nvidia-222.mdev.<driver>, count: 1}
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.dra.deviceclasses import mdev_class_name
from vfio_dp.model import naming
from vfio_dp.model.config import DEVICE_PLUGIN, DRA, Config
from vfio_dp.model.mdev_config import MdevEntry
from vfio_dp.model.routes import ANY, Route, routes_for_ids, routes_for_name
from vm_translate.entries import claim_request_problem, resolve_device_name
from vm_translate.errors import Problem, SpecError, Unresolvable
from vm_translate.spec import (
    claims_path,
    describe,
    devices_path,
    dig,
    vm_object_entries_raw,
)

RESOURCE_API = "resource.k8s.io/v1"
#: The VMI-level claim name used for the generated template (suffixed if already taken).
CLAIM_NAME = "vfio"
#: The longest string attribute value a ResourceSlice holds (a longer resourceName is not
#: published, so no CEL can select on it).
MAX_ATTRIBUTE_STRING = 64
_PAIR = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{4})")
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class EntryVerdict:
    """What ``translate --dra`` did with one ``deviceName`` entry, and why."""

    where: str  # spec.domain.devices.hostDevices[0]
    name: str
    device_name: str
    path: str | None  # DRA, DEVICE_PLUGIN, or None (undecided, or no selector takes it)
    converted: bool
    why: str

    def describe(self) -> str:
        what = "converted to a claim request (DRA)" if self.converted else "left as deviceName"
        return f"{self.where} ({self.device_name}): {what}: {self.why}"


@dataclass(frozen=True, slots=True)
class DraTranslation:
    """The VMI/VM in DRA form and the ResourceClaimTemplate it needs (None: nothing to move),
    with a verdict per ``deviceName`` entry."""

    subject: str
    obj: Mapping[str, Any]
    template: Mapping[str, Any] | None
    verdicts: tuple[EntryVerdict, ...] = ()

    @property
    def objects(self) -> list[Mapping[str, Any]]:
        """What to ``kubectl apply -f -``: the template first, then the VM that names it."""
        return [self.template, self.obj] if self.template is not None else [self.obj]


def _routes(
    device_name: str, resource: str, config: Config, classes: Mapping[tuple[str, str], str]
) -> list[Route]:
    m = _PAIR.fullmatch(device_name)
    if m:
        vendor, device = m.group(1).lower(), m.group(2).lower()
        found = routes_for_ids(config, vendor, device, classes.get((vendor, device)))
    else:
        found = routes_for_name(config, resource, dict(classes))
    return [r for r in found if r.resource == resource]


def _verdict_path(routes: Sequence[Route], resource: str) -> tuple[str | None, str]:
    """The path that serves every route (None: none or several), and why, in words."""
    paths = {r.path for r in routes}
    listed = "; ".join(r.describe() for r in routes)
    if not routes:
        return None, (
            f"no selector of the configuration gives {resource} (another provider's "
            "resource?): the vfio_dp DRA driver cannot serve it; both paths work side by side"
        )
    if paths == {ANY}:
        return DRA, f"no selectors in the configuration: either process serves it ({listed})"
    if paths == {DRA}:
        return DRA, f"the DRA plugin serves it: {listed}"
    if paths == {DEVICE_PLUGIN}:
        return DEVICE_PLUGIN, f"the device plugin serves it: {listed}"
    return None, (
        f"the path depends on what the VM spec does not say: {listed}; tell the device's "
        "class with --pci-class VENDOR:DEVICE=CLASS, or name the IDs in the selectors"
    )


def to_dra(
    obj: Mapping[str, Any],
    config: Config,
    driver: str,
    classes: Mapping[tuple[str, str], str] | None = None,
) -> DraTranslation:
    """The DRA form of a VMI or VM: the entries the configuration sends to DRA become claim
    requests, the others stay. Raises :class:`SpecError` listing every entry that cannot be
    expressed (and every problem the admission check would find). ``classes`` maps a
    lowercase (vendor, device) to its 6-hex-digit PCI class, when the caller knows it."""
    subject = describe(obj)
    path = devices_path(obj)
    if path is None:
        raise SpecError(
            subject,
            [
                Problem(
                    "kind",
                    obj.get("kind"),
                    "translate --dra takes a VirtualMachineInstance or a VirtualMachine",
                )
            ],
        )
    why = naming.dra_driver_name_problem(driver)
    if why:
        raise SpecError(subject, [Problem("--driver-name", driver, why)])
    prefix = ".".join(path)
    raw, _, problems = vm_object_entries_raw(obj, path, config)
    requests: list[dict[str, Any]] = []
    moved: list[tuple[str, int, str]] = []  # (list key, index, request name)
    verdicts: list[EntryVerdict] = []
    taken: set[str] = set()
    for e in raw:
        if e.has_claim or not isinstance(e.device_name, str):
            continue  # already a DRA entry (kept as it is), or listed by the admission check
        where = e.where(prefix)
        mdev = _dra_mdev(e.device_name, config)
        if mdev is not None and isinstance(e.name, str):  # an mdev type the DRA plugin serves
            problems[:] = [p for p in problems if p.where != f"{where}.deviceName"]
            request = _request_name(e.name, taken)
            taken.add(request)
            cls = mdev_class_name(driver, mdev.type_id)
            requests.append({"name": request, "exactly": {"deviceClassName": cls, "count": 1}})
            moved.append((e.list_key, e.index, request))
            why = f"an mdev: entry with path: dra serves it ({mdev.describe()}; class {cls})"
            verdicts.append(EntryVerdict(where, e.name, e.device_name, DRA, True, why))
            continue
        try:
            resource = resolve_device_name(e.device_name, config)
        except Unresolvable:
            continue  # already listed by vm_object_entries
        routes = _routes(e.device_name, resource, config, classes or {})
        served_by, reason = _verdict_path(routes, resource)
        entry_name = e.name if isinstance(e.name, str) else "?"
        if served_by != DRA:
            verdicts.append(
                EntryVerdict(where, entry_name, e.device_name, served_by, False, reason)
            )
            continue
        expression = _cel_for(e.device_name, resource, driver, where, problems)
        if expression is None or not isinstance(e.name, str):
            continue
        request = _request_name(e.name, taken)
        taken.add(request)
        requests.append(
            {
                "name": request,
                "exactly": {
                    "deviceClassName": driver,
                    "count": 1,
                    "selectors": [{"cel": {"expression": expression}}],
                },
            }
        )
        moved.append((e.list_key, e.index, request))
        verdicts.append(EntryVerdict(where, entry_name, e.device_name, DRA, True, reason))
    too_many = claim_request_problem(CLAIM_NAME, len(requests), ".".join(claims_path(path)))
    if too_many is not None:
        problems.append(too_many)
    if problems:
        raise SpecError(subject, problems)
    if not moved:
        return DraTranslation(subject, obj, None, tuple(verdicts))
    out = copy.deepcopy(dict(obj))
    # a VM's template gets the claim too: each VMI it starts gets its own claim
    spec = out
    for key in claims_path(path)[:-1]:
        spec = spec[key]
    claims = spec.setdefault("resourceClaims", [])
    existing = {c.get("name") for c in claims if isinstance(c, Mapping)}
    claim = CLAIM_NAME
    n = 1
    while claim in existing:
        n += 1
        claim = f"{CLAIM_NAME}{n}"
    name = dig(obj, ("metadata", "name"))
    base = name if isinstance(name, str) and name else "vm"
    template_name = _label(f"{base}-{claim}", 253)
    claims.append({"name": claim, "resourceClaimTemplateName": template_name})
    devices = dig(out, path)
    assert isinstance(devices, dict)
    for list_key, index, request in moved:
        entry = devices[list_key][index]
        entry.pop("deviceName", None)
        entry["claimName"] = claim
        entry["requestName"] = request
    metadata: dict[str, Any] = {"name": template_name}
    namespace = dig(obj, ("metadata", "namespace"))
    if isinstance(namespace, str) and namespace:
        metadata["namespace"] = namespace
    template = {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": metadata,
        "spec": {"spec": {"devices": {"requests": requests}}},
    }
    return DraTranslation(subject, out, template, tuple(verdicts))


def _dra_mdev(device_name: str, config: Config) -> MdevEntry | None:
    """The ``mdev:`` entry with ``path: dra`` a ``deviceName`` names (case-folded): its
    ``resourceName`` (with or without the domain) or its type id (``nvidia-222``); None."""
    wanted = device_name.lower()
    for m in config.mdev:
        if m.path != DRA:
            continue
        names = {m.type_id.lower(), naming.qualify(m.type_id, config.resource_domain).lower()}
        if m.resource_name:
            names |= {m.resource_name.lower(), m.resource_name.partition("/")[2].lower()}
        if wanted in names:
            return m
    return None


def _request_name(entry_name: str, taken: set[str]) -> str:
    """A DNS label (≤ 63) from the entry's name, unique within the claim."""
    base = _label(entry_name, 63) or "device"
    name, n = base, 1
    while name in taken:
        n += 1
        suffix = f"-{n}"
        name = base[: 63 - len(suffix)].rstrip("-") + suffix
    return name


def _label(text: str, limit: int) -> str:
    return _NOT_LABEL.sub("-", text.lower()).strip("-")[:limit].rstrip("-")


def _cel_for(
    device_name: str, resource: str, driver: str, where: str, problems: list[Problem]
) -> str | None:
    """The CEL expression selecting what ``deviceName`` meant, or None (problem recorded):
    the published ``resourceName`` (guarded: a device without it does not match), and for
    a vendor:device entry its IDs too."""
    attr = f'device.attributes["{driver}"]'
    parts: list[str] = []
    if len(resource) <= MAX_ATTRIBUTE_STRING:
        parts.append(f'"resourceName" in {attr} && {attr}.resourceName == "{resource}"')
    m = _PAIR.fullmatch(device_name)
    if m:
        parts.append(f'{attr}.vendorID == "{m.group(1).lower()}"')
        parts.append(f'{attr}.deviceID == "{m.group(2).lower()}"')
    if not parts:
        problems.append(
            Problem(
                f"{where}.deviceName",
                device_name,
                f"{resource} is longer than the {MAX_ATTRIBUTE_STRING} characters a "
                "ResourceSlice attribute holds, so the DRA plugin does not publish it as "
                "resourceName and no CEL selector can name it; give the selector a shorter "
                "resourceName, or name the device as vendor:device",
            )
        )
        return None
    return " && ".join(parts)
