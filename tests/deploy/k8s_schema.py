"""A strict structural checker for rendered Kubernetes objects.

Built-in kinds are checked against the ``kubernetes`` Python client's models: each model's
``attribute_map`` names every JSON field the API knows, and ``openapi_types`` gives each
field's type (``V1PodSpec``, ``List[V1Container]``, ``Dict[str, str]``, ``int``, ...). The
checker walks the object recursively and reports every unknown field and every value of the
wrong JSON type, with its path. Custom resources (cert-manager) are checked against the small
explicit schemas in :data:`CRD_SCHEMAS`.

A second, independent check (:func:`deserialize_errors`) feeds the object through the client's
own deserializer, which enforces required fields and enum values the client knows.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import Any

import kubernetes.client as k8s
from kubernetes.client import ApiClient

# (apiVersion, kind) -> model class name. A kind that is not listed is an error, so a new
# manifest cannot slip through unchecked.
BUILTIN_KINDS: dict[tuple[str, str], str] = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job",
    ("batch/v1", "CronJob"): "V1CronJob",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    (
        "admissionregistration.k8s.io/v1",
        "MutatingWebhookConfiguration",
    ): "V1MutatingWebhookConfiguration",
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicy",
    ): "V1ValidatingAdmissionPolicy",
    (
        "admissionregistration.k8s.io/v1",
        "ValidatingAdmissionPolicyBinding",
    ): "V1ValidatingAdmissionPolicyBinding",
    ("resource.k8s.io/v1", "DeviceClass"): "V1DeviceClass",
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): "V1ResourceClaimTemplate",
    ("resource.k8s.io/v1", "ResourceSlice"): "V1ResourceSlice",
    ("resource.k8s.io/v1", "DeviceTaintRule"): "V1DeviceTaintRule",
}

_LIST = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict\[|dict\()str, (.+)[\])]$")
_PRIMITIVES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
}


@dataclass(frozen=True, slots=True)
class Problem:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _type_name(value: object) -> str:
    return type(value).__name__


def check_typed(value: object, type_name: str, path: str, out: list[Problem]) -> None:
    """Check ``value`` against a client type string such as ``List[V1Container]``."""
    if value is None:
        return  # an explicit null is how YAML spells "unset"
    m = _LIST.match(type_name)
    if m:
        if not isinstance(value, list):
            out.append(Problem(path, f"expected a list ({type_name}), got {_type_name(value)}"))
            return
        for i, item in enumerate(value):
            check_typed(item, m.group(1), f"{path}[{i}]", out)
        return
    m = _DICT.match(type_name)
    if m:
        if not isinstance(value, dict):
            out.append(Problem(path, f"expected a map ({type_name}), got {_type_name(value)}"))
            return
        for key, item in value.items():
            if not isinstance(key, str):
                out.append(Problem(f"{path}.{key}", "map keys must be strings"))
            check_typed(item, m.group(1), f"{path}.{key}", out)
        return
    if type_name == "object":
        return  # IntOrString, RawExtension, ...: any JSON value
    if type_name in ("bytes", "bytearray"):
        # []byte travels as base64 text; Go's decoder skips line breaks, so do we.
        if not isinstance(value, str):
            out.append(Problem(path, f"expected base64 text, got {_type_name(value)}"))
        else:
            try:
                base64.b64decode("".join(value.split()), validate=True)
            except binascii.Error as e:
                out.append(Problem(path, f"not valid base64: {e}"))
        return
    if type_name in _PRIMITIVES:
        allowed = _PRIMITIVES[type_name]
        # bool is an int in Python; YAML `true` is never a valid int or string.
        if isinstance(value, bool) and bool not in allowed:
            out.append(Problem(path, f"expected {type_name}, got bool {value!r}"))
        elif not isinstance(value, allowed):
            out.append(Problem(path, f"expected {type_name}, got {_type_name(value)} {value!r}"))
        return
    model = getattr(k8s, type_name, None)
    if model is None:
        out.append(Problem(path, f"checker does not know the type {type_name!r}"))
        return
    check_model(value, model, path, out)


def check_model(value: object, model: type, path: str, out: list[Problem]) -> None:
    if not isinstance(value, dict):
        out.append(Problem(path, f"expected an object ({model.__name__}), got {_type_name(value)}"))
        return
    attribute_map: dict[str, str] = model.attribute_map  # type: ignore[attr-defined]
    openapi_types: dict[str, str] = model.openapi_types  # type: ignore[attr-defined]
    by_json = {json_key: openapi_types[attr] for attr, json_key in attribute_map.items()}
    for key, item in value.items():
        sub = f"{path}.{key}" if path else str(key)
        if key not in by_json:
            known = ", ".join(sorted(by_json))
            out.append(Problem(sub, f"unknown field for {model.__name__} (known: {known})"))
            continue
        check_typed(item, by_json[key], sub, out)


# ----------------------------------------------------------------------- custom resources
# A schema is a primitive type name, ("list", schema), ("map", schema), or a dict of
# field -> schema (unknown fields are errors). Written from cert-manager's v1 API.
Schema = Any

_META = "V1ObjectMeta"
_ISSUER_REF: Schema = {"name": "str", "kind": "str", "group": "str"}
CRD_SCHEMAS: dict[tuple[str, str], Schema] = {
    ("cert-manager.io/v1", "Issuer"): {
        "apiVersion": "str",
        "kind": "str",
        "metadata": _META,
        "spec": {
            "selfSigned": {"crlDistributionPoints": ("list", "str")},
            "ca": {
                "secretName": "str",
                "crlDistributionPoints": ("list", "str"),
                "ocspServers": ("list", "str"),
            },
        },
    },
    ("cert-manager.io/v1", "Certificate"): {
        "apiVersion": "str",
        "kind": "str",
        "metadata": _META,
        "spec": {
            "secretName": "str",
            "commonName": "str",
            "dnsNames": ("list", "str"),
            "ipAddresses": ("list", "str"),
            "uris": ("list", "str"),
            "duration": "str",
            "renewBefore": "str",
            "isCA": "bool",
            "usages": ("list", "str"),
            "issuerRef": _ISSUER_REF,
            "privateKey": {
                "algorithm": "str",
                "encoding": "str",
                "size": "int",
                "rotationPolicy": "str",
            },
            "secretTemplate": {
                "annotations": ("map", "str"),
                "labels": ("map", "str"),
            },
            "revisionHistoryLimit": "int",
        },
    },
}
# Values cert-manager's validation accepts for these enums.
CRD_ENUMS: dict[str, set[object]] = {
    "spec.privateKey.algorithm": {"RSA", "ECDSA", "Ed25519"},
    "spec.privateKey.rotationPolicy": {"Never", "Always"},
    "spec.privateKey.encoding": {"PKCS1", "PKCS8"},
    "spec.issuerRef.kind": {"Issuer", "ClusterIssuer"},
}
_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment",
    "key agreement", "data encipherment", "cert sign", "crl sign", "encipher only",
    "decipher only", "any", "server auth", "client auth", "code signing", "email protection",
    "s/mime", "ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
    "microsoft sgc", "netscape sgc",
}  # fmt: skip


def check_schema(value: object, schema: Schema, path: str, out: list[Problem]) -> None:
    if value is None:
        return
    if isinstance(schema, str):
        check_typed(value, schema, path, out)
    elif isinstance(schema, tuple):
        container, inner = schema
        if container == "list":
            if not isinstance(value, list):
                out.append(Problem(path, f"expected a list, got {_type_name(value)}"))
                return
            for i, item in enumerate(value):
                check_schema(item, inner, f"{path}[{i}]", out)
        else:
            if not isinstance(value, dict):
                out.append(Problem(path, f"expected a map, got {_type_name(value)}"))
                return
            for key, item in value.items():
                check_schema(item, inner, f"{path}.{key}", out)
    else:
        if not isinstance(value, dict):
            out.append(Problem(path, f"expected an object, got {_type_name(value)}"))
            return
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            if key not in schema:
                out.append(Problem(sub, f"unknown field (known: {', '.join(sorted(schema))})"))
                continue
            check_schema(item, schema[key], sub, out)
            if sub in CRD_ENUMS and item not in CRD_ENUMS[sub]:
                out.append(
                    Problem(sub, f"{item!r} is not one of {sorted(map(str, CRD_ENUMS[sub]))}")
                )
        if path == "spec" and isinstance(value.get("usages"), list):
            for u in value["usages"]:
                if u not in _USAGES:
                    out.append(Problem("spec.usages", f"{u!r} is not a cert-manager key usage"))


# ------------------------------------------------------------------------------ entry points


def check_object(obj: object) -> list[Problem]:
    """Every structural problem of one rendered object (empty list = OK)."""
    if not isinstance(obj, dict):
        return [Problem("", f"expected an object, got {_type_name(obj)}")]
    key = (obj.get("apiVersion"), obj.get("kind"))
    if not isinstance(key[0], str) or not isinstance(key[1], str):
        return [Problem("", "apiVersion and kind must be strings")]
    out: list[Problem] = []
    kind_key = (key[0], key[1])
    if kind_key in BUILTIN_KINDS:
        check_model(obj, getattr(k8s, BUILTIN_KINDS[kind_key]), "", out)
    elif kind_key in CRD_SCHEMAS:
        check_schema(obj, CRD_SCHEMAS[kind_key], "", out)
        meta = obj.get("metadata")
        if not isinstance(meta, dict) or not meta.get("name"):
            out.append(Problem("metadata.name", "required"))
        if "spec" not in obj:
            out.append(Problem("spec", "required"))
    else:
        out.append(
            Problem("", f"no schema for {kind_key[0]} {kind_key[1]}: add one to the checker")
        )
    return out


def deserialize_errors(obj: dict[str, Any]) -> list[str]:
    """Run a built-in object through the client's deserializer (required fields, enums)."""
    name = BUILTIN_KINDS.get((obj["apiVersion"], obj["kind"]))
    if name is None:
        return []
    try:
        # The public deserialize() changed signature across client versions (response object
        # vs. text); the private worker it calls is the same in both.
        ApiClient()._ApiClient__deserialize(json.loads(json.dumps(obj)), name)  # type: ignore[attr-defined]
    except ValueError as e:
        return [f"{obj['kind']}/{obj.get('metadata', {}).get('name')}: {e}"]
    return []
