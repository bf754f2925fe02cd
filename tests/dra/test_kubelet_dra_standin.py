"""The kubelet DRA stand-in itself: it wipes slices when kubelet would, and refuses
registrations kubelet refuses (so a plugin that gets GetInfo wrong fails the tests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from tests.dra.apiserver_standin import SLICES, ApiServerStandin
from tests.dra.conftest import DRIVER, NODE, a_slice
from tests.dra.kubelet_dra_standin import DraPluginView, KubeletDraStandin
from tests.dra.recording_handler import RecordingHandler
from tests.waiting import wait_until_async
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2 as reg_pb2
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vfio_dp.dra.kubeletapi.server import KubeletFrontEnd


def slice_names(api: ApiServerStandin) -> list[str]:
    return sorted(s["metadata"]["name"] for s in api.objects(SLICES))


async def test_at_start_it_deletes_every_slice_of_its_node(
    apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    apiserver.seed(SLICES, a_slice("mine"))
    apiserver.seed(SLICES, a_slice("other-driver-same-node", driver="gpu.example.com"))
    apiserver.seed(SLICES, a_slice("other-node", node="node-b"))
    k = KubeletDraStandin(kdirs[0], NODE, api_client=apiserver.client())
    await k.start()
    try:
        assert slice_names(apiserver) == ["other-node"]
        assert k.wipes == [f"spec.nodeName={NODE}"]
    finally:
        await k.stop()


class FakeRegistration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    """A plugin's registration socket answering whatever PluginInfo a test gives it."""

    def __init__(self, info: Any) -> None:
        self.info = info
        self.statuses: list[tuple[bool, str]] = []

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return self.info

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.statuses.append((request.plugin_registered, request.error))
        return reg_pb2.RegistrationStatusResponse()


@pytest.fixture
async def kubelet(kdirs: tuple[str, str]) -> AsyncIterator[KubeletDraStandin]:
    k = KubeletDraStandin(kdirs[0], NODE, poll=0.02)
    await k.start()
    yield k
    await k.stop()


@pytest.mark.parametrize(
    ("info", "why"),
    [
        (
            dict(type="CSIPlugin"),
            "RegisterPlugin error -- no handler registered for plugin type: CSIPlugin at socket",
        ),
        (dict(supported_versions=[]), "empty list of supported gRPC services"),
        (
            dict(supported_versions=["v1alpha4.DRAPlugin"]),
            "none of services supported by the plugin (['v1alpha4.DRAPlugin'])",
        ),
        (dict(supported_versions=["v1", "v1beta1"]), "none of services supported"),
    ],
)
async def test_it_refuses_what_kubelet_refuses_and_says_so(
    kubelet: KubeletDraStandin, kdirs: tuple[str, str], info: dict[str, Any], why: str
) -> None:
    fields: dict[str, Any] = dict(
        type="DRAPlugin",
        name=DRIVER,
        endpoint="/nonexistent/dra.sock",
        supported_versions=["v1.DRAPlugin", "v1beta1.DRAPlugin"],
    )
    fields.update(info)
    plugin = FakeRegistration(reg_pb2.PluginInfo(**fields))
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{kdirs[0]}/{DRIVER}-reg.sock")
    await server.start()
    try:
        await kubelet.wait_for("an attempt", lambda k: bool(k.attempts) and bool(plugin.statuses))
        assert kubelet.plugins == {}
        assert why in kubelet.attempts[0].error
        assert plugin.statuses == [(False, kubelet.attempts[0].error)]
    finally:
        await server.stop(0)


async def test_it_takes_the_first_supported_version_in_the_plugins_order(
    kubelet: KubeletDraStandin, kdirs: tuple[str, str]
) -> None:
    plugin = FakeRegistration(
        reg_pb2.PluginInfo(
            type="DRAPlugin",
            name=DRIVER,
            endpoint="/x/dra.sock",
            supported_versions=["v1beta1.DRAPlugin", "v1.DRAPlugin"],
        )
    )
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{kdirs[0]}/{DRIVER}-reg.sock")
    await server.start()
    try:
        # the plugin hears of it after kubelet took it: wait for both, not the first only
        await kubelet.wait_for(
            "registration, told", lambda k: DRIVER in k.plugins and bool(plugin.statuses)
        )
        assert kubelet.plugins[DRIVER].version == "v1beta1.DRAPlugin"
        assert plugin.statuses == [(True, "")]
    finally:
        await server.stop(0)


