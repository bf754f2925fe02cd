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

from collections.abc import Callable, Sequence
from typing import Any

import kubernetes.client as k8s

#: the resource.k8s.io API's base path (every DRA object: slices, claims, classes)
RESOURCE_API = "/apis/resource.k8s.io/v1"

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
    resp = _call(client, method, path, body, query, content_type, request_timeout)
    data: bytes = resp.read()
    if not 200 <= resp.status <= 299:
        raise k8s.ApiException(
            status=resp.status, reason=resp.reason, body=data.decode("utf-8", "replace")
        )
    return data


#: a list method's keyword arguments, as the typed ``list_*`` methods name them → the query's
_LIST_QUERY = {
    "field_selector": "fieldSelector",
    "label_selector": "labelSelector",
    "resource_version": "resourceVersion",
    "allow_watch_bookmarks": "allowWatchBookmarks",
    "timeout_seconds": "timeoutSeconds",
    "watch": "watch",
}


def lister(client: k8s.ApiClient, path: str) -> Callable[..., Any]:
    """The list (and watch) of the collection at ``path`` (e.g.
    ``/apis/resource.k8s.io/v1/resourceslices``) as a function called the way
    ``kubernetes.watch.Watch`` and :func:`.client.call_json` call a typed ``list_*`` method
    with ``_preload_content=False``: keyword arguments :data:`_LIST_QUERY`, ``_request_timeout``;
    → the unread ``urllib3`` response; a status outside 2xx raises ``ApiException`` (as the
    typed method does). No typed API is built: ``ResourceV1Api``'s module loads ~100 pydantic
    models (~0.15 s of CPU per process) for calls whose JSON is read as it is."""

    def list_(
        *, _preload_content: bool = False, _request_timeout: Timeout = None, **kwargs: Any
    ) -> Any:
        query = [(_LIST_QUERY[k], v) for k, v in kwargs.items() if v is not None]
        resp = _call(client, "GET", path, None, query, "application/json", _request_timeout)
        if not 200 <= resp.status <= 299:
            data = resp.read()
            raise k8s.ApiException(
                status=resp.status, reason=resp.reason, body=data.decode("utf-8", "replace")
            )
        return resp.response

    return list_


def _call(
    client: k8s.ApiClient,
    method: str,
    path: str,
    body: Any,
    query: Sequence[tuple[str, Any]],
    content_type: str,
    request_timeout: Timeout,
) -> Any:
    """The request through the client's REST layer: its ``RESTResponse`` (not read)."""
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
    return client.call_api(method, url, headers, body, post, _request_timeout=request_timeout)
