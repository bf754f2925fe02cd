"""Claims on the DRA path, pure: kubelet's claim identity and answers, the ResourceClaim as we
read it, and the checks that come before anything is touched. No I/O, no ``grpc``.

kubelet names a claim ``Claim{namespace, uid, name}`` (:class:`ClaimRef`) and is answered per
claim with its devices or an error (:class:`ClaimResult`). The ResourceClaim itself
(``resource.k8s.io/v1``, read through the API server) matters only in these parts::

    {"metadata": {"uid": "1f0c...", "name": "vm-gpu", "namespace": "default",
                  "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"}},
     "status": {"allocation": {"devices": {
         "results": [{"request": "gpu", "driver": "vfio.dra.vfio-dp.io", "pool": "node-a",
                      "device": "pci-0000-3b-00-0", "adminAccess": false}],
         "config": [{"requests": ["gpu"], "opaque": {"driver": "...", "parameters": {}}}]}}}}

:func:`view_claim` turns it into a :class:`ClaimView`; :func:`check_current` refuses a claim
re-created under the same name; :func:`ours` picks the results of our driver and refuses
what we cannot prepare (another node's pool, a request name that is not a DNS label -- it
reaches file paths --, opaque configuration for our driver: we define no parameters);
:func:`stale_reason` says why a checkpointed claim is no longer ours (reconcile).
A field of the wrong type or size (``results: 5``, more than :data:`MAX_RESULTS` results, a
pod-claim-name annotation that is not a string) is :class:`Malformed`, naming the field: an
error for that claim only. :func:`check_identity` refuses a UID already held under another
namespace/name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vfio_dp.dra.claimpath import extended
from vfio_dp.errors import ClaimError
from vfio_dp.model import dra_metadata as md
from vfio_dp.model import naming
from vfio_dp.model.parsed import dig


# -- kubelet's side ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClaimRef:
    """A ResourceClaim as kubelet names it: ``Claim{namespace=1, uid=2, name=3}``."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One device of a prepared claim: ``Device{request_names, pool_name, device_name,
    cdi_device_ids}`` (``share_id`` is never set: no device of ours is shared)."""

    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimResult:
    """The answer for one claim: its devices, or a non-empty ``error`` (devices then ignored)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


class Handler(Protocol):
    """What the DRA core does with kubelet's calls; both are called with validated claims
    (distinct uids) and must be idempotent (kubelet re-sends every claim on a retry)."""

    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, ClaimResult]:
        """Results keyed by claim uid."""
        ...

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Errors keyed by claim uid (``""`` = done)."""
        ...


def describe(namespace: str, name: str, uid: str) -> str:
    """``default/vm-gpu (uid 1f0c...)``: how every message names a claim."""
    return f"{namespace}/{name} (uid {uid})"


# -- the ResourceClaim, as far as we read it -------------------------------------------------
@dataclass(frozen=True, slots=True)
class AllocationResult:
    """``status.allocation.devices.results[]``: ``{request, driver, pool, device, adminAccess}``."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    #: the ``bindingConditions`` the scheduler copied from the device (KEP-5007): the device
    #: is switched ahead of the pod (:mod:`.ahead`)
    binding_conditions: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimView:
    uid: str
    name: str
    namespace: str
    pod_claim_name: str | None
    allocated: bool
    results: tuple[AllocationResult, ...]
    opaque_config: tuple[tuple[str, tuple[str, ...]], ...]  # (driver, requests) per entry
    #: made by the scheduler for a pod's extended-resource limits (KEP-5004)
    extended: bool = False
    #: request → its ``exactly.deviceClassName`` (how an extended request finds its resource)
    request_classes: tuple[tuple[str, str], ...] = ()


#: upstream's ``AllocationResultsMaxSize`` (resource.k8s.io/v1): no valid claim holds more results
MAX_RESULTS = 32
#: upstream's limit on ``status.allocation.devices.config`` entries (``+k8s:maxItems=64``)
MAX_CONFIG = 64
_DEVICES = "status.allocation.devices"


