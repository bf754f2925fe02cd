"""The one call to the Kubernetes API the webhook makes: list nodes (thin adapter).

Imports the ``kubernetes`` client lazily (~220 ms) — only a webhook started with the
node check pays for it. In-cluster config first (the webhook's ServiceAccount needs
``get/list`` on ``nodes``), else ``~/.kube/config``.
"""

from __future__ import annotations

import json
from typing import Any

from vm_translate.errors import NodeCheckError
from vm_translate.nodes import NodeResources, nodes_from_list


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
    return nodes_from_list(data.get("items") or [])
