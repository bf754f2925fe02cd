"""The kubelet side of the DRA front-end: plugin registration and the DRAPlugin services.

The ONLY module on the DRA side that imports ``grpc`` and the generated code
(``vfio_dp.dra._pb``, vendored from kubernetes/kubelet ``pkg/apis/...``). It translates
between the wire and the typed values of :mod:`vfio_dp.dra.claims` (pure, so the claim path
loads no ``grpc``); every decision is the :class:`~vfio_dp.dra.claims.Handler`'s.

Sockets (as kubelet and kubernetes/dynamic-resource-allocation ``kubeletplugin`` expect)::

    <plugins dir>/<driver>/dra.sock           k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin
                                               k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin
                                               v1.DRAResourceHealth, v1alpha1.DRAResourceHealth
                                               (:mod:`vfio_dp.dra.health_stream`, when given)
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
- a stale socket at start is replaced; anything else at a socket path (a directory, a regular
  file, a symlink) is a :class:`~vfio_dp.errors.SocketPathError` naming the path and the fix;
  :meth:`KubeletFrontEnd.check` re-creates a socket removed or replaced from under us;
  :meth:`KubeletFrontEnd.stop` removes only sockets that are still ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import stat
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from vfio_dp.dra._pb.dra.v1 import api_pb2 as v1_pb2
from vfio_dp.dra._pb.dra.v1 import api_pb2_grpc as v1_grpc
from vfio_dp.dra._pb.dra.v1beta1 import api_pb2 as v1beta1_pb2
from vfio_dp.dra._pb.dra.v1beta1 import api_pb2_grpc as v1beta1_grpc
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2 as reg_pb2
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vfio_dp.dra.claims import ClaimRef, ClaimResult, Handler
from vfio_dp.dra.health_stream import SERVICE_NAMES, HealthStream
from vfio_dp.errors import DriverNameError, SocketPathError
from vfio_dp.host.files import FileId, file_id
from vfio_dp.model import naming

log = logging.getLogger("vfio_dp.dra")

PLUGIN_TYPE = "DRAPlugin"  # kubernetes/kubelet pkg/apis/pluginregistration/v1/constants.go
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")  # v1 first: kubelet takes the first
SERVICE_SOCKET = "dra.sock"
REGISTRATION_SUFFIX = "-reg.sock"
MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL
MAX_MESSAGE = 1 << 20  # a pod's claims for one driver fit many times over
MAX_CONCURRENT_RPCS = 64
MAX_ECHO = 80  # characters of a client-supplied string quoted back in an error
MAX_ERROR = 4096  # characters of one per-claim error sent to kubelet
MAX_UID = 128  # Kubernetes UIDs are 36-character UUIDs

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_UID = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_.]*")


def _clip(text: str, limit: int = MAX_ECHO) -> str:
    """``text`` quoted for a message, cut to ``limit`` characters (client input is hostile)."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"...({len(text)} characters)"


def _describe(claim: ClaimRef) -> str:
    return f"claim {_clip(claim.namespace)}/{_clip(claim.name)} (uid {_clip(claim.uid)})"


def claim_problem(claim: ClaimRef) -> str | None:
    """Why kubelet's claim identity is unusable, or None. The handler builds paths from it."""
    if not claim.uid:
        return "uid is empty"
    if len(claim.uid) > MAX_UID or not _UID.fullmatch(claim.uid):
        return f"uid is not a Kubernetes UID (at most {MAX_UID} of [A-Za-z0-9-_.])"
    if len(claim.namespace) > 63 or not _DNS_LABEL.fullmatch(claim.namespace):
        return "namespace is not a DNS label"
    if naming.dns_subdomain_problem(claim.name) is not None:
        return "name is not a DNS subdomain"
    return None


def _file_id(path: str) -> FileId | None:
    """The socket file itself (never what a link there points at)."""
    return file_id(path, follow=False)


