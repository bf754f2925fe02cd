"""AdmissionReview ``admission.k8s.io/v1`` in, AdmissionReview out (pure).

Request (what the API server POSTs)::

    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
     "request": {"uid": "705ab4f5-...", "operation": "CREATE",
                 "kind": {"group": "kubevirt.io", "version": "v1", "kind": "VirtualMachineInstance"},
                 "object": {...}}}

Response — allowed with a patch, allowed unchanged, or denied naming the entry and the fix::

    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
     "response": {"uid": "705ab4f5-...", "allowed": true,
                  "patchType": "JSONPatch", "patch": "<base64 of the JSON patch>"}}
    {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
     "response": {"uid": "...", "allowed": false,
                  "status": {"code": 422, "reason": "Invalid", "message": "..."}}}

A body that is not such a review raises :class:`~vm_translate.errors.ReviewError` (the
webhook answers HTTP 400 with the reason): not JSON, not UTF-8, nested deeper than
:data:`MAX_DEPTH` (a Kubernetes object is about 15 levels deep inside its review; Python's
JSON parser itself gives up near 1,000), or not shaped like a review. Pod UPDATEs are allowed untouched: a running
pod's resources are immutable, and CREATE already recorded what was applied.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal, NotRequired, Required, TypedDict

from vfio_dp.model.config import Config
from vfio_dp.model.json_depth import nesting_depth
from vm_translate.errors import ReviewError, SpecError
from vm_translate.nodes import NodeResources, capacity_problems
from vm_translate.spec import POD_KIND
from vm_translate.translate import Translation, translate

API_VERSION = "admission.k8s.io/v1"
#: Deepest nesting of arrays/objects accepted in a review body.
MAX_DEPTH = 200


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class AdmissionRequest(TypedDict, total=False):
    uid: Required[str]
    kind: GroupVersionKind
    operation: str
    namespace: str
    name: str
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool


class Status(TypedDict, total=False):
    code: int
    reason: str
    message: str


class AdmissionResponse(TypedDict, total=False):
    uid: Required[str]
    allowed: Required[bool]
    patchType: Literal["JSONPatch"]
    patch: str
    status: Status
    warnings: list[str]


class AdmissionReview(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    request: NotRequired[AdmissionRequest]
    response: NotRequired[AdmissionResponse]


def parse_review(body: bytes) -> AdmissionRequest:
    """The ``request`` of an AdmissionReview body; raise :class:`ReviewError` saying why not."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise ReviewError(f"body is not JSON ({e})") from e
    except RecursionError as e:
        raise ReviewError(
            f"body is JSON nested too deep to parse; at most {MAX_DEPTH} levels of "
            "arrays/objects are accepted"
        ) from e
    # each level opens with a "[" or "{" byte (strings' brackets count too: an upper bound):
    # a body with at most MAX_DEPTH of them needs no walk (~0.06 ms of a ~0.5 ms review)
    opens = body.count(b"[") + body.count(b"{")
    if opens > MAX_DEPTH and nesting_depth(data, MAX_DEPTH) > MAX_DEPTH:
        raise ReviewError(
            f"body is JSON nested more than {MAX_DEPTH} levels deep; at most {MAX_DEPTH} "
            "levels of arrays/objects are accepted"
        )
    if not isinstance(data, dict):
        raise ReviewError("body is not a JSON object")
    if data.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind is {data.get('kind')!r}, expected 'AdmissionReview'")
    if data.get("apiVersion") != API_VERSION:
        raise ReviewError(
            f"apiVersion is {data.get('apiVersion')!r}, expected {API_VERSION!r}; set "
            "admissionReviewVersions: [v1] in the MutatingWebhookConfiguration"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing or not a string")
    obj = request.get("object")
    if obj is not None and not isinstance(obj, dict):
        raise ReviewError("request.object is not an object")
    if obj is None and request.get("operation") in ("CREATE", "UPDATE"):
        raise ReviewError(f"request.object is missing for {request['operation']}")
    return request  # type: ignore[return-value]  # shape checked above


def _kind_of(request: AdmissionRequest, obj: Mapping[str, Any]) -> str:
    kind = request.get("kind")
    if isinstance(kind, Mapping) and isinstance(kind.get("kind"), str):
        return str(kind["kind"])
    return str(obj.get("kind", ""))


def decide(
    request: AdmissionRequest,
    config: Config,
    nodes: Sequence[NodeResources] | None = None,
    warnings: Sequence[str] = (),
) -> AdmissionReview:
    """The complete response to one request. ``nodes`` enables the capacity check."""
    uid = request["uid"]
    obj = request.get("object")
    if obj is None:  # DELETE / CONNECT: nothing to translate
        return allow(uid, None, warnings)
    kind = _kind_of(request, obj)
    if kind == POD_KIND and request.get("operation") != "CREATE":
        return allow(uid, None, warnings)
    if "kind" not in obj and kind:  # objects in reviews carry kind; be safe when they do not
        obj = {**obj, "kind": kind}
    try:
        translation = translate(obj, config)
    except SpecError as e:
        return deny(uid, str(e))
    if nodes is not None:
        problems = capacity_problems(translation.requests, nodes)
        if problems:
            return deny(uid, f"{translation.subject}: " + "; ".join(problems))
    return allow(uid, translation, warnings)


def allow(
    uid: str, translation: Translation | None, warnings: Sequence[str] = ()
) -> AdmissionReview:
    response: AdmissionResponse = {"uid": uid, "allowed": True}
    if translation is not None and translation.changed:
        patch = json.dumps(list(translation.patch), separators=(",", ":")).encode()
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(patch).decode("ascii")
    if warnings:
        response["warnings"] = list(warnings)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def deny(uid: str, message: str) -> AdmissionReview:
    return {
        "apiVersion": API_VERSION,
        "kind": "AdmissionReview",
        "response": {
            "uid": uid,
            "allowed": False,
            "status": {"code": 422, "reason": "Invalid", "message": message},
        },
    }
