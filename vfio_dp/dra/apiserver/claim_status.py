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
runs this writer off the kubelet's path). The builders are pure; :class:`ClaimStatusWriter`
is a blocking shell (run it in a thread)
over the client's ``ApiClient`` with plain JSON bodies, like :mod:`vfio_dp.dra.apiserver.publisher`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from vfio_dp.core.health import HEALTHY
from vfio_dp.dra.observers.claim_status import DeviceStatus

log = logging.getLogger("vfio_dp.dra")

__all__ = ["ClaimStatusWriter", "DeviceStatus", "StatusError", "entry", "merged"]

TIMEOUT = 10.0
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
    return {
        "driver": driver,
        "pool": s.pool,
        "device": s.device,
        "conditions": [
            {
                "type": "Ready",
                "status": status,
                "reason": "DeviceReady" if ready else "DeviceUnhealthy",
                "message": s.message[:MAX_MESSAGE],
                "lastTransitionTime": since,
            }
        ],
        "data": {
            "pciAddresses": list(s.addresses),
            "iommuGroup": s.iommu_group,
            "vfioDevnodes": list(s.devnodes),
            "boundBy": s.bound_by,
        },
    }


def merged(
    devices: Sequence[dict[str, Any]], driver: str, ours: Sequence[DeviceStatus]
) -> list[dict[str, Any]]:
    """``status.devices`` with our driver's entries replaced by ``ours`` (others kept)."""
    old = {(d.get("pool"), d.get("device")): d for d in devices if d.get("driver") == driver}
    out = [dict(d) for d in devices if d.get("driver") != driver]
    out.extend(entry(driver, s, old.get((s.pool, s.device))) for s in ours)
    return out


class StatusError(Exception):
    """The API server refused the status write (the message says which and why)."""


class ClaimStatusWriter:
    """Writes our entries of one claim's ``status.devices`` (blocking; see module doc)."""

    def __init__(self, client: Any, driver: str) -> None:
        self.client = client
        self.driver = driver
        self.writes = 0
        self.conflicts = 0

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        params = self.client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[("fieldValidation", "Strict")] if body is not None else [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(*params, _request_timeout=TIMEOUT)
            data = resp.read()
        except Exception as e:  # urllib3 and the client raise many types
            raise StatusError(f"{method} {path}: {e}") from e
        try:
            answer = json.loads(data or b"{}")
        except ValueError:
            answer = {}
        return resp.status, answer if isinstance(answer, dict) else {}

    def write(self, namespace: str, name: str, uid: str, ours: Sequence[DeviceStatus]) -> bool:
        """Make our entries of claim ``namespace/name`` (UID ``uid``) exactly ``ours``; False
        when the claim is gone or is another one now (nothing to write)."""
        path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
        for _ in range(RETRIES):
            code, claim = self._call("GET", path)
            if code == 404:
                return False
            if code != 200:
                raise StatusError(
                    f"reading ResourceClaim {namespace}/{name}: HTTP {code}: {claim.get('message', '')}"
                )
            if (claim.get("metadata") or {}).get("uid") != uid:
                return False
            status = dict(claim.get("status") or {})
            before = list(status.get("devices") or [])
            after = merged(before, self.driver, ours)
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
            code, answer = self._call("PUT", path + "/status", body)
            if code == 409:
                self.conflicts += 1
                continue  # someone wrote meanwhile: read again
            if code == 404:
                return False
            if code == 403:
                raise StatusError(
                    f"writing the status of ResourceClaim {namespace}/{name}: HTTP 403: "
                    f"{answer.get('message', '')}; the DRA plugin's ServiceAccount needs "
                    "update/patch on resourceclaims/status and associated-node:update/patch on "
                    f"resourceclaims/driver named {self.driver} (deploy/components/dra/dra-rbac.yaml)"
                )
            if not 200 <= code < 300:
                raise StatusError(
                    f"writing the status of ResourceClaim {namespace}/{name}: HTTP {code}: "
                    f"{answer.get('message', '')}"
                )
            self.writes += 1
            return True
        raise StatusError(
            f"writing the status of ResourceClaim {namespace}/{name}: still conflicting after "
            f"{RETRIES} attempts"
        )
