"""An API-server stand-in: behaves like kube-apiserver for the objects a DRA plugin touches.

Named as such on purpose — it is not kube-apiserver. It is a real HTTP server on loopback
(stdlib ``http.server``, one thread per connection) that the real ``kubernetes`` Python client
talks to through a generated kubeconfig (bearer token required; a wrong one gets 401). It
serves, with the real paths and verbs:

- ``/api/v1/nodes[/<name>]``: get, list, create (Nodes are seeded by tests);
- ``/api/v1/namespaces/<ns>/secrets[/<name>]`` and
  ``/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations[/<name>]`` (what the
  self-signed overlay's certificate Job reads and writes), with the same verbs as below;
- ``/apis/resource.k8s.io/v1/resourceslices[/<name>]``: get, list, watch, create, update,
  patch, delete, deletecollection; field selectors ``metadata.name``, ``spec.nodeName``,
  ``spec.driver`` (any other field label is a 400, as upstream), label selectors
  (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``);
- ``/apis/resource.k8s.io/v1/[namespaces/<ns>/]resourceclaims[/<name>[/status]]``: get,
  list, watch, create, update, patch, delete, deletecollection; ``status`` only through the
  ``/status`` subresource (create and main-resource updates keep the stored status, as
  upstream's strategy does).

Strict where the real server is strict:

- every body is decoded against the ``kubernetes`` client's models (``openapi_types`` and
  ``attribute_map``): an unknown field or a wrongly typed value is a 400 BadRequest
  ``strict decoding error: unknown field "spec.foo"``. (The real server does this with
  ``fieldValidation=Strict``, kubectl's default; in its ``Warn`` default it would drop the
  field silently — which is exactly the bug a test must see, so the stand-in always refuses.)
- ResourceSlice validation as upstream ``pkg/apis/resource/validation`` (and
  ``../shared/reference/dra.md``): 422 Invalid with one cause per problem — metadata name a DNS
  subdomain, no namespace on a cluster-scoped object, driver a DNS subdomain <= 63, pool name
  ``/``-separated DNS subdomains <= 253, generation >= 0, resourceSliceCount > 0, exactly one of
  nodeName/nodeSelector/allNodes/perDeviceNodeSelection, <= 128 devices (64 with taints or
  counters), device names DNS labels and unique, <= 16 taints per device (key a qualified
  label name, value a label value, effect None/NoSchedule/NoExecute, timeAdded RFC 3339), <= 32 attributes + capacities per device,
  attribute/capacity names a C identifier <= 32 or ``<DNS subdomain <= 63>/<C identifier <= 32>``,
  exactly one value per attribute, strings <= 64, versions semver <= 64, capacity values
  quantities; on update pool.name, driver and nodeName are immutable.
- create with ``metadata.resourceVersion`` set: 400; an existing name: 409 AlreadyExists;
  update/patch/delete with a stale ``resourceVersion`` (or delete precondition): 409 Conflict;
  a missing object: 404; ``metadata.generateName`` makes a name; bodies > 3 MiB: 413;
  a JSON Patch (the client's DEFAULT patch content type) whose body is not a list: 400.

Watch streams (``?watch=true``) send ``{"type", "object"}`` lines: with ``resourceVersion``
unset or ``"0"`` first an ADDED per existing object, then every change after it; with
``allowWatchBookmarks`` a BOOKMARK (only ``metadata.resourceVersion``) when a watch ends at its
``timeoutSeconds``; they end then, at :meth:`ApiServerStandin.end_watches` (what an API-server
restart or a dropped connection does) or :meth:`ApiServerStandin.stop`.

History: kept until :meth:`ApiServerStandin.compact` forgets it (etcd's compaction, which the
real server does every 5 minutes): then a watch from an older ``resourceVersion`` is answered
as kube-apiserver answers it, HTTP 200 and one ERROR event ``{"kind": "Status", "code": 410,
"reason": "Expired", "message": "too old resource version: <rv> (<oldest>)"}``, and a list
with ``resourceVersionMatch=Exact`` at an older one is a 410 Gone. A client must list again.

RBAC (when :attr:`ApiServerStandin.rules` is set, e.g. to a deploy ClusterRole's rules):
every request is authorized as the API server's RBAC authorizer would (403 Forbidden naming
the user, verb and resource); a write of a ResourceClaim's ``status.devices`` additionally
needs ``associated-node:update|patch`` on ``resourceclaims/driver`` named after each driver
whose entries change (Kubernetes >= 1.36, ``../shared/reference/dra.md``).

Tests may reach into :attr:`ApiServerStandin.store` only through :meth:`seed`, :meth:`objects`
and :attr:`requests` (what was called), never to make a refused object accepted.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import functools
import ipaddress
import json
import os
import random
import re
import select
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubernetes.client as k8s


def _clone(obj: Any) -> Any:
    """A deep copy of a JSON value (every stored object is one: it came in as JSON): a JSON
    round trip, several times faster than ``copy.deepcopy``, which was most of the stand-in's
    time per request."""
    return json.loads(json.dumps(obj))


MAX_BODY = 3 * 1024 * 1024  # kube-apiserver's default request body limit
RESOURCE_GROUP = "resource.k8s.io"

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL_RE = re.compile(_DNS_LABEL)
_DNS_SUBDOMAIN_RE = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?\d+)?")
_SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(-(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(\.(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*)?"
    r"(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?"
)
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's SimpleNameGenerator

MAX_DEVICES = 128
MAX_DEVICES_WITH_TAINTS_OR_COUNTERS = 64
MAX_TAINTS_PER_DEVICE = 16
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_ID = 32
MAX_DRIVER_NAME = 63
MAX_POOL_NAME = 253
MAX_VALUE = 64
MAX_COUNTER_SETS = 8  # ResourceSliceMaxCounterSets (per slice)
MAX_COUNTERS_PER_SET = 32  # ResourceSliceMaxCountersPerCounterSet
#: the ResourceSlice fields of DRAPartitionableDevices and of DRADeviceBindingConditions
PARTITIONABLE_FIELDS = frozenset({"sharedCounters", "consumesCounters"})
BINDING_FIELDS = frozenset({"bindingConditions", "bindingFailureConditions", "bindsToNode"})
MAX_BINDING_CONDITIONS = 4  # BindingConditionsMaxSize, BindingFailureConditionsMaxSize
MAX_CONSUMPTIONS_PER_DEVICE = 2  # ResourceSliceMaxDeviceCounterConsumptionsPerDevice
MAX_COUNTERS_PER_CONSUMPTION = 32  # ResourceSliceMaxCountersPerDeviceCounterConsumption
ATTRIBUTE_VALUE_FIELDS = (
    "bool",
    "int",
    "string",
    "version",
    "bools",
    "ints",
    "strings",
    "versions",
)


@dataclass(frozen=True)
class Kind:
    """One served resource: where it lives on the wire and which client model decodes it."""

    plural: str
    kind: str
    group: str  # "" = core
    version: str
    model: str  # name in kubernetes.client
    namespaced: bool
    field_labels: tuple[str, ...]
    has_status: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural


NODES = Kind("nodes", "Node", "", "v1", "V1Node", False, ("metadata.name",), True)
SLICES = Kind(
    "resourceslices",
    "ResourceSlice",
    RESOURCE_GROUP,
    "v1",
    "V1ResourceSlice",
    False,
    ("metadata.name", "spec.nodeName", "spec.driver"),
    False,
)
CLAIMS = Kind(
    "resourceclaims",
    "ResourceClaim",
    RESOURCE_GROUP,
    "v1",
    "ResourceV1ResourceClaim",
    True,
    ("metadata.name", "metadata.namespace"),
    True,
)
# What the self-signed overlay's certificate Job touches (vfioctl webhook-certs).
SECRETS = Kind(
    "secrets",
    "Secret",
    "",
    "v1",
    "V1Secret",
    True,
    ("metadata.name", "metadata.namespace", "type"),
    False,
)
WEBHOOK_CONFIGS = Kind(
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    "admissionregistration.k8s.io",
    "v1",
    "V1MutatingWebhookConfiguration",
    False,
    ("metadata.name",),
    False,
)
KINDS = (NODES, SLICES, CLAIMS, SECRETS, WEBHOOK_CONFIGS)


class ApiError(Exception):
    """An answer other than success: becomes a ``Status`` object with this code/reason."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def _bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def _not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{kind.qualified} "{name}" not found',
        details={"name": name, "group": kind.group, "kind": kind.plural},
    )


def _conflict(kind: Kind, name: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {kind.qualified} "{name}": the object has been '
        "modified; please apply your changes to the latest version and try again",
        details={"name": name, "group": kind.group, "kind": kind.plural},
    )


def _invalid(kind: Kind, name: str, causes: list[tuple[str, str]]) -> ApiError:
    text = ", ".join(f"{f}: {m}" for f, m in causes)
    return ApiError(
        422,
        "Invalid",
        f'{kind.kind}.{kind.group or "core"} "{name}" is invalid: [{text}]',
        details={
            "name": name,
            "group": kind.group,
            "kind": kind.kind,
            "causes": [
                {"field": f, "message": m, "reason": "FieldValueInvalid"} for f, m in causes
            ],
        },
    )


# -- strict decoding against the client's models --------------------------------------------
_SCALARS: dict[str, Callable[[Any], bool]] = {
    "str": lambda v: isinstance(v, str),
    "datetime": lambda v: isinstance(v, str),
    "date": lambda v: isinstance(v, str),
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
}


@functools.cache
def _model_fields(type_name: str) -> dict[str, str] | None:
    """The client model ``type_name``'s fields, JSON key -> type name (None: not a model the
    client has, accepted like "object"); read once per type (``attribute_map`` inverted)."""
    model = getattr(k8s, type_name, None)
    if model is None:
        return None
    return {j: model.openapi_types[a] for a, j in model.attribute_map.items()}


def decode_problems(value: Any, type_name: str, path: str = "") -> list[str]:
    """Unknown fields and wrong JSON types in ``value`` for the client type ``type_name``:
    judged by :func:`_decodes` (no path or message built: a 4,096-device pool's 32 slices
    took ~0.2 s of the stand-in's CPU to walk with them), said by :func:`_decode_walk`."""
    if _decodes(value, type_name):
        return []
    return _decode_walk(value, type_name, path)


