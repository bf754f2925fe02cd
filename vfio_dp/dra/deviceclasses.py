"""DeviceClasses that let a pod's extended-resource limit be served by DRA (KEP-5004): pure.

For every resource a ``path: dra`` selector produces, one DeviceClass whose CEL selects
exactly the devices our driver publishes under that resource (the ``resourceName`` attribute
every published device carries, :mod:`vfio_dp.dra.slices`) and whose ``extendedResourceName``
is the name KubeVirt asks for (:mod:`vfio_dp.model.naming`, the device plugin's name)::

    apiVersion: resource.k8s.io/v1
    kind: DeviceClass
    metadata:
      name: 10de-1eb8.devices.kubevirt.io
      labels: {app.kubernetes.io/managed-by: vfio-dp, app.kubernetes.io/part-of: vfio-dp}
    spec:
      extendedResourceName: devices.kubevirt.io/10de_1eb8
      selectors:
      - cel:
          expression: device.driver == "vfio.dra.vfio-dp.io" && (!("kind" in
            device.attributes["vfio.dra.vfio-dp.io"]) || device.attributes["vfio.dra.vfio-dp.io"].kind
            == "vfio") && "resourceName" in device.attributes["vfio.dra.vfio-dp.io"] &&
            device.attributes["vfio.dra.vfio-dp.io"].resourceName == "devices.kubevirt.io/10de_1eb8"

The ``kind`` guard keeps a VM's claim off every other entry of the pool (a group's container
entry, ``kind: native``: :mod:`vfio_dp.dra.personalities`; mdev slots); a device without
``kind`` is one an older plugin published, always a VFIO one (a rolling upgrade keeps
selecting it). The container entries have a class of their own, :func:`native_device_class`
(``native.<driver>``, no ``extendedResourceName``), which ``vfioctl deviceclasses`` prints
after the resources' classes.

Which names a selector produces: its ``resourceName``; else ``<domain>/<vendor>_<device>``
for each vendor × device it names; a selector that names no device IDs (``vendor: "10de"``,
``class: "0108"``) names each device after its own IDs, so its names come from the IDs the
caller lists (``vfioctl deviceclasses --device 10de:1eb8``), kept only where the config's
first match can give that selector the IDs (:mod:`vfio_dp.model.routes`). A selector left
without any class is a problem with the fix; so is a name longer than the 64 characters an
attribute holds (it is not published, nothing could select it).

A class without ``extendedResourceName`` is still reachable as
``deviceclass.resource.kubernetes.io/<class name>`` (:func:`extended_resource_name`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.errors import ConfigError
from vfio_dp.model import naming
from vfio_dp.model.config import DRA, Config, Selector
from vfio_dp.model.routes import routes_for_ids, selector_condition

API_VERSION = "resource.k8s.io/v1"
#: The name a class without ``extendedResourceName`` is reachable under (KEP-5004).
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
MANAGED_BY = ("app.kubernetes.io/managed-by", "vfio-dp")
#: the label every object of ours carries: the uninstall steps select by it
#: (``kubectl delete deviceclass -l app.kubernetes.io/part-of=vfio-dp``, docs/install.md)
PART_OF = ("app.kubernetes.io/part-of", "vfio-dp")
MAX_ATTRIBUTE_STRING = 64
MAX_NAME = 253
_NOT_LABEL = re.compile(r"[^a-z0-9]+")
_DRIVER_IN = re.compile(r'device\.driver == "([^"]+)" && ')


@dataclass(frozen=True, slots=True)
class DraResource:
    """One resource the DRA path serves, and the selectors that produce it."""

    name: str
    selectors: tuple[int, ...]


def extended_resource_name(device_class: Mapping[str, Any]) -> str:
    """The extended resource a DeviceClass serves: its ``spec.extendedResourceName``, else
    the implicit ``deviceclass.resource.kubernetes.io/<name>``."""
    spec = device_class.get("spec") or {}
    explicit = spec.get("extendedResourceName") if isinstance(spec, Mapping) else None
    if isinstance(explicit, str) and explicit:
        return explicit
    name = (device_class.get("metadata") or {}).get("name", "")
    return f"{IMPLICIT_PREFIX}{name}"


def _names_of(
    config: Config, index: int, sel: Selector, ids: Sequence[tuple[str, str]]
) -> list[str]:
    if sel.resource_name:
        return [sel.resource_name]
    if sel.vendors and sel.devices:
        return [
            naming.default_resource_name(v, d, config.resource_domain)
            for v in sel.vendors
            for d in sel.devices
        ]
    out: list[str] = []
    for vendor, device in ids:
        if not sel.admits_ids(vendor, device):
            continue
        if any(r.index == index for r in routes_for_ids(config, vendor, device)):
            out.append(naming.default_resource_name(vendor, device, config.resource_domain))
    return out


def _describe(sel: Selector) -> str:
    ids = [
        f"{k} {' or '.join(v)}" for k, v in (("vendor", sel.vendors), ("device", sel.devices)) if v
    ]
    return ", ".join([*ids, *filter(None, [selector_condition(sel)])])


def dra_resources(
    config: Config, ids: Sequence[tuple[str, str]] = (), source: str = "<config>"
) -> list[DraResource]:
    """Every resource the config's ``path: dra`` selectors produce (for open selectors: for
    ``ids``), in order of first appearance. Raises :class:`ConfigError` naming each DRA
    selector that gets no name, and each name no CEL could select."""
    ids = [(v.lower(), d.lower()) for v, d in ids]
    found: dict[str, list[int]] = {}
    problems: list[tuple[str, object, str]] = []
    for index, sel in enumerate(config.selectors):
        if not (config.any_path or sel.path == DRA):
            continue
        names = _names_of(config, index, sel, ids)
        if not names:
            given = ", ".join(f"{v}:{d}" for v, d in ids) or "none"
            problems.append(
                (
                    f"selectors[{index}]",
                    _describe(sel),
                    "names each device after its own vendor:device IDs and none of the IDs "
                    f"given (--device: {given}) reaches it; list the IDs of its devices "
                    "(vfioctl list shows them), e.g. --device 10de:1eb8, or give it a "
                    "resourceName",
                )
            )
        for name in names:
            if len(name) > MAX_ATTRIBUTE_STRING:
                problems.append(
                    (
                        f"selectors[{index}].resourceName",
                        name,
                        f"longer than the {MAX_ATTRIBUTE_STRING} characters a ResourceSlice "
                        "attribute holds: the DRA plugin cannot publish it and no DeviceClass "
                        "can select it; choose a shorter name",
                    )
                )
                continue
            found.setdefault(name, []).append(index)
    if problems:
        raise ConfigError(source, problems)
    return [DraResource(n, tuple(i)) for n, i in found.items()]


def class_name(resource: str) -> str:
    """The DeviceClass name for a resource: ``<name part as DNS labels>.<domain>``
    (``devices.kubevirt.io/10de_1eb8`` → ``10de-1eb8.devices.kubevirt.io``); a hash of the
    resource name is appended to the first label when the name part had to change beyond
    ``_`` → ``-`` (so ``A_b`` and ``a-b`` never share a class)."""
    domain, _, short = resource.partition("/")
    labels = [_NOT_LABEL.sub("-", part.lower()).strip("-") for part in short.split(".")]
    labels = [label[:63].rstrip("-") or "x" for label in labels]
    lossless = ".".join(labels) == short.replace("_", "-")
    if not lossless:
        digest = hashlib.sha256(resource.encode()).hexdigest()[:8]
        labels[0] = f"{labels[0][:54].rstrip('-')}-{digest}"
    name = ".".join([*labels, domain])
    if len(name) > MAX_NAME:
        digest = hashlib.sha256(resource.encode()).hexdigest()[:12]
        name = f"vfio-{digest}.{domain}"
    return name


def kind_guard(driver: str, kind: str = "vfio") -> str:
    """CEL true for ``driver``'s devices of ``kind`` (for ``vfio``: also a device without
    the attribute, published before it existed)."""
    attr = f'device.attributes["{driver}"]'
    if kind == "vfio":
        return f'(!("kind" in {attr}) || {attr}.kind == "vfio")'
    return f'"kind" in {attr} && {attr}.kind == "{kind}"'


def selector_expression(driver: str, resource: str, *, guarded: bool = True) -> str:
    """CEL selecting exactly ``driver``'s VFIO devices published under ``resource``
    (``guarded=False``: the expression before the ``kind`` guard, still recognised by
    :func:`ours` in classes applied by an older release)."""
    attr = f'device.attributes["{driver}"]'
    guard = f"{kind_guard(driver)} && " if guarded else ""
    return (
        f'device.driver == "{driver}" && {guard}"resourceName" in {attr} && '
        f'{attr}.resourceName == "{resource}"'
    )


def native_class_name(driver: str) -> str:
    """``native.<driver>``: the DeviceClass of the container entries."""
    return f"native.{driver}"


def native_device_class(driver: str) -> dict[str, Any]:
    """The DeviceClass selecting every container entry (``kind: native``) of ``driver``: a
    claim asks for ``native.<driver>`` and narrows with CEL on ``pciBusID``, ``numaNode`` or
    ``nativeDriver``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {
            "name": native_class_name(driver),
            "labels": {MANAGED_BY[0]: MANAGED_BY[1], PART_OF[0]: PART_OF[1]},
        },
        "spec": {
            "selectors": [
                {
                    "cel": {
                        "expression": f'device.driver == "{driver}" && {kind_guard(driver, "native")}'
                    }
                }
            ]
        },
    }


