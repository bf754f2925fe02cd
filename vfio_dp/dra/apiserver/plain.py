"""One API request with a plain JSON body through the ``kubernetes`` client's ``ApiClient``.

::

    GET    /api/v1/nodes/<node>                                         (the slice publisher)
    POST   /apis/resource.k8s.io/v1/resourceslices?fieldValidation=Strict   {...}
    PUT    /api/v1/namespaces/<ns>/secrets/<name>                        {...}  (webhook-certs)
    PATCH  /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/<name>
           Content-Type: application/json-patch+json                     [{"op": ...}]

The request goes through the client's REST layer as it is -- its kubeconfig or in-cluster
auth, TLS and connection pool -- and the answer comes back as bytes; no pydantic model is
built on either side. The typed APIs cost what this saves: a typed write validates a dict into
models and back (~350 ms of CPU per 1,024-device republish against ~7 ms for ``json.dumps``),
and importing ``CoreV1Api`` builds the model of every core type (~0.7-0.9 s of CPU per
process start, for one GET). Used by :mod:`.publisher` (its writes and the Node's read),
``vfioctl webhook-certs`` (:mod:`vm_translate.webhook_certs`) and ``kubectl vfio``'s reads
(:mod:`vm_translate.cluster`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import kubernetes.client as k8s

#: a (connect, read) timeout pair in seconds, or one number for both, as urllib3 takes it
Timeout = float | tuple[float, float] | None


def send(
    client: k8s.ApiClient,
    method: str,
    path: str,
    body: Any = None,
    *,
    query: Sequence[tuple[str, str]] = (),
    content_type: str = "application/json",
    request_timeout: Timeout = None,
) -> bytes:
    """``method path`` (``path`` already quoted, e.g. ``/api/v1/nodes/n1``) with ``body`` (a
    dict or list, JSON-encoded by the REST layer; None: no body) as ``content_type``; the
    answer's body, read whole. A status outside 2xx raises ``kubernetes.client.ApiException``
    with the server's ``status``, ``reason`` and ``body`` (its ``Status`` object), as the typed
    API methods do; transport failures raise what urllib3 raises."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = content_type
    method, url, headers, _, post = client.param_serialize(
        method=method,
        resource_path=path,
        query_params=list(query),
        header_params=headers,
        # the body goes to the REST layer as it is (it json.dumps it):
        # ApiClient.sanitize_for_serialization would walk every value in Python (~15 ms of
        # each 1,024-device republish)
        body=None,
        auth_settings=["BearerToken"],
    )
    resp: Any = client.call_api(method, url, headers, body, post, _request_timeout=request_timeout)
    data: bytes = resp.read()
    if not 200 <= resp.status <= 299:
        raise k8s.ApiException(
            status=resp.status, reason=resp.reason, body=data.decode("utf-8", "replace")
        )
    return data
