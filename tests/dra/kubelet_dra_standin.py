"""A kubelet DRA stand-in: behaves like kubelet's plugin watcher + DRA plugin manager as
documented (``../shared/reference/dra.md``; kubernetes ``pkg/kubelet/pluginmanager`` and
``pkg/kubelet/cm/dra/plugin``); a test fixture built from the vendored official protos.

Named as such on purpose — it is not the kubelet, but it follows the kubelet's protocol:

- at :meth:`start` it deletes ALL of the node's ResourceSlices through the API server
  (DeleteCollection, ``fieldSelector=spec.nodeName=<node>``), as a starting kubelet does;
- it watches the registry dir (``/var/lib/kubelet/plugins_registry``, recursively) and dials
  every new socket whose name does not start with ``.`` (:attr:`attempts` records each
  socket's file name, so tests can check ``<driver>-reg.sock``);
- on each: ``pluginregistration.Registration/GetInfo`` (1 s deadline, as kubelet); an unknown
  ``type`` gets ``NotifyRegistrationStatus(false, "RegisterPlugin error -- no handler
  registered for plugin type: ...")``; an empty ``endpoint`` means the registration socket
  itself; ``supported_versions`` naming no service it speaks, or an endpoint another instance
  of the driver already registered, is refused with kubelet's message; otherwise it takes the
  FIRST entry it supports (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``), answers
  ``plugin_registered=true`` and connects to the endpoint at once;
- a driver is *usable* while at least one registered instance has a connected gRPC channel to
  its endpoint. When it is not usable (registration socket gone, or ``dra.sock`` gone so the
  channel cannot connect), a wipe is scheduled ``wipe_grace`` seconds later (30 s in kubelet;
  shorter in tests) that deletes that driver's slices on this node
  (``spec.nodeName=<node>,spec.driver=<driver>``); becoming usable again cancels it;
- health (KEP-4680, kubelet ``pkg/kubelet/cm/dra/healthinfo.go``): when the plugin's
  ``supported_versions`` name a ``DRAResourceHealth`` service it speaks (``v1`` before
  ``v1alpha1``), it opens ``NodeWatchResources`` on the endpoint and keeps it (reopened after
  1 s when it ends); each response is the driver's full list: every device in it is stored
  with the time it ARRIVED (kubelet ignores ``last_updated_time``) and its timeout
  (``health_check_timeout_seconds``, 0 or less = 30 s); a device not heard of within its
  timeout reads ``Unknown`` with no message. Pods run through :meth:`run_pod` get
  ``status.containerStatuses[0].allocatedResourcesStatus`` =
  ``[{name: "claim:<claim>/<request>", resources: [{resourceID: "<driver>/<pool>/<device>",
  health: Healthy|Unhealthy|Unknown, message}]}]``, rewritten on every health change;
- :meth:`prepare` / :meth:`unprepare` call ``NodePrepareResources`` /
  ``NodeUnprepareResources`` of the chosen service on the newest connected instance (else the
  newest), with a deadline, and — like kubelet — treat a claim missing from the response as a
  failure of the whole call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from vfio_dp.dra._pb.dra.v1 import api_pb2 as v1_pb2
from vfio_dp.dra._pb.dra.v1 import api_pb2_grpc as v1_grpc
from vfio_dp.dra._pb.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vfio_dp.dra._pb.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vfio_dp.dra._pb.dra_health.v1 import api_pb2 as health_v1_pb2
from vfio_dp.dra._pb.dra_health.v1 import api_pb2_grpc as health_v1_grpc
from vfio_dp.dra._pb.dra_health.v1alpha1 import api_pb2 as health_v1alpha1_pb2
from vfio_dp.dra._pb.dra_health.v1alpha1 import api_pb2_grpc as health_v1alpha1_grpc
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2 as reg_pb2
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2_grpc as reg_grpc

DRA_PLUGIN_TYPE = "DRAPlugin"
# the services this kubelet speaks, by the names plugins list in supported_versions
SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAPlugin": (v1_pb2, v1_grpc),
    "v1beta1.DRAPlugin": (v1beta1_pb2, v1beta1_grpc),
}
HEALTH_SERVICES: dict[str, tuple[Any, Any]] = {
    "v1.DRAResourceHealth": (health_v1_pb2, health_v1_grpc),
    "v1alpha1.DRAResourceHealth": (health_v1alpha1_pb2, health_v1alpha1_grpc),
}
DEFAULT_HEALTH_TIMEOUT = 30.0  # kubelet's DefaultHealthTimeout
POD_HEALTH = {0: "Unknown", 1: "Healthy", 2: "Unhealthy"}  # HealthStatus -> pod status value
KUBELET_WIPE_GRACE = 30.0
GET_INFO_TIMEOUT = 1.0  # kubelet: dial 10 s, GetInfo 1 s
DIAL_TIMEOUT = 10.0
PREPARE_TIMEOUT = 45.0


async def _cancelled(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it has ended. A cancel of the caller itself is not
    swallowed, as ``suppress(CancelledError)`` around ``await task`` would: stop() cancels
    the registry watcher while it waits here for a health task, and must see it end."""
    task.cancel()
    await asyncio.wait({task})
    failed = None if task.cancelled() else task.exception()
    if failed is not None:
        raise failed


