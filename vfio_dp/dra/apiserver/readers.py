"""The claim path's reads of the API server: the ResourceClaim kubelet names, and DeviceClasses.

::

    GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>   (Prepare, reconcile)
    GET /apis/resource.k8s.io/v1/deviceclasses/<name>                      (extended resources)

Each runs on a :class:`~vfio_dp.dra.apiserver.client.Lane` of its own kind (claim reads never
wait behind DeviceClass reads or status writes, and never take the host-I/O threads that
Unprepare needs) and ends by its deadline (10 s): a GET that never answers, or trickles, is an
error of that claim. Answers are the API JSON as the server sends it (camelCase), read with
plain requests (:mod:`.plain`): the claim path reads a few fields of it, and a pydantic model
per claim would cost more than the read (and the typed ``ResourceV1Api``'s module ~0.15 s of
CPU to load).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

import kubernetes.client as k8s

from vfio_dp.dra.apiserver.client import TIMEOUT, Lane, call_json
from vfio_dp.dra.apiserver.plain import RESOURCE_API, send
from vfio_dp.errors import ApiCallError

ReadClaim = Callable[[str, str], Awaitable[dict[str, Any] | None]]
ReadClass = Callable[[str], Awaitable[str]]


def claim_reader(
    client: k8s.ApiClient, lane: Lane | None = None, timeout: float = TIMEOUT
) -> ReadClaim:
    """``await read(namespace, name)`` → the ResourceClaim in its API JSON form
    (``resource.k8s.io/v1``, camelCase as the server sends it), None when it does not exist
    (404); any other API failure raises :class:`~vfio_dp.errors.ApiCallError`, and so does a
    GET not answered in full within ``timeout`` seconds. The Prepare handler's only door to
    the API server; runs on ``lane`` (default: a claim lane of its own)."""
    lane = lane or Lane(client, "claims", 8, timeout)

    def get(namespace: str, name: str) -> dict[str, Any] | None:
        what = f"reading ResourceClaim {namespace}/{name}"
        path = f"{RESOURCE_API}/namespaces/{quote(namespace, safe='')}/resourceclaims/{quote(name, safe='')}"
        try:
            return call_json(what, send, lane.client, "GET", path, timeout=timeout)
        except ApiCallError as e:
            if e.status == 404:
                return None
            raise

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        what = f"reading ResourceClaim {namespace}/{name}"
        return await lane.run(what, get, namespace, name, timeout=timeout)

    return read


def class_reader(
    client: k8s.ApiClient, lane: Lane | None = None, timeout: float = TIMEOUT
) -> ReadClass:
    """``await read(name)`` → the extended resource the DeviceClass ``name`` serves
    (``spec.extendedResourceName``, else ``deviceclass.resource.kubernetes.io/<name>``), read
    when asked -- a class created after the plugin started is used at once. A missing class
    raises :class:`LookupError`; any other API failure (its deadline of ``timeout`` s passed
    included) raises :class:`~vfio_dp.errors.ApiCallError`. Runs on ``lane`` (default: a
    class lane of its own)."""
    from vfio_dp.dra.deviceclasses import extended_resource_name

    lane = lane or Lane(client, "classes", 4, timeout)

    def get(name: str) -> str:
        path = f"{RESOURCE_API}/deviceclasses/{quote(name, safe='')}"
        try:
            data = call_json(f"reading DeviceClass {name}", send, lane.client, "GET", path,
                             timeout=timeout)  # fmt: skip
        except ApiCallError as e:
            if e.status == 404:
                raise LookupError(f"DeviceClass {name} does not exist") from None
            raise
        return extended_resource_name(data)

    async def read(name: str) -> str:
        return await lane.run(f"reading DeviceClass {name}", get, name, timeout=timeout)

    return read