class SlowToHear(FakeRegistration):
    """A plugin whose NotifyRegistrationStatus answers only when the test says so."""

    def __init__(self, info: Any) -> None:
        super().__init__(info)
        self.release = asyncio.Event()

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        await self.release.wait()
        return await super().NotifyRegistrationStatus(request, context)


async def test_a_registered_driver_has_its_accepted_attempt_before_the_plugin_is_told(
    kubelet: KubeletDraStandin, kdirs: tuple[str, str]
) -> None:
    """kubelet accepts, then tells the plugin: whoever sees the driver registered finds its
    accepted attempt at once, however long the plugin takes to answer the notification."""
    plugin = SlowToHear(
        reg_pb2.PluginInfo(
            type="DRAPlugin", name=DRIVER, endpoint="/x/dra.sock",
            supported_versions=["v1.DRAPlugin"],
        )
    )  # fmt: skip
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix:{kdirs[0]}/{DRIVER}-reg.sock")
    await server.start()
    try:
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
        assert [a.accepted for a in kubelet.attempts] == [True]
        assert plugin.statuses == []  # still unanswered
        plugin.release.set()
        await kubelet.wait_for("the plugin told", lambda _k: bool(plugin.statuses))
        assert plugin.statuses == [(True, "")]
    finally:
        plugin.release.set()
        await server.stop(0)