def _make_room(path: str, flag: str) -> None:
    """Check that ``path`` can take a new socket: create its directory; a socket there is stale.

    Refuses (``SocketPathError``) anything that is not a socket, and a path too long for
    ``sun_path``; ``flag`` names the option that chose the directory, for the fix.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise SocketPathError(
            path,
            f"is {len(os.fsencode(path))} bytes long, unix sockets allow {MAX_SOCKET_PATH}",
            f"choose a shorter {flag} or driver name",
        )
    parent = os.path.dirname(path)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as e:
        raise SocketPathError(
            path,
            f"needs the directory {parent}, which cannot be created: {e.strerror or e}",
            f"make {parent} a writable directory or choose another {flag}",
        ) from e
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SocketPathError(
            path, f"cannot be inspected: {e.strerror or e}", "check the permissions"
        ) from e
    if not stat.S_ISSOCK(st.st_mode):
        kind = (
            "a directory"
            if stat.S_ISDIR(st.st_mode)
            else "a symlink"
            if stat.S_ISLNK(st.st_mode)
            else "a regular file"
            if stat.S_ISREG(st.st_mode)
            else "a special file"
        )
        raise SocketPathError(
            path,
            f"is {kind}, not a stale socket",
            f"remove it (rm -r {path}) or choose another {flag}",
        )
    # a socket: stale (an earlier run) or someone else's at our path; the rename in
    # KubeletFrontEnd._serve replaces it atomically


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


class _Served:
    """One socket and the gRPC server on it."""

    def __init__(self, path: str, flag: str) -> None:
        self.path = path
        self.flag = flag
        self.server: Any = None
        self.file_id: FileId | None = None
        self.problem = ""  # why the last re-create failed (logged once per change)


class KubeletFrontEnd:
    """Serves DRAPlugin v1 + v1beta1 and the registration socket for one driver."""

    def __init__(
        self,
        driver_name: str,
        registry_dir: str,
        plugins_dir: str,
        handler: Handler,
        health: HealthStream | None = None,
    ) -> None:
        """``health``: also serve ``DRAResourceHealth`` (v1, v1alpha1) on ``dra.sock``."""
        why = naming.dns_subdomain_problem(driver_name, naming.DRA_DRIVER_NAME_MAX)
        if why is not None:
            raise DriverNameError(driver_name, why)
        self.driver_name = driver_name
        self.handler = handler
        self.health = health
        self.supported_versions = SUPPORTED_VERSIONS + (SERVICE_NAMES if health else ())
        self.service_socket = os.path.join(plugins_dir, driver_name, SERVICE_SOCKET)
        self.registration_socket = os.path.join(registry_dir, driver_name + REGISTRATION_SUFFIX)
        self._service = _Served(self.service_socket, "--kubelet-plugins-dir")
        self._registration = _Served(self.registration_socket, "--kubelet-registry-dir")
        self.registered = False
        self.registration_error = ""
        self._running: set[asyncio.Task[Any]] = set()
        self._serial = 0

    # -- lifecycle -----------------------------------------------------------------------
    async def start(self) -> None:
        """Serve ``dra.sock`` first, then ``<driver>-reg.sock`` (kubelet dials in at once)."""
        await self._serve(self._service)
        try:
            await self._serve(self._registration)
        except BaseException:
            await self._close(self._service)
            raise

    async def check(self) -> None:
        """Re-create a socket removed or replaced from under us (kubelet restart, cleanup).

        A socket that cannot be re-created is logged (once per distinct problem) and tried
        again at the next check; it never raises.
        """
        for served in (self._service, self._registration):
            if served.server is not None and _file_id(served.path) == served.file_id:
                continue
            if served is self._registration:
                self.registered = False  # kubelet will dial the new socket and register again
            what = "is gone" if _file_id(served.path) is None else "was replaced"
            try:
                await self._close(served)
                await self._serve(served)
            except SocketPathError as e:
                if str(e) != served.problem:
                    log.error("%s: %s %s: %s", self.driver_name, served.path, what, e)
                    served.problem = str(e)
                continue
            served.problem = ""
            log.warning("%s: %s %s: serving it again", self.driver_name, served.path, what)

    async def stop(self, *, drain: float = 60.0) -> None:
        """Stop both servers and remove both sockets (only if they are still ours); then wait
        up to ``drain`` seconds for handler calls still running (a bind is finished, never
        abandoned half-way)."""
        await self._close(self._registration)
        await self._close(self._service)
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

    async def _serve(self, served: _Served) -> None:
        """Serve ``served.path``: bind a hidden name beside it, then rename it into place.

        gRPC unlinks the path it bound when its server stops; binding ``.<pid>.<n>.sock`` and
        renaming means that unlink hits a name nobody uses, never a socket someone else put
        at our path meanwhile. The rename also replaces a stale socket atomically. kubelet's
        watcher ignores names starting with ``.``.
        """
        _make_room(served.path, served.flag)
        self._serial += 1
        hidden = os.path.join(os.path.dirname(served.path), f".{os.getpid()}.{self._serial}.sock")
        if len(os.fsencode(hidden)) > MAX_SOCKET_PATH:
            raise SocketPathError(
                served.path,
                f"is in a directory too long for a unix socket ({MAX_SOCKET_PATH} bytes)",
                f"choose a shorter {served.flag}",
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hidden)  # our own leftover (pid reused after a crash)
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE),
                ("grpc.max_send_message_length", MAX_MESSAGE),
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
        )
        if served is self._service:
            v1_grpc.add_DRAPluginServicer_to_server(_DraServicer(self, v1_pb2, "v1"), server)
            v1beta1_grpc.add_DRAPluginServicer_to_server(
                _DraServicer(self, v1beta1_pb2, "v1beta1"), server
            )
            if self.health is not None:
                self.health.add_to_server(server)
        else:
            reg_grpc.add_RegistrationServicer_to_server(_RegistrationServicer(self), server)
        try:
            port = server.add_insecure_port("unix:" + hidden)
        except RuntimeError as e:
            port, why = 0, f"cannot be bound: {e}"
        else:
            why = "cannot be bound (gRPC refused it)"
        if port == 0:
            await server.stop(None)
            raise SocketPathError(served.path, why, "check the directory's permissions")
        await server.start()
        try:
            os.rename(hidden, served.path)
        except OSError as e:
            await server.stop(None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hidden)
            raise SocketPathError(
                served.path,
                f"cannot be put in place: {e.strerror or e}",
                f"remove it (rm -r {served.path}) or choose another {served.flag}",
            ) from e
        served.server = server
        served.file_id = _file_id(served.path)
        log.info("%s: serving %s", self.driver_name, served.path)

    async def _close(self, served: _Served) -> None:
        server, served.server = served.server, None
        if server is not None:
            await server.stop(0.5)
        if served.file_id is not None and _file_id(served.path) == served.file_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(served.path)
        served.file_id = None

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

    async def _prepare(self, claims: Sequence[ClaimRef], version: str) -> dict[str, ClaimResult]:
        valid, invalid, by_uid = self._split(claims)
        results: dict[str, ClaimResult] = {uid: ClaimResult(error=e) for uid, e in invalid.items()}
        answered: Mapping[str, ClaimResult] = {}
        failure = ""
        if valid:
            try:
                answered = await self._call(
                    f"{version} NodePrepareResources", self.handler.prepare(valid)
                )
            except Exception as e:  # the handler's bug must not become a gRPC UNKNOWN
                log.exception("%s: prepare failed", self.driver_name)
                failure = f"{type(e).__name__}: {e}"
        for claim in valid:
            result = answered.get(claim.uid)
            if failure:
                result = ClaimResult(
                    error=f"driver {self.driver_name}: preparing {_describe(claim)} failed: {failure}"
                )
            elif not isinstance(result, ClaimResult):
                result = ClaimResult(
                    error=f"driver {self.driver_name}: no result for {_describe(claim)} "
                    "(a driver bug); kubelet will retry"
                )
            results[claim.uid] = result
        extra = set(answered) - set(by_uid)
        if extra:
            log.warning(
                "%s: prepare answered %d claims not asked for", self.driver_name, len(extra)
            )
        log.info(
            "%s: %s NodePrepareResources: %d claims, %d failed",
            self.driver_name,
            version,
            len(results),
            sum(1 for r in results.values() if r.error),
        )
        return results

    async def _unprepare(self, claims: Sequence[ClaimRef], version: str) -> dict[str, str]:
        valid, invalid, by_uid = self._split(claims)
        errors: dict[str, str] = dict(invalid)
        answered: Mapping[str, str] = {}
        failure = ""
        if valid:
            try:
                answered = await self._call(
                    f"{version} NodeUnprepareResources", self.handler.unprepare(valid)
                )
            except Exception as e:
                log.exception("%s: unprepare failed", self.driver_name)
                failure = f"{type(e).__name__}: {e}"
        for claim in valid:
            error = answered.get(claim.uid)
            if failure:
                error = (
                    f"driver {self.driver_name}: unpreparing {_describe(claim)} failed: {failure}"
                )
            elif not isinstance(error, str):
                error = (
                    f"driver {self.driver_name}: no result for {_describe(claim)} "
                    "(a driver bug); kubelet will retry"
                )
            errors[claim.uid] = error
        extra = set(answered) - set(by_uid)
        if extra:
            log.warning(
                "%s: unprepare answered %d claims not asked for", self.driver_name, len(extra)
            )
        log.info(
            "%s: %s NodeUnprepareResources: %d claims, %d failed",
            self.driver_name,
            version,
            len(errors),
            sum(1 for e in errors.values() if e),
        )
        return errors
