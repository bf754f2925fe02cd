"""The kubelet side of the DRA front-end: plugin registration and the DRAPlugin services.

The ONLY module on the DRA side that imports ``grpc`` and the generated code
(``vfio_dp.dra._pb``, vendored from kubernetes/kubelet ``pkg/apis/...``). It translates
between the wire and the typed values of :mod:`vfio_dp.dra.claimpath.claims` (pure, so the claim path
loads no ``grpc``); every decision is the :class:`~vfio_dp.dra.claimpath.claims.Handler`'s.

Sockets (as kubelet and kubernetes/dynamic-resource-allocation ``kubeletplugin`` expect)::

    <plugins dir>/<driver>/dra.sock           k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin
                                               k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin
                                               v1.DRAResourceHealth, v1alpha1.DRAResourceHealth
                                               (:mod:`vfio_dp.dra.kubeletapi.health_stream`, when given)
    <registry dir>/<driver>-reg.sock          pluginregistration.Registration

kubelet watches the registry dir, dials ``-reg.sock``, calls ``GetInfo`` (answered with
``type = "DRAPlugin"``, ``name = <driver>``, ``endpoint = <dra.sock path>``,
``supported_versions = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
"v1alpha1.DRAResourceHealth"]`` — kubelet takes the first DRAPlugin it supports) and ``NotifyRegistrationStatus``; then it calls ``NodePrepareResources`` /
``NodeUnprepareResources`` on ``dra.sock``.

Invariants:

- the service socket serves before the registration socket exists (kubelet dials in at once);
- every claim in a request has an entry in the response (a missing one aborts the pod's whole
  prepare in kubelet): a claim the handler left out, a malformed claim identity and a handler
  exception all become that claim's ``error``, never a gRPC error with a traceback;
- the handler only ever sees validated claim identities (namespace a DNS label, name a DNS
  subdomain, uid short and printable) — it builds file names from them;
- what is echoed from a request into an error message is clipped (:func:`_clip`);
- a handler call runs to completion even when kubelet's deadline cancels the RPC, so a retry
  finds finished work instead of a half-done bind;
- both sockets are served by :class:`vfio_dp.core.sockets.SocketServer`, the one helper of both
  front-ends: a stale socket at start is replaced atomically; anything else at a socket path
  (a directory, a regular file, a symlink) is a :class:`~vfio_dp.errors.SocketPathError` naming
  the path and the fix; :meth:`KubeletFrontEnd.check` re-creates a socket removed or replaced
  from under us; :meth:`KubeletFrontEnd.stop` removes only sockets that are still ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from vfio_dp.core.sockets import SocketServer
from vfio_dp.dra._pb.dra.v1 import api_pb2 as v1_pb2
from vfio_dp.dra._pb.dra.v1 import api_pb2_grpc as v1_grpc
from vfio_dp.dra._pb.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vfio_dp.dra._pb.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2 as reg_pb2
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vfio_dp.dra.claimpath.claims import ClaimRef, ClaimResult, Handler, describe
from vfio_dp.dra.claimpath.outcome import outcome
from vfio_dp.dra.kubeletapi.health_stream import SERVICE_NAMES, HealthStream
from vfio_dp.model import naming

if TYPE_CHECKING:
    from vfio_dp.core.metrics import Metrics

#: seconds the DRA service gives running calls and streams when the plugin stops
STOP_GRACE = 3.0

log = logging.getLogger("vfio_dp.dra")

T = TypeVar("T")

PLUGIN_TYPE = "DRAPlugin"  # kubernetes/kubelet pkg/apis/pluginregistration/v1/constants.go
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # v1 first: kubelet takes the first
SERVICE_SOCKET = "dra.sock"
REGISTRATION_SUFFIX = "-reg.sock"
MAX_ECHO = 80  # characters of a client-supplied string quoted back in an error
MAX_ERROR = 4096  # characters of one per-claim error sent to kubelet


def _clip(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (client input is hostile)."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"...({len(text)} characters)"


def _describe(claim: ClaimRef) -> str:
    return f"claim {_clip(claim.namespace)}/{_clip(claim.name)} (uid {_clip(claim.uid)})"


def claim_problem(claim: ClaimRef) -> str | None:
    """Why kubelet's claim identity is unusable, or None. The handler builds paths from it."""
    if (why := naming.claim_uid_problem(claim.uid)) is not None:
        return f"uid {why}"
    if not naming.is_dns_label(claim.namespace):
        return "namespace is not a DNS label"
    if not naming.is_dns_subdomain(claim.name):
        return "name is not a DNS subdomain"
    return None


