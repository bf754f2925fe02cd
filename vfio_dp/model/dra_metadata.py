"""The KEP-5304 device-metadata format, written by the DRA plugin and read by ``vfioctl hostdev``.

One place for the format so the writer (:mod:`vfio_dp.dra.claimpath.metadata`) and every reader
(vm_translate's hostdev) cannot drift. Pure: strings in, typed values out, no I/O.

The file is a JSON *stream*: the same object once per supported version, newest first;
readers take the first version they know and skip the rest::

    {"apiVersion": "metadata.resource.k8s.io/v1alpha1", "kind": "DeviceMetadata",
     "metadata": {"name": "vm-nic", "namespace": "default", "uid": "6f1c...", "generation": 1},
     "podClaimName": "nic",                       # only for template-generated claims
     "requests": [{"name": "nic", "devices": [{"driver": "vfio.example.com",
         "pool": "node-1", "name": "pci-0000-3b-00-0",
         "attributes": {"resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"}}}]}]}

Inside the container KubeVirt >= 1.8.3 reads it at (:func:`container_path`)::

    /var/run/kubernetes.io/dra-device-attributes/resourceclaims/<claimName>/<request>/<driver>-metadata.json
    /var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/<podClaimName>/<request>/<driver>-metadata.json

the second for a claim generated from a template (annotation
``resource.kubernetes.io/pod-claim-name``). A request's JSON ``name`` may be
``<request>/<subrequest>`` (prioritized list) while the path uses ``<request>``; readers here
accept both (:func:`request_matches`) — KubeVirt's exact comparison misses the long form.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from vfio_dp.errors import MetadataFormatError
from vfio_dp.model import naming
from vfio_dp.model.json_depth import nesting_depth

API_VERSION = "metadata.resource.k8s.io/v1alpha1"
KIND = "DeviceMetadata"
#: Versions this code writes, newest first (the stream's order).
SUPPORTED_VERSIONS: tuple[str, ...] = (API_VERSION,)
CONTAINER_BASE = "/var/run/kubernetes.io/dra-device-attributes"
CLAIMS_SUBDIR = "resourceclaims"
TEMPLATES_SUBDIR = "resourceclaimtemplates"
FILE_SUFFIX = "-metadata.json"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
#: a mediated device's UUID, a bare attribute (KubeVirt's launcher reads it; it wins over
#: ``pciBusID`` when a device has both)
MDEV_UUID = "mdevUUID"
POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
#: A metadata file is small; a reader refuses anything bigger (hostile or corrupt input).
MAX_BYTES = 1 << 20
#: deepest nesting of arrays/objects in a metadata object (a valid one is 6 deep)
MAX_DEPTH = 32

AttributeKind = Literal["string", "int", "bool", "version"]
_KINDS: tuple[AttributeKind, ...] = ("string", "int", "bool", "version")


@dataclass(frozen=True, slots=True)
class Attribute:
    """One DRA device attribute: exactly one of ``string``, ``int``, ``bool``, ``version``."""

    kind: AttributeKind
    value: str | int | bool

    def to_json(self) -> dict[str, str | int | bool]:
        return {self.kind: self.value}


@dataclass(frozen=True, slots=True)
class MetadataDevice:
    driver: str
    pool: str
    name: str
    attributes: Mapping[str, Attribute] = field(default_factory=dict)

    @property
    def pci_bus_id(self) -> str | None:
        """``resource.kubernetes.io/pciBusID`` (``0000:3b:00.0``) when present as a string."""
        attr = self.attributes.get(PCI_BUS_ID)
        return attr.value if attr is not None and isinstance(attr.value, str) else None

    @property
    def mdev_uuid(self) -> str | None:
        """``mdevUUID`` when present as a string."""
        attr = self.attributes.get(MDEV_UUID)
        return attr.value if attr is not None and isinstance(attr.value, str) else None


@dataclass(frozen=True, slots=True)
class MetadataRequest:
    name: str  # "<request>" or "<request>/<subrequest>"
    devices: tuple[MetadataDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceMetadata:
    """One claim's metadata as one driver writes it (one file per claim and request)."""

    name: str  # the ResourceClaim's name
    namespace: str
    uid: str
    requests: tuple[MetadataRequest, ...] = ()
    pod_claim_name: str | None = None  # set for template-generated claims only
    generation: int = 1

    def devices_for(self, request: str) -> list[MetadataDevice]:
        """Every device of ``request`` (its base name, or ``<request>/<subrequest>``)."""
        return [d for r in self.requests if request_matches(r.name, request) for d in r.devices]


def request_base(name: str) -> str:
    """``gpu`` for ``gpu`` and for ``gpu/big`` (the name the container path uses)."""
    return name.partition("/")[0]