class Malformed(ValueError):
    """A field of a ResourceClaim has a type or size no valid claim has: ``field`` names it."""

    def __init__(self, field: str, why: str) -> None:
        self.field = field
        super().__init__(f"field {field} {why}: not a valid ResourceClaim, nothing was touched")


def _kind(value: object) -> str:
    return type(value).__name__


def _list(obj: Any, field: str, *path: str, limit: int | None = None) -> list[Any]:
    value = dig(obj, *path)
    if value is None:
        return []
    if not isinstance(value, list):
        raise Malformed(field, f"must be a list, got {_kind(value)} {str(value)[:40]!r}")
    if limit is not None and len(value) > limit:
        raise Malformed(field, f"has {len(value)} entries; a claim holds at most {limit}")
    return value


def _str(entry: Mapping[str, Any], key: str, field: str) -> str:
    value = entry.get(key, "")
    if not isinstance(value, str):
        raise Malformed(f"{field}.{key}", f"must be a string, got {_kind(value)}")
    return value


def view_claim(obj: Mapping[str, Any]) -> ClaimView:
    """The parts of a ResourceClaim (API JSON, ``resource.k8s.io/v1``) that Prepare reads;
    :class:`Malformed` (naming the field) when one has a type or size no valid claim has --
    checked before anything is built (at most :data:`MAX_RESULTS` results)."""
    results: list[AllocationResult] = []
    raw = _list(obj, f"{_DEVICES}.results", "status", "allocation", "devices", "results",
                limit=MAX_RESULTS)  # fmt: skip
    for i, r in enumerate(raw):
        field = f"{_DEVICES}.results[{i}]"
        if not isinstance(r, dict):
            raise Malformed(field, f"must be an object, got {_kind(r)}")
        results.append(
            AllocationResult(
                request=_str(r, "request", field),
                driver=_str(r, "driver", field),
                pool=_str(r, "pool", field),
                device=_str(r, "device", field),
                admin_access=r.get("adminAccess") is True,
                binding_conditions=tuple(
                    c
                    for c in _list(r, f"{field}.bindingConditions", "bindingConditions", limit=4)
                    if isinstance(c, str)
                ),
            )
        )
    configs: list[tuple[str, tuple[str, ...]]] = []
    raw = _list(obj, f"{_DEVICES}.config", "status", "allocation", "devices", "config",
                limit=MAX_CONFIG)  # fmt: skip
    for i, c in enumerate(raw):
        field = f"{_DEVICES}.config[{i}]"
        if not isinstance(c, dict):
            raise Malformed(field, f"must be an object, got {_kind(c)}")
        opaque = c.get("opaque")
        if isinstance(opaque, dict):
            reqs = _list(c, f"{field}.requests", "requests")
            if not all(isinstance(x, str) for x in reqs):
                raise Malformed(f"{field}.requests", "must be a list of strings")
            configs.append((_str(opaque, "driver", f"{field}.opaque"), tuple(reqs)))
    annotations = dig(obj, "metadata", "annotations")
    if annotations is not None and not isinstance(annotations, dict):
        raise Malformed("metadata.annotations", f"must be an object, got {_kind(annotations)}")
    pcn = (annotations or {}).get(md.POD_CLAIM_NAME_ANNOTATION)
    if pcn is not None and not isinstance(pcn, str):
        raise Malformed(
            f"metadata.annotations[{md.POD_CLAIM_NAME_ANNOTATION}]",
            f"must be a string, got {_kind(pcn)}",
        )
    meta: dict[str, str] = {}
    for key in ("uid", "name", "namespace"):
        value = dig(obj, "metadata", key)
        if value is not None and not isinstance(value, str):
            raise Malformed(f"metadata.{key}", f"must be a string, got {_kind(value)}")
        meta[key] = value or ""
    return ClaimView(
        uid=meta["uid"],
        name=meta["name"],
        namespace=meta["namespace"],
        pod_claim_name=md.pod_claim_name(annotations),
        allocated=isinstance(dig(obj, "status", "allocation"), dict),
        results=tuple(results),
        opaque_config=tuple(configs),
        extended=extended.is_extended(obj),
        request_classes=tuple(extended.request_classes(obj).items()),
    )


