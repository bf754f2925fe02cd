"""A VMI/VM that names devices by ``vendor:device`` or resource name → its DRA form (pure).

``vfioctl translate --dra`` uses this to move a VM from the device-plugin path to DRA
(KubeVirt ≥ 1.8.3 with ``HostDevicesWithDRA`` / ``GPUsWithDRA``). Every ``deviceName`` entry
becomes a claim entry of ONE ResourceClaimTemplate per VM, one request per entry (one device
each: KubeVirt takes exactly one device per request)::

    spec.domain.devices.hostDevices: [{name: nic1, deviceName: 8086:10d3}]
    →
    spec.domain.devices.hostDevices: [{name: nic1, claimName: vfio, requestName: nic1}]
    spec.resourceClaims: [{name: vfio, resourceClaimTemplateName: vm1-vfio}]
    ---
    apiVersion: resource.k8s.io/v1
    kind: ResourceClaimTemplate
    metadata: {name: vm1-vfio, namespace: default}
    spec:
      spec:
        devices:
          requests:
          - name: nic1
            exactly:
              deviceClassName: <driver>
              count: 1
              selectors:
              - cel: {expression: 'device.attributes["<driver>"].vendorID == "8086" &&
                                   device.attributes["<driver>"].deviceID == "10d3"'}

The DeviceClass named after the driver (``deploy/``) selects the driver's devices; the CEL
selector narrows to the IDs. A resource name is expressed through the configuration's
selectors that produce it (their vendor/device/class/subsystem IDs); what a CEL selector on
the published attributes cannot say (a selector by PCI address or by driver, a resource of
another provider such as ``nvidia.com/...``) is refused with the reason.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.model import naming
from vfio_dp.model.config import Config, Selector
from vm_translate.entries import resolve_device_name
from vm_translate.errors import Problem, SpecError, Unresolvable
from vm_translate.spec import (
    claims_path,
    describe,
    devices_path,
    dig,
    vm_entries,
    vm_object_entries,
)

RESOURCE_API = "resource.k8s.io/v1"
#: The VMI-level claim name used for the generated template (suffixed if already taken).
CLAIM_NAME = "vfio"
_PAIR = re.compile(r"([0-9a-fA-F]{4}):([0-9a-fA-F]{4})")
_DEFAULT_SHORT = re.compile(r"([0-9a-f]{4})_([0-9a-f]{4})")
_NOT_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class DraTranslation:
    """The VMI/VM in DRA form and the ResourceClaimTemplate it needs (None: nothing to move)."""

    subject: str
    obj: Mapping[str, Any]
    template: Mapping[str, Any] | None

    @property
    def objects(self) -> list[Mapping[str, Any]]:
        """What to ``kubectl apply -f -``: the template first, then the VM that names it."""
        return [self.template, self.obj] if self.template is not None else [self.obj]


def to_dra(obj: Mapping[str, Any], config: Config, driver: str) -> DraTranslation:
    """The DRA form of a VMI or VM. Raises :class:`SpecError` listing every entry that cannot
    be expressed (and every problem the admission check would find)."""
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
    _, problems = vm_object_entries(obj, path, config)
    raw, _ = vm_entries(dig(obj, path), prefix)
    requests: list[dict[str, Any]] = []
    moved: list[tuple[str, int, str]] = []  # (list key, index, request name)
    taken: set[str] = set()
    for e in raw:
        if e.has_claim:
            continue  # already a DRA entry: kept as it is
        where = e.where(prefix)
        try:
            resource = resolve_device_name(e.device_name, config)
        except Unresolvable:
            continue  # already listed by vm_object_entries
        expression = _cel_for(e.device_name, resource, config, driver, where, problems)
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
    if problems:
        raise SpecError(subject, problems)
    if not moved:
        return DraTranslation(subject, obj, None)
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
    return DraTranslation(subject, out, template)


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
    device_name: object,
    resource: str,
    config: Config,
    driver: str,
    where: str,
    problems: list[Problem],
) -> str | None:
    """The CEL expression selecting what ``deviceName`` meant, or None (problem recorded)."""
    attr = f'device.attributes["{driver}"]'
    if isinstance(device_name, str):
        m = _PAIR.fullmatch(device_name)
        if m:
            return _ids_cel(attr, [m.group(1).lower()], [m.group(2).lower()])
    selectors = [s for s in config.selectors if _names(s, config) == resource]
    domain, _, short = resource.partition("/")
    m = _DEFAULT_SHORT.fullmatch(short)
    if not selectors and m and domain == config.resource_domain:
        return _ids_cel(attr, [m.group(1)], [m.group(2)])
    if not selectors:
        problems.append(
            Problem(
                f"{where}.deviceName",
                device_name,
                f"no selector of the vfio_dp configuration produces {resource} (another "
                "provider's resource?), so the vfio_dp DRA driver cannot serve it; keep it as a "
                "deviceName entry (both paths work side by side) or name it as vendor:device",
            )
        )
        return None
    alternatives: list[str] = []
    for sel in selectors:
        if sel.addresses or sel.drivers:
            problems.append(
                Problem(
                    f"{where}.deviceName",
                    device_name,
                    f"{resource} is selected by PCI address or by driver in the configuration, "
                    "which a CEL selector on the published attributes cannot express; write the "
                    "ResourceClaimTemplate by hand (e.g. on the pciBusID attribute)",
                )
            )
            return None
        alternatives.append(_selector_cel(attr, sel))
    if len(alternatives) == 1:
        return alternatives[0]
    return " || ".join(f"({a})" for a in alternatives)


def _names(sel: Selector, config: Config) -> str | None:
    if sel.resource_name:
        return sel.resource_name
    if len(sel.vendors) == 1 and len(sel.devices) == 1:
        return naming.default_resource_name(sel.vendors[0], sel.devices[0], config.resource_domain)
    return None


def _any_of(attr: str, key: str, values: Sequence[str]) -> str:
    if len(values) == 1:
        return f'{attr}.{key} == "{values[0]}"'
    listed = ", ".join(f'"{v}"' for v in values)
    return f"{attr}.{key} in [{listed}]"


def _ids_cel(attr: str, vendors: Sequence[str], devices: Sequence[str]) -> str:
    return f"{_any_of(attr, 'vendorID', vendors)} && {_any_of(attr, 'deviceID', devices)}"


def _selector_cel(attr: str, sel: Selector) -> str:
    parts: list[str] = []
    for key, values in (
        ("vendorID", sel.vendors),
        ("deviceID", sel.devices),
        ("subsystemVendorID", sel.subsystem_vendors),
        ("subsystemDeviceID", sel.subsystem_devices),
    ):
        if values:
            parts.append(_any_of(attr, key, values))
    if sel.classes:
        ors = " || ".join(f'{attr}.classID.startsWith("{c}")' for c in sel.classes)
        parts.append(f"({ors})" if len(sel.classes) > 1 else ors)
    return " && ".join(parts) or "true"
