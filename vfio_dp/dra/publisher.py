"""Keeps this node's ResourceSlices published: the Kubernetes client shell of the DRA plugin.

The one module of :mod:`vfio_dp.dra` that imports the ``kubernetes`` client (``ResourceV1Api``,
``resource.k8s.io/v1``; pinned in ``pyproject.toml``). It talks to the API server only
through these calls (what the DRA plugin's RBAC must allow)::

    GET    /api/v1/nodes/<node>                                   (the owner reference's uid)
    GET    /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>
    POST   /apis/resource.k8s.io/v1/resourceslices
    PUT    /apis/resource.k8s.io/v1/resourceslices/<name>         (with the resourceVersion read)
    DELETE /apis/resource.k8s.io/v1/resourceslices/<name>

Invariants:

- ``pool.generation`` only grows: every reconcile that writes starts from the highest
  generation seen on the server for this node and driver (so after a restart it continues
  from what the previous process published) and adds one;
- what we wrote is remembered by ``resourceVersion``: a slice deleted or changed by anyone
  else (kubelet deletes a node's slices at its start and 30 s after the driver goes away) is
  noticed at the next reconcile — the plugin reconciles after every scan of the node core,
  so within one resync — and the pool is republished at a new generation;
- at start, slices already on the server that are exactly what we would publish are adopted
  without a write (a restart does not churn the scheduler);
- calls block, so they run on one thread of their own, never on the event loop and never on
  the core's host-I/O threads; each has a 10 s timeout; a failure is logged and retried with
  backoff, the last good slices stay.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes.client as k8s

from vfio_dp.dra.slices import Device, NodeRef, Slice, build_slices

log = logging.getLogger("vfio_dp.dra")

TIMEOUT = 10.0
MAX_BACKOFF = 10.0


def api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.ApiClient``: from ``kubeconfig``, or the pod's in-cluster config
    (service-account token) without one."""
    import kubernetes.config

    config: Any = kubernetes.config  # untyped module
    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return k8s.ApiClient()


class PublishError(Exception):
    """The API server refused or could not be reached (the message says which call)."""


def _api_error(what: str, e: Exception) -> PublishError:
    status = getattr(e, "status", None)
    reason = getattr(e, "reason", None) or type(e).__name__
    body = getattr(e, "body", None) or ""
    message = ""
    if body:
        try:
            message = json.loads(body).get("message", "")
        except (ValueError, AttributeError):
            message = str(body)[:300]
    detail = f"HTTP {status} {reason}" if status else str(e) or reason
    return PublishError(f"{what}: {detail}" + (f": {message}" if message else ""))


