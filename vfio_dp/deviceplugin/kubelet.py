"""The device plugin at the kubelet: one socket, gRPC server and registration per resource.

Serves ``<kubelet-dir>/vfio_dp-<resource, / as _>.sock`` (``--kubelet-dir``, a path as the
daemon sees it, NOT under ``--root``) and registers it by dialing
``<kubelet-dir>/kubelet.sock`` (``/v1beta1.Registration/Register``; the kubelet dials back
inside the call). Waits while ``kubelet.sock`` is absent and retries a failed ``Register``
with back-off (0.2 s doubling to 5 s).

A kubelet restart shows in the dir: our socket gone or replaced, or ``kubelet.sock``
re-created (a new inode) -> serve again and register again (:meth:`Endpoints.check`, run on
every change of the dir by the front-end's watch). While the dir shows no change since a
check that found all in order (:class:`~vfio_dp.core.sockets.DirWatch`), one ``stat`` of the
dir stands for the ``lstat`` of every socket.

What each server answers (ListAndWatch, Allocate, ...) is :mod:`vfio_dp.deviceplugin.servicer`'s
and the daemon's (:mod:`vfio_dp.deviceplugin.app`); this module only keeps them reachable.
"""

from __future__ import annotations

import asyncio
import logging
import os

from vfio_dp.core.metrics import Metrics
from vfio_dp.core.sockets import DirWatch
from vfio_dp.deviceplugin import servicer
from vfio_dp.host.files import FileId, file_id
from vfio_dp.model import naming

log = logging.getLogger("vfio_dp.deviceplugin")

KUBELET_SOCKET = "kubelet.sock"


#: seconds a resource's socket gives its running calls and streams when the plugin stops
#: (the DRA plugin's is the same: vfio_dp.dra.kubeletapi.server.STOP_GRACE)
STOP_GRACE = 3.0


class Endpoint:
    """One resource: its socket, its gRPC server, its device feed, its registration."""

    def __init__(
        self, resource: str, kubelet_dir: str, core: servicer.Core, metrics: Metrics
    ) -> None:
        self.resource = resource
        self.name = naming.socket_name(resource)
        self.path = os.path.join(kubelet_dir, self.name)
        self.feed = servicer.Feed()
        self.socket = servicer.socket_server(resource, self.feed, core, self.path, metrics)
        self.kubelet_id: FileId | None = None  # kubelet.sock we registered with
        self.registering: asyncio.Task[None] | None = None


class Endpoints:
    """Every resource's :class:`Endpoint` in ``kubelet_dir``, by resource name
    (``by_resource``); ``core`` answers their calls."""

    def __init__(self, kubelet_dir: str, core: servicer.Core, metrics: Metrics) -> None:
        self.kubelet_dir = kubelet_dir
        self.kubelet_socket = os.path.join(kubelet_dir, KUBELET_SOCKET)
        self.dir = DirWatch(kubelet_dir)
        self.by_resource: dict[str, Endpoint] = {}
        self._core = core
        self._metrics = metrics

    async def open(self, resource: str) -> Endpoint:
        """Serve ``resource``'s socket (raises :class:`~vfio_dp.errors.SocketPathError` when
        its path is unusable) and start registering it."""
        ep = Endpoint(resource, self.kubelet_dir, self._core, self._metrics)
        await ep.socket.serve()
        self._start_registering(ep)
        self.by_resource[resource] = ep
        return ep

    async def withdraw(self, resource: str) -> None:
        """A resource no longer configured: empty list sent, server stopped, socket removed."""
        ep = self.by_resource.pop(resource)
        if ep.registering:
            ep.registering.cancel()
        log.info("%s: no longer configured: empty list sent, socket %s removed", resource, ep.path)
        await self._close(ep)

    async def close_all(self) -> None:
        """At stop: every stream gets an empty list and ends, every socket is removed."""
        for ep in self.by_resource.values():
            if ep.registering:
                ep.registering.cancel()
        await asyncio.gather(
            *(self._close(ep) for ep in self.by_resource.values()), return_exceptions=True
        )
        self.by_resource.clear()

    async def _close(self, ep: Endpoint) -> None:
        await ep.feed.publish((), closing=True)
        # its ListAndWatch streams were just told to end: give them time to answer rather
        # than be cancelled (grpc logs a cancelled stream as a traceback; a loaded node took
        # more than a second). close() returns as soon as they are done.
        await ep.socket.close(STOP_GRACE)

    def _start_registering(self, ep: Endpoint) -> None:
        ep.registering = asyncio.create_task(self._register(ep), name=f"register {ep.name}")

    async def _register(self, ep: Endpoint) -> None:
        import grpc

        delay, waiting_logged = 0.2, False
        while True:
            kid = file_id(self.kubelet_socket)
            if kid is None:
                if not waiting_logged:
                    log.info("%s: waiting for %s", ep.resource, self.kubelet_socket)
                    waiting_logged = True
                await asyncio.sleep(0.1)
                continue
            try:
                await servicer.register(self.kubelet_socket, ep.resource, ep.name)
            except grpc.aio.AioRpcError as e:
                log.warning(
                    "%s: Register with %s failed (%s: %s); retrying in %.1fs",
                    ep.resource,
                    self.kubelet_socket,
                    e.code().name,
                    e.details(),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            ep.kubelet_id = kid
            self._metrics.inc("vfio_dp_kubelet_registrations_total", resource=ep.resource)
            log.info("%s: registered with the kubelet as %s", ep.resource, ep.name)
            return

    async def _reserve(self, ep: Endpoint, why: str) -> None:
        """Serve ``ep`` again and register again (a path that refuses the socket is logged
        once and tried again at the next check)."""
        if ep.registering:
            ep.registering.cancel()
        if await ep.socket.restore(why):
            self._start_registering(ep)
            await ep.feed.publish(ep.feed.units)

    async def check(self) -> bool:
        """On every change in the kubelet dir: a socket of ours removed or replaced, or a new
        ``kubelet.sock`` (kubelet restarted) -> serve and register again. False while
        something is left to retry (a registration under way, a socket that could not be
        served again)."""
        if self.dir.unchanged():
            return True
        before = self.dir.look()
        kid = file_id(self.kubelet_socket)
        steady = True
        for ep in list(self.by_resource.values()):
            what = ep.socket.changed()
            if what is not None:
                steady = False
                await self._reserve(ep, f"{ep.path} {what} (kubelet restart?)")
            elif (
                kid is not None
                and ep.kubelet_id is not None
                and kid != ep.kubelet_id
                and (ep.registering is None or ep.registering.done())
            ):
                steady = False
                await self._reserve(ep, f"{self.kubelet_socket} was re-created (kubelet restart)")
            elif ep.registering is not None and not ep.registering.done():
                steady = False  # its outcome is not in the dir: check again next time
        if steady and kid is not None:
            self.dir.settled(before)
        else:
            self.dir.forget()
        return steady