async def test_slices_go_after_the_grace_without_the_driver_and_stay_if_it_returns(
    apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    registry, plugins = kdirs
    grace = 2.0
    k = KubeletDraStandin(
        registry, NODE, api_client=apiserver.client(), wipe_grace=grace, poll=0.02
    )
    await k.start()
    front = KubeletFrontEnd(DRIVER, registry, plugins, RecordingHandler())
    try:
        await front.start()
        await k.wait_for("registration", lambda k: k.usable(DRIVER))
        apiserver.seed(SLICES, a_slice("mine"))
        apiserver.seed(SLICES, a_slice("theirs", driver="gpu.example.com"))

        # a restart within the grace: the wipe is called off, nothing is deleted
        await front.stop()
        await k.wait_for("deregistration", lambda k: DRIVER not in k.plugins)
        await front.start()
        await k.wait_for("re-registration", lambda k: k.usable(DRIVER))
        events = [what for _, what in k.events]
        wiping = f"{DRIVER}: not usable, wipe in {grace} s"
        assert events.index(wiping) < events.index(f"{DRIVER}: usable again, wipe cancelled")
        assert slice_names(apiserver) == ["mine", "theirs"], k.events

        # gone for longer than the grace: only this driver's slices on this node go
        await front.stop()
        await k.wait_for("deregistration", lambda k: DRIVER not in k.plugins)
        assert k.events[-1][1] == wiping
        assert slice_names(apiserver) == ["mine", "theirs"]  # not at once
        await k.wait_for("wipe", lambda k: len(k.wipes) == 2, timeout=grace + 10)
        assert k.wipes[-1] == f"spec.nodeName={NODE},spec.driver={DRIVER}"
        assert slice_names(apiserver) == ["theirs"]
        # not before the grace (a lower bound only: a loaded machine can but be later)
        gone_at = max(t for t, what in k.events if what == wiping)
        (wiped_at,) = [
            t for t, what in k.events if what.startswith(f"wiping spec.nodeName={NODE},")
        ]
        assert wiped_at - gone_at >= grace, k.events
    finally:
        await front.stop()
        await k.stop()


async def test_a_restarted_kubelet_finds_the_socket_again(
    kdirs: tuple[str, str], kubelet: KubeletDraStandin
) -> None:
    registry, plugins = kdirs
    front = KubeletFrontEnd(DRIVER, registry, plugins, RecordingHandler())
    await front.start()
    try:
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
        await kubelet.restart()
        await kubelet.wait_for("registration after restart", lambda k: k.usable(DRIVER))
        assert len(kubelet.attempts) == 2
        answer = await kubelet.prepare(DRIVER, [("d", "u-1", "c")])
        assert answer["u-1"].error == ""
    finally:
        await front.stop()


async def serve_registration(path: str, info: Any) -> tuple[FakeRegistration, Any]:
    plugin = FakeRegistration(info)
    server = grpc.aio.server()
    reg_grpc.add_RegistrationServicer_to_server(plugin, server)
    server.add_insecure_port("unix:" + path)
    await server.start()
    return plugin, server


async def test_an_empty_endpoint_means_the_registration_socket_itself(
    kubelet: KubeletDraStandin, kdirs: tuple[str, str]
) -> None:
    path = f"{kdirs[0]}/{DRIVER}-reg.sock"
    info = reg_pb2.PluginInfo(type="DRAPlugin", name=DRIVER, supported_versions=["v1.DRAPlugin"])
    plugin, server = await serve_registration(path, info)
    try:
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
        assert kubelet.plugins[DRIVER].endpoint == path
        # the stand-in, as kubelet, accepts first and then tells the plugin: wait for the call
        await wait_until_async(lambda: plugin.statuses, what="NotifyRegistrationStatus")
        assert plugin.statuses == [(True, "")]
    finally:
        await server.stop(0)


async def test_a_second_instance_may_not_take_over_an_endpoint(
    kubelet: KubeletDraStandin, kdirs: tuple[str, str]
) -> None:
    info = reg_pb2.PluginInfo(
        type="DRAPlugin", name=DRIVER, endpoint="/x/dra.sock", supported_versions=["v1.DRAPlugin"]
    )
    first, s1 = await serve_registration(f"{kdirs[0]}/a-reg.sock", info)
    second, s2 = await serve_registration(f"{kdirs[0]}/b-reg.sock", info)
    try:
        await kubelet.wait_for("two attempts", lambda k: first.statuses and second.statuses)
        outcomes = sorted([first.statuses[0][0], second.statuses[0][0]])
        assert outcomes == [False, True]
        refused = first.statuses[0] if not first.statuses[0][0] else second.statuses[0]
        assert "endpoint /x/dra.sock already registered for DRA driver plugin" in refused[1]
    finally:
        await s1.stop(0)
        await s2.stop(0)


async def test_a_registered_driver_whose_service_socket_is_gone_loses_its_slices(
    apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    registry, plugins = kdirs
    k = KubeletDraStandin(registry, NODE, api_client=apiserver.client(), wipe_grace=0.5, poll=0.02)
    await k.start()
    front = KubeletFrontEnd(DRIVER, registry, plugins, RecordingHandler())
    try:
        await front.start()
        await k.wait_for("connected", lambda k: k.usable(DRIVER))
        apiserver.seed(SLICES, a_slice("mine"))
        await front._service.close()  # the DRAPlugin server dies, registration stays
        await k.wait_for("disconnected", lambda k: not k.usable(DRIVER), timeout=5)
        assert DRIVER in k.plugins  # still registered
        await k.wait_for("wipe", lambda k: len(k.wipes) == 2, timeout=5)
        assert slice_names(apiserver) == []
    finally:
        await front.stop()
        await k.stop()


async def test_a_stop_that_meets_the_watcher_closing_a_view_ends_the_watcher() -> None:
    """stop() cancels the registry watcher; when the watcher is itself waiting for a view's
    health task to end (the plugin's socket went: the view is closed), that cancel must end
    the watcher, or stop() waits for it for ever (a ``suppress(CancelledError)`` around the
    wait swallowed it: a fresh-clone run hung in test_dra_health's teardown)."""
    ending = asyncio.Event()

    async def slow_to_end() -> None:  # as a gRPC stream, which takes turns to end
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await ending.wait()
            raise

    view = DraPluginView(DRIVER, "/x/reg.sock", (0, 0, 0), "/x/dra.sock", "v1.DRAPlugin")
    view.health_task = asyncio.create_task(slow_to_end())
    await asyncio.sleep(0)
    closing = asyncio.create_task(KubeletDraStandin._close(view))  # the watcher's part
    await asyncio.sleep(0)  # it waits for the health task now
    closing.cancel()  # stop() cancels the watcher
    await asyncio.sleep(0)
    ending.set()
    await asyncio.wait({closing}, timeout=30)
    assert closing.cancelled()