class _DraServicer:
    """``DRAPlugin`` of one API version (``pb`` = its generated messages) over the handler."""

    def __init__(self, front: KubeletFrontEnd, pb: Any, version: str) -> None:
        self.front = front
        self.pb = pb
        self.version = version

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        claims = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        results = await self.front._prepare(claims, self.version)
        response = self.pb.NodePrepareResourcesResponse()
        for uid, result in results.items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error[:MAX_ERROR]
                continue
            for d in result.devices:
                entry.devices.append(
                    self.pb.Device(
                        request_names=list(d.request_names),
                        pool_name=d.pool_name,
                        device_name=d.device_name,
                        cdi_device_ids=list(d.cdi_device_ids),
                    )
                )
        return response

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        claims = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        errors = await self.front._unprepare(claims, self.version)
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in errors.items():
            response.claims[uid].error = error[:MAX_ERROR]
        return response


class _RegistrationServicer(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, front: KubeletFrontEnd) -> None:
        self.front = front

    async def GetInfo(self, request: Any, context: Any) -> Any:
        log.info("%s: kubelet asked for the plugin info", self.front.driver_name)
        return reg_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.front.driver_name,
            endpoint=self.front.service_socket,
            supported_versions=list(self.front.supported_versions),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.front.registered = bool(request.plugin_registered)
        self.front.registration_error = request.error[:MAX_ERROR]
        if request.plugin_registered:
            log.info("%s: registered with kubelet", self.front.driver_name)
        else:
            log.error(
                "%s: kubelet refused the registration: %s",
                self.front.driver_name,
                _clip(request.error, MAX_ERROR),
            )
        return reg_pb2.RegistrationStatusResponse()