# -- the checks before anything is touched ---------------------------------------------------
def check_current(claim: ClaimRef, obj: Mapping[str, Any] | None) -> ClaimView:
    """The view of ``obj`` (the API server's answer for ``claim``), or :class:`ClaimError`
    when it is gone or is another claim of the same name (deleted and re-created)."""
    who = describe(claim.namespace, claim.name, claim.uid)
    if obj is None:
        raise ClaimError(
            who,
            f"the ResourceClaim {claim.namespace}/{claim.name} does not exist in the API "
            "server (deleted?); nothing was bound",
        )
    try:
        view = view_claim(obj)
    except Malformed as e:
        raise ClaimError(who, str(e)) from e
    if view.uid != claim.uid:
        raise ClaimError(
            who,
            f"the ResourceClaim {claim.namespace}/{claim.name} now has uid {view.uid!r}: it "
            "was deleted and re-created; this request is for the old one",
        )
    return view


def check_identity(claim: ClaimRef, namespace: str, name: str) -> None:
    """A UID names one claim forever: :class:`ClaimError` when ``claim`` comes with the UID
    of one this plugin already holds as ``namespace/name`` (a UID is never reused, so one of
    the two is not what it says; the first claim's files and devices are left alone)."""
    if (claim.namespace, claim.name) != (namespace, name):
        raise ClaimError(
            describe(claim.namespace, claim.name, claim.uid),
            f"uid {claim.uid} is already prepared here as the ResourceClaim "
            f"{namespace}/{name}; a uid names one claim only, refusing "
            f"{claim.namespace}/{claim.name} (unprepare {namespace}/{name} first if it is gone)",
        )


def ours(view: ClaimView, driver: str, node: str, who: str) -> tuple[AllocationResult, ...]:
    """The results of ``driver`` in ``view``, or :class:`ClaimError` naming why the claim
    cannot be prepared here (see the module docstring)."""
    if not view.allocated:
        raise ClaimError(who, "the ResourceClaim is not allocated (no status.allocation)")
    mine = [r for r in view.results if r.driver == driver]
    for r in mine:
        if r.pool != node:
            raise ClaimError(
                who,
                f"allocated from pool {r.pool!r}, but this is node {node!r}: the "
                "device is not ours to prepare",
                r.device,
            )
    if not mine:
        raise ClaimError(who, f"no device of driver {driver} is allocated to it")
    for r in mine:  # request names reach file paths: refuse before anything is touched
        if (problem := naming.request_name_problem(r.request)) is not None:
            raise ClaimError(who, problem, r.device[:80])
    seen: set[tuple[str, str]] = set()
    for r in mine:  # one device is one IOMMU group: it cannot be handed over twice
        if (r.pool, r.device) in seen:
            raise ClaimError(
                who, "allocated twice in this claim: not a valid allocation", r.device[:80]
            )
        seen.add((r.pool, r.device))
    requests = {md.request_base(r.request) for r in mine} | {r.request for r in mine}
    for cfg_driver, reqs in view.opaque_config:
        if cfg_driver != driver:
            continue
        if reqs and not requests.intersection(reqs):
            continue
        raise ClaimError(
            who,
            f"opaque configuration for driver {cfg_driver} (requests "
            f"{', '.join(reqs) or 'all'}) is not understood: {driver} takes no "
            "parameters; remove the config from the claim or its DeviceClass",
        )
    return tuple(mine)


def stale_reason(uid: str, obj: Mapping[str, Any] | None, driver: str, node: str) -> str | None:
    """Why a prepared claim (``uid``) is no longer ours, given the API server's answer for its
    namespace/name (None: gone); None while it is still allocated on this node."""
    if obj is None:
        return "its ResourceClaim is gone"
    if dig(obj, "metadata", "uid") != uid:
        return f"its ResourceClaim was re-created (uid {str(dig(obj, 'metadata', 'uid'))[:80]})"
    view = view_claim(obj)  # Malformed: the caller keeps the claim and reports it
    if view.uid != uid:
        return f"its ResourceClaim was re-created (uid {view.uid})"
    if not any(r.driver == driver and r.pool == node for r in view.results):
        return "it is no longer allocated on this node"
    return None