@dataclass
class Attempt:
    """One registration attempt: the socket dialled and what came of it."""

    socket: str  # file name in the registry dir
    info: Any = None  # the PluginInfo answered, if any
    accepted: bool = False
    error: str = ""


@dataclass
class DraPluginView:
    """What the stand-in knows about one registered driver."""

    driver: str
    socket: str  # registration socket path
    socket_id: tuple[int, int, int]
    endpoint: str
    version: str  # the chosen service, e.g. "v1.DRAPlugin"
    channel: Any = None
    stub: Any = None
    connected: bool = False
    calls: list[str] = field(default_factory=list)
    health_version: str = ""  # the DRAResourceHealth service followed ("" = none)
    health_task: Any = None


@dataclass
class SeenHealth:
    """One device's health as kubelet's cache holds it."""

    health: str  # Healthy / Unhealthy / Unknown
    message: str
    timeout: float
    received: float  # monotonic time the response arrived


@dataclass
class StandinPod:
    """A pod the stand-in runs: which claim/request got which device of which driver."""

    name: str
    namespace: str
    driver: str
    # (claim name, request, pool, device) for every device kubelet was answered
    devices: list[tuple[str, str, str, str]]
    status: dict[str, Any] = field(default_factory=dict)


class KubeletDraStandin:
    def __init__(
        self,
        registry_dir: str,
        node_name: str,
        *,
        api_client: Any = None,
        wipe_grace: float = KUBELET_WIPE_GRACE,
        poll: float = 0.05,
        versions: tuple[str, ...] = tuple(SERVICES),
        health_versions: tuple[str, ...] = tuple(HEALTH_SERVICES),
    ) -> None:
        """``api_client``: a ``kubernetes.client.ApiClient`` (e.g. the API-server stand-in's);
        None = no API server (slices are not wiped). ``versions``: the services this kubelet
        speaks (an older kubelet knows only ``v1beta1.DRAPlugin``)."""
        self.dir = registry_dir
        self.node = node_name
        self.api_client = api_client
        self.wipe_grace = wipe_grace
        self.poll = poll
        self.versions = versions
        self.health_versions = health_versions
        #: driver -> (pool, device) -> what the health stream said last
        self.health: dict[str, dict[tuple[str, str], SeenHealth]] = {}
        #: (monotonic time, driver, pool, device, health) per device whose health changed
        self.health_changes: list[tuple[float, str, str, str, str]] = []
        self.health_responses = 0
        self.pods: dict[str, StandinPod] = {}
        self.instances: dict[str, list[DraPluginView]] = {}  # driver -> in registration order
        self.attempts: list[Attempt] = []
        self.wipes: list[str] = []  # field selectors of the DeleteCollection calls made
        self.events: list[tuple[float, str]] = []  # (monotonic time, what happened), for failures
        self.changed = asyncio.Condition()
        self._known: dict[str, tuple[int, int, int]] = {}  # socket path -> file id dialled
        self._wipe_timers: dict[str, asyncio.Task[None]] = {}
        self._watcher: asyncio.Task[None] | None = None

    @property
    def plugins(self) -> dict[str, DraPluginView]:
        """driver -> the instance kubelet would call (newest connected, else newest)."""
        return {d: self._pick(d) for d, views in self.instances.items() if views}

    def _pick(self, driver: str) -> DraPluginView:
        views = self.instances[driver]
        return next((v for v in reversed(views) if v.connected), views[-1])

    def usable(self, driver: str) -> bool:
        return any(v.connected for v in self.instances.get(driver, ()))

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        if self.api_client is not None:
            await self._wipe(f"spec.nodeName={self.node}")
        self._watcher = asyncio.create_task(self._watch(), name="kubelet-dra-standin watch")

    async def stop(self) -> None:
        if self._watcher is not None:
            await _cancelled(self._watcher)
            self._watcher = None
        for timer in self._wipe_timers.values():
            timer.cancel()
        self._wipe_timers.clear()
        for views in self.instances.values():
            for view in views:
                await self._close(view)
        self.instances.clear()
        self._known.clear()

    async def restart(self) -> None:
        """A kubelet restart: forget every plugin, wipe the node's slices, re-discover the
        sockets still in the registry dir."""
        await self.stop()
        await self.start()

    # -- the watcher -----------------------------------------------------------------------
    async def _watch(self) -> None:
        while True:
            await self._scan()
            await asyncio.sleep(self.poll)  # the stand-in's plugin watcher polls the registry dir

    async def _scan(self) -> None:
        present: dict[str, tuple[int, int, int]] = {}
        for top, dirs, files in os.walk(self.dir):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for name in files:
                if name.startswith("."):
                    continue
                path = os.path.join(top, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                if stat.S_ISSOCK(st.st_mode):
                    present[path] = (st.st_dev, st.st_ino, st.st_ctime_ns)
        for path, fid in list(self._known.items()):
            if present.get(path) != fid:
                del self._known[path]
                await self._deregister(path, fid)
        for path, fid in present.items():
            if path not in self._known:
                self._known[path] = fid
                await self._register(path, fid)
        await self._monitor()

    async def _monitor(self) -> None:
        """Follow each instance's channel (kubelet: gRPC ConnBegin/ConnEnd, reconnecting)."""
        changed = False
        for driver, views in self.instances.items():
            for view in views:
                state = view.channel.get_state(try_to_connect=True)
                connected = state == grpc.ChannelConnectivity.READY
                if connected != view.connected:
                    view.connected = connected
                    changed = True
                    self._note(f"{driver} {view.endpoint}: {state.name}")
            if changed:
                self._sync(driver)
        if changed:
            async with self.changed:
                self.changed.notify_all()

    def _sync(self, driver: str) -> None:
        """kubelet's DRAPluginManager.sync: usable → cancel a pending wipe; not → schedule one
        (a wipe already pending keeps its time)."""
        if self.api_client is None:
            return
        if self.usable(driver):
            timer = self._wipe_timers.pop(driver, None)
            if timer is not None:
                timer.cancel()
                self._note(f"{driver}: usable again, wipe cancelled")
        elif driver not in self._wipe_timers:
            self._wipe_timers[driver] = asyncio.create_task(self._wipe_later(driver))
            self._note(f"{driver}: not usable, wipe in {self.wipe_grace} s")

    async def _register(self, path: str, fid: tuple[int, int, int]) -> None:
        attempt = Attempt(os.path.basename(path))
        self.attempts.append(attempt)
        try:
            async with grpc.aio.insecure_channel("unix:" + path) as channel:
                stub = reg_grpc.RegistrationStub(channel)
                try:
                    # asyncio.timeout: Python 3.11's wait_for loses a cancel (stop()) that
                    # comes as the channel gets ready
                    async with asyncio.timeout(DIAL_TIMEOUT):
                        await channel.channel_ready()
                    info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT)
                except (grpc.aio.AioRpcError, TimeoutError) as e:
                    attempt.error = f"RegisterPlugin error -- GetInfo at socket {path}: {e}"
                    return
                attempt.info = info
                endpoint = info.endpoint or path
                why, version = self._validate(info, path, endpoint)
                if why:
                    attempt.error = why
                    with contextlib.suppress(grpc.aio.AioRpcError):
                        await stub.NotifyRegistrationStatus(
                            reg_pb2.RegistrationStatus(plugin_registered=False, error=why),
                            timeout=GET_INFO_TIMEOUT,
                        )
                    return
                view = DraPluginView(info.name, path, fid, endpoint, version)
                view.channel = grpc.aio.insecure_channel("unix:" + endpoint)
                view.stub = SERVICES[version][1].DRAPluginStub(view.channel)
                view.channel.get_state(try_to_connect=True)  # connect early, as kubelet
                view.health_version = next(
                    (v for v in self.health_versions if v in info.supported_versions), ""
                )
                self.instances.setdefault(info.name, []).append(view)
                # accepted together with the instance (no await between): kubelet decides,
                # then tells the plugin; whoever sees the plugin sees the accepted attempt
                attempt.accepted = True
                self._sync(info.name)
                try:
                    await stub.NotifyRegistrationStatus(
                        reg_pb2.RegistrationStatus(plugin_registered=True), timeout=GET_INFO_TIMEOUT
                    )
                except grpc.aio.AioRpcError as e:
                    attempt.error = f"NotifyRegistrationStatus failed: {e.code().name}"
                if view.health_version:  # kubelet follows health once the plugin is registered
                    view.health_task = asyncio.create_task(self._follow_health(view))
        finally:
            async with self.changed:
                self.changed.notify_all()

    def _validate(self, info: Any, path: str, endpoint: str) -> tuple[str, str]:
        """(why refused or "", the chosen service) — kubelet's checks and messages."""
        if info.type != DRA_PLUGIN_TYPE:
            return (
                f"RegisterPlugin error -- no handler registered for plugin type: {info.type} "
                f"at socket {path}",
                "",
            )
        prefix = (
            "RegisterPlugin error -- plugin validation failed with err: invalid supported gRPC "
            f"versions of DRA driver plugin {info.name} at endpoint {endpoint}: "
        )
        versions = list(info.supported_versions)
        if not versions:
            return prefix + "empty list of supported gRPC services (aka supported versions)", ""
        chosen = next((v for v in versions if v in self.versions), "")
        if not chosen:
            return (
                prefix + f"none of services supported by the plugin ({versions}) are supported "
                f"by the kubelet ({list(self.versions)})",
                "",
            )
        if any(v.endpoint == endpoint for v in self.instances.get(info.name, ())):
            return (
                f"RegisterPlugin error -- plugin registration failed with err: endpoint "
                f"{endpoint} already registered for DRA driver plugin {info.name}",
                "",
            )
        return "", chosen

    async def _deregister(self, path: str, fid: tuple[int, int, int]) -> None:
        for driver, views in self.instances.items():
            for view in list(views):
                if view.socket == path and view.socket_id == fid:
                    views.remove(view)
                    await self._close(view)
                    self._sync(driver)
        self.instances = {d: v for d, v in self.instances.items() if v}
        async with self.changed:
            self.changed.notify_all()

    async def _wipe_later(self, driver: str) -> None:
        await asyncio.sleep(self.wipe_grace)  # the kubelet's own grace before it wipes
        self._wipe_timers.pop(driver, None)
        if not self.usable(driver):
            await self._wipe(f"spec.nodeName={self.node},spec.driver={driver}")

    async def _wipe(self, selector: str) -> None:
        from kubernetes.client import ResourceV1Api

        api = ResourceV1Api(self.api_client)
        self._note(f"wiping {selector}")
        await asyncio.to_thread(api.delete_collection_resource_slice, field_selector=selector)
        self.wipes.append(selector)
        async with self.changed:
            self.changed.notify_all()

    def _note(self, what: str) -> None:
        self.events.append((time.monotonic(), what))

    @staticmethod
    async def _close(view: DraPluginView) -> None:
        if view.health_task is not None:
            await _cancelled(view.health_task)
            view.health_task = None
        if view.channel is not None:
            await view.channel.close()
            view.channel = None

    # -- health (KEP-4680) -----------------------------------------------------------------
    async def _follow_health(self, view: DraPluginView) -> None:
        pb, grpc_mod = HEALTH_SERVICES[view.health_version]
        while view.channel is not None:
            stub = grpc_mod.DRAResourceHealthStub(view.channel)
            try:
                async for response in stub.NodeWatchResources(pb.NodeWatchResourcesRequest()):
                    await self._take_health(view.driver, response)
                self._note(f"{view.driver}: health stream ended")
            except grpc.aio.AioRpcError as e:
                self._note(f"{view.driver}: health stream: {e.code().name}")
            await asyncio.sleep(1.0)  # kubelet retries the stream

    async def _take_health(self, driver: str, response: Any) -> None:
        """kubelet's updateHealthInfo: the response is the driver's full list."""
        now = time.monotonic()
        cache = self.health.setdefault(driver, {})
        self.health_responses += 1
        for d in response.devices:
            key = (d.device.pool_name, d.device.device_name)
            timeout = float(d.health_check_timeout_seconds)
            seen = SeenHealth(
                POD_HEALTH.get(d.health, "Unknown"),
                d.message,
                timeout if timeout > 0 else DEFAULT_HEALTH_TIMEOUT,
                now,
            )
            before = cache.get(key)
            if before is None or (before.health, before.message) != (seen.health, seen.message):
                self.health_changes.append((now, driver, key[0], key[1], seen.health))
            cache[key] = seen
        self._refresh_pods()
        async with self.changed:
            self.changed.notify_all()

    def health_of(self, driver: str, pool: str, device: str) -> tuple[str, str]:
        """(health, message) as kubelet would report it now (its getHealthInfo)."""
        seen = self.health.get(driver, {}).get((pool, device))
        if seen is None or time.monotonic() - seen.received > seen.timeout:
            return "Unknown", ""
        return seen.health, seen.message

    def _refresh_pods(self) -> None:
        for pod in self.pods.values():
            by_name: dict[str, list[dict[str, str]]] = {}
            for claim, request, pool, device in pod.devices:
                health, message = self.health_of(pod.driver, pool, device)
                entry = {"resourceID": f"{pod.driver}/{pool}/{device}", "health": health}
                if message:
                    entry["message"] = message
                by_name.setdefault(f"claim:{claim}/{request}", []).append(entry)
            pod.status = {
                "containerStatuses": [
                    {
                        "name": "compute",
                        "allocatedResourcesStatus": [
                            {"name": n, "resources": r} for n, r in sorted(by_name.items())
                        ],
                    }
                ]
            }

    async def run_pod(
        self, driver: str, pod: str, namespace: str, claims: list[tuple[str, str]]
    ) -> StandinPod:
        """Prepare the pod's claims ``(uid, name)`` and keep the pod's device health current."""
        answers = await self.prepare(driver, [(namespace, uid, name) for uid, name in claims])
        names = dict(claims)
        devices: list[tuple[str, str, str, str]] = []
        for uid, answer in answers.items():
            if answer.error:
                raise AssertionError(f"NodePrepareResources: {answer.error}")
            for d in answer.devices:
                for request in d.request_names:
                    devices.append((names[uid], request, d.pool_name, d.device_name))
        self.pods[pod] = StandinPod(pod, namespace, driver, devices)
        self._refresh_pods()
        return self.pods[pod]

    # -- kubelet's calls -------------------------------------------------------------------
    def _pb(self, driver: str) -> tuple[DraPluginView, Any]:
        if not self.instances.get(driver):
            raise LookupError(f"DRA driver {driver} is not registered")
        view = self._pick(driver)
        return view, SERVICES[view.version][0]

    async def prepare(
        self, driver: str, claims: list[tuple[str, str, str]], *, timeout: float = PREPARE_TIMEOUT
    ) -> dict[str, Any]:
        """NodePrepareResources for ``(namespace, uid, name)`` claims → uid -> per-claim answer.
        Raises AssertionError, as kubelet fails the pod, when a claim is missing."""
        view, pb = self._pb(driver)
        request = pb.NodePrepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        view.calls.append("NodePrepareResources")
        response = await view.stub.NodePrepareResources(request, timeout=timeout)
        missing = [uid for _, uid, _ in claims if uid not in response.claims]
        if missing:
            raise AssertionError(
                f"NodePrepareResources: claims {missing} missing from the response"
            )
        return dict(response.claims)

    async def unprepare(
        self, driver: str, claims: list[tuple[str, str, str]], *, timeout: float = PREPARE_TIMEOUT
    ) -> dict[str, str]:
        view, pb = self._pb(driver)
        request = pb.NodeUnprepareResourcesRequest(
            claims=[pb.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        view.calls.append("NodeUnprepareResources")
        response = await view.stub.NodeUnprepareResources(request, timeout=timeout)
        missing = [uid for _, uid, _ in claims if uid not in response.claims]
        if missing:
            raise AssertionError(
                f"NodeUnprepareResources: claims {missing} missing from the response"
            )
        return {uid: r.error for uid, r in response.claims.items()}

    async def prepare_pod(
        self, pod: dict[str, Any], claims: list[dict[str, Any]]
    ) -> dict[str, list[str]]:
        """As kubelet's DRA manager does for one pod: NodePrepareResources for the pod's
        claims (one call per driver; any error fails the pod: AssertionError), then each
        container's CDI device IDs — for the extended-resource claim
        (``status.extendedResourceClaimStatus``) the devices of the requests its
        ``requestMappings`` give that container (KEP-5004); for a claim a container names in
        ``resources.claims`` (through ``spec.resourceClaims[].resourceClaimName``), the
        devices of that request, or all of the claim's."""
        ns = pod["metadata"]["namespace"]
        by_uid = {c["metadata"]["uid"]: c for c in claims}
        drivers: dict[str, list[tuple[str, str, str]]] = {}
        for c in claims:
            results = c["status"]["allocation"]["devices"]["results"]
            for d in sorted({r["driver"] for r in results}):
                drivers.setdefault(d, []).append((ns, c["metadata"]["uid"], c["metadata"]["name"]))
        devices: dict[str, list[Any]] = {}  # claim name -> prepared devices (all drivers)
        for driver, refs in drivers.items():
            answer = await self.prepare(driver, refs)
            for uid, result in answer.items():
                if result.error:
                    raise AssertionError(f"NodePrepareResources: {result.error}")
                devices.setdefault(by_uid[uid]["metadata"]["name"], []).extend(result.devices)

        def ids(claim: str, request: str | None) -> list[str]:
            return [
                i
                for d in devices.get(claim, [])
                if request is None or request in d.request_names
                for i in d.cdi_device_ids
            ]

        out: dict[str, list[str]] = {c["name"]: [] for c in pod["spec"]["containers"]}
        ext = (pod.get("status") or {}).get("extendedResourceClaimStatus")
        if ext:
            for m in ext["requestMappings"]:
                out[m["containerName"]].extend(ids(ext["resourceClaimName"], m["requestName"]))
        named = {
            c["name"]: c.get("resourceClaimName") for c in pod["spec"].get("resourceClaims") or []
        }
        for ctr in pod["spec"]["containers"]:
            for ref in (ctr.get("resources") or {}).get("claims") or []:
                claim = named.get(ref["name"])
                if claim:
                    out[ctr["name"]].extend(ids(claim, ref.get("request")))
        return out

    async def wait_for(
        self, what: str, predicate: Callable[[KubeletDraStandin], bool], timeout: float = 10.0
    ) -> None:
        deadline = time.monotonic() + timeout
        async with self.changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"kubelet DRA stand-in: timed out waiting for {what}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), min(left, 0.1))