class KubeletFrontEnd:
    """Serves DRAPlugin v1 + v1beta1 and the registration socket for one driver."""

    def __init__(
        self,
        driver_name: str,
        registry_dir: str,
        plugins_dir: str,
        handler: Handler,
        health: HealthStream | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """``health``: also serve ``DRAResourceHealth`` (v1, v1alpha1) on ``dra.sock``.
        ``metrics``: where each Prepare/Unprepare call's latency goes."""
        self.driver_name = naming.check_dra_driver_name(driver_name)
        self.handler = handler
        self.health = health
        self.metrics = metrics
        self.supported_versions = SUPPORTED_VERSIONS + (SERVICE_NAMES if health else ())
        self.service_socket = os.path.join(plugins_dir, driver_name, SERVICE_SOCKET)
        self.registration_socket = os.path.join(registry_dir, driver_name + REGISTRATION_SUFFIX)
        self._service = SocketServer(
            self.service_socket,
            "--kubelet-plugins-dir",
            grpc.aio.server,
            self._add_dra_services,
            log=log,
            label=driver_name,
            base=plugins_dir,  # <plugins>/<driver> is ours: never a link elsewhere
        )
        self._registration = SocketServer(
            self.registration_socket,
            "--kubelet-registry-dir",
            grpc.aio.server,
            lambda server: reg_grpc.add_RegistrationServicer_to_server(
                _RegistrationServicer(self), server
            ),
            log=log,
            label=driver_name,
        )
        self.registered = False
        self.registration_error = ""
        self._running: set[asyncio.Task[Any]] = set()

    @property
    def sockets(self) -> tuple[SocketServer, SocketServer]:
        """``dra.sock`` and ``<driver>-reg.sock`` (the plugin's ``/healthz`` checks them)."""
        return (self._service, self._registration)

    def _add_dra_services(self, server: Any) -> None:
        v1_grpc.add_DRAPluginServicer_to_server(_DraServicer(self, v1_pb2, "v1"), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(
            _DraServicer(self, v1beta1_pb2, "v1beta1"), server
        )
        if self.health is not None:
            self.health.add_to_server(server)

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Serve ``dra.sock`` first, then ``<driver>-reg.sock`` (kubelet dials in at once)."""
        await self._service.serve()
        try:
            await self._registration.serve()
        except BaseException:
            await self._service.close()
            raise

    def directories(self) -> list[str]:
        """Where the two sockets are (watched for changes: :meth:`check`)."""
        return [os.path.dirname(self.service_socket), os.path.dirname(self.registration_socket)]

    async def check(self) -> bool:
        """Re-create a socket removed or replaced from under us (kubelet restart, cleanup).

        A socket that cannot be re-created is logged (once per distinct problem) and tried
        again at the next check (False: one is not served); it never raises.
        """
        served_all = True
        for served in (self._service, self._registration):
            what = served.changed()
            if what is None:
                continue
            if served is self._registration:
                self.registered = False  # kubelet will dial the new socket and register again
            served_all = await served.restore(f"{served.path} {what}") and served_all
        return served_all

    async def stop(self, *, drain: float = 60.0) -> None:
        """Stop both servers and remove both sockets (only if they are still ours); then wait
        up to ``drain`` seconds for handler calls still running (a bind is finished, never
        abandoned half-way)."""
        await self._registration.close()
        # the health streams were told to end just before (the plugin closes them first):
        # give them, and a call in flight, time to answer rather than be cancelled -- a
        # loaded node took more than half a second, and grpc logged the cancellation as a
        # traceback. stop() returns as soon as they are done.
        await self._service.close(grace=STOP_GRACE)
        self.registered = False
        if self._running:
            log.info("%s: waiting for %d running call(s)", self.driver_name, len(self._running))
            _, pending = await asyncio.wait(set(self._running), timeout=drain)
            if pending:
                log.error(
                    "%s: %d call(s) still running after %.0f s; stopping anyway",
                    self.driver_name,
                    len(pending),
                    drain,
                )

    # -- requests ------------------------------------------------------------------------
    def _split(
        self, claims: Sequence[ClaimRef]
    ) -> tuple[list[ClaimRef], dict[str, str], dict[str, ClaimRef]]:
        """(valid distinct claims, uid -> error for invalid ones, uid -> claim)."""
        valid: list[ClaimRef] = []
        invalid: dict[str, str] = {}
        by_uid: dict[str, ClaimRef] = {}
        for claim in claims:
            if claim.uid in by_uid:
                continue  # kubelet sends each claim once; a repeat gets the first's answer
            by_uid[claim.uid] = claim
            why = claim_problem(claim)
            if why is None:
                valid.append(claim)
            else:
                invalid[claim.uid] = f"driver {self.driver_name}: {_describe(claim)}: {why}"
        return valid, invalid, by_uid

    async def _call(self, what: str, coro: Any) -> Any:
        """Await the handler; if the RPC is cancelled (kubelet's deadline), let it finish."""
        task = asyncio.ensure_future(coro)
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            log.warning(
                "%s: kubelet gave up on %s; it keeps running so a retry finds it done",
                self.driver_name,
                what,
            )
            raise

    def _timed(self, histogram: str, version: str) -> contextlib.AbstractContextManager[None]:
        if self.metrics is None:
            return contextlib.nullcontext()
        return self.metrics.time(histogram, version=version)

    async def _prepare(self, claims: Sequence[ClaimRef], version: str) -> dict[str, ClaimResult]:
        with self._timed("vfio_dp_dra_prepare_seconds", version):
            results, errors = await self._answer(
                claims,
                version,
                "prepare",
                self.handler.prepare,
                ClaimResult,
                lambda r: bool(r.error),
            )
        return {**{uid: ClaimResult(error=e) for uid, e in errors.items()}, **results}

    async def _unprepare(self, claims: Sequence[ClaimRef], version: str) -> dict[str, str]:
        with self._timed("vfio_dp_dra_unprepare_seconds", version):
            results, errors = await self._answer(
                claims, version, "unprepare", self.handler.unprepare, str, bool
            )
        return {**errors, **results}

    async def _answer(
        self,
        claims: Sequence[ClaimRef],
        version: str,
        verb: str,
        call: Callable[[list[ClaimRef]], Awaitable[Mapping[str, T]]],
        kind: type[T],
        failed: Callable[[T], bool],
    ) -> tuple[dict[str, T], dict[str, str]]:
        """Hand the valid claims to the handler's ``verb``: (its answers by uid, the shell's
        own error for every other claim — malformed, left out, or the handler raised)."""
        rpc = f"{version} Node{verb.capitalize()}Resources"
        valid, errors, by_uid = self._split(claims)
        answered: Mapping[str, object] = {}
        raised: Exception | None = None
        if valid:
            try:
                answered = await self._call(rpc, call(valid))
            except Exception as e:  # the handler's bug must not become a gRPC UNKNOWN
                log.exception("%s: %s failed", self.driver_name, verb)
                raised = e
        results: dict[str, T] = {}
        for claim in valid:
            result = answered.get(claim.uid)
            if raised is not None:  # the claim path's one mapper says what it means
                said = outcome(describe(claim.namespace, claim.name, claim.uid), raised)
                errors[claim.uid] = f"driver {self.driver_name}: {said.error}"
            elif isinstance(result, kind):
                results[claim.uid] = result
            else:
                errors[claim.uid] = (
                    f"driver {self.driver_name}: no result for {_describe(claim)} "
                    "(a driver bug); kubelet will retry"
                )
        extra = set(answered) - set(by_uid)
        if extra:
            log.warning(
                "%s: %s answered %d claims not asked for", self.driver_name, verb, len(extra)
            )
        log.info(
            "%s: %s: %d claims, %d failed",
            self.driver_name,
            rpc,
            len(errors) + len(results),
            len(errors) + sum(1 for r in results.values() if failed(r)),
        )
        return results, errors
