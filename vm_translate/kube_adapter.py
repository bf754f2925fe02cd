"""The Kubernetes API calls the webhook makes: list nodes, DeviceClasses, ResourceSlices.

Imports the ``kubernetes`` client lazily (~220 ms) — only a webhook started with the
node check pays for it. In-cluster config first (the webhook's ServiceAccount needs
``get/list`` on ``nodes``, and ``list`` on ``deviceclasses`` and ``resourceslices`` for names
DRA serves), else ``~/.kube/config``.
"""

from __future__ import annotations

import json
from typing import Any

from vm_translate.errors import NodeCheckError
from vm_translate.nodes import NodeResources, dra_capacity, nodes_from_list, with_dra


def list_nodes() -> list[NodeResources]:
    """``GET /api/v1/nodes`` → :class:`NodeResources` (blocking; run it in a thread)."""
    from kubernetes import client, config

    try:
        try:
            config.load_incluster_config()  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        # _preload_content=False: the raw JSON, skipping the slow model deserialization
        resp: Any = client.CoreV1Api().list_node(_preload_content=False, _request_timeout=5)
        data: Any = json.loads(resp.data)
    except Exception as e:  # the client raises many unrelated types; all mean "cannot ask"
        raise NodeCheckError(
            f"cannot list nodes for the capacity check: {e}; give the webhook's ServiceAccount "
            "list on nodes, or run without --check-nodes"
        ) from e
    nodes = nodes_from_list(data.get("items") or [])
    classes, slices = _dra_objects(client)
    counts, unchecked = dra_capacity(classes, slices)
    return with_dra(nodes, counts, unchecked)


def _dra_objects(client: Any) -> tuple[list[Any], list[Any]]:
    """DeviceClasses and ResourceSlices (``resource.k8s.io/v1``); none on a cluster without
    that API (404: Kubernetes < 1.34)."""
    from kubernetes.client.exceptions import ApiException

    api = client.ResourceV1Api()
    try:
        classes = json.loads(api.list_device_class(_preload_content=False, _request_timeout=5).data)
        slices = json.loads(
            api.list_resource_slice(_preload_content=False, _request_timeout=5).data
        )
    except ApiException as e:
        if e.status == 404:
            return [], []
        raise NodeCheckError(
            f"cannot list DeviceClasses and ResourceSlices for the capacity check: {e.reason}; "
            "give the webhook's ServiceAccount list on deviceclasses and resourceslices "
            "(deploy/components/check-nodes), or run without --check-nodes"
        ) from e
    except Exception as e:
        raise NodeCheckError(
            f"cannot list DeviceClasses and ResourceSlices for the capacity check: {e}"
        ) from e
    return list(classes.get("items") or []), list(slices.get("items") or [])