def _decode_walk(value: Any, type_name: str, path: str = "") -> list[str]:
    """Every problem of ``value`` as ``type_name``, each with its path."""
    if value is None or type_name in ("object", "Any"):
        return []
    where = path or "<root>"
    if type_name.startswith("List[") and type_name.endswith("]"):
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type(value).__name__}"]
        inner = type_name[5:-1]
        return [p for i, v in enumerate(value) for p in _decode_walk(v, inner, f"{path}[{i}]")]
    if type_name.startswith("Dict[") and type_name.endswith("]"):
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type(value).__name__}"]
        inner = type_name[5:-1].split(",", 1)[1].strip()
        return [p for k, v in value.items() for p in _decode_walk(v, inner, f"{path}[{k}]")]
    if type_name in _SCALARS:
        if _SCALARS[type_name](value):
            return []
        return [f"{where}: expected {type_name}, got {type(value).__name__} {str(value)[:40]!r}"]
    fields = _model_fields(type_name)
    if fields is None:
        return []  # a type the client does not model: accepted like "object"
    if not isinstance(value, dict):
        return [f"{where}: expected an object, got {type(value).__name__}"]
    problems: list[str] = []
    for key, sub in value.items():
        sub_path = f"{path}.{key}" if path else key
        sub_type = fields.get(key)
        if sub_type is None:
            problems.append(f'unknown field "{sub_path}"')
            continue
        problems.extend(_decode_walk(sub, sub_type, sub_path))
    return problems


def _decodes(value: Any, type_name: str) -> bool:
    """Does ``value`` decode as ``type_name`` without a problem? :func:`_decode_walk`'s rules
    exactly (it says what is wrong when this is False), with no path or message built."""
    if value is None:
        return True
    check = _DECODERS.get(type_name)
    if check is None:
        check = _DECODERS[type_name] = _decoder(type_name)
    return check(value)


#: type name -> its check (:func:`_decoder`), made at first use
_DECODERS: dict[str, Callable[[Any], bool]] = {}


def _decoder(type_name: str) -> Callable[[Any], bool]:
    """The check of one type name, as :func:`_decode_walk` judges it (None is never passed:
    :func:`_decodes` accepts it first)."""
    if type_name in ("object", "Any"):
        return lambda v: True
    if type_name.startswith("List[") and type_name.endswith("]"):
        inner = type_name[5:-1]
        return lambda v: isinstance(v, list) and all(_decodes(x, inner) for x in v)
    if type_name.startswith("Dict[") and type_name.endswith("]"):
        inner = type_name[5:-1].split(",", 1)[1].strip()
        return lambda v: isinstance(v, dict) and all(_decodes(x, inner) for x in v.values())
    if type_name in _SCALARS:
        return _SCALARS[type_name]
    fields = _model_fields(type_name)
    if fields is None:
        return lambda v: True

    def model(v: Any) -> bool:
        if not isinstance(v, dict):
            return False
        for key, sub in v.items():
            sub_type = fields.get(key)
            if sub_type is None or not (sub is None or _decodes(sub, sub_type)):
                return False
        return True

    return model


# -- validation as kube-apiserver's ---------------------------------------------------------
def _dns_subdomain(value: str, limit: int = 253) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > limit:
        return f"must be no more than {limit} characters"
    if not _DNS_SUBDOMAIN_RE.fullmatch(value):
        return "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.'"
    return None


def _dns_label(value: str) -> str | None:
    if not value:
        return "must not be empty"
    if len(value) > 63:
        return "must be no more than 63 characters"
    if not _DNS_LABEL_RE.fullmatch(value):
        return (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-'"
        )
    return None


def _c_identifier(value: str) -> str | None:
    if len(value) > MAX_ID:
        return f"may not be more than {MAX_ID} bytes"
    if not _C_IDENTIFIER.fullmatch(value):
        return "a valid C identifier must start with alphabetic character or '_', followed by alphanumerics or '_'"
    return None


@functools.lru_cache(maxsize=4096)
def _qualified_attribute_name(name: str) -> tuple[str, ...]:
    """The problems of an attribute or capacity name (each distinct name judged once: a
    pool's devices share a handful)."""
    parts = name.split("/")
    if len(parts) == 1:
        why = _c_identifier(parts[0])
        return (why,) if why else ()
    domain, ident = parts[0], "/".join(parts[1:])
    problems = []
    if not domain:
        problems.append("the domain must not be empty")
    elif why := _dns_subdomain(domain, MAX_DRIVER_NAME):
        problems.append(f"domain {why}")
    if not ident:
        problems.append("the name must not be empty")
    elif why := _c_identifier(ident):
        problems.append(why)
    return tuple(problems)


#: the one-value fields of a device attribute that hold one scalar
_SCALAR_VALUE_FIELDS = frozenset({"bool", "int", "string"})


def _plain_attribute(key: str, attr: Any) -> bool:
    """Is this attribute one :func:`_device_problems` finds nothing wrong with, judged
    without building its path: a valid name and exactly one value, a bool, an int or a
    string of at most :data:`MAX_VALUE` (anything else goes through the full check)."""
    if type(attr) is not dict or len(attr) != 1 or _qualified_attribute_name(key):
        return False
    ((f, v),) = attr.items()
    return f in _SCALAR_VALUE_FIELDS and v is not None and (f != "string" or len(v) <= MAX_VALUE)


def _meta_problems(kind: Kind, meta: dict[str, Any]) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    name = meta.get("name") or ""
    if not name:
        causes.append(("metadata.name", "Required value: name or generateName is required"))
    elif why := _dns_subdomain(name):
        causes.append(("metadata.name", f"Invalid value: {name[:80]!r}: {why}"))
    ns = meta.get("namespace") or ""
    if kind.namespaced:
        if why := _dns_label(ns):
            causes.append(("metadata.namespace", f"Invalid value: {ns[:80]!r}: {why}"))
    elif ns:
        causes.append(("metadata.namespace", "Forbidden: not allowed on this type"))
    for key, value in (meta.get("labels") or {}).items():
        prefix, _, short = key.rpartition("/")
        if (
            (prefix and _dns_subdomain(prefix))
            or not short
            or len(short) > 63
            or not _LABEL_VALUE.fullmatch(short)
        ):
            causes.append(("metadata.labels", f"Invalid value: {key[:80]!r}: not a qualified name"))
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            causes.append(("metadata.labels", f"Invalid value: {value[:80]!r}: not a label value"))
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for f in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(f):
                causes.append((f"metadata.ownerReferences[{i}].{f}", "Required value"))
    return causes


