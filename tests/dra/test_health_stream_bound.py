"""Health watchers cannot starve the kubelet's calls (issue 37 item 14): ``dra.sock``'s gRPC
server runs at most 64 calls at once, and every open ``NodeWatchResources`` stream is one of
them. Seventy streams opened with a real gRPC client on the real unix socket: the ones past
the streams' own bound are refused, and NodePrepareResources is still answered."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import grpc
import pytest

from tests.dra.conftest import DRIVER
from tests.dra.recording_handler import UID_A, RecordingHandler
from vfio_dp.dra._pb.dra.v1 import api_pb2 as dra_pb2
from vfio_dp.dra._pb.dra.v1 import api_pb2_grpc as dra_grpc
from vfio_dp.dra._pb.dra_health.v1 import api_pb2 as health_pb2
from vfio_dp.dra._pb.dra_health.v1 import api_pb2_grpc as health_grpc
from vfio_dp.dra.kubeletapi.health_stream import MAX_STREAMS, HealthStream
from vfio_dp.dra.kubeletapi.server import KubeletFrontEnd

WATCHERS = 70
#: a liveness guard for a loaded machine, never a performance target
GUARD = 30.0


@pytest.fixture
async def front(kdirs: tuple[str, str]) -> AsyncIterator[KubeletFrontEnd]:
    registry, plugins = kdirs
    stream = HealthStream("node-a", 30)
    stream.publish([])  # a list to send: an accepted stream answers at once
    f = KubeletFrontEnd(DRIVER, registry, plugins, RecordingHandler(), health=stream)
    await f.start()
    yield f
    await f.stop()


async def test_seventy_open_health_streams_leave_prepare_answered(front: KubeletFrontEnd) -> None:
    async with grpc.aio.insecure_channel("unix:" + front.service_socket) as channel:
        watch = health_grpc.DRAResourceHealthStub(channel)
        calls = [watch.NodeWatchResources(health_pb2.NodeWatchResourcesRequest())
                 for _ in range(WATCHERS)]  # fmt: skip

        async def first(call: grpc.aio.UnaryStreamCall) -> grpc.StatusCode:
            try:
                await asyncio.wait_for(call.read(), GUARD)
            except grpc.aio.AioRpcError as e:
                return e.code()
            return grpc.StatusCode.OK  # open and following: it stays open

        try:
            codes = await asyncio.gather(*(first(c) for c in calls))
            assert codes.count(grpc.StatusCode.OK) == MAX_STREAMS, codes
            assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}
            assert front.health is not None and front.health.streams == MAX_STREAMS
            stub = dra_grpc.DRAPluginStub(channel)
            claim = dra_pb2.Claim(namespace="default", uid=UID_A, name="a")
            answer = await stub.NodePrepareResources(
                dra_pb2.NodePrepareResourcesRequest(claims=[claim]), timeout=GUARD
            )
            assert answer.claims[UID_A].error == ""
            assert list(answer.claims[UID_A].devices)  # prepared
        finally:
            for c in calls:
                with contextlib.suppress(Exception):
                    c.cancel()