class SlicePublisher:
    """Publishes the devices it is given (:meth:`want`) as this node's pool, and keeps them."""

    def __init__(self, client: Any, driver: str, node_name: str) -> None:
        # Any: bodies are plain dicts and answers raw JSON (_preload_content=False), no models
        self.slices_api: Any = k8s.ResourceV1Api(client)
        self.nodes_api: Any = k8s.CoreV1Api(client)
        self.driver = driver
        self.node = NodeRef(node_name)
        #: the highest pool generation known (written by us or found on the server)
        self.generation = 0
        self.wanted: list[Device] | None = None
        self.written_devices: list[Device] | None = None
        self.written: dict[str, str] = {}  # slice name -> resourceVersion after our write
        self.writes = 0  # reconciles that wrote (tests, metrics)
        self.problem: str | None = None  # the last error, None once a reconcile succeeds
        self.on_published: list[Any] = []  # callbacks(generation, slices) after each write
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vfio_dp-api")
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    # -- the asyncio side ----------------------------------------------------------------
    def want(self, devices: Sequence[Device]) -> None:
        """Publish ``devices`` (the latest call wins) and check what is on the server."""
        self.wanted = list(devices)
        self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="publish slices")

    async def stop(self) -> None:
        """Stop publishing (the slices stay: kubelet removes them 30 s after we are gone)."""
        if self._task is not None:
            self._task.cancel()
            with _suppress_cancel():
                await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self) -> None:
        backoff = 0.2
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            devices = self.wanted
            if devices is None:
                continue
            try:
                await loop.run_in_executor(self._executor, self.reconcile, devices)
            except PublishError as e:
                if str(e) != self.problem:
                    log.error("ResourceSlices not published: %s; retrying", e)
                self.problem = str(e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                self._wake.set()
                continue
            if self.problem is not None:
                log.info("ResourceSlices published again")
            self.problem = None
            backoff = 0.2

    # -- the blocking side (one thread) ----------------------------------------------------
    def _read_node_uid(self) -> None:
        try:
            resp = self.nodes_api.read_node(
                self.node.name, _preload_content=False, _request_timeout=TIMEOUT
            )
        except Exception as e:
            raise _api_error(f"reading Node {self.node.name}", e) from e
        uid = json.loads(resp.data).get("metadata", {}).get("uid")
        if not uid:
            raise PublishError(f"Node {self.node.name} has no metadata.uid")
        self.node = NodeRef(self.node.name, uid)

    def _list(self) -> dict[str, Slice]:
        try:
            resp = self.slices_api.list_resource_slice(
                field_selector=f"spec.nodeName={self.node.name},spec.driver={self.driver}",
                _preload_content=False,
                _request_timeout=TIMEOUT,
            )
        except Exception as e:
            raise _api_error("listing this node's ResourceSlices", e) from e
        items = json.loads(resp.data).get("items") or []
        return {s["metadata"]["name"]: s for s in items}

    def reconcile(self, devices: list[Device]) -> bool:
        """Make the server hold exactly ``devices`` for this node; True when it wrote."""
        if self.node.uid is None:
            self._read_node_uid()
        current = self._list()
        highest = max(
            [self.generation]
            + [int(s.get("spec", {}).get("pool", {}).get("generation") or 0) for s in current.values()]
        )
        self.generation = highest
        if (
            devices == self.written_devices
            and set(current) == set(self.written)
            and all(current[n]["metadata"].get("resourceVersion") == rv for n, rv in self.written.items())
        ):
            return False
        if self.written_devices is None and self._adopt(devices, current, highest):
            return False
        generation = highest + 1
        wanted = build_slices(devices, driver=self.driver, node=self.node, generation=generation)
        written: dict[str, str] = {}
        names = {s["metadata"]["name"] for s in wanted}
        for name in sorted(set(current) - names):  # a smaller pool: fewer slices
            self._delete(name)
        for s in wanted:
            name = s["metadata"]["name"]
            old = current.get(name)
            written[name] = self._write(s, old)
        self.generation = generation
        self.written = written
        self.written_devices = devices
        self.writes += 1
        log.info(
            "published %d device(s) in %d ResourceSlice(s), pool %s generation %d",
            len(devices),
            len(wanted),
            self.node.name,
            generation,
        )
        for cb in self.on_published:
            cb(generation, wanted)
        return True

    def _adopt(self, devices: list[Device], current: dict[str, Slice], generation: int) -> bool:
        """At start: are the slices on the server exactly ours at ``generation``? Keep them."""
        if not current:
            return False
        wanted = build_slices(devices, driver=self.driver, node=self.node, generation=generation)
        if set(current) != {s["metadata"]["name"] for s in wanted}:
            return False
        for s in wanted:
            have = current[s["metadata"]["name"]]
            if have.get("spec") != s["spec"] or have["metadata"].get("ownerReferences") != s[
                "metadata"
            ].get("ownerReferences"):
                return False
        self.written = {n: s["metadata"].get("resourceVersion", "") for n, s in current.items()}
        self.written_devices = devices
        log.info("the %d ResourceSlice(s) on the server are current (generation %d)", len(current), generation)
        return True

    def _write(self, body: Slice, old: Slice | None) -> str:
        name = body["metadata"]["name"]
        try:
            if old is None:
                resp = self.slices_api.create_resource_slice(
                    body, _preload_content=False, _request_timeout=TIMEOUT
                )
            else:
                body = {
                    **body,
                    "metadata": {
                        **body["metadata"],
                        "resourceVersion": old["metadata"].get("resourceVersion"),
                    },
                }
                resp = self.slices_api.replace_resource_slice(
                    name, body, _preload_content=False, _request_timeout=TIMEOUT
                )
        except Exception as e:
            raise _api_error(f"writing ResourceSlice {name}", e) from e
        rv: str = json.loads(resp.data).get("metadata", {}).get("resourceVersion", "")
        return rv

    def _delete(self, name: str) -> None:
        try:
            self.slices_api.delete_resource_slice(
                name, _preload_content=False, _request_timeout=TIMEOUT
            )
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return
            raise _api_error(f"deleting ResourceSlice {name}", e) from e


class _suppress_cancel:
    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, e: object, tb: object) -> bool:
        return et is asyncio.CancelledError