def validate_slice(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The causes kube-apiserver would give for this ResourceSlice (empty: valid)."""
    causes = _meta_problems(SLICES, obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    driver = spec.get("driver") or ""
    if not driver:
        causes.append(("spec.driver", "Required value"))
    elif why := _dns_subdomain(driver, MAX_DRIVER_NAME):
        causes.append(("spec.driver", f"Invalid value: {driver[:80]!r}: {why}"))
    pool = spec.get("pool") or {}
    pool_name = pool.get("name") or ""
    if not pool_name:
        causes.append(("spec.pool.name", "Required value"))
    elif len(pool_name) > MAX_POOL_NAME:
        causes.append(("spec.pool.name", f"Too long: may not be more than {MAX_POOL_NAME} bytes"))
    else:
        for part in pool_name.split("/"):
            if why := _dns_subdomain(part):
                causes.append(("spec.pool.name", f"Invalid value: {pool_name[:80]!r}: {why}"))
                break
    if (pool.get("resourceSliceCount") or 0) <= 0:
        causes.append(("spec.pool.resourceSliceCount", "Invalid value: must be greater than zero"))
    if (pool.get("generation") or 0) < 0:
        causes.append(
            ("spec.pool.generation", "Invalid value: must be greater than or equal to zero")
        )
    if old is not None:
        old_spec = old.get("spec") or {}
        for path, new_v, old_v in (
            ("spec.pool.name", pool_name, (old_spec.get("pool") or {}).get("name")),
            ("spec.driver", driver, old_spec.get("driver")),
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
        ):
            if new_v != old_v:
                causes.append((path, "Invalid value: field is immutable"))
    set_fields = []
    node_name = spec.get("nodeName")
    if node_name is not None:
        if node_name == "":
            causes.append(
                (
                    "spec.nodeName",
                    "Invalid value: must be either unset or set to a non-empty string",
                )
            )
        else:
            set_fields.append("nodeName")
            if why := _dns_subdomain(node_name):
                causes.append(("spec.nodeName", f"Invalid value: {node_name[:80]!r}: {why}"))
    if spec.get("nodeSelector") is not None:
        set_fields.append("nodeSelector")
    for flag in ("allNodes", "perDeviceNodeSelection"):
        if spec.get(flag) is True:
            set_fields.append(flag)
        elif spec.get(flag) is False:
            causes.append((f"spec.{flag}", "Invalid value: must be either unset or set to true"))
    if len(set_fields) != 1:
        causes.append(
            (
                "spec",
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` "
                f"is required (set: {set_fields})",
            )
        )
    devices = spec.get("devices") or []
    if spec.get("sharedCounters") is not None and spec.get("devices") is not None:
        causes.append(
            ("spec", "Invalid value: only one of `sharedCounters` or `devices` is allowed")
        )
    limited = any(d.get("taints") or d.get("consumesCounters") for d in devices)
    limit = MAX_DEVICES_WITH_TAINTS_OR_COUNTERS if limited else MAX_DEVICES
    if len(devices) > limit:
        causes.append(
            ("spec.devices", f"Too many: {len(devices)}: must have at most {limit} items")
        )
        return causes  # upstream short-circuits here (DoS protection)
    seen: set[str] = set()
    for i, device in enumerate(devices):
        causes.extend(_device_problems(device, f"spec.devices[{i}]"))
        name = device.get("name") or ""
        if name in seen:
            causes.append((f"spec.devices[{i}]", f"Duplicate value: {name!r}"))
        seen.add(name)
    causes.extend(
        _counter_list_problems(
            spec.get("sharedCounters") or [],
            "spec.sharedCounters",
            key="name",
            limit=MAX_COUNTER_SETS,
            counters_limit=MAX_COUNTERS_PER_SET,
        )
    )
    return causes


def _counter_list_problems(
    items: list[Any], path: str, *, key: str, limit: int, counters_limit: int
) -> list[tuple[str, str]]:
    """A slice's ``sharedCounters`` (``key`` ``name``) or a device's ``consumesCounters``
    (``key`` ``counterSet``), as upstream's validateSet over validateCounterSet /
    validateDeviceCounterConsumption: at most ``limit`` items, each named by ``key`` with a
    DNS label, unique, with a valid ``counters`` map of at most ``counters_limit``."""
    causes: list[tuple[str, str]] = []
    if len(items) > limit:
        causes.append((path, f"Too many: {len(items)}: must have at most {limit} items"))
    seen: set[str] = set()
    for i, item in enumerate(items):
        ipath = f"{path}[{i}]"
        name = (item or {}).get(key) or ""
        if not name:
            causes.append((f"{ipath}.{key}", "Required value"))
        elif why := _dns_label(name):
            causes.append((f"{ipath}.{key}", f"Invalid value: {name[:80]!r}: {why}"))
        elif name in seen:
            causes.append((ipath, f"Duplicate value: {name!r}"))
        seen.add(name)
        causes.extend(
            _counters_problems((item or {}).get("counters"), counters_limit, f"{ipath}.counters")
        )
    return causes


def _counters_problems(counters: Any, limit: int, path: str) -> list[tuple[str, str]]:
    """A ``counters`` map ``{<DNS label>: {"value": <quantity>}}``, as upstream's
    validateMap(..., validateCounterName, validateDeviceCounter)."""
    if not counters:
        return [(path, "Required value")]
    causes: list[tuple[str, str]] = []
    if len(counters) > limit:
        causes.append((path, f"Too many: {len(counters)}: must have at most {limit} items"))
    for key, counter in counters.items():
        if why := _dns_label(key):
            causes.append((path, f"Invalid value: {key[:80]!r}: {why}"))
        value = (counter or {}).get("value")
        if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
            causes.append(
                (f"{path}[{key[:63]}].value", f"Invalid value: {str(value)[:80]!r}: not a quantity")
            )
    return causes


Counters = dict[str, dict[str, float]]


def pool_counters(slices: list[dict[str, Any]]) -> tuple[Counters, dict[str, Counters]]:
    """One pool's counter sets (name -> counter -> value) and what each device consumes
    (device name -> counter set -> counter -> value)."""
    defined: Counters = {}
    consumes: dict[str, Counters] = {}
    for s in slices:
        for cs in s["spec"].get("sharedCounters") or []:
            defined[cs["name"]] = {k: parse_quantity(v["value"]) for k, v in cs["counters"].items()}
        for d in s["spec"].get("devices") or []:
            mine = consumes.setdefault(d["name"], {})
            for c in d.get("consumesCounters") or []:
                for k, v in c["counters"].items():
                    mine.setdefault(c["counterSet"], {})[k] = parse_quantity(v["value"])
    return defined, consumes


def over_consumed(
    defined: Counters, consumes: dict[str, Counters], devices: Collection[str]
) -> list[str]:
    """Each counter the ``devices`` together consume more of than it holds (upstream's
    allocator rule: the sum over ALLOCATED devices never exceeds a counter's value)."""
    used: dict[tuple[str, str], float] = {}
    for name in devices:
        for cs, counters in consumes.get(name, {}).items():
            for k, v in counters.items():
                used[(cs, k)] = used.get((cs, k), 0) + v
    return [
        f"{cs}/{k}: {n:g} consumed, {defined[cs][k]:g} available"
        for (cs, k), n in sorted(used.items())
        if cs in defined and k in defined[cs] and n > defined[cs][k]
    ]


def pool_counter_problems(
    slices: list[dict[str, Any]], allocated: Collection[str] = ()
) -> list[str]:
    """What the scheduler's allocator would trip on in one pool's slices (not API validation:
    the API accepts each slice alone): a device consuming a counter set or counter the pool
    does not define, or the ``allocated`` devices (names) together consuming more than a
    counter holds. Upstream's rule (KEP-4815): only what ALLOCATED devices consume counts,
    so two published devices that each consume 1 of a counter of value 1 are fine until both
    are allocated -- which the allocator never does."""
    defined, consumes = pool_counters(slices)
    problems = [
        f"device {name} consumes {cs}/{k}, not defined"
        for name, sets in consumes.items()
        for cs, counters in sets.items()
        for k in counters
        if k not in defined.get(cs, {})
    ]
    return problems + over_consumed(defined, consumes, allocated)


_SUFFIX = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18, "m": 1e-3,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}  # fmt: skip


def parse_quantity(text: str) -> float:
    """A Kubernetes quantity's value (``"2"``, ``"1Ki"``, ``"500m"``, ``"1e3"``)."""
    m = re.fullmatch(r"([+-]?(?:\d+(?:\.\d*)?|\.\d+))([a-zA-Z]*|[eE][+-]?\d+)", text)
    if m is None:
        raise ValueError(f"not a quantity: {text!r}")
    number, suffix = m.groups()
    if suffix[:1] in ("e", "E"):
        return float(number + suffix)
    return float(number) * _SUFFIX[suffix]


def _attribute_problems(key: str, attr: Any, key_path: str) -> list[tuple[str, str]]:
    """One device attribute's problems (its name, exactly one value, the value's limits)."""
    causes: list[tuple[str, str]] = []
    causes.extend(
        (key_path, f"Invalid value: {key[:80]!r}: {p}") for p in _qualified_attribute_name(key)
    )
    present = [f for f in ATTRIBUTE_VALUE_FIELDS if (attr or {}).get(f) is not None]
    if len(present) != 1:
        causes.append(
            (key_path, f"Invalid value: exactly one value must be specified (got {present})")
        )
    for f in present:
        values = attr[f] if f.endswith("s") else [attr[f]]
        for v in values:
            if f.startswith("string") and len(v) > MAX_VALUE:
                causes.append(
                    (f"{key_path}.{f}", f"Too long: may not be more than {MAX_VALUE} bytes")
                )
            if f.startswith("version"):
                if not _SEMVER.fullmatch(v):
                    causes.append(
                        (
                            f"{key_path}.{f}",
                            f"Invalid value: {v[:80]!r}: must be a string compatible with semver.org spec 2.0.0",
                        )
                    )
                if len(v) > MAX_VALUE:
                    causes.append(
                        (f"{key_path}.{f}", f"Too long: may not be more than {MAX_VALUE} bytes")
                    )
    return causes


def _device_problems(device: dict[str, Any], path: str) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    name = device.get("name") or ""
    if why := _dns_label(name):
        causes.append((f"{path}.name", f"Invalid value: {name[:80]!r}: {why}"))
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    total = len(attributes) + len(capacity)
    if total > MAX_ATTRIBUTES_AND_CAPACITIES:
        causes.append(
            (
                path,
                f"Invalid value: {total}: the total number of attributes and capacities must not "
                f"exceed {MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for key, attr in attributes.items():
        if not _plain_attribute(key, attr):  # the common case: no path built
            causes.extend(_attribute_problems(key, attr, f"{path}.attributes[{key[:70]}]"))
    for key, cap in capacity.items():
        key_path = f"{path}.capacity[{key[:70]}]"
        causes.extend(
            (key_path, f"Invalid value: {key[:80]!r}: {p}") for p in _qualified_attribute_name(key)
        )
        value = (cap or {}).get("value")
        if not isinstance(value, str) or not _QUANTITY.fullmatch(value):
            causes.append(
                (f"{key_path}.value", f"Invalid value: {str(value)[:80]!r}: not a quantity")
            )
    causes.extend(_taint_problems(device.get("taints") or [], f"{path}.taints"))
    causes.extend(
        binding_problems(
            device.get("bindingConditions") or [],
            device.get("bindingFailureConditions") or [],
            path,
        )
    )
    causes.extend(
        _counter_list_problems(
            device.get("consumesCounters") or [],
            f"{path}.consumesCounters",
            key="counterSet",
            limit=MAX_CONSUMPTIONS_PER_DEVICE,
            counters_limit=MAX_COUNTERS_PER_CONSUMPTION,
        )
    )
    return causes


def binding_problems(ready: list[Any], failed: list[Any], path: str) -> list[tuple[str, str]]:
    """``bindingConditions`` / ``bindingFailureConditions`` as upstream's
    validateDeviceBindingParameters: at most 4 each, qualified names, no duplicates, no
    overlap, and both or neither."""
    causes: list[tuple[str, str]] = []
    for f, items in (("bindingConditions", ready), ("bindingFailureConditions", failed)):
        if len(items) > MAX_BINDING_CONDITIONS:
            causes.append(
                (
                    f"{path}.{f}",
                    f"Too many: {len(items)}: must have at most {MAX_BINDING_CONDITIONS} items",
                )
            )
        seen: set[str] = set()
        for i, c in enumerate(items):
            causes.extend(
                (f"{path}.{f}[{i}]", f"Invalid value: {str(c)[:80]!r}: {w}")
                for w in _label_name_problems(str(c))
            )
            if c in seen:
                causes.append((f"{path}.{f}[{i}]", f"Duplicate value: {c!r}"))
            seen.add(c)
    for i, c in enumerate(failed):
        if c in ready:
            causes.append(
                (
                    f"{path}.bindingFailureConditions[{i}]",
                    f"Invalid value: {c!r}: bindingFailureConditions must not overlap with bindingConditions",
                )
            )
    if failed and not ready:
        causes.append(
            (
                f"{path}.bindingConditions",
                "Invalid value: bindingConditions are required to use bindingFailureConditions",
            )
        )
    if ready and not failed:
        causes.append(
            (
                f"{path}.bindingFailureConditions",
                "Invalid value: bindingFailureConditions are required to use bindingConditions",
            )
        )
    return causes


def _label_name_problems(key: str) -> list[str]:
    """A qualified label name (``[prefix/]name``), as upstream's IsQualifiedName."""
    prefix, _, name = key.rpartition("/")
    out: list[str] = []
    if "/" in key and (why := _dns_subdomain(prefix)):
        out.append(f"prefix part {why}")
    if not name or len(name) > 63 or not _LABEL_VALUE.fullmatch(name):
        out.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must "
            "start and end with an alphanumeric character, at most 63 characters"
        )
    return out


def _taint_problems(taints: list[Any], path: str) -> list[tuple[str, str]]:
    """``devices[].taints`` as upstream's validateDeviceTaint (KEP-5055)."""
    causes: list[tuple[str, str]] = []
    if len(taints) > MAX_TAINTS_PER_DEVICE:
        causes.append(
            (path, f"Too many: {len(taints)}: must have at most {MAX_TAINTS_PER_DEVICE} items")
        )
    for j, taint in enumerate(taints):
        p = f"{path}[{j}]"
        key = taint.get("key") or ""
        if not key:
            causes.append((f"{p}.key", "Required value"))
        else:
            causes.extend(
                (f"{p}.key", f"Invalid value: {key[:80]!r}: {w}") for w in _label_name_problems(key)
            )
        value = taint.get("value") or ""
        if len(value) > 63 or not _LABEL_VALUE.fullmatch(value):
            causes.append(
                (
                    f"{p}.value",
                    f"Invalid value: {value[:80]!r}: a valid label must be an empty string or "
                    "consist of alphanumeric characters, '-', '_' or '.', at most 63 characters",
                )
            )
        effect = taint.get("effect")
        if not effect:
            causes.append((f"{p}.effect", "Required value"))
        elif effect not in ("NoSchedule", "NoExecute", "None"):
            causes.append((f"{p}.effect", f"Unsupported value: {str(effect)[:40]!r}"))
        added = taint.get("timeAdded")
        if added is not None:
            try:
                datetime.datetime.strptime(added, "%Y-%m-%dT%H:%M:%SZ")
            except (TypeError, ValueError):
                causes.append(
                    (f"{p}.timeAdded", f"Invalid value: {str(added)[:40]!r}: not RFC 3339")
                )
    return causes


def validate_claim(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    causes = _meta_problems(CLAIMS, obj.get("metadata") or {})
    requests = ((obj.get("spec") or {}).get("devices") or {}).get("requests") or []
    for i, req in enumerate(requests):
        if why := _dns_label(req.get("name") or ""):
            causes.append((f"spec.devices.requests[{i}].name", f"Invalid value: {why}"))
    if old is not None and obj.get("spec") != old.get("spec"):
        causes.append(("spec", "Invalid value: field is immutable"))
    for i, result in enumerate(
        (((obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
        or []
    ):
        p = f"status.allocation.devices.results[{i}]"
        if why := _dns_subdomain(result.get("driver") or "", MAX_DRIVER_NAME):
            causes.append((f"{p}.driver", f"Invalid value: {why}"))
        if why := _dns_label(result.get("device") or ""):
            causes.append((f"{p}.device", f"Invalid value: {why}"))
        if not result.get("pool"):
            causes.append((f"{p}.pool", "Required value"))
        if not result.get("request"):
            causes.append((f"{p}.request", "Required value"))
    return causes


def validate_node(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    return _meta_problems(NODES, obj.get("metadata") or {})


_SECRET_KEY = re.compile(r"[-._a-zA-Z0-9]+")


def validate_secret(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    """As upstream ``ValidateSecret``: key names, base64 values, a TLS Secret's two keys, an
    immutable type."""
    causes = _meta_problems(SECRETS, obj.get("metadata") or {})
    data = obj.get("data") or {}
    for key, value in data.items():
        if not _SECRET_KEY.fullmatch(key) or len(key) > 253:
            causes.append(
                (
                    f"data[{key[:60]}]",
                    "Invalid value: a valid config key must consist of alphanumeric characters, '-', '_' or '.'",
                )
            )
        try:
            base64.b64decode(value, validate=True)
        except ValueError:
            causes.append((f"data[{key[:60]}]", "Invalid value: illegal base64 data"))
    if obj.get("type") == "kubernetes.io/tls":
        for key in ("tls.crt", "tls.key"):
            if key not in data:
                causes.append((f"data[{key}]", "Required value"))
    if old is not None and (obj.get("type") or "Opaque") != (old.get("type") or "Opaque"):
        causes.append(("type", "Invalid value: field is immutable"))
    return causes


def validate_webhook_config(
    obj: dict[str, Any], old: dict[str, Any] | None
) -> list[tuple[str, str]]:
    """As upstream ``ValidateMutatingWebhookConfiguration`` (the parts a client can get wrong):
    unique qualified names, exactly one of url/service, a base64 caBundle, the required enums."""
    causes = _meta_problems(WEBHOOK_CONFIGS, obj.get("metadata") or {})
    seen: set[str] = set()
    for i, hook in enumerate(obj.get("webhooks") or []):
        where = f"webhooks[{i}]"
        name = hook.get("name") or ""
        if name in seen:
            causes.append((f"{where}.name", f"Duplicate value: {name[:80]!r}"))
        seen.add(name)
        if name.count(".") < 2 or _dns_subdomain(name):
            causes.append(
                (f"{where}.name", "Invalid value: should be a domain with at least three segments")
            )
        cc = hook.get("clientConfig") or {}
        if bool(cc.get("url")) == bool(cc.get("service")):
            causes.append(
                (
                    f"{where}.clientConfig",
                    "Required value: exactly one of url or service is required",
                )
            )
        if "caBundle" in cc:
            try:
                base64.b64decode(cc["caBundle"], validate=True)
            except ValueError:
                causes.append(
                    (f"{where}.clientConfig.caBundle", "Invalid value: illegal base64 data")
                )
        if hook.get("sideEffects") not in ("None", "NoneOnDryRun"):
            causes.append((f"{where}.sideEffects", "Unsupported value"))
        if not hook.get("admissionReviewVersions"):
            causes.append((f"{where}.admissionReviewVersions", "Required value"))
    return causes


VALIDATORS: dict[str, Callable[[dict[str, Any], dict[str, Any] | None], list[tuple[str, str]]]] = {
    "nodes": validate_node,
    "resourceslices": validate_slice,
    "resourceclaims": validate_claim,
    "secrets": validate_secret,
    "mutatingwebhookconfigurations": validate_webhook_config,
}


# -- selectors ------------------------------------------------------------------------------
def _field_value(obj: dict[str, Any], label: str) -> str:
    cur: Any = obj
    for part in label.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    return "" if cur is None else str(cur)


def parse_field_selector(kind: Kind, text: str) -> list[tuple[str, str, bool]]:
    """``a=b,c!=d`` → [(label, value, equal)]; unsupported labels are a 400 as upstream."""
    terms = []
    for term in filter(None, (t.strip() for t in text.split(","))):
        m = re.fullmatch(r"([^=!]+)(==|=|!=)(.*)", term)
        if not m:
            raise _bad_request(f"invalid field selector: {term[:80]!r}")
        label, op, value = m.group(1).strip(), m.group(2), m.group(3).strip()
        if label not in kind.field_labels:
            raise _bad_request(
                f"field label not supported: {label[:80]}"
                f" (supported for {kind.qualified}: {', '.join(kind.field_labels)})"
            )
        terms.append((label, value, op != "!="))
    return terms


def parse_label_selector(text: str) -> list[Callable[[dict[str, str]], bool]]:
    preds: list[Callable[[dict[str, str]], bool]] = []
    for term in re.findall(r"(?:[^,(]|\([^)]*\))+", text):
        term = term.strip()
        if not term:
            continue
        if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
            key, op = m.group(1), m.group(2)
            values = {v.strip() for v in m.group(3).split(",")}
            if op == "in":
                preds.append(lambda ls, k=key, vs=values: ls.get(k) in vs)
            else:
                preds.append(lambda ls, k=key, vs=values: ls.get(k) not in vs)
        elif m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w./-]*)", term):
            key, op, value = m.group(1), m.group(2), m.group(3)
            if op == "!=":
                preds.append(lambda ls, k=key, v=value: ls.get(k) != v)
            else:
                preds.append(lambda ls, k=key, v=value: ls.get(k) == v)
        elif m := re.fullmatch(r"!\s*([\w./-]+)", term):
            absent = m.group(1)
            preds.append(lambda ls, k=absent: k not in ls)
        elif re.fullmatch(r"[\w./-]+", term):
            preds.append(lambda ls, k=term: k in ls)
        else:
            raise _bad_request(f"unable to parse requirement: {term[:80]!r}")
    return preds


def _rbac_verb(method: str, named: bool, query: dict[str, str]) -> str:
    """The RBAC verb of a request (k8s.io/apiserver's RequestInfoFactory)."""
    if method == "GET":
        return "get" if named else ("watch" if query.get("watch") in ("1", "true") else "list")
    if method == "DELETE":
        return "delete" if named else "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())


def _json_merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return _clone(patch)
    result = _clone(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _json_merge(result.get(key), value)
    return result


def _json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(ops, list):
        raise _bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch "
            "(a JSON Patch body must be a list of operations; for a partial object send "
            "Content-Type application/merge-patch+json)"
        )
    doc = _clone(doc)

    def split(pointer: str) -> list[str]:
        if not pointer.startswith("/"):
            raise _bad_request(f"invalid JSON pointer {pointer[:80]!r}")
        return [p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/")]

    def parent(pointer: str) -> tuple[Any, str]:
        parts = split(pointer)
        cur = doc
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        return cur, parts[-1]

    def get(pointer: str) -> Any:
        cont, key = parent(pointer)
        return cont[int(key)] if isinstance(cont, list) else cont[key]

    def remove(pointer: str) -> Any:
        cont, key = parent(pointer)
        return cont.pop(int(key)) if isinstance(cont, list) else cont.pop(key)

    def add(pointer: str, value: Any) -> None:
        cont, key = parent(pointer)
        if isinstance(cont, list):
            cont.insert(len(cont) if key == "-" else int(key), value)
        else:
            cont[key] = value

    try:
        for op in ops:
            kind, path = op["op"], op["path"]
            if kind == "add":
                add(path, _clone(op["value"]))
            elif kind == "remove":
                remove(path)
            elif kind == "replace":
                remove(path)
                add(path, _clone(op["value"]))
            elif kind == "move":
                add(path, remove(op["from"]))
            elif kind == "copy":
                add(path, _clone(get(op["from"])))
            elif kind == "test":
                if get(path) != op["value"]:
                    raise ApiError(422, "Invalid", f"the test operation on {path} failed")
            else:
                raise _bad_request(f"unknown JSON patch operation {str(kind)[:40]!r}")
    except (KeyError, IndexError, ValueError, TypeError) as e:
        raise ApiError(422, "Invalid", f"the JSON patch could not be applied: {e!s:.200}") from e
    return doc


# -- the store ------------------------------------------------------------------------------
@dataclass
class Event:
    rv: int
    type: str
    kind: Kind
    obj: dict[str, Any]


METADATA_LIST = "PartialObjectMetadataList"


def _answer_as(accept: str, method: str, named: bool) -> str:
    """The media type to answer with, from ``Accept`` as kube-apiserver reads it: the first
    acceptable of its comma-separated alternatives; ``application/json;as=
    PartialObjectMetadataList;g=meta.k8s.io;v=v1`` is a metadata-only list (a list GET only);
    JSON otherwise. None acceptable: 406 NotAcceptable, as the real server answers."""
    if not accept.strip():
        return "json"
    for alt in accept.split(","):
        media, *params = (p.strip() for p in alt.split(";"))
        if media not in ("application/json", "application/*", "*/*"):
            continue
        opts = dict(p.split("=", 1) for p in params if "=" in p)
        transform = opts.get("as")
        if transform is None:
            return "json"
        if (
            transform == METADATA_LIST
            and opts.get("g") == "meta.k8s.io"
            and opts.get("v") in ("v1", "v1beta1")
            and method == "GET"
            and not named
        ):
            return METADATA_LIST
    raise ApiError(
        406,
        "NotAcceptable",
        f"only the following media types are accepted: application/json (Accept {accept[:120]!r})",
    )


def _metadata_list(listing: dict[str, Any]) -> dict[str, Any]:
    """A list as ``PartialObjectMetadataList`` (meta.k8s.io/v1): each item only its kind and
    its whole ``metadata``."""
    return {
        "kind": METADATA_LIST,
        "apiVersion": "meta.k8s.io/v1",
        "metadata": listing.get("metadata") or {},
        "items": [
            {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata") or {},
            }
            for o in listing.get("items") or []
        ],
    }


@dataclass
class Request:
    """One request served (for tests: who called what, when, and the answer's code)."""

    method: str
    path: str
    query: dict[str, str]
    code: int
    at: float = field(default_factory=time.monotonic)
    #: the media type the answer was given as: ``json``, or ``PartialObjectMetadataList``
    #: for a metadata-only list
    answered_as: str = "json"


@dataclass
class Store:
    """What the stand-in holds. A stored object is never changed in place: every write
    stores a new one (so an event and an HTTP answer may share it, only ever encoding it)."""

    rv: int = 0
    #: the resourceVersion up to which the history is forgotten (:meth:`ApiServerStandin.compact`)
    compacted: int = 0
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


class ApiServerStandin:
    """Start with :meth:`start`; :attr:`kubeconfig` is a file the real client loads."""

    def __init__(self, directory: str, *, token: str | None = None, tls: bool = False) -> None:
        """``tls``: serve HTTPS with a fresh CA (in the kubeconfig as
        ``certificate-authority-data``), as a real API server does; else plain HTTP."""
        self.dir = directory
        self.tls = tls
        self.ca_pem = b""
        self.token = token or uuid.uuid4().hex
        self.store = Store()
        self.lock = threading.Condition()
        self.requests: list[Request] = []
        self.stopping = False
        self.server: ThreadingHTTPServer | None = None
        self.thread: threading.Thread | None = None
        self.kubeconfig = os.path.join(directory, "kubeconfig")
        self.url = ""
        #: RBAC: None lets every request of the token through; a list of ClusterRole
        #: ``rules`` makes the stand-in authorize each request against them (403 otherwise),
        #: including the granular claim-status check of Kubernetes >= 1.36 (see authorize)
        self.rules: list[dict[str, Any]] | None = None
        self.user = "system:serviceaccount:vfio-dp:vfio-dp-dra"
        #: ``pods/exec`` (tests/dra/standin_exec.py): runs the command locally with the
        #: container's env; a test may replace it
        from tests.dra.standin_exec import local_runner

        self.exec_runner = local_runner
        #: ResourceSlice fields of features this "cluster" has off, dropped on every write as
        #: kube-apiserver's strategy drops the fields of a disabled feature gate (no error):
        #: :data:`PARTITIONABLE_FIELDS`, :data:`BINDING_FIELDS`
        self.disabled_fields: set[str] = set()
        #: watches open now (tests wait on it), and what ends them
        self.open_watches = 0
        self._watch_epoch = 0
        self._watches_paused = False
        #: watch requests of these plurals to hang up on unanswered, one each (:meth:`hang_up_on`)
        self._hang_ups: list[str] = []
        #: plurals whose lists wait unanswered (:meth:`hold_lists`), lists waiting now, and
        #: when a client hung up on a held list (monotonic times)
        self._held_lists: set[str] = set()
        self.lists_held = 0
        self.held_hangups: list[float] = []
        #: (method, plural, status subresource) -> how many more such requests fail with 503
        #: (:meth:`fail_next`)
        self._failing: dict[tuple[str, str, bool], int] = {}
        #: ResourceSlice creates and updates: in flight now, the most at once, and the client
        #: ports they came from (one per connection); :meth:`gather_slice_writes`
        self.slice_writes_in_flight = 0
        self.slice_writes_most = 0
        self.slice_write_ports: list[int] = []
        self._gather = 0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        standin = self

        class Handler(_Handler):
            api = standin

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        scheme = "http"
        os.makedirs(self.dir, exist_ok=True)
        if self.tls:
            self.ca_pem, context = _tls_context(self.dir)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="apiserver-standin",
            daemon=True,
        )
        self.thread.start()
        with open(self.kubeconfig, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": self._cluster()}],
                    "users": [{"name": "plugin", "user": {"token": self.token}}],
                    "contexts": [
                        {"name": "standin", "context": {"cluster": "standin", "user": "plugin"}}
                    ],
                    "current-context": "standin",
                },
                f,
            )

    def _cluster(self) -> dict[str, str]:
        cluster = {"server": self.url}
        if self.tls:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_pem).decode()
        return cluster

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def client(self) -> Any:
        """A real ``kubernetes.client.ApiClient`` loaded from :attr:`kubeconfig`."""
        import kubernetes.config

        return kubernetes.config.new_client_from_config(config_file=self.kubeconfig)

    # -- test-side access ----------------------------------------------------------------
    def seed(self, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as if created (status included), through the same decoding and
        validation as a request: a seed the real server would refuse raises ApiError."""
        with self.lock:
            return self._create(
                kind, (obj.get("metadata") or {}).get("namespace", ""), obj, keep_status=True
            )

    def objects(self, kind: Kind, namespace: str = "") -> list[dict[str, Any]]:
        with self.lock:
            return [
                _clone(o)
                for (p, ns, _), o in sorted(self.store.objects.items())
                if p == kind.plural and (not namespace or ns == namespace)
            ]

    def objects_of_plural(self, plural: str) -> list[dict[str, Any]]:
        return self.objects(next(k for k in KINDS if k.plural == plural))

    def wait_for(
        self, what: str, predicate: Callable[[ApiServerStandin], bool], timeout: float = 10.0
    ) -> None:
        """Block (a thread, not the event loop) until ``predicate(self)``; raise naming ``what``."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"API-server stand-in: timed out waiting for {what}")
                self.lock.wait(min(left, 0.1))

    # -- history and watches (a test's levers: what a real cluster does by itself) ------------
    def end_watches(self, pause: bool = False) -> None:
        """End every open watch stream, as an API-server restart does; ``pause``: new watch
        requests wait (unanswered) until :meth:`resume_watches` -- the server is "away"."""
        with self.lock:
            self._watch_epoch += 1
            self._watches_paused = pause
            self.lock.notify_all()

    def hang_up_on(self, plural: str) -> None:
        """The next watch request of ``plural`` is read and the connection closed with no
        answer: what a client meets when it reuses a kept-alive connection the server (or a
        proxy in front of it) had just closed -- urllib3's "Remote end closed connection
        without response". Not recorded in :attr:`requests` (nothing was served)."""
        with self.lock:
            self._hang_ups.append(plural)

    def _take_hang_up(self, plural: str) -> bool:
        with self.lock:
            if plural in self._hang_ups:
                self._hang_ups.remove(plural)
                return True
            return False

    def resume_watches(self) -> None:
        with self.lock:
            self._watches_paused = False
            self.lock.notify_all()

    def fail_next(self, method: str, plural: str, count: int, *, status: bool = False) -> None:
        """The next ``count`` ``method`` requests on ``plural`` (its ``/status`` with
        ``status``) are answered 503 ServiceUnavailable, as an overloaded server does."""
        with self.lock:
            self._failing[(method, plural, status)] = count

    def _take_failure(self, method: str, plural: str, status: bool) -> None:
        with self.lock:
            left = self._failing.get((method, plural, status), 0)
            if left <= 0:
                return
            self._failing[(method, plural, status)] = left - 1
        raise ApiError(503, "ServiceUnavailable", "the server is currently unable to handle it")

    def hold_lists(self, plural: str) -> None:
        """List requests of ``plural`` (GET of the collection, not a watch) wait unanswered
        until :meth:`release_lists` or :meth:`stop`: a server slow to answer a list.
        :attr:`lists_held` counts the lists waiting now."""
        with self.lock:
            self._held_lists.add(plural)
            self.lock.notify_all()

    def release_lists(self) -> None:
        with self.lock:
            self._held_lists.clear()
            self.lock.notify_all()

    def _wait_if_held(self, kind: Kind, conn: socket.socket) -> bool:
        """(The connection's thread) wait while lists of ``kind`` are held; False when the
        client hung up meanwhile (it sends nothing else while it waits for the answer: the
        connection turning readable is its end), noted in :attr:`held_hangups`."""
        with self.lock:
            if kind.plural not in self._held_lists:
                return True
            self.lists_held += 1
            self.lock.notify_all()
            try:
                while kind.plural in self._held_lists and not self.stopping:
                    if select.select([conn], [], [], 0)[0]:
                        self.held_hangups.append(time.monotonic())
                        return False
                    self.lock.wait(0.1)
                return True
            finally:
                self.lists_held -= 1
                self.lock.notify_all()

    def compact(self) -> int:
        """Forget the history up to now (etcd's compaction); open watches end first, so none
        misses an event. → the oldest resourceVersion a watch may still start from."""
        with self.lock:
            self._watch_epoch += 1
            self.store.compacted = self.store.rv
            self.store.events = []
            self.lock.notify_all()
            return self.store.compacted

    def _too_old(self, rv: int) -> ApiError | None:
        if rv < self.store.compacted:
            return ApiError(
                410, "Expired", f"too old resource version: {rv} ({self.store.compacted})"
            )
        return None

    # -- operations (called with the lock held) ---------------------------------------------
    def _now(self) -> str:
        return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _emit(self, kind: Kind, type_: str, obj: dict[str, Any]) -> None:
        """``obj``: the stored object (never changed in place: :class:`Store`)."""
        self.store.events.append(Event(self.store.rv, type_, kind, obj))
        self.lock.notify_all()

    def _decode(self, kind: Kind, body: Any, owned: bool = False) -> dict[str, Any]:
        """``body`` checked as ``kind``; a copy of it, or ``body`` itself when ``owned`` (the
        stand-in's own: a request's, decoded from its JSON for this call alone)."""
        if not isinstance(body, dict):
            raise _bad_request(f"the body is not a JSON object but {type(body).__name__}")
        problems = decode_problems(body, kind.model)
        if problems:
            raise _bad_request("strict decoding error: " + ", ".join(problems[:20]))
        for f, want in (("kind", kind.kind), ("apiVersion", kind.api_version)):
            if body.get(f) not in (None, "", want):
                raise _bad_request(
                    f"{f} {str(body.get(f))[:80]!r} does not match the URL: expected {want!r}"
                )
        return body if owned else _clone(body)

    def _drop_disabled(self, kind: Kind, obj: dict[str, Any]) -> None:
        if kind is not SLICES or not self.disabled_fields:
            return
        spec = obj.get("spec") or {}
        for f in self.disabled_fields:
            spec.pop(f, None)
            for d in spec.get("devices") or []:
                d.pop(f, None)

    def gather_slice_writes(self, n: int) -> None:
        """Hold each ResourceSlice write (before it is served) until ``n`` are in flight
        together (or 5 s pass), once: a client that writes one at a time never reaches ``n``."""
        with self.lock:
            self._gather = n

    def _slice_write_begins(self, port: int) -> None:
        with self.lock:
            self.slice_writes_in_flight += 1
            self.slice_write_ports.append(port)
            self.slice_writes_most = max(self.slice_writes_most, self.slice_writes_in_flight)
            self.lock.notify_all()
            self.lock.wait_for(lambda: self.slice_writes_in_flight >= self._gather, timeout=5.0)
            self._gather = 0  # reached (or given up): the later writes pass

    def _slice_write_ends(self) -> None:
        with self.lock:
            self.slice_writes_in_flight -= 1

    def slice_writes(self, since: int = 0) -> list[Request]:
        """The ResourceSlice creates and updates answered 2xx (after request ``since``)."""
        with self.lock:
            return [
                r
                for r in self.requests[since:]
                if r.method in ("POST", "PUT", "PATCH")
                and "/resourceslices" in r.path
                and 200 <= r.code < 300
            ]

    def _validate(self, kind: Kind, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        causes = VALIDATORS[kind.plural](obj, old)
        if causes:
            raise _invalid(kind, str((obj.get("metadata") or {}).get("name", ""))[:253], causes)

    def _key(self, kind: Kind, ns: str, name: str) -> tuple[str, str, str]:
        return (kind.plural, ns if kind.namespaced else "", name)

    def _create(
        self, kind: Kind, ns: str, body: Any, *, keep_status: bool = False, owned: bool = False
    ) -> dict[str, Any]:
        """Store ``body`` as created: a copy of what was stored, or -- ``owned``: the body is
        a request's own, and the answer only encoded (the HTTP path) -- the stored object
        itself (never changed in place, :class:`Store`), with no copy on either way."""
        obj = self._decode(kind, body, owned)
        meta = obj.setdefault("metadata", {})
        if meta.get("resourceVersion"):
            raise _bad_request("resourceVersion should not be set on objects to be created")
        if kind.namespaced:
            if meta.get("namespace") not in (None, "", ns):
                raise _bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"][:58] + "".join(
                random.choices(_GENERATE_ALPHABET, k=5)
            )
        if kind.has_status and not keep_status:
            obj.pop("status", None)
        obj["kind"], obj["apiVersion"] = kind.kind, kind.api_version
        self._drop_disabled(kind, obj)
        self._validate(kind, obj, None)
        key = self._key(kind, ns, meta["name"])
        if key in self.store.objects:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.qualified} "{meta["name"]}" already exists',
                details={"name": meta["name"], "group": kind.group, "kind": kind.plural},
            )
        self.store.rv += 1
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(self.store.rv),
            creationTimestamp=self._now(),
            generation=1,
        )
        self.store.objects[key] = obj
        self._emit(kind, "ADDED", obj)
        return obj if owned else _clone(obj)

    def _get(self, kind: Kind, ns: str, name: str) -> dict[str, Any]:
        obj = self.store.objects.get(self._key(kind, ns, name))
        if obj is None:
            raise _not_found(kind, name)
        return obj

    def authorize(self, group: str, resource: str, verb: str, name: str) -> None:
        """RBAC as the API server applies ClusterRole rules (group, resource incl.
        ``/subresource``, verb, optional ``resourceNames``); 403 Forbidden otherwise."""
        if self.rules is None:
            return
        for rule in self.rules:
            if (
                group in rule.get("apiGroups", ())
                and resource in rule.get("resources", ())
                and (verb in rule.get("verbs", ()) or "*" in rule.get("verbs", ()))
                and (not rule.get("resourceNames") or name in rule["resourceNames"])
            ):
                return
        where = f' in API group "{group}"' if group else ""
        raise ApiError(
            403,
            "Forbidden",
            f'User "{self.user}" cannot {verb} resource "{resource}"{where}'
            + (f' named "{name[:80]}"' if name else ""),
        )

    def _authorize_claim_status(self, old: dict[str, Any], new: dict[str, Any], verb: str) -> None:
        """KEP-4817 granular authorization (DRAResourceClaimGranularStatusAuthorization, beta
        on in 1.36): a write of ``status.devices`` also needs ``associated-node:<verb>`` (a
        node-bound token, as ours) on ``resourceclaims/driver`` named after EVERY driver
        whose entries it adds, changes or removes."""

        def entries(obj: dict[str, Any]) -> dict[tuple[str, str, str], Any]:
            return {
                (d.get("driver", ""), d.get("pool", ""), d.get("device", "")): d
                for d in ((obj.get("status") or {}).get("devices") or [])
            }

        before, after = entries(old), entries(new)
        drivers = {k[0] for k in set(before) | set(after) if before.get(k) != after.get(k)}
        for driver in sorted(drivers):
            self.authorize(
                RESOURCE_GROUP, "resourceclaims/driver", f"associated-node:{verb}", driver
            )

    def _replace(
        self,
        kind: Kind,
        ns: str,
        name: str,
        body: Any,
        *,
        status: bool,
        verb: str = "update",
        owned: bool = False,
    ) -> dict[str, Any]:
        """Store ``body`` over ``name``; what :meth:`_create` answers (``owned`` alike)."""
        old = self._get(kind, ns, name)
        new = self._decode(kind, body, owned)
        meta = new.setdefault("metadata", {})
        if meta.get("name") not in (None, name):
            raise _bad_request(
                f"the name of the object ({str(meta.get('name'))[:80]}) does not match the name on the URL ({name})"
            )
        rv = meta.get("resourceVersion")
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise _conflict(kind, name)
        if status:  # the /status subresource changes only status
            merged = _clone(old)
            merged["status"] = new.get("status")
            new = merged
            if kind is CLAIMS:
                self._authorize_claim_status(old, new, verb)
        elif kind.has_status:
            new["status"] = _clone(old.get("status"))
        for server_owned in (
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "namespace",
            "name",
        ):
            if server_owned in old["metadata"]:
                new["metadata"][server_owned] = old["metadata"][server_owned]
            else:
                new["metadata"].pop(server_owned, None)
        new["kind"], new["apiVersion"] = kind.kind, kind.api_version
        self._drop_disabled(kind, new)
        self._validate(kind, new, old)
        if new == old:  # a no-op update does not bump resourceVersion
            return old if owned else _clone(old)
        if new.get("spec") != old.get("spec"):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        self.store.rv += 1
        new["metadata"]["resourceVersion"] = str(self.store.rv)
        self.store.objects[self._key(kind, ns, name)] = new
        self._emit(kind, "MODIFIED", new)
        return new if owned else _clone(new)

    def _patch(
        self, kind: Kind, ns: str, name: str, body: Any, content_type: str, *, status: bool
    ) -> dict[str, Any]:
        old = self._get(kind, ns, name)
        if content_type == "application/json-patch+json":
            patched = _json_patch(old, body)
        elif content_type in (
            "application/merge-patch+json",
            "application/strategic-merge-patch+json",
        ):
            if not isinstance(body, dict):
                raise _bad_request("a merge patch must be a JSON object")
            problems = decode_problems(body, kind.model)
            if problems:
                raise _bad_request("strict decoding error: " + ", ".join(problems[:20]))
            patched = _json_merge(old, body)
        else:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the API-server stand-in does not support patch content type {content_type[:80]!r} "
                "(server-side apply is not served)",
            )
        return self._replace(kind, ns, name, patched, status=status, verb="patch")

    def _delete(self, kind: Kind, ns: str, name: str, options: Any) -> dict[str, Any]:
        obj = self._get(kind, ns, name)
        pre = (options or {}).get("preconditions") or {}
        if pre.get("uid") and pre["uid"] != obj["metadata"]["uid"]:
            raise ApiError(
                409,
                "Conflict",
                f"Precondition failed: UID in precondition: {pre['uid'][:80]}, UID in object meta: {obj['metadata']['uid']}",
            )
        if (
            pre.get("resourceVersion")
            and pre["resourceVersion"] != obj["metadata"]["resourceVersion"]
        ):
            raise _conflict(kind, name)
        del self.store.objects[self._key(kind, ns, name)]
        self.store.rv += 1
        gone = _clone(obj)
        gone["metadata"]["resourceVersion"] = str(self.store.rv)
        self._emit(kind, "DELETED", gone)
        return gone

    def _select(
        self, kind: Kind, ns: str, query: dict[str, str]
    ) -> Callable[[dict[str, Any]], bool]:
        fields = parse_field_selector(kind, query.get("fieldSelector", ""))
        labels = parse_label_selector(query.get("labelSelector", ""))

        def match(obj: dict[str, Any]) -> bool:
            meta = obj.get("metadata") or {}
            if kind.namespaced and ns and meta.get("namespace") != ns:
                return False
            if any((_field_value(obj, f) == v) != eq for f, v, eq in fields):
                return False
            ls = meta.get("labels") or {}
            return all(p(ls) for p in labels)

        return match

    def _list(self, kind: Kind, ns: str, query: dict[str, str]) -> dict[str, Any]:
        match = self._select(kind, ns, query)
        if query.get("resourceVersionMatch") == "Exact":
            try:
                at = int(query.get("resourceVersion") or "")
            except ValueError:
                raise _bad_request("resourceVersionMatch=Exact needs a resourceVersion") from None
            gone = self._too_old(at)
            if gone is not None:
                raise gone
            if at != self.store.rv:  # the stand-in keeps no old states to answer from
                raise ApiError(
                    504,
                    "Timeout",
                    f"the stand-in lists only at the current resourceVersion {self.store.rv}",
                )
        items = [
            _clone(o)
            for (p, _, _), o in sorted(self.store.objects.items())
            if p == kind.plural and match(o)
        ]
        return {
            "kind": kind.kind + "List",
            "apiVersion": kind.api_version,
            "metadata": {"resourceVersion": str(self.store.rv)},
            "items": items,
        }

    def _delete_collection(self, kind: Kind, ns: str, query: dict[str, str]) -> dict[str, Any]:
        listing = self._list(kind, ns, query)
        deleted = [
            self._delete(kind, o["metadata"].get("namespace", ""), o["metadata"]["name"], None)
            for o in listing["items"]
        ]
        listing["items"] = deleted
        listing["metadata"] = {"resourceVersion": str(self.store.rv)}
        return listing

    def watch(self, kind: Kind, ns: str, query: dict[str, str]) -> Iterator[dict[str, Any]]:
        """Events for a watch request (runs in the connection's thread). Selectors and the
        resourceVersion are checked here, before the caller sends any header."""
        with self.lock:
            while self._watches_paused and not self.stopping:
                self.lock.wait(0.5)
            match = self._select(kind, ns, query)
            rv_text = query.get("resourceVersion", "")
            epoch = self._watch_epoch
            if rv_text in ("", "0"):
                start = self.store.rv
                initial = [
                    {"type": "ADDED", "object": _clone(o)}
                    for (p, _, _), o in sorted(self.store.objects.items())
                    if p == kind.plural and match(o)
                ]
            else:
                try:
                    start = int(rv_text)
                except ValueError:
                    raise _bad_request(f"invalid resourceVersion {rv_text[:40]!r}") from None
                gone = self._too_old(start)
                if gone is not None:  # answered 200, then the Status as an ERROR event
                    return iter([{"type": "ERROR", "object": gone.status()}])
                initial = []
        timeout = float(query.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
        return self._events(kind, match, initial, start, deadline, epoch, bookmarks)

    def _events(
        self,
        kind: Kind,
        match: Callable[[dict[str, Any]], bool],
        initial: list[dict[str, Any]],
        seen: int,
        deadline: float,
        epoch: int,
        bookmarks: bool,
    ) -> Iterator[dict[str, Any]]:
        with self.lock:
            self.open_watches += 1
            self.lock.notify_all()
        try:
            yield from initial
            while True:
                bookmark: dict[str, Any] | None = None
                batch: list[Event] = []
                with self.lock:
                    while (
                        not self.stopping
                        and epoch == self._watch_epoch
                        and (not self.store.events or self.store.events[-1].rv <= seen)
                    ):
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self.lock.wait(min(left, 0.5))
                    if self.stopping or epoch != self._watch_epoch:
                        return
                    if self.store.events and self.store.events[-1].rv > seen:
                        batch = [e for e in self.store.events if e.rv > seen]
                        seen = self.store.events[-1].rv
                    elif bookmarks:  # the timeout: where the next watch may start
                        bookmark = {
                            "type": "BOOKMARK",
                            "object": {
                                "kind": kind.kind,
                                "apiVersion": kind.api_version,
                                "metadata": {"resourceVersion": str(self.store.rv)},
                            },
                        }
                for e in batch:  # an event's object is the stored one, only ever encoded
                    if e.kind is kind and match(e.obj):
                        yield {"type": e.type, "object": e.obj}
                if not batch:  # the timeout passed
                    if bookmark is not None:
                        yield bookmark
                    return
        finally:
            with self.lock:
                self.open_watches -= 1
                self.lock.notify_all()


def _tls_context(directory: str) -> tuple[bytes, ssl.SSLContext]:
    """A fresh CA and a serving certificate for 127.0.0.1 signed by it (files in
    ``directory``); returns (CA PEM, server context)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "apiserver-standin-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_file = os.path.join(directory, "apiserver.crt")
    key_file = os.path.join(directory, "apiserver.key")
    with open(cert_file, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(key_file, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    return ca.public_bytes(serialization.Encoding.PEM), context


_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[a-z0-9.-]+)/(?P<version>v1))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>status))?)?$"
)


class _Handler(BaseHTTPRequestHandler):
    api: ApiServerStandin
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # quiet in tests
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            # read (and drop) a bounded amount so the client sees the answer, then hang up
            left = min(length, 2 * MAX_BODY)
            while left > 0:
                got = self.rfile.read(min(left, 1 << 16))
                if not got:
                    break
                left -= len(got)
            self.close_connection = True
            raise ApiError(
                413,
                "RequestEntityTooLarge",
                f"the request body is {length} bytes, more than {MAX_BODY}",
            )
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError as e:
            raise _bad_request(f"the body is not JSON: {e!s:.120}") from e

    def _route(self) -> tuple[Kind, str, str, bool, dict[str, str]]:
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        m = _PATH.match(url.path)
        kind = None
        if m:
            group = "" if m.group("core") else m.group("group")
            kind = next(
                (k for k in KINDS if k.plural == m.group("plural") and k.group == group), None
            )
        if m is None or kind is None:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({url.path[:120]})",
            )
        ns = m.group("ns") or ""
        if ns and not kind.namespaced:
            raise ApiError(
                404,
                "NotFound",
                f"{kind.plural} is cluster-scoped: no namespaces/{ns[:63]} in its path",
            )
        sub = m.group("sub") == "status"
        if sub and not kind.has_status:
            raise ApiError(404, "NotFound", f"{kind.plural} has no status subresource")
        return kind, ns, m.group("name") or "", sub, query

    def _record(self, method: str, code: int, answered_as: str = "json") -> None:
        """Note the request BEFORE answering it: a client that got its answer finds it."""
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        with self.api.lock:
            self.api.requests.append(
                Request(method, url.path, query, code, answered_as=answered_as)
            )
            self.api.lock.notify_all()

    def _serve(self, method: str) -> None:
        try:
            if self.headers.get("Authorization") != f"Bearer {self.api.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            kind, ns, name, sub, query = self._route()
            self.api.authorize(
                kind.group,
                kind.plural + ("/status" if sub else ""),
                _rbac_verb(method, bool(name), query),
                name,
            )
            body = self._body() if method in ("POST", "PUT", "PATCH", "DELETE") else None
            self.api._take_failure(method, kind.plural, sub)
            if kind.plural == "resourceslices" and method in ("POST", "PUT"):
                self.api._slice_write_begins(self.client_address[1])
                try:
                    self._answer(method, kind, ns, name, sub, query, body)
                finally:
                    self.api._slice_write_ends()
                return
            self._answer(method, kind, ns, name, sub, query, body)
        except ApiError as e:
            self._record(method, e.code)
            self._send(e.code, e.status())

    def _answer(
        self,
        method: str,
        kind: Kind,
        ns: str,
        name: str,
        sub: bool,
        query: dict[str, str],
        body: Any,
    ) -> None:
        code = 200
        try:
            if method == "GET" and not name and query.get("watch") in ("true", "1"):
                if self.api._take_hang_up(kind.plural):
                    self.close_connection = True  # no status line: the client sees a hang-up
                    return
                self._watch(kind, ns, query)
                return
            if query.get("dryRun"):
                raise _bad_request("the API-server stand-in does not serve dryRun")
            answered_as = _answer_as(self.headers.get("Accept") or "", method, bool(name))
            if method == "GET" and not name and not self.api._wait_if_held(kind, self.connection):
                self.close_connection = True
                return
            with self.api.lock:
                if method == "GET":
                    result = (
                        self.api._get(kind, ns, name) if name else self.api._list(kind, ns, query)
                    )
                    result = _clone(result)
                    if answered_as == METADATA_LIST:
                        result = _metadata_list(result)
                elif method == "POST" and not name:
                    if kind.namespaced and not ns:
                        raise ApiError(
                            405,
                            "MethodNotAllowed",
                            "create a namespaced object under /namespaces/<ns>/",
                        )
                    # the body is this request's own, the answer only encoded: no copies
                    result, code = self.api._create(kind, ns, body, owned=True), 201
                elif method == "PUT" and name:
                    result = self.api._replace(kind, ns, name, body, status=sub, owned=True)
                elif method == "PATCH" and name:
                    ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                    result = self.api._patch(kind, ns, name, body, ctype, status=sub)
                elif method == "DELETE" and name:
                    result = self.api._delete(kind, ns, name, body)
                elif method == "DELETE":
                    result = self.api._delete_collection(kind, ns, query)
                else:
                    raise ApiError(
                        405, "MethodNotAllowed", f"{method} is not allowed on {self.path[:120]}"
                    )
        except ApiError as e:
            self._record(method, e.code)
            self._send(e.code, e.status())
            return
        self._record(method, code, answered_as)
        self._send(code, result)

    def _watch(self, kind: Kind, ns: str, query: dict[str, str]) -> None:
        events = self.api.watch(kind, ns, query)  # selector errors raise before any header
        self._record("GET", 200)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            for event in events:
                chunk(json.dumps(event).encode() + b"\n")
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def do_GET(self) -> None:
        from tests.dra import standin_exec

        if standin_exec.is_exec(self.path):
            standin_exec.serve(self, self.api, self.api.exec_runner)
            return
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_DELETE(self) -> None:
        self._serve("DELETE")


# == KEP-5004: extended resources served by DRA (issue 23) ====================================
# DeviceClasses (cluster-scoped; ``spec.extendedResourceName``) and Pods (namespaced, with a
# status subresource carrying ``extendedResourceClaimStatus``) are served like the kinds
# above, through the same decoding and validation core; :func:`schedule_extended_resources`
# is the scheduler's part of KEP-5004, as upstream documents it:
#
# - a container's limit on a name some DeviceClass serves (its ``extendedResourceName``, or
#   the implicit ``deviceclass.resource.kubernetes.io/<class>``; of several classes naming
#   it, the newest, ties to the lexicographically first) on a node whose ``allocatable`` does
#   not list it (no device plugin advertises it there) becomes a request of ONE claim per pod:
#   ``generateName <pod>-extended-resources-``, annotation
#   ``resource.kubernetes.io/extended-resource-claim: "true"``, owner the pod, one request per
#   (container, resource) named ``container-<i>-request-<j>`` (NOT part of the API),
#   ``exactly: {deviceClassName, allocationMode: ExactCount, count}``;
# - it is allocated on the node's slices (each pool's newest generation; devices the class's
#   CEL selects, evaluated with cel-python; none another claim holds; none with a NoSchedule
#   or NoExecute taint) and reserved for the pod;
# - the pod gets ``spec.nodeName`` and ``status.extendedResourceClaimStatus{resourceClaimName,
#   requestMappings[{containerName, resourceName, requestName}]}``.

DEVICE_CLASSES = Kind(
    "deviceclasses", "DeviceClass", RESOURCE_GROUP, "v1", "V1DeviceClass", False,
    ("metadata.name",), False,
)  # fmt: skip
PODS = Kind("pods", "Pod", "", "v1", "V1Pod", True, ("metadata.name", "spec.nodeName"), True)
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_CLASS_PREFIX = "deviceclass.resource.kubernetes.io/"
_MAX_SELECTORS = 32
_MAX_CEL = 10 * 1024
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def _cel_problem(expression: str) -> str | None:
    """Why kube-apiserver would refuse this CEL expression (it compiles every one)."""
    if not expression:
        return "Required value"
    if len(expression) > _MAX_CEL:
        return f"Too long: may not be more than {_MAX_CEL} bytes"
    import celpy  # a test extra (pyproject); the stand-in compiles as the real server does

    try:
        celpy.Environment().compile(expression)
    except Exception as e:  # celpy raises its own parse errors
        return f"Invalid value: compilation failed: {str(e)[:200]}"
    return None


def _extended_resource_problem(name: str) -> str | None:
    """kube-apiserver's ``IsExtendedResourceName`` for a DeviceClass's name field."""
    domain, sep, short = name.partition("/")
    if not sep or "/" in short:
        return "must be a domain-prefixed path (such as example.com/gpu)"
    if _dns_subdomain(domain) or not _QUALIFIED_NAME.fullmatch(short) or len(short) > 63:
        return "must be a qualified name: <DNS subdomain>/<name of 1-63 characters>"
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        return "the kubernetes.io namespace is reserved (the implicit deviceclass.resource.kubernetes.io/<class> name needs no field)"
    return None


def validate_device_class(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    causes = _meta_problems(DEVICE_CLASSES, obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    selectors = spec.get("selectors") or []
    if len(selectors) > _MAX_SELECTORS:
        causes.append(
            (
                "spec.selectors",
                f"Too many: {len(selectors)}: must have at most {_MAX_SELECTORS} items",
            )
        )
    for i, sel in enumerate(selectors):
        cel = (sel or {}).get("cel")
        if cel is None:
            causes.append((f"spec.selectors[{i}]", "Required value: exactly one of `cel`"))
        elif why := _cel_problem(cel.get("expression") or ""):
            causes.append((f"spec.selectors[{i}].cel.expression", why))
    name = spec.get("extendedResourceName")
    if name is not None and (why := _extended_resource_problem(name)):
        causes.append(("spec.extendedResourceName", f"Invalid value: {name[:120]!r}: {why}"))
    return causes


def validate_pod(obj: dict[str, Any], old: dict[str, Any] | None) -> list[tuple[str, str]]:
    causes = _meta_problems(PODS, obj.get("metadata") or {})
    spec = obj.get("spec") or {}
    containers = spec.get("containers") or []
    if not containers:
        causes.append(("spec.containers", "Required value"))
    for i, ctr in enumerate(containers):
        p = f"spec.containers[{i}]"
        if why := _dns_label(ctr.get("name") or ""):
            causes.append((f"{p}.name", f"Invalid value: {why}"))
        res = ctr.get("resources") or {}
        limits, requests = res.get("limits") or {}, res.get("requests") or {}
        for rname, value in {**requests, **limits}.items():
            if "/" not in rname or rname.partition("/")[0].endswith("kubernetes.io"):
                continue  # cpu, memory, hugepages-*: not modelled here
            if not re.fullmatch(r"[0-9]+", str(value)):
                causes.append(
                    (f"{p}.resources", f"Invalid value: {value!r}: must be an integer for {rname}")
                )
            elif (
                rname in requests and rname in limits and str(requests[rname]) != str(limits[rname])
            ):
                causes.append(
                    (f"{p}.resources.requests", f"Invalid value: must be equal to {rname} limit")
                )
    if old is not None:
        if spec.get("containers") != (old.get("spec") or {}).get("containers"):
            causes.append(("spec.containers", "Forbidden: pod updates may not change containers"))
        was = (old.get("spec") or {}).get("nodeName")
        if was and spec.get("nodeName") != was:
            causes.append(("spec.nodeName", "Forbidden: a pod's node may not change"))
    return causes


KINDS = (*KINDS, DEVICE_CLASSES, PODS)
VALIDATORS.update({"deviceclasses": validate_device_class, "pods": validate_pod})


class Unschedulable(AssertionError):
    """The stand-in scheduler cannot place the pod's extended resources on the node."""


def _class_for(api: ApiServerStandin, resource: str) -> dict[str, Any] | None:
    classes = api.objects(DEVICE_CLASSES)
    if resource.startswith(IMPLICIT_CLASS_PREFIX):
        name = resource.removeprefix(IMPLICIT_CLASS_PREFIX)
        return next((c for c in classes if c["metadata"]["name"] == name), None)
    named = [c for c in classes if (c.get("spec") or {}).get("extendedResourceName") == resource]
    if not named:
        return None
    newest = max(c["metadata"]["creationTimestamp"] for c in named)
    tied = [c for c in named if c["metadata"]["creationTimestamp"] == newest]
    return min(tied, key=lambda c: c["metadata"]["name"])


def _cel_device(driver: str, device: dict[str, Any]) -> dict[str, Any]:
    """A slice device as a DRA CEL expression sees it (bare attribute names: driver's domain)."""
    attrs: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, ident = name.rpartition("/")
        attrs.setdefault(domain or driver, {})[ident] = next(iter(value.values()))
    return {"driver": driver, "attributes": attrs}


def _selects(device_class: dict[str, Any], driver: str, device: dict[str, Any]) -> bool:
    import celpy

    env = celpy.Environment()
    activation = {"device": celpy.json_to_cel(_cel_device(driver, device))}
    for sel in (device_class.get("spec") or {}).get("selectors") or []:
        result = env.program(env.compile(sel["cel"]["expression"])).evaluate(activation)
        if isinstance(result, Exception) or not bool(result):
            return False  # a runtime error does not select (the scheduler reports it)
    return True


def schedule_extended_resources(
    api: ApiServerStandin, namespace: str, pod_name: str, node: str
) -> dict[str, Any] | None:
    """Bind the pod to ``node`` and, when it asks for names DRA serves there, make and
    allocate its extended-resource claim (see this section's header). Returns the claim
    (None: nothing DRA-backed). Raises :class:`Unschedulable` naming what is missing."""
    pod = api.objects(PODS, namespace)
    pod = next(p for p in pod if p["metadata"]["name"] == pod_name)
    node_obj = next(n for n in api.objects(NODES) if n["metadata"]["name"] == node)
    allocatable = (node_obj.get("status") or {}).get("allocatable") or {}
    requests: list[dict[str, Any]] = []
    mappings: list[dict[str, str]] = []
    classes: dict[str, dict[str, Any]] = {}
    for i, ctr in enumerate(pod["spec"]["containers"]):
        j = 0
        for resource, count in ((ctr.get("resources") or {}).get("limits") or {}).items():
            cls = _class_for(api, resource)
            if cls is None or resource in allocatable:
                # not DRA-backed, or a device plugin advertises it on this node (listed, even
                # at 0: the kubelet keeps a stopped plugin's name for its grace period)
                continue
            name = f"container-{i}-request-{j}"
            j += 1
            classes[name] = cls
            requests.append(
                {
                    "name": name,
                    "exactly": {
                        "deviceClassName": cls["metadata"]["name"],
                        "allocationMode": "ExactCount",
                        "count": int(str(count)),
                    },
                }
            )
            mappings.append(
                {"containerName": ctr["name"], "resourceName": resource, "requestName": name}
            )
    bound = {**pod, "spec": {**pod["spec"], "nodeName": node}}
    if not requests:
        with api.lock:
            api._replace(PODS, namespace, pod_name, bound, status=False)
        return None
    taken = {
        (r["driver"], r["pool"], r["device"])
        for c in api.objects(CLAIMS)
        for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
            "results"
        )
        or []
    }
    slices = [s for s in api.objects(SLICES) if s["spec"].get("nodeName") == node]
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, 0), s["spec"]["pool"]["generation"])
    free = [
        (s["spec"]["driver"], s["spec"]["pool"]["name"], d)
        for s in slices
        if s["spec"]["pool"]["generation"]
        == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
        for d in s["spec"].get("devices") or []
        if not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in d.get("taints") or [])
    ]
    results: list[dict[str, str]] = []
    for req in requests:
        want = req["exactly"]["count"]
        for driver, pool, device in free:
            key = (driver, pool, device["name"])
            if want and key not in taken and _selects(classes[req["name"]], driver, device):
                taken.add(key)
                results.append(
                    {
                        "request": req["name"],
                        "driver": driver,
                        "pool": pool,
                        "device": device["name"],
                    }
                )
                want -= 1
        if want:
            raise Unschedulable(
                f"pod {namespace}/{pod_name}: {want} more device(s) of class "
                f"{req['exactly']['deviceClassName']} needed on node {node} for {req['name']}"
            )
    meta = pod["metadata"]
    claim = {
        "apiVersion": CLAIMS.api_version,
        "kind": CLAIMS.kind,
        "metadata": {
            "generateName": f"{pod_name}-extended-resources-",
            "namespace": namespace,
            "annotations": {EXTENDED_RESOURCE_CLAIM: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": pod_name,
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"devices": {"requests": requests}},
    }
    with api.lock:
        made = api._create(CLAIMS, namespace, claim)
        made["status"] = {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
            },
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": meta["uid"]}],
        }  # fmt: skip
        made = api._replace(CLAIMS, namespace, made["metadata"]["name"], made, status=True)
        bound = api._replace(PODS, namespace, pod_name, bound, status=False)
        bound["status"] = {
            **(bound.get("status") or {}),
            "extendedResourceClaimStatus": {
                "resourceClaimName": made["metadata"]["name"],
                "requestMappings": mappings,
            },
        }
        api._replace(PODS, namespace, pod_name, bound, status=True)
    return made
