"""Keeps this node's ResourceSlices published: the Kubernetes client shell of the DRA plugin.

The one module of :mod:`vfio_dp.dra` that imports the ``kubernetes`` client (pinned in
``pyproject.toml`` to the tested 37.x, whose ``ResourceV1Api`` serves ``resource.k8s.io/v1``).
Requests go through the client's ``ApiClient`` (its kubeconfig / in-cluster auth and TLS) with
plain JSON bodies: ``ResourceV1Api``'s typed methods validate a dict body into pydantic models
and dump it back, ~0.7 ms per device here — seconds per change on a big host, against the
1 s target. It talks to the API server only through these calls (what the DRA plugin's RBAC
must allow)::

    GET    /api/v1/nodes/<node>                                   (the owner reference's uid)
    GET    /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>
           (also as a metadata-only list: Accept: application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1)
    POST   /apis/resource.k8s.io/v1/resourceslices?fieldValidation=Strict
    PUT    /apis/resource.k8s.io/v1/resourceslices/<name>?fieldValidation=Strict  (resourceVersion read)
    DELETE /apis/resource.k8s.io/v1/resourceslices/<name>

Invariants:

- ``pool.generation`` only grows: every reconcile that writes starts from the highest
  generation seen on the server for this node and driver (so after a restart it continues
  from what the previous process published) and adds one;
- what we wrote is remembered by ``resourceVersion``: a slice deleted or changed by anyone
  else (kubelet deletes a node's slices at its start and 30 s after the driver goes away) is
  noticed at the next reconcile — the plugin reconciles after every scan of the node core,
  so within one resync — and the pool is republished at a new generation; while the devices
  are unchanged, that check is a metadata-only list (names and resourceVersions, a few
  hundred bytes per slice instead of every device), the full list only when they differ (a
  server that refuses the metadata form, 406, gets the full list every time);
- at start, slices already on the server that are exactly what we would publish are adopted
  without a write (a restart does not churn the scheduler);
- calls block, so they run on one thread of their own, never on the event loop and never on
  the core's host-I/O threads; each has a 10 s timeout; a failure is logged and retried with
  backoff, the last good slices stay.

The claim path's readers (:func:`claim_reader`, :func:`class_reader`) run on a pool of their
own (:func:`api_executor`), each call with a deadline (10 s): a GET that never answers is an
error of that claim, and never holds the host-I/O threads Unprepare needs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kubernetes.client as k8s

from vfio_dp.dra.slices import Device, NodeRef, Slice, build_slices

log = logging.getLogger("vfio_dp.dra")

TIMEOUT = 10.0
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
#: the Accept of a metadata-only list (kube-apiserver's PartialObjectMetadataList transform)
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
MAX_BACKOFF = 10.0


def client_config_source(
    kubeconfig: str | None, env: Mapping[str, str], home: str
) -> tuple[str, str | None]:
    """Where the client config comes from, in kubectl's order: ``--kubeconfig``, then
    ``$KUBECONFIG``, then ``~/.kube/config`` if it exists, then the pod's service account
    (``/var/run/secrets/kubernetes.io/serviceaccount``). → ``(kind, path)`` with kind one of
    ``flag``, ``env``, ``home``, ``in-cluster``."""
    if kubeconfig:
        return "flag", kubeconfig
    if env.get("KUBECONFIG"):
        return "env", env["KUBECONFIG"]
    default = os.path.join(home, ".kube", "config")
    if os.path.isfile(default):
        return "home", default
    return "in-cluster", None


def api_client(kubeconfig: str | None) -> Any:
    """A ``kubernetes.client.ApiClient`` from :func:`client_config_source`'s choice.

    Raises ``ValueError`` naming the source tried when its config cannot be loaded."""
    import kubernetes.config

    config: Any = kubernetes.config  # untyped module
    kind, path = client_config_source(kubeconfig, os.environ, os.path.expanduser("~"))
    cfg = k8s.Configuration()
    try:
        if path is not None:
            # $KUBECONFIG may list several files (':'-separated), merged as kubectl does
            config.load_kube_config(config_file=path, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
    except Exception as e:  # the loaders raise their own types
        where = {
            "flag": f"--kubeconfig {path}",
            "env": f"KUBECONFIG={path}",
            "home": path,
            "in-cluster": "the pod's service account (no --kubeconfig, KUBECONFIG or "
            "~/.kube/config found)",
        }[kind]
        raise ValueError(f"cannot load the Kubernetes client config from {where}: {e}") from e
    # No silent retries inside urllib3 (three "Retrying (Retry(total=2 ...))" warnings per
    # call while the API server is down): every caller has its own deadline and back-off,
    # and says one line per failed attempt.
    cfg.retries = 0
    return k8s.ApiClient(cfg)


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
        self.client: Any = client
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
        self.metadata_lists = True  # False once the server refused the metadata-only form
        #: each device's JSON as last written, by identity (the front-end hands the same
        #: Device objects again for devices that did not change: a change of one device
        #: encodes one)
        self._encoded: dict[int, tuple[Device, dict[str, Any]]] = {}
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
                log.error("ResourceSlices not published: %s; next try in %.1f s", e, backoff)
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
    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Slice | None = None,
        accept: str = "application/json",
    ) -> dict[str, Any]:
        """One API request through the client's ``ApiClient``; the answer's JSON."""
        headers = {"Accept": accept}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            # the body goes to the client's REST layer as it is (it json.dumps it): our
            # bodies are plain JSON values already, and ApiClient's sanitize_for_serialization
            # walks every value in Python (~35 ms of each 1,024-device republish)
            method, url, headers, _, post = self.client.param_serialize(
                method=method,
                resource_path=path,
                query_params=query or [],
                header_params=headers,
                body=None,
                auth_settings=["BearerToken"],
            )
            resp = self.client.call_api(method, url, headers, body, post, _request_timeout=TIMEOUT)
            data = resp.read()
        except Exception as e:  # urllib3 and the client raise many types
            raise _api_error(what, e) from e
        if not 200 <= resp.status < 300:
            err = k8s.ApiException(status=resp.status, reason=resp.reason)
            err.body = data
            raise _api_error(what, err)
        answer: dict[str, Any] = json.loads(data or b"{}")
        return answer

    def _read_node_uid(self) -> None:
        node = self._call(
            f"reading Node {self.node.name}", "GET", f"/api/v1/nodes/{self.node.name}"
        )
        uid = node.get("metadata", {}).get("uid")
        if not uid:
            raise PublishError(f"Node {self.node.name} has no metadata.uid")
        self.node = NodeRef(self.node.name, uid)

    def _list(self, metadata_only: bool = False) -> dict[str, Slice]:
        """This node's slices of our driver, by name (``metadata_only``: each only its
        ``metadata``, as ``PartialObjectMetadata``)."""
        answer = self._call(
            "listing this node's ResourceSlices",
            "GET",
            SLICES_PATH,
            query=[("fieldSelector", f"spec.nodeName={self.node.name},spec.driver={self.driver}")],
            accept=METADATA_LIST if metadata_only else "application/json",
        )
        return {s["metadata"]["name"]: s for s in answer.get("items") or []}

    def _unchanged_on_server(self) -> bool:
        """Does the server hold exactly the slices we wrote (names and resourceVersions)?
        One metadata-only list; False also when the server refuses that form (406: every
        later check lists in full)."""
        try:
            current = self._list(metadata_only=True)
        except PublishError as e:
            if "HTTP 406" not in str(e):
                raise
            log.info("the API server refuses metadata-only lists (%s): listing in full", e)
            self.metadata_lists = False
            return False
        versions = {n: s["metadata"].get("resourceVersion", "") for n, s in current.items()}
        return versions == self.written

    def list_current(self) -> dict[str, Slice]:
        """This node's slices of our driver on the server, by name (blocking)."""
        return self._list()

    def reconcile(self, devices: list[Device]) -> bool:
        """Make the server hold exactly ``devices`` for this node; True when it wrote.

        New devices after a write of ours are written straight away over what we wrote
        (one round trip less on the path from a device change to the new slices); if anyone
        else touched the pool meanwhile (409 Conflict, 404), the pool is listed and rewritten.
        An unchanged device list is checked against a fresh list (deleted or changed slices).
        """
        if self.node.uid is None:
            self._read_node_uid()
        if self.written and self.written_devices is not None and devices != self.written_devices:
            try:
                self._publish(devices, dict(self.written), self.generation)
                return True
            except PublishError as e:
                if not any(code in str(e) for code in ("HTTP 409", "HTTP 404")):
                    raise
                log.info("the pool changed under us (%s): listing it again", e)
        elif (
            self.written
            and devices == self.written_devices
            and self.metadata_lists
            and self._unchanged_on_server()
        ):
            return False
        current = self._list()
        highest = max(
            [self.generation]
            + [
                int(s.get("spec", {}).get("pool", {}).get("generation") or 0)
                for s in current.values()
            ]
        )
        self.generation = highest
        versions = {n: s["metadata"].get("resourceVersion", "") for n, s in current.items()}
        if devices == self.written_devices and versions == self.written:
            return False
        if self.written_devices is None and self._adopt(devices, current, highest):
            return False
        self._publish(devices, versions, highest)
        return True

    def _publish(self, devices: list[Device], versions: dict[str, str], highest: int) -> None:
        """Write ``devices`` at ``highest + 1`` over the slices named in ``versions``
        (name -> resourceVersion on the server), deleting the ones no longer needed."""
        generation = highest + 1
        before, self._encoded = self._encoded, {}

        def encode(d: Device) -> dict[str, Any]:
            hit = before.get(id(d))
            if hit is None or hit[0] is not d:
                hit = (d, d.to_json())
            self._encoded[id(d)] = hit
            return hit[1]

        wanted = build_slices(
            devices, driver=self.driver, node=self.node, generation=generation, encode=encode
        )
        names = {s["metadata"]["name"] for s in wanted}
        self.written_devices = None  # half-written until the end: a failure lists again
        for name in sorted(set(versions) - names):  # a smaller pool: fewer slices
            self._delete(name)
            self.written.pop(name, None)
        written: dict[str, str] = {}
        for s in wanted:
            name = s["metadata"]["name"]
            written[name] = self._write(s, versions.get(name))
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
        log.info(
            "the %d ResourceSlice(s) on the server are current (generation %d)",
            len(current),
            generation,
        )
        return True

    def _write(self, body: Slice, resource_version: str | None) -> str:
        name = body["metadata"]["name"]
        strict = [("fieldValidation", "Strict")]
        if resource_version is None:
            answer = self._call(
                f"creating ResourceSlice {name}", "POST", SLICES_PATH, query=strict, body=body
            )
        else:
            meta = {**body["metadata"], "resourceVersion": resource_version}
            answer = self._call(
                f"updating ResourceSlice {name}",
                "PUT",
                f"{SLICES_PATH}/{name}",
                query=strict,
                body={**body, "metadata": meta},
            )
        rv: str = answer.get("metadata", {}).get("resourceVersion", "")
        return rv

    def _delete(self, name: str) -> None:
        try:
            self._call(f"deleting ResourceSlice {name}", "DELETE", f"{SLICES_PATH}/{name}")
        except PublishError as e:
            if "HTTP 404" not in str(e):
                raise


