"""A stand-in for the kubelet's PodResources API (test fixture, not the kubelet).

Serves ``v1.PodResourcesLister`` from the vendored official proto on a real unix socket, as
the kubelet does on ``/var/lib/kubelet/pod-resources/kubelet.sock``: ``List`` answers every
pod set in :attr:`pods` (the kubelet lists the active pods with their devices);
``GetAllocatableResources`` and ``Get`` answer ``UNIMPLEMENTED`` (nothing here asks them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc

from vfio_dp.deviceplugin._pb.podresources.v1 import api_pb2, api_pb2_grpc


@dataclass
class Pod:
    namespace: str
    name: str
    container: str
    resource: str
    device_ids: list[str]


class PodResourcesStandin(api_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    def __init__(self, socket: str) -> None:
        self.socket = socket
        self.pods: list[Pod] = []
        self.calls = 0
        self.server: Any = None

    async def start(self) -> None:
        self.server = grpc.aio.server()
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self, self.server)
        self.server.add_insecure_port("unix:" + self.socket)
        await self.server.start()

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(0)
            self.server = None

    async def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        return api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name=p.name,
                    namespace=p.namespace,
                    containers=[
                        api_pb2.ContainerResources(
                            name=p.container,
                            devices=[
                                api_pb2.ContainerDevices(
                                    resource_name=p.resource, device_ids=p.device_ids
                                )
                            ],
                        )
                    ],
                )
                for p in self.pods
            ]
        )
