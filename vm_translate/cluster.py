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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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
        self.core: Any = client.CoreV1Api(self.api)

    def close(self) -> None:
        self.api.close()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return fn(*args, _request_timeout=self.request_timeout, **kwargs)
        except ApiException as e:
            reason = (e.reason or "").strip() or "refused"
            raise ClusterError(
                f"the API server {self.server} answered {e.status} {reason} to {what}"
            ) from e
        except (HTTPError, OSError) as e:
            raise ClusterError(f"the API server {self.server} did not answer {what}: {e}") from e

    def pods(self, node: str | None = None) -> list[Pod]:
        """Our DaemonSet pods (on ``node`` only, when given), one per node: the device
        plugin's before the DRA plugin's (either sees the host)."""
        kwargs: dict[str, Any] = {"label_selector": POD_SELECTOR}
        if node:
            kwargs["field_selector"] = f"spec.nodeName={node}"
        listing = self._call(
            f"list pods in {self.namespace}",
            self.core.list_namespaced_pod,
            self.namespace,
            **kwargs,
        )
        chosen: dict[str, Pod] = {}
        for p in sorted(listing.items, key=lambda p: p.metadata.name):
            if not p.spec.node_name or (p.status and p.status.phase != "Running"):
                continue
            pod = Pod(p.metadata.name, p.spec.node_name, p.spec.containers[0].name)
            if pod.node not in chosen or "vfio-dp-daemon" in (p.metadata.labels or {}).values():
                chosen[pod.node] = pod
        return [chosen[n] for n in sorted(chosen)]

    def exec(self, pod: Pod, command: Sequence[str]) -> ExecResult:
        """Run ``command`` in the pod's container (pods/exec over a WebSocket), bounded by
        ``exec_timeout``: a command still running then is named, not waited for."""
        import websocket
        from kubernetes.client.exceptions import ApiException
        from kubernetes.stream import stream
        from websocket import WebSocketException

        # the client opens the WebSocket with no timeout of its own: a server that accepts and
        # never answers the handshake (or stalls mid-frame) would hold this process forever
        websocket.setdefaulttimeout(self.request_timeout)
        try:
            ws = stream(
                self.core.connect_get_namespaced_pod_exec,
                pod.name,
                self.namespace,
                command=list(command),
                container=pod.container,
                stdin=False,
                stdout=True,
                stderr=True,
                tty=False,
                _preload_content=False,
                _request_timeout=self.request_timeout,
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
        from kubernetes import client

        res: Any = client.ResourceV1Api(self.api)
        sanitize: Any = self.api.sanitize_for_serialization
        nodes = self._call("list nodes", self.core.list_node)
        pods = self._call(
            f"list pods in {self.namespace}",
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=POD_SELECTOR,
        )
        slices = self._call("list resourceslices", res.list_resource_slice)
        claims = self._call("list resourceclaims", res.list_resource_claim_for_all_namespaces)
        return (
            [sanitize(n) for n in nodes.items],
            [sanitize(p) for p in pods.items],
            [sanitize(s) for s in slices.items],
            [sanitize(c) for c in claims.items],
        )
