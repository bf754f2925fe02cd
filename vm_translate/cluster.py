"""The Kubernetes client shell of ``kubectl vfio``: find our DaemonSet pods, exec, read objects.

What it calls, with the RBAC each needs (docs/install.md, "Every node from one command"):

- ``GET /api/v1/namespaces/<ns>/pods?labelSelector=…`` (``list pods``) — the DaemonSet pods
  of ours, the device plugin's (``app.kubernetes.io/name=vfio-dp-daemon``) or the DRA
  plugin's (``vfio-dp-dra``); with ``--node`` also ``fieldSelector=spec.nodeName=<node>``;
- ``GET /api/v1/namespaces/<ns>/pods/<pod>/exec?command=vfioctl&command=…`` upgraded to a
  WebSocket (``create pods/exec``, as ``kubectl exec`` needs) — the read command, in the
  pod's first container, which sees the host (``VFIOCTL_ROOT``);
- for ``status`` only reads: ``list nodes``, ``list resourceslices``, ``list resourceclaims``
  (cluster-wide).

Configuration as kubectl plugins take it: ``--kubeconfig`` (else ``$KUBECONFIG``, else
``~/.kube/config``; in a pod, the service account), ``--context``, ``-n``. Every call has a
deadline: ``request_timeout`` seconds for reads, ``exec_timeout`` for one command.

Every call goes through the ``kubernetes`` client's ``ApiClient`` as it is (its kubeconfig or
in-cluster auth, TLS, connection pool) with no typed API class: the reads are plain JSON GETs
(:func:`vfio_dp.dra.apiserver.plain.send`) and the exec is the request ``CoreV1Api`` would
make, upgraded by ``kubernetes.stream``'s ``websocket_call`` (what ``stream()`` does). Importing
``CoreV1Api`` builds the pydantic model of every core type, ~0.7 s of CPU at each ``kubectl
vfio`` start, and ``status`` wants plain dicts anyway.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.model.parsed import dig
from vm_translate.errors import ClusterError

#: the DaemonSet pods of ours, either front-end: both see the host
POD_SELECTOR = "app.kubernetes.io/name in (vfio-dp-daemon,vfio-dp-dra)"


@dataclass(frozen=True)
class Pod:
    name: str
    node: str
    container: str


@dataclass(frozen=True)
class ExecResult:
    node: str
    pod: str
    returncode: int
    stdout: str
    stderr: str


class Cluster:
    """One API connection, made from a kubeconfig as kubectl would."""

    def __init__(
        self,
        kubeconfig: str | None,
        context: str | None,
        namespace: str,
        *,
        request_timeout: float = 30.0,
        exec_timeout: float = 120.0,
    ) -> None:
        from kubernetes import client
        from kubernetes import config as kubeconfig_mod

        config: Any = kubeconfig_mod  # untyped package: one Any at the boundary
        self.namespace = namespace
        self.request_timeout = request_timeout
        self.exec_timeout = exec_timeout
        path = kubeconfig or os.environ.get("KUBECONFIG", "").split(os.pathsep)[0] or None
        try:
            if path is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                config.load_incluster_config()
                self.api: Any = client.ApiClient()
            else:
                self.api = config.new_client_from_config(config_file=path, context=context)
        except (config.ConfigException, OSError, ValueError) as e:
            raise ClusterError(f"cannot load the kubeconfig {path or '~/.kube/config'}: {e}") from e
        self.server = self.api.configuration.host

    def close(self) -> None:
        self.api.close()

    def _list(self, what: str, path: str, query: Sequence[tuple[str, str]] = ()) -> list[Any]:
        """``GET path`` (a list): its ``items``, as plain API dicts (camelCase)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from vfio_dp.dra.apiserver.plain import send

        try:
            raw = send(self.api, "GET", path, query=query, request_timeout=self.request_timeout)
        except ApiException as e:
            reason = (e.reason or "").strip() or "refused"
            raise ClusterError(
                f"the API server {self.server} answered {e.status} {reason} to {what}"
            ) from e
        except (HTTPError, OSError) as e:
            raise ClusterError(f"the API server {self.server} did not answer {what}: {e}") from e
        try:
            items = json.loads(raw)["items"]
        except (ValueError, TypeError, KeyError) as e:
            raise ClusterError(
                f"the API server {self.server} answered {what} with no list: {raw[:200]!r}"
            ) from e
        if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
            raise ClusterError(f"the API server {self.server} answered {what} with bad items")
        return items

    def _pods(self, node: str | None = None) -> list[Any]:
        """``GET /api/v1/namespaces/<ns>/pods?labelSelector=…[&fieldSelector=…]``."""
        from urllib.parse import quote

        query = [("labelSelector", POD_SELECTOR)]
        if node:
            query.append(("fieldSelector", f"spec.nodeName={node}"))
        path = f"/api/v1/namespaces/{quote(self.namespace, safe='')}/pods"
        return self._list(f"list pods in {self.namespace}", path, query)

    def pods(self, node: str | None = None) -> list[Pod]:
        """Our DaemonSet pods (on ``node`` only, when given), one per node: the device
        plugin's before the DRA plugin's (either sees the host)."""
        chosen: dict[str, Pod] = {}
        for p in sorted(self._pods(node), key=lambda p: str(dig(p, "metadata", "name"))):
            name, on = dig(p, "metadata", "name"), dig(p, "spec", "nodeName")
            containers = dig(p, "spec", "containers") or [{}]
            status = p.get("status")
            if (
                not name
                or not on
                or (status is not None and dig(p, "status", "phase") != "Running")
            ):
                continue
            pod = Pod(str(name), str(on), str(containers[0].get("name", "")))
            labels = dig(p, "metadata", "labels") or {}
            if pod.node not in chosen or "vfio-dp-daemon" in labels.values():
                chosen[pod.node] = pod
        return [chosen[n] for n in sorted(chosen)]

    def exec(self, pod: Pod, command: Sequence[str]) -> ExecResult:
        """Run ``command`` in the pod's container (pods/exec over a WebSocket), bounded by
        ``exec_timeout``: a command still running then is named, not waited for."""
        import websocket
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream.ws_client import websocket_call
        from websocket import WebSocketException

        # the client opens the WebSocket with no timeout of its own: a server that accepts and
        # never answers the handshake (or stalls mid-frame) would hold this process forever
        websocket.setdefaulttimeout(self.request_timeout)
        upgrade: Any = websocket_call  # untyped package: one Any at the boundary
        # CoreV1Api.connect_get_namespaced_pod_exec's request, as stream() sends it
        method, url, headers, _, _ = self.api.param_serialize(
            method="GET",
            resource_path="/api/v1/namespaces/{namespace}/pods/{name}/exec",
            path_params={"namespace": self.namespace, "name": pod.name},
            query_params=[("command", list(command)), ("container", pod.container),
                          ("stderr", True), ("stdin", False), ("stdout", True), ("tty", False)],
            header_params={"Accept": "*/*"},
            auth_settings=["BearerToken"],
            collection_formats={"command": "multi"},
        )  # fmt: skip
        try:
            ws = upgrade(
                self.api.configuration,
                method,
                url,
                headers=headers,
                _request_timeout=self.request_timeout,
                _preload_content=False,
            )
        except ApiException as e:
            raise ClusterError(
                f"the API server {self.server} answered {e.status} {(e.reason or '').strip()} "
                f"to exec in pod {self.namespace}/{pod.name} (it needs create on pods/exec)"
            ) from e
        except (WebSocketException, OSError) as e:
            raise ClusterError(
                f"exec in pod {self.namespace}/{pod.name} through {self.server} failed: {e}"
            ) from e
        try:
            try:
                ws.run_forever(timeout=self.exec_timeout)
            except (WebSocketException, OSError) as e:
                raise ClusterError(
                    f"exec in pod {self.namespace}/{pod.name} through {self.server} broke off: {e}"
                ) from e
            if ws.is_open():
                raise ClusterError(
                    f"{' '.join(command)} in pod {self.namespace}/{pod.name} (node {pod.node}) "
                    f"did not finish within {self.exec_timeout:g} s"
                )
            out, err = ws.read_stdout(), ws.read_stderr()
            rc = ws.returncode
        finally:
            ws.close()
        return ExecResult(pod.node, pod.name, int(rc or 0), out or "", err or "")

    def objects(self) -> tuple[list[Any], list[Any], list[Any], list[Any]]:
        """Nodes, our pods, ResourceSlices and ResourceClaims as plain API dicts (camelCase)."""
        return (
            self._list("list nodes", "/api/v1/nodes"),
            self._pods(),
            self._list("list resourceslices", "/apis/resource.k8s.io/v1/resourceslices"),
            self._list("list resourceclaims", "/apis/resource.k8s.io/v1/resourceclaims"),
        )

