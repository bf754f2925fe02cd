"""The claim's device status (KEP-4817): our entries of ``status.devices[]``, and their writer.

After a successful Prepare the DRA plugin writes one entry per device it prepared; it flips
the ``Ready`` condition with the device's health and removes its entries at Unprepare::

    PUT /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>/status
    {"status": {..., "devices": [
      {"driver": "vfio.dra.vfio-dp.io", "pool": "node-a", "device": "pci-0000-3b-00-0",
       "conditions": [{"type": "Ready", "status": "False", "reason": "DeviceUnhealthy",
                       "message": "0000:3b:00.1 (10de:10f8) was unbound ...",
                       "lastTransitionTime": "2026-11-24T19:02:11Z"}],
       "data": {"pciAddresses": ["0000:3b:00.0", "0000:3b:00.1"], "iommuGroup": 45,
                "vfioDevnodes": ["/dev/vfio/vfio", "/dev/vfio/45"], "boundBy": "claim:<uid>"}},
      <other drivers' entries, kept as they are>]}}

Read-modify-write: GET the claim, check its UID, replace only our driver's entries, PUT with
the ``resourceVersion`` read; a 409 Conflict (someone else wrote meanwhile) reads again, as
controllers do. The API server (Kubernetes >= 1.36) authorizes the write twice: ``update`` on
``resourceclaims/status`` AND ``associated-node:update`` on the synthetic
``resourceclaims/driver`` subresource named after our driver (RBAC in
``deploy/components/dra/dra-rbac.yaml``); a 403 is logged with that fix.

What to say of a device (:class:`~vfio_dp.dra.observers.claim_status.DeviceStatus`) and when
to write it is the claim-status feed's (:mod:`vfio_dp.dra.observers.claim_status`, which
runs this writer off the kubelet's path, on the status
:class:`~vfio_dp.dra.apiserver.client.Lane`). The builders are pure; :class:`ClaimStatusWriter`
is a blocking shell over the typed ``ResourceV1Api`` (``read_namespaced_resource_claim``,
``replace_namespaced_resource_claim_status``; built at its first write: its module loads ~100
pydantic models, ~0.15 s of CPU, not to be paid before the first slices); each call ends by its deadline
(:func:`~vfio_dp.dra.apiserver.client.call_json`) and says the server's status from
``ApiException.status``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import kubernetes.client as k8s

from vfio_dp.core.health import HEALTHY
from vfio_dp.dra.apiserver.client import call_json, with_deadlines
from vfio_dp.dra.observers.claim_status import DeviceStatus
from vfio_dp.errors import ApiCallError

log = logging.getLogger("vfio_dp.dra")

__all__ = [
    "Binding",
    "ClaimStatusWriter",
    "DeviceStatus",
    "StatusError",
    "entry",
    "merged",
    "with_binding",
    "with_condition",
]

RETRIES = 5
MAX_MESSAGE = 32768  # metav1.Condition.message


def entry(driver: str, s: DeviceStatus, old: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``status.devices[]`` entry (``lastTransitionTime`` kept while the status holds)."""
    ready = s.health == HEALTHY
    status = "True" if ready else "False"
    since = s.since
    for c in (old or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == status and c.get("lastTransitionTime"):
            since = c["lastTransitionTime"]
    condition = {
        "type": "Ready",
        "status": status,
        "reason": "DeviceReady" if ready else "DeviceUnhealthy",
        "message": s.message[:MAX_MESSAGE],
        "lastTransitionTime": since,
    }
    return {
        "driver": driver,
        "pool": s.pool,
        "device": s.device,
        "conditions": with_condition((old or {}).get("conditions") or [], condition),
        "data": {
            "pciAddresses": list(s.addresses),
            "iommuGroup": s.iommu_group,
            "vfioDevnodes": list(s.devnodes),
            "boundBy": s.bound_by,
        },
    }


def with_condition(
    conditions: Sequence[dict[str, Any]], condition: dict[str, Any]
) -> list[dict[str, Any]]:
    """``conditions`` merged by ``type`` with ``condition`` (its ``lastTransitionTime`` kept
    while its status holds): the Ready condition and the binding conditions
    (``<driver>/ready``, ``<driver>/failed``) of one entry never replace one another."""
    out: list[dict[str, Any]] = []
    for c in conditions:
        if c.get("type") != condition["type"]:
            out.append(dict(c))
        elif c.get("status") == condition["status"] and c.get("lastTransitionTime"):
            condition = {**condition, "lastTransitionTime": c["lastTransitionTime"]}
    out.append(condition)
    return sorted(out, key=lambda c: str(c.get("type")))


def merged(
    devices: Sequence[dict[str, Any]], driver: str, ours: Sequence[DeviceStatus]
) -> list[dict[str, Any]]:
    """``status.devices`` with our driver's entries replaced by ``ours`` (others kept; an
    entry's binding conditions, :func:`with_binding`, kept beside its Ready condition)."""
    old = {(d.get("pool"), d.get("device")): d for d in devices if d.get("driver") == driver}
    out = [dict(d) for d in devices if d.get("driver") != driver]
    out.extend(entry(driver, s, old.get((s.pool, s.device))) for s in ours)
    return out


#: ``(pool, device) -> condition`` of one claim: what :meth:`ClaimStatusWriter.write_binding` writes
Binding = dict[tuple[str, str], dict[str, Any]]


def with_binding(
    devices: Sequence[dict[str, Any]], driver: str, binding: Binding
) -> list[dict[str, Any]]:
    """``status.devices`` with each ``binding`` condition merged by type into our entry of
    its device (an entry made with only that condition when there is none yet)."""
    out = [dict(d) for d in devices]
    for (pool, device), condition in binding.items():
        for d in out:
            if (d.get("driver"), d.get("pool"), d.get("device")) == (driver, pool, device):
                d["conditions"] = with_condition(d.get("conditions") or [], condition)
                break
        else:
            out.append({"driver": driver, "pool": pool, "device": device,
                        "conditions": [condition]})  # fmt: skip
    return out


#: the status write's failures (the one error of the API-server shell)
StatusError = ApiCallError


class ClaimStatusWriter:
    """Writes our entries of one claim's ``status.devices`` (blocking; see module doc)."""

    def __init__(self, client: k8s.ApiClient, driver: str) -> None:
        self.client = with_deadlines(client)
        self._api: k8s.ResourceV1Api | None = None
        self.driver = driver
        self.writes = 0
        self.conflicts = 0

    def write(self, namespace: str, name: str, uid: str, ours: Sequence[DeviceStatus]) -> bool:
        """Make our entries of claim ``namespace/name`` (UID ``uid``) exactly ``ours``; False
        when the claim is gone or is another one now (nothing to write)."""
        return self._update(namespace, name, uid, lambda ds: merged(ds, self.driver, ours))

    def write_binding(self, namespace: str, name: str, uid: str, binding: Binding) -> bool:
        """Merge ``binding``'s conditions (``<driver>/ready`` or ``<driver>/failed``) into
        our entries of the claim's devices, by type (the Ready condition kept); False when
        the claim is gone or is another one now."""
        return self._update(namespace, name, uid, lambda ds: with_binding(ds, self.driver, binding))

    def _update(
        self,
        namespace: str,
        name: str,
        uid: str,
        change: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    ) -> bool:
        claim_name = f"ResourceClaim {namespace}/{name}"
        if self._api is None:
            self._api = k8s.ResourceV1Api(self.client)
        api = self._api
        for _ in range(RETRIES):
            try:
                claim = call_json(
                    f"reading {claim_name}", api.read_namespaced_resource_claim, name,
                    namespace,
                )  # fmt: skip
            except ApiCallError as e:
                if e.status == 404:
                    return False
                raise
            if (claim.get("metadata") or {}).get("uid") != uid:
                return False
            status = dict(claim.get("status") or {})
            before = list(status.get("devices") or [])
            after = change(before)
            if after == before:
                return True
            status["devices"] = after
            if not after:
                status.pop("devices")
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {**claim["metadata"]},
                "spec": claim.get("spec") or {},
                "status": status,
            }
            what = f"writing the status of {claim_name}"
            try:
                call_json(
                    what, api.replace_namespaced_resource_claim_status, name, namespace,
                    body, field_validation="Strict",
                )  # fmt: skip
            except ApiCallError as e:
                if e.status == 409:
                    self.conflicts += 1
                    continue  # someone wrote meanwhile: read again
                if e.status == 404:
                    return False
                if e.status == 403:
                    raise ApiCallError(
                        f"{e}; the DRA plugin's ServiceAccount needs update/patch on "
                        "resourceclaims/status and associated-node:update/patch on "
                        f"resourceclaims/driver named {self.driver} "
                        "(deploy/components/dra/dra-rbac.yaml)",
                        status=403,
                    ) from e
                raise
            self.writes += 1
            return True
        raise ApiCallError(
            f"writing the status of {claim_name}: still conflicting after {RETRIES} attempts"
        )