def request_matches(entry_name: str, request: str) -> bool:
    """Does a request entry named ``entry_name`` answer ``request``? Both ``request`` and
    ``request/<subrequest>`` do."""
    return entry_name == request or request_base(entry_name) == request


# -- names and paths -----------------------------------------------------------------------
def _check(kind: str, value: str, ok: bool) -> str:
    if not ok:
        raise MetadataFormatError("<path>", f"{kind} {value!r} is not a valid Kubernetes name")
    return value


def file_name(driver: str) -> str:
    """``<driver>-metadata.json``."""
    return _check("driver", driver, naming.dra_driver_name_problem(driver) is None) + FILE_SUFFIX


def container_dir(claim_name: str, request: str, pod_claim_name: str | None = None) -> str:
    """The directory the container sees for one claim and request (see module doc). Every
    component is validated as a Kubernetes name, so none can be ``..`` or contain ``/``."""
    req = request_base(request)
    _check("request", req, naming.is_dns_label(req))
    if pod_claim_name:
        _check("pod claim name", pod_claim_name, naming.is_dns_label(pod_claim_name))
        return f"{CONTAINER_BASE}/{TEMPLATES_SUBDIR}/{pod_claim_name}/{req}"
    _check("claim name", claim_name, naming.is_dns_subdomain(claim_name))
    return f"{CONTAINER_BASE}/{CLAIMS_SUBDIR}/{claim_name}/{req}"


def container_path(
    claim_name: str, request: str, driver: str, pod_claim_name: str | None = None
) -> str:
    """``/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm-nic/nic/<driver>-metadata.json``."""
    return f"{container_dir(claim_name, request, pod_claim_name)}/{file_name(driver)}"


def pod_claim_name(annotations: Mapping[str, str] | None) -> str | None:
    """The pod-level claim name of a template-generated ResourceClaim, from its annotations."""
    value = (annotations or {}).get(POD_CLAIM_NAME_ANNOTATION)
    return value or None


# -- writing -------------------------------------------------------------------------------
def to_object(meta: DeviceMetadata, api_version: str = API_VERSION) -> dict[str, object]:
    """The JSON object of one version."""
    obj: dict[str, object] = {
        "apiVersion": api_version,
        "kind": KIND,
        "metadata": {
            "name": meta.name,
            "namespace": meta.namespace,
            "uid": meta.uid,
            "generation": meta.generation,
        },
    }
    if meta.pod_claim_name:
        obj["podClaimName"] = meta.pod_claim_name
    obj["requests"] = [
        {
            "name": r.name,
            "devices": [
                {
                    "driver": d.driver,
                    "pool": d.pool,
                    "name": d.name,
                    "attributes": {k: a.to_json() for k, a in sorted(d.attributes.items())},
                }
                for d in r.devices
            ],
        }
        for r in meta.requests
    ]
    return obj


def render(meta: DeviceMetadata) -> str:
    """The file's text: one JSON object per supported version, newest first, one per line."""
    return "".join(
        json.dumps(to_object(meta, v), sort_keys=False, separators=(",", ":")) + "\n"
        for v in SUPPORTED_VERSIONS
    )


# -- reading -------------------------------------------------------------------------------
def _objects(text: str, source: str) -> list[object]:
    decoder = json.JSONDecoder()
    out: list[object] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            return out
        try:
            obj, i = decoder.raw_decode(text, i)
        except ValueError as e:
            raise MetadataFormatError(source, f"invalid JSON: {e}") from None
        except RecursionError:
            obj = None
            depth = MAX_DEPTH + 1
        else:
            depth = nesting_depth(obj, MAX_DEPTH)
        if depth > MAX_DEPTH:
            raise MetadataFormatError(
                source,
                f"JSON nested more than {MAX_DEPTH} levels deep (a metadata file is 6); "
                "not a device-metadata file",
            )
        out.append(obj)


