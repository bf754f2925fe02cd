"""The ``v1beta1.DevicePlugin`` servicer: protobuf ↔ typed values, nothing else.

One instance per resource, on the resource's own socket
(``<kubelet dir>/vfio_dp-<resource with / as _>.sock``). Every decision is made by the
daemon core (:class:`Core`) on typed values from :mod:`vfio_dp.deviceplugin.allocation`; errors become gRPC
status codes whose message names the device and the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from vfio_dp.core.sockets import SocketServer
from vfio_dp.deviceplugin._pb.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from vfio_dp.deviceplugin.allocation import ContainerAllocation
from vfio_dp.deviceplugin.listing import Unit
from vfio_dp.deviceplugin.mdevs import MdevUnit
from vfio_dp.errors import DevicePluginError, PluginRequestError, UnknownDeviceError

if TYPE_CHECKING:
    from vfio_dp.core.metrics import Metrics

log = logging.getLogger("vfio_dp.deviceplugin")

OPTIONS = api_pb2.DevicePluginOptions(
    pre_start_required=True, get_preferred_allocation_available=True
)


#: what one resource lists: IOMMU-group units, or mdev instances (:mod:`vfio_dp.deviceplugin.mdevs`)
Units = tuple[Unit, ...] | tuple[MdevUnit, ...]


class Feed:
    """The latest device list of one resource and a way to wait for the next one."""

    def __init__(self) -> None:
        self.units: Units = ()
        self.version = 0
        self.closing = False
        self.changed = asyncio.Condition()

    async def publish(self, units: Units, *, closing: bool = False) -> None:
        async with self.changed:
            self.units = units
            self.closing = closing
            self.version += 1
            self.changed.notify_all()


class Core(Protocol):
    async def allocate(self, resource: str, ids: Sequence[str]) -> ContainerAllocation: ...

    def preferred(
        self, resource: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]: ...

    async def prestart(self, resource: str, ids: Sequence[str]) -> None: ...


def to_device(u: Unit | MdevUnit) -> Any:
    topology = (
        api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=n) for n in u.numa_nodes])
        if u.numa_nodes
        else None
    )
    return api_pb2.Device(ID=str(u.id), health=u.health, topology=topology)


def _status(e: DevicePluginError) -> grpc.StatusCode:
    if isinstance(e, UnknownDeviceError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(e, PluginRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT
    return grpc.StatusCode.FAILED_PRECONDITION


class DevicePluginServicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(
        self, resource: str, feed: Feed, core: Core, metrics: Metrics | None = None
    ) -> None:
        """``metrics``: where Allocate's latency goes (``vfio_dp_allocate_seconds``)."""
        self.resource = resource
        self.feed = feed
        self.core = core
        self.metrics = metrics

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return OPTIONS

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        feed = self.feed
        sent = [-1]  # a cell, read by the predicate
        log.info("%s: kubelet opened ListAndWatch", self.resource)
        while True:
            async with feed.changed:
                await feed.changed.wait_for(lambda: feed.version != sent[0])
                units, sent[0], closing = feed.units, feed.version, feed.closing
            yield api_pb2.ListAndWatchResponse(devices=[to_device(u) for u in units])
            if closing:
                return

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        responses = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=self.core.preferred(
                    self.resource,
                    list(r.available_deviceIDs),
                    list(r.must_include_deviceIDs),
                    r.allocation_size,
                )
            )
            for r in request.container_requests
        ]
        return api_pb2.PreferredAllocationResponse(container_responses=responses)

    async def Allocate(self, request: Any, context: Any) -> Any:
        timer = (
            self.metrics.time("vfio_dp_allocate_seconds", resource=self.resource)
            if self.metrics is not None
            else contextlib.nullcontext()
        )
        with timer:
            return await self._allocate(request, context)

    async def _allocate(self, request: Any, context: Any) -> Any:
        responses = []
        for creq in request.container_requests:
            try:
                alloc = await self.core.allocate(self.resource, list(creq.devices_ids))
            except DevicePluginError as e:
                await context.abort(_status(e), str(e))
            responses.append(
                api_pb2.ContainerAllocateResponse(
                    envs=alloc.envs,
                    devices=[
                        api_pb2.DeviceSpec(
                            container_path=d.container_path,
                            host_path=d.host_path,
                            permissions=d.permissions,
                        )
                        for d in alloc.devices
                    ],
                    annotations=alloc.annotations,
                    cdi_devices=[api_pb2.CDIDevice(name=n) for n in alloc.cdi_devices],
                )
            )
        return api_pb2.AllocateResponse(container_responses=responses)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        try:
            await self.core.prestart(self.resource, list(request.devices_ids))
        except DevicePluginError as e:
            await context.abort(_status(e), str(e))
        return api_pb2.PreStartContainerResponse()


def socket_server(
    resource: str, feed: Feed, core: Core, socket_path: str, metrics: Metrics | None = None
) -> SocketServer:
    """One resource's socket (``<kubelet-dir>/vfio_dp-<resource>.sock``) and the
    ``v1beta1.DevicePlugin`` server on it (not yet serving: :meth:`SocketServer.serve`)."""

    def add_services(server: Any) -> None:
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            DevicePluginServicer(resource, feed, core, metrics), server
        )

    return SocketServer(
        socket_path, "--kubelet-dir", grpc.aio.server, add_services, log=log, label=resource
    )


async def register(
    kubelet_socket: str, resource: str, endpoint: str, timeout: float = 20.0
) -> None:
    """Call ``/v1beta1.Registration/Register`` on ``kubelet_socket`` (the kubelet dials back
    inside it, so our server must already serve ``endpoint``); raises ``grpc.aio.AioRpcError``."""
    async with grpc.aio.insecure_channel("unix:" + kubelet_socket) as channel:
        stub = api_pb2_grpc.RegistrationStub(channel)
        await stub.Register(
            api_pb2.RegisterRequest(
                version="v1beta1", endpoint=endpoint, resource_name=resource, options=OPTIONS
            ),
            timeout=timeout,
            wait_for_ready=False,
        )