def mdev_class_name(driver: str, type_id: str) -> str:
    """``<type>.mdev.<driver>`` (``mtty-2.mdev.vfio.dra.vfio-dp.io``): the DeviceClass of
    one mdev type's entries; the type id as a DNS label (a hash added when that lost
    something: :func:`vfio_dp.model.naming.mdev_label`)."""
    return f"{naming.mdev_label(type_id)}.mdev.{driver}"


def mdev_device_class(driver: str, type_id: str) -> dict[str, Any]:
    """The DeviceClass selecting ``driver``'s mediated-device entries (``kind: mdev``,
    :mod:`vfio_dp.dra.mdev_slices`) of type ``type_id``: static instances and slots alike;
    a claim narrows with CEL on ``mdevParent``, ``pciBusID`` or ``numaNode``."""
    attr = f'device.attributes["{driver}"]'
    expression = (
        f'device.driver == "{driver}" && {kind_guard(driver, "mdev")} && '
        f'{attr}.mdevType == "{type_id}"'
    )
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {
            "name": mdev_class_name(driver, type_id),
            "labels": {MANAGED_BY[0]: MANAGED_BY[1], PART_OF[0]: PART_OF[1]},
        },
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def mdev_device_classes(config: Config, driver: str) -> list[dict[str, Any]]:
    """One :func:`mdev_device_class` per type the config's ``path: dra`` mdev entries name."""
    types = dict.fromkeys(e.type_id for e in config.mdev if e.path == "dra")
    return [mdev_device_class(driver, t) for t in types]