def _str(obj: Mapping[str, object], key: str, where: str, source: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise MetadataFormatError(source, f"{where}.{key} must be a non-empty string")
    return value


def _list(obj: Mapping[str, object], key: str, where: str, source: str) -> list[object]:
    value = obj.get(key, [])
    if value is None:
        return []
    if not isinstance(value, list):
        raise MetadataFormatError(source, f"{where}.{key} must be a list")
    return value


def _map(value: object, where: str, source: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise MetadataFormatError(source, f"{where} must be an object")
    return value


def _attribute(value: object, where: str, source: str) -> Attribute:
    body = _map(value, where, source)
    kinds = [k for k in _KINDS if k in body]
    if len(kinds) != 1:
        raise MetadataFormatError(
            source, f"{where} must have exactly one of string, int, bool, version"
        )
    kind = kinds[0]
    v = body[kind]
    ok = (
        isinstance(v, bool)
        if kind == "bool"
        else (isinstance(v, int) and not isinstance(v, bool))
        if kind == "int"
        else isinstance(v, str)
    )
    if not ok:
        raise MetadataFormatError(source, f"{where}.{kind} has the wrong type: {v!r}")
    assert isinstance(v, str | int | bool)
    return Attribute(kind, v)


def attribute(value: object, where: str = "attribute") -> Attribute:
    """An attribute from its JSON form (``{"string": "0000:3b:00.0"}``, as in a ResourceSlice)."""
    return _attribute(value, where, "<attribute>")


def _from_object(obj: Mapping[str, object], source: str) -> DeviceMetadata:
    meta = _map(obj.get("metadata"), "metadata", source)
    gen = meta.get("generation", 0)
    if not isinstance(gen, int) or isinstance(gen, bool):
        raise MetadataFormatError(source, "metadata.generation must be an integer")
    pcn = obj.get("podClaimName")
    if pcn is not None and not isinstance(pcn, str):
        raise MetadataFormatError(source, "podClaimName must be a string")
    requests: list[MetadataRequest] = []
    for i, raw_req in enumerate(_list(obj, "requests", "", source)):
        rw = f"requests[{i}]"
        req = _map(raw_req, rw, source)
        devices: list[MetadataDevice] = []
        for j, raw_dev in enumerate(_list(req, "devices", rw, source)):
            dw = f"{rw}.devices[{j}]"
            dev = _map(raw_dev, dw, source)
            attrs = _map(dev.get("attributes") or {}, f"{dw}.attributes", source)
            devices.append(
                MetadataDevice(
                    driver=_str(dev, "driver", dw, source),
                    pool=_str(dev, "pool", dw, source),
                    name=_str(dev, "name", dw, source),
                    attributes={
                        k: _attribute(v, f"{dw}.attributes[{k!r}]", source)
                        for k, v in attrs.items()
                    },
                )
            )
        name = _str(req, "name", rw, source)
        problem = naming.request_name_problem(name)
        if problem is not None:
            raise MetadataFormatError(source, f"{rw}.name: {problem}")
        requests.append(MetadataRequest(name, tuple(devices)))
    return DeviceMetadata(
        name=_str(meta, "name", "metadata", source),
        namespace=_str(meta, "namespace", "metadata", source),
        uid=_str(meta, "uid", "metadata", source),
        requests=tuple(requests),
        pod_claim_name=pcn or None,
        generation=gen,
    )


def parse(text: str | bytes, source: str = "<string>") -> DeviceMetadata:
    """The first object of a version we know (the newest we support), skipping others.

    Raises :class:`MetadataFormatError` naming ``source`` for bad JSON, a stream with no
    known version, or a known version with missing or mistyped fields. Fields this code does
    not use (e.g. a device's ``networkData``) are ignored, as the Go readers do.
    """
    if isinstance(text, bytes):
        if len(text) > MAX_BYTES:
            raise MetadataFormatError(source, f"larger than {MAX_BYTES} bytes")
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MetadataFormatError(source, f"not UTF-8: {e}") from None
    if len(text) > MAX_BYTES:
        raise MetadataFormatError(source, f"larger than {MAX_BYTES} bytes")
    seen: list[str] = []
    for obj in _objects(text, source):
        if not isinstance(obj, dict):
            raise MetadataFormatError(source, "each stream entry must be a JSON object")
        version, kind = obj.get("apiVersion"), obj.get("kind")
        if kind == KIND and version in SUPPORTED_VERSIONS:
            return _from_object(obj, source)
        seen.append(f"{version}/{kind}")
    why = "empty" if not seen else f"no known version (saw {', '.join(seen)}; know {API_VERSION})"
    raise MetadataFormatError(source, why)


def pci_bus_ids(meta: DeviceMetadata, request: str, driver: str | None = None) -> list[str]:
    """The ``pciBusID`` of every device of ``request`` (of ``driver`` when given), in order."""
    out = []
    for d in meta.devices_for(request):
        if driver is not None and d.driver != driver:
            continue
        if d.pci_bus_id is not None:
            out.append(d.pci_bus_id)
    return out


def build(
    *,
    claim_name: str,
    namespace: str,
    uid: str,
    request: str,
    devices: Sequence[MetadataDevice],
    pod_claim_name: str | None = None,
) -> DeviceMetadata:
    """One claim and request's metadata (the unit of one file)."""
    return DeviceMetadata(
        name=claim_name,
        namespace=namespace,
        uid=uid,
        requests=(MetadataRequest(request, tuple(devices)),),
        pod_claim_name=pod_claim_name,
    )
