"""A kubelet stand-in: behaves like the kubelet's device manager as documented (test fixture).

Named as such on purpose — it is not the kubelet, but it follows the kubelet's protocol:

- serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock`` (real gRPC, real unix socket);
- INSIDE ``Register`` it dials the plugin's socket ``<dir>/<endpoint>`` (10 s timeout,
  blocking) and calls ``GetDevicePluginOptions``; a failure fails the Register call;
- right after ``Register`` returns it opens ``ListAndWatch`` from a separate task and keeps it
  open; every response replaces the resource's whole device set; if the stream ends every
  device of the resource is marked unhealthy;
- calls ``GetPreferredAllocation`` (when the option is set) with one container request and
  reads ``container_responses[0].deviceIDs``; ``Allocate`` with exactly one container request
  and reads ``container_responses[0]``; ``PreStartContainer`` (when ``pre_start_required``);
- :meth:`restart` wipes every socket file in the dir (the checkpoint file stays) and serves a
  fresh ``kubelet.sock``, as a starting kubelet does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from vfio_dp.deviceplugin._pb.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc

CHECKPOINT = "kubelet_internal_checkpoint"


@dataclass
class PluginView:
    """What the stand-in knows about one registered resource."""

    resource: str
    endpoint: str
    options: Any
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health
    topology: dict[str, list[int]] = field(default_factory=dict)
    updates: int = 0
    stream_open: bool = False
    channel: Any = None
    stub: Any = None
    task: asyncio.Task[None] | None = None


class KubeletStandin(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.socket = os.path.join(directory, "kubelet.sock")
        self.plugins: dict[str, PluginView] = {}
        self.registrations: list[str] = []
        self.server: Any = None
        self.changed = asyncio.Condition()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        with open(os.path.join(self.dir, CHECKPOINT), "a"):
            pass
        self.server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port("unix:" + self.socket)
        await self.server.start()

    async def stop(self) -> None:
        for view in self.plugins.values():
            await self._drop(view)
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    async def restart(self) -> None:
        """Stop, wipe every socket in the dir (not the checkpoint), start again."""
        await self.stop()
        for name in os.listdir(self.dir):
            path = os.path.join(self.dir, name)
            if name != CHECKPOINT:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self.plugins.clear()
        await self.start()

    async def _drop(self, view: PluginView) -> None:
        if view.task:
            view.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await view.task
        if view.channel is not None:
            await view.channel.close()

    # -- Registration ------------------------------------------------------------------
    async def Register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "unsupported version")
        if "/" not in request.resource_name or request.resource_name.split("/")[0].endswith(
            "kubernetes.io"
        ):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "invalid resource name")
        channel = grpc.aio.insecure_channel("unix:" + os.path.join(self.dir, request.endpoint))
        stub = api_pb2_grpc.DevicePluginStub(channel)
        try:  # the kubelet dials back inside Register, blocking, 10 s
            options = await stub.GetDevicePluginOptions(
                api_pb2.Empty(), timeout=10, wait_for_ready=True
            )
        except grpc.aio.AioRpcError as e:
            await channel.close()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"dial back failed: {e.details()}")
        old = self.plugins.get(request.resource_name)
        if old is not None:
            await self._drop(old)
        view = PluginView(
            request.resource_name, request.endpoint, options, channel=channel, stub=stub
        )
        self.plugins[request.resource_name] = view
        self.registrations.append(request.resource_name)
        view.task = asyncio.create_task(self._list_and_watch(view))
        return api_pb2.Empty()

    async def _list_and_watch(self, view: PluginView) -> None:
        try:
            stream = view.stub.ListAndWatch(api_pb2.Empty())
            view.stream_open = True
            async for resp in stream:
                async with self.changed:
                    view.devices = {d.ID: d.health for d in resp.devices}
                    view.topology = {
                        d.ID: [n.ID for n in d.topology.nodes]
                        for d in resp.devices
                        if d.HasField("topology")
                    }
                    view.updates += 1
                    self.changed.notify_all()
        except grpc.aio.AioRpcError:
            pass
        finally:  # stream ended: the kubelet marks every device unhealthy
            view.stream_open = False
            async with self.changed:
                view.devices = dict.fromkeys(view.devices, "Unhealthy")
                view.updates += 1
                self.changed.notify_all()

    # -- what tests wait for -----------------------------------------------------------
    async def wait_for(
        self, what: str, predicate: Callable[[KubeletStandin], bool], timeout: float = 5.0
    ) -> float:
        """Wait until ``predicate(self)`` holds; return the seconds it took; fail clearly."""
        start = time.monotonic()

        async def waiter() -> None:
            async with self.changed:
                await self.changed.wait_for(lambda: predicate(self))

        async def ticker() -> None:  # registrations are not notified; re-check periodically
            while True:
                await asyncio.sleep(0.05)  # the poll period of the re-check
                async with self.changed:
                    self.changed.notify_all()

        tick = asyncio.create_task(ticker())
        try:
            await asyncio.wait_for(waiter(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"kubelet stand-in: timed out after {timeout}s waiting for {what}; "
                f"state: { {r: v.devices for r, v in self.plugins.items()} }"
            ) from None
        finally:
            tick.cancel()
        return time.monotonic() - start

    def devices(self, resource: str) -> dict[str, str]:
        view = self.plugins.get(resource)
        return dict(view.devices) if view else {}

    # -- calls like the kubelet's --------------------------------------------------------
    def _stub(self, resource: str) -> Any:
        return self.plugins[resource].stub

    async def preferred(
        self, resource: str, available: list[str], must: list[str], size: int
    ) -> list[str]:
        assert self.plugins[resource].options.get_preferred_allocation_available
        resp = await self._stub(resource).GetPreferredAllocation(
            api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available,
                        must_include_deviceIDs=must,
                        allocation_size=size,
                    )
                ]
            )
        )
        return list(resp.container_responses[0].deviceIDs)

    async def allocate(self, resource: str, ids: list[str]) -> Any:
        resp = await self._stub(resource).Allocate(
            api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            )
        )
        return resp.container_responses[0]

    async def prestart(self, resource: str, ids: list[str]) -> None:
        if self.plugins[resource].options.pre_start_required:
            await self._stub(resource).PreStartContainer(
                api_pb2.PreStartContainerRequest(devices_ids=ids), timeout=30
            )