def ours(device_class: Mapping[str, Any]) -> tuple[str, str] | None:
    """(driver, resource) when ``device_class`` selects exactly what :func:`device_class`
    makes it select (its one CEL selector is :func:`selector_expression` of them), else None:
    a class we can count devices for without evaluating CEL (the webhook's node check)."""
    spec = device_class.get("spec")
    if not isinstance(spec, Mapping):
        return None
    selectors = spec.get("selectors")
    resource = spec.get("extendedResourceName")
    if not (isinstance(selectors, list) and len(selectors) == 1 and isinstance(resource, str)):
        return None
    cel = selectors[0].get("cel") if isinstance(selectors[0], Mapping) else None
    expression = cel.get("expression") if isinstance(cel, Mapping) else None
    m = _DRIVER_IN.match(expression) if isinstance(expression, str) else None
    if m is None or expression not in (
        selector_expression(m.group(1), resource),
        selector_expression(m.group(1), resource, guarded=False),
    ):
        return None
    return m.group(1), resource


def device_class(resource: DraResource, driver: str) -> dict[str, Any]:
    """The DeviceClass object (the API's JSON form) for one resource."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceClass",
        "metadata": {
            "name": class_name(resource.name),
            "labels": {MANAGED_BY[0]: MANAGED_BY[1], PART_OF[0]: PART_OF[1]},
        },
        "spec": {
            "extendedResourceName": resource.name,
            "selectors": [{"cel": {"expression": selector_expression(driver, resource.name)}}],
        },
    }


def device_classes(
    config: Config,
    driver: str,
    ids: Sequence[tuple[str, str]] = (),
    source: str = "<config>",
) -> list[dict[str, Any]]:
    """Every DeviceClass the config's DRA resources need (see the module docstring)."""
    return [device_class(r, driver) for r in dra_resources(config, ids, source)]