class _suppress_cancel:
    def __enter__(self) -> None:
        return None

    def __exit__(self, et: object, e: object, tb: object) -> bool:
        return et is asyncio.CancelledError


#: threads for the claim path's API calls (ResourceClaim and DeviceClass GETs, claim status
#: writes): their own pool, so that hanging calls never take the host-I/O threads that
#: Unprepare, scans and binds run on
API_WORKERS = 8


def api_executor() -> ThreadPoolExecutor:
    """The claim path's own pool of API threads (see :data:`API_WORKERS`)."""
    return ThreadPoolExecutor(max_workers=API_WORKERS, thread_name_prefix="vfio_dp-claims")


async def _deadline(
    executor: ThreadPoolExecutor, timeout: float, what: str, fn: Any, *args: Any
) -> Any:
    """Run ``fn(*args)`` on ``executor``, at most ``timeout`` seconds from now (queueing
    included): :class:`PublishError` naming the call when it passes (the thread's own
    socket timeout ends it soon after)."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.run_in_executor(executor, fn, *args), timeout)
    except TimeoutError:
        raise PublishError(
            f"{what}: the API server did not answer within {timeout:g} s (check the "
            "API server and the network; kubelet retries)"
        ) from None


def claim_reader(
    client: Any, executor: ThreadPoolExecutor | None = None, timeout: float = TIMEOUT
) -> Any:
    """``await read(namespace, name)`` → the ResourceClaim in its API JSON form
    (``resource.k8s.io/v1``, camelCase as the server sends it), None when it does not exist
    (404); any other API failure raises, and so does a GET not answered within ``timeout``
    seconds. The Prepare handler's only door to the API server; runs on ``executor`` (default:
    its own :func:`api_executor`), never on the host-I/O threads."""
    api = k8s.ResourceV1Api(client)
    pool = executor or api_executor()

    def get(namespace: str, name: str) -> dict[str, Any] | None:
        try:
            resp = api.read_namespaced_resource_claim(
                name, namespace, _preload_content=False, _request_timeout=timeout
            )
        except k8s.exceptions.ApiException as e:
            if e.status == 404:
                return None
            raise _api_error(f"reading ResourceClaim {namespace}/{name}", e) from e
        raw: Any = resp  # an urllib3 response with _preload_content=False
        data = json.loads(raw.data)
        return data if isinstance(data, dict) else None

    async def read(namespace: str, name: str) -> dict[str, Any] | None:
        what = f"reading ResourceClaim {namespace}/{name}"
        result: dict[str, Any] | None = await _deadline(pool, timeout, what, get, namespace, name)
        return result

    return read


def class_reader(
    client: Any, executor: ThreadPoolExecutor | None = None, timeout: float = TIMEOUT
) -> Any:
    """``await read(name)`` → the extended resource the DeviceClass ``name`` serves
    (``spec.extendedResourceName``, else ``deviceclass.resource.kubernetes.io/<name>``), read
    when asked — a class created after the plugin started is used at once. A missing class
    raises :class:`LookupError`; any other API failure (a deadline of ``timeout`` s passed
    included) raises :class:`PublishError`. Runs on ``executor`` like :func:`claim_reader`."""
    from vfio_dp.dra.deviceclasses import extended_resource_name

    api = k8s.ResourceV1Api(client)
    pool = executor or api_executor()

    def get(name: str) -> str:
        try:
            resp = api.read_device_class(name, _preload_content=False, _request_timeout=timeout)
        except k8s.exceptions.ApiException as e:
            if e.status == 404:
                raise LookupError(f"DeviceClass {name} does not exist") from None
            raise _api_error(f"reading DeviceClass {name}", e) from e
        raw: Any = resp
        data = json.loads(raw.data)
        if not isinstance(data, dict):
            raise LookupError(f"DeviceClass {name}: the API server sent no object")
        return extended_resource_name(data)

    async def read(name: str) -> str:
        result: str = await _deadline(pool, timeout, f"reading DeviceClass {name}", get, name)
        return result

    return read
