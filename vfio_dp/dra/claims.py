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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vfio_dp.dra import extended
from vfio_dp.errors import ClaimError
from vfio_dp.model import dra_metadata as md
from vfio_dp.model import naming


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


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def view_claim(obj: Mapping[str, Any]) -> ClaimView:
    """The parts of a ResourceClaim (API JSON, ``resource.k8s.io/v1``) that Prepare reads."""
    results: list[AllocationResult] = []
    for r in _get(obj, "status", "allocation", "devices", "results") or []:
        if not isinstance(r, dict):
            continue
        results.append(
            AllocationResult(
                request=str(r.get("request", "")),
                driver=str(r.get("driver", "")),
                pool=str(r.get("pool", "")),
                device=str(r.get("device", "")),
                admin_access=r.get("adminAccess") is True,
            )
        )
    configs: list[tuple[str, tuple[str, ...]]] = []
    for c in _get(obj, "status", "allocation", "devices", "config") or []:
        opaque = _get(c, "opaque")
        if isinstance(opaque, dict):
            reqs = _get(c, "requests") or []
            configs.append((str(opaque.get("driver", "")), tuple(str(x) for x in reqs)))
    annotations = _get(obj, "metadata", "annotations")
    return ClaimView(
        uid=str(_get(obj, "metadata", "uid") or ""),
        name=str(_get(obj, "metadata", "name") or ""),
        namespace=str(_get(obj, "metadata", "namespace") or ""),
        pod_claim_name=md.pod_claim_name(annotations if isinstance(annotations, dict) else None),
        allocated=isinstance(_get(obj, "status", "allocation"), dict),
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
    view = view_claim(obj)
    if view.uid != claim.uid:
        raise ClaimError(
            who,
            f"the ResourceClaim {claim.namespace}/{claim.name} now has uid {view.uid!r}: it "
            "was deleted and re-created; this request is for the old one",
        )
    return view


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
        if not naming.is_dns_label(md.request_base(r.request)):
            raise ClaimError(
                who, f"request name {r.request[:80]!r} is not a DNS label", r.device[:80]
            )
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
    view = view_claim(obj)
    if view.uid != uid:
        return f"its ResourceClaim was re-created (uid {view.uid})"
    if not any(r.driver == driver and r.pool == node for r in view.results):
        return "it is no longer allocated on this node"
    return None
