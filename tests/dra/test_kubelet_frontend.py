"""``vfio_dp.dra.kubeletapi.server``: registration and DRAPlugin v1/v1beta1 over real unix sockets, called
by the kubelet DRA stand-in (a real gRPC client from the vendored protos) and by raw stubs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable

import grpc
import pytest

from tests.dra.conftest import DRIVER, NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.recording_handler import UID_A, UID_B, RecordingHandler
from tests.waiting import wait_until_async
from vfio_dp.dra._pb.dra.v1 import api_pb2 as v1_pb2
from vfio_dp.dra._pb.dra.v1 import api_pb2_grpc as v1_grpc
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2 as reg_pb2
from vfio_dp.dra._pb.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from vfio_dp.dra.kubeletapi.server import (
    MAX_ECHO,
    STOP_GRACE,
    KubeletFrontEnd,
)
from vfio_dp.errors import DriverNameError, SocketPathError


@pytest.fixture
def handler() -> RecordingHandler:
    return RecordingHandler()


@pytest.fixture
async def front(
    kdirs: tuple[str, str], handler: RecordingHandler
) -> AsyncIterator[KubeletFrontEnd]:
    registry, plugins = kdirs
    f = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    await f.start()
    yield f
    await f.stop()


@pytest.fixture
async def kubelet(kdirs: tuple[str, str]) -> AsyncIterator[KubeletDraStandin]:
    k = KubeletDraStandin(kdirs[0], NODE, poll=0.02)
    await k.start()
    yield k
    await k.stop()


def registered(driver: str = DRIVER) -> Callable[[KubeletDraStandin], bool]:
    """Registered and connected (kubelet's "usable")."""
    return lambda k: k.usable(driver)


async def test_sockets_paths_and_get_info_are_what_kubelet_expects(
    front: KubeletFrontEnd, kdirs: tuple[str, str]
) -> None:
    registry, plugins = kdirs
    assert front.service_socket == f"{plugins}/{DRIVER}/dra.sock"
    assert front.registration_socket == f"{registry}/{DRIVER}-reg.sock"
    async with grpc.aio.insecure_channel("unix:" + front.registration_socket) as ch:
        info = await reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=5)
    assert info.type == "DRAPlugin"
    assert info.name == DRIVER
    assert info.endpoint == front.service_socket
    assert list(info.supported_versions) == ["v1.DRAPlugin", "v1beta1.DRAPlugin"]


async def test_kubelet_standin_registers_with_v1_and_prepares(
    front: KubeletFrontEnd, kubelet: KubeletDraStandin, handler: RecordingHandler
) -> None:
    await kubelet.wait_for("registration", registered())
    assert kubelet.plugins[DRIVER].version == "v1.DRAPlugin"
    assert [a.socket for a in kubelet.attempts] == [f"{DRIVER}-reg.sock"]
    assert front.registered and front.registration_error == ""

    answer = await kubelet.prepare(DRIVER, [("default", UID_A, "vm-gpu"), ("default", UID_B, "b")])
    assert set(answer) == {UID_A, UID_B}
    dev = answer[UID_A].devices[0]
    assert (list(dev.request_names), dev.pool_name, dev.device_name) == (
        ["gpu"],
        NODE,
        "pci-0000-3b-00-0",
    )
    assert list(dev.cdi_device_ids) == [f"{DRIVER}/pci=g0f1e2d3c"]
    assert not dev.HasField("share_id")
    assert answer[UID_A].error == ""
    assert handler.calls == [("prepare", [UID_A, UID_B])]

    errors = await kubelet.unprepare(DRIVER, [("default", UID_A, "vm-gpu")])
    assert errors == {UID_A: ""}
    assert set(handler.prepared) == {UID_B}


async def test_an_older_kubelet_gets_the_same_handler_over_v1beta1(
    front: KubeletFrontEnd, kdirs: tuple[str, str], handler: RecordingHandler
) -> None:
    k = KubeletDraStandin(kdirs[0], NODE, poll=0.02, versions=("v1beta1.DRAPlugin",))
    await k.start()
    try:
        await k.wait_for("registration", registered())
        assert k.plugins[DRIVER].version == "v1beta1.DRAPlugin"
        answer = await k.prepare(DRIVER, [("ns1", UID_A, "c")])
        assert answer[UID_A].devices[0].device_name == "pci-0000-3b-00-0"
        assert await k.unprepare(DRIVER, [("ns1", UID_A, "c")]) == {UID_A: ""}
        assert [c[0] for c in handler.calls] == ["prepare", "unprepare"]
    finally:
        await k.stop()


async def test_a_kubelet_that_speaks_neither_version_refuses_and_the_plugin_knows(
    front: KubeletFrontEnd, kdirs: tuple[str, str]
) -> None:
    k = KubeletDraStandin(kdirs[0], NODE, poll=0.02, versions=("v1alpha4.DRAPlugin",))
    await k.start()
    try:
        await k.wait_for("a refused attempt", lambda k: any(a.error for a in k.attempts))
        await wait_until_async(
            lambda: front.registration_error, what="the plugin told of the refusal"
        )
        assert not front.registered
        assert "none of services supported by the plugin" in front.registration_error
    finally:
        await k.stop()


async def test_a_claim_the_handler_leaves_out_gets_an_error_not_a_missing_key(
    front: KubeletFrontEnd, kubelet: KubeletDraStandin, handler: RecordingHandler
) -> None:
    await kubelet.wait_for("registration", registered())
    handler.omit = {UID_B}
    answer = await kubelet.prepare(DRIVER, [("default", UID_A, "a"), ("default", UID_B, "b")])
    assert answer[UID_A].error == ""
    assert "no result for claim 'default'/'b'" in answer[UID_B].error
    assert not answer[UID_B].devices
    errors = await kubelet.unprepare(DRIVER, [("default", UID_A, "a"), ("default", UID_B, "b")])
    assert errors[UID_A] == "" and "no result" in errors[UID_B]


async def test_a_handler_exception_is_a_per_claim_error_not_grpc_unknown(
    front: KubeletFrontEnd,
    kubelet: KubeletDraStandin,
    handler: RecordingHandler,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await kubelet.wait_for("registration", registered())
    handler.fail_with = RuntimeError("sysfs write failed: EBUSY")
    with caplog.at_level(logging.ERROR, logger="vfio_dp.dra"):
        answer = await kubelet.prepare(DRIVER, [("default", UID_A, "a"), ("default", UID_B, "b")])
    for uid in (UID_A, UID_B):
        assert "RuntimeError: sysfs write failed: EBUSY" in answer[uid].error
        assert "Traceback" not in answer[uid].error
    assert "prepare failed" in caplog.text  # the traceback goes to the log, not to kubelet
    errors = await kubelet.unprepare(DRIVER, [("default", UID_A, "a")])
    assert "RuntimeError" in errors[UID_A]


async def test_hostile_claim_identities_never_reach_the_handler_and_are_clipped(
    front: KubeletFrontEnd, kubelet: KubeletDraStandin, handler: RecordingHandler
) -> None:
    await kubelet.wait_for("registration", registered())
    long_uid = "u" * 100_000
    claims = [
        ("../../etc", UID_A, "x"),  # namespace not a DNS label
        ("default", long_uid, "x"),  # uid far too long
        ("default", UID_B, "a/../b"),  # name not a DNS subdomain
        ("default", "", "x"),  # no uid
        ("default", "22222222-2222-2222-2222-222222222222", "fine"),
    ]
    answer = await kubelet.prepare(DRIVER, claims)
    assert set(answer) == {c[1] for c in claims}
    assert "namespace is not a DNS label" in answer[UID_A].error
    assert "name is not a DNS subdomain" in answer[UID_B].error
    assert "uid is empty" in answer[""].error
    assert "not a Kubernetes UID" in answer[long_uid].error
    assert len(answer[long_uid].error) < 400  # the 100 kB uid is not echoed back
    assert "(100000 characters)" in answer[long_uid].error
    assert answer["22222222-2222-2222-2222-222222222222"].error == ""
    assert handler.calls == [("prepare", ["22222222-2222-2222-2222-222222222222"])]
    assert MAX_ECHO < 400


async def test_a_request_larger_than_the_bound_is_refused(
    front: KubeletFrontEnd, handler: RecordingHandler
) -> None:
    async with grpc.aio.insecure_channel("unix:" + front.service_socket) as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        big = v1_pb2.NodePrepareResourcesRequest(
            claims=[v1_pb2.Claim(namespace="d", uid=f"u{i}", name="n" * 200) for i in range(10_000)]
        )
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.NodePrepareResources(big, timeout=10)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert handler.calls == []


async def test_a_cancelled_call_lets_the_handler_finish(
    front: KubeletFrontEnd, handler: RecordingHandler
) -> None:
    handler.gate = asyncio.Event()  # the handler works until the test says (a slow bind)
    async with grpc.aio.insecure_channel("unix:" + front.service_socket) as ch:
        stub = v1_grpc.DRAPluginStub(ch)
        req = v1_pb2.NodePrepareResourcesRequest(
            claims=[v1_pb2.Claim(namespace="d", uid=UID_A, name="a")]
        )
        # a deadline the call surely reaches the handler within (a 0.1 s one could pass
        # before the server took the call on a loaded machine: no handler to wait for)
        call = asyncio.ensure_future(stub.NodePrepareResources(req, timeout=2.0))
        await wait_until_async(lambda: handler.calls, what="the handler running the call")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await call
        assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert handler.finished == []  # the deadline passed while the handler was working
    handler.gate.set()
    await wait_until_async(lambda: handler.finished, what="the handler to finish its call")
    assert handler.finished == ["prepare"]  # the bind was not abandoned half-way
    assert UID_A in handler.prepared


async def test_duplicate_claims_in_one_request_are_prepared_once(
    front: KubeletFrontEnd, handler: RecordingHandler
) -> None:
    async with grpc.aio.insecure_channel("unix:" + front.service_socket) as ch:
        req = v1_pb2.NodePrepareResourcesRequest(
            claims=[v1_pb2.Claim(namespace="d", uid=UID_A, name="a")] * 3
        )
        resp = await v1_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=5)
    assert list(resp.claims) == [UID_A]
    assert handler.calls == [("prepare", [UID_A])]


# -- socket lifecycle ------------------------------------------------------------------------
def _stale_socket(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.close()  # the file stays: a socket nobody serves, as after a crash


async def test_stale_sockets_at_start_are_replaced(
    kdirs: tuple[str, str], handler: RecordingHandler, kubelet: KubeletDraStandin
) -> None:
    registry, plugins = kdirs
    f = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    _stale_socket(f.service_socket)
    _stale_socket(f.registration_socket)
    await f.start()
    try:
        await kubelet.wait_for("registration", registered())
        answer = await kubelet.prepare(DRIVER, [("d", UID_A, "a")])
        assert answer[UID_A].error == ""
    finally:
        await f.stop()
    assert not os.path.exists(f.service_socket)
    assert not os.path.exists(f.registration_socket)


@pytest.mark.parametrize("which", ["service", "registration"])
@pytest.mark.parametrize("what", ["directory", "file"])
async def test_a_socket_path_that_is_not_a_socket_is_a_clear_error(
    kdirs: tuple[str, str], handler: RecordingHandler, which: str, what: str
) -> None:
    registry, plugins = kdirs
    f = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    path = f.service_socket if which == "service" else f.registration_socket
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if what == "directory":
        os.makedirs(path)
    else:
        with open(path, "w") as fh:
            fh.write("keep me")
    with pytest.raises(SocketPathError) as e:
        await f.start()
    msg = str(e.value)
    assert path in msg and f"rm -r {path}" in msg
    assert ("a directory" if what == "directory" else "a regular file") in msg
    # nothing was destroyed, and nothing is left serving
    if what == "directory":
        assert os.path.isdir(path)
    else:
        with open(path) as fh:
            assert fh.read() == "keep me"
    assert not os.path.exists(f.service_socket) or which == "service"
    assert not os.path.exists(f.registration_socket) or which == "registration"


@pytest.mark.parametrize("target", ["absolute", "relative"])
async def test_a_symlinked_driver_directory_is_refused(
    kdirs: tuple[str, str], handler: RecordingHandler, target: str
) -> None:
    """``<plugins>/<driver>`` is the plugin's own directory: a link elsewhere is refused and
    nothing is created where it points (issue 20 item 5)."""
    registry, plugins = kdirs
    elsewhere = os.path.join(os.path.dirname(plugins), "elsewhere")
    os.mkdir(elsewhere)
    link = os.path.join(plugins, DRIVER)
    os.symlink(elsewhere if target == "absolute" else "../elsewhere", link)
    f = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    with pytest.raises(SocketPathError) as e:
        await f.start()
    assert link in str(e.value) and "is a symlink" in str(e.value)
    assert "remove the link" in str(e.value)
    assert os.listdir(elsewhere) == []
    assert not os.path.exists(f.registration_socket)


async def test_a_path_too_long_for_a_unix_socket_is_a_clear_error(
    handler: RecordingHandler,
) -> None:
    deep = "/tmp/" + "d" * 120
    f = KubeletFrontEnd(DRIVER, deep + "/reg", deep + "/plugins", handler)
    with pytest.raises(SocketPathError, match="unix sockets allow 107"):
        await f.start()
    assert not os.path.exists(deep)


@pytest.mark.parametrize(
    "name",
    ["", "Vfio.Example.com", "vfio_example.com", "-vfio.example.com", "a" * 60 + ".com", "x" * 254],
)
def test_the_driver_name_must_be_a_dns_subdomain(name: str, handler: RecordingHandler) -> None:
    with pytest.raises(DriverNameError) as e:
        KubeletFrontEnd(name, "/tmp/r", "/tmp/p", handler)
    assert "lowercase DNS subdomain" in str(e.value)


def test_a_driver_name_of_63_characters_is_fine(handler: RecordingHandler) -> None:
    name = "d" * 55 + ".example"  # 63 characters; one more is refused (the test above)
    f = KubeletFrontEnd(name, "/tmp/r", "/tmp/p", handler)
    assert f.registration_socket == f"/tmp/r/{name}-reg.sock"
    assert f.service_socket == f"/tmp/p/{name}/dra.sock"


async def test_stop_waits_for_a_running_call(
    front: KubeletFrontEnd, handler: RecordingHandler
) -> None:
    handler.delay = STOP_GRACE + 0.7  # longer than the server's stop grace: the RPC is cancelled
    async with grpc.aio.insecure_channel("unix:" + front.service_socket) as ch:
        req = v1_pb2.NodePrepareResourcesRequest(
            claims=[v1_pb2.Claim(namespace="d", uid=UID_A, name="a")]
        )
        call = asyncio.ensure_future(v1_grpc.DRAPluginStub(ch).NodePrepareResources(req, timeout=5))
        await wait_until_async(lambda: handler.calls, what="the handler running the call")
        await front.stop()
        assert handler.finished == ["prepare"]
        with contextlib.suppress(grpc.aio.AioRpcError):
            await call


async def test_a_removed_service_socket_is_recreated_and_serves(
    front: KubeletFrontEnd, kubelet: KubeletDraStandin
) -> None:
    await kubelet.wait_for("registration", registered())
    os.unlink(front.service_socket)
    await front.check()
    assert os.path.exists(front.service_socket)
    # The kubelet's channel redials the new socket (after its reconnect backoff). Its
    # connection to the old server may still read READY for a moment after that server
    # stopped, so a call can meet the closing stream: the kubelet fails that pod sync with
    # UNAVAILABLE and calls again at the next one, as this does.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 15
    while True:
        await kubelet.wait_for("reconnected", lambda k: k.usable(DRIVER), timeout=15)
        try:
            answer = await kubelet.prepare(DRIVER, [("d", UID_A, "a")])
            break
        except grpc.aio.AioRpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or loop.time() > deadline:
                raise
            await asyncio.sleep(0.2)
    assert answer[UID_A].error == ""


async def test_a_replaced_registration_socket_is_recreated_and_kubelet_registers_again(
    front: KubeletFrontEnd, kubelet: KubeletDraStandin
) -> None:
    await kubelet.wait_for("registration", registered())
    os.unlink(front.registration_socket)
    _stale_socket(front.registration_socket)  # someone else's socket at our path
    await front.check()
    assert not front.registered  # until kubelet registers the new socket
    await kubelet.wait_for(
        "second registration", lambda k: len(k.attempts) >= 2 and front.registered
    )
    assert kubelet.attempts[-1].accepted


async def test_check_leaves_sockets_alone_while_they_are_ours(front: KubeletFrontEnd) -> None:
    before = (os.stat(front.service_socket).st_ino, os.stat(front.registration_socket).st_ino)
    for _ in range(3):
        await front.check()
    after = (os.stat(front.service_socket).st_ino, os.stat(front.registration_socket).st_ino)
    assert before == after


async def test_check_logs_a_path_it_cannot_recreate_once_and_keeps_trying(
    front: KubeletFrontEnd, caplog: pytest.LogCaptureFixture
) -> None:
    os.unlink(front.service_socket)
    os.makedirs(front.service_socket)
    with caplog.at_level(logging.ERROR, logger="vfio_dp.dra"):
        await front.check()
        await front.check()
    assert caplog.text.count("it is a directory") == 1
    os.rmdir(front.service_socket)
    await front.check()
    assert os.path.exists(front.service_socket)
    async with grpc.aio.insecure_channel("unix:" + front.service_socket) as ch:
        resp = await v1_grpc.DRAPluginStub(ch).NodeUnprepareResources(
            v1_pb2.NodeUnprepareResourcesRequest(), timeout=5
        )
    assert len(resp.claims) == 0


async def test_stop_removes_only_our_sockets(
    kdirs: tuple[str, str], handler: RecordingHandler
) -> None:
    registry, plugins = kdirs
    f = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    await f.start()
    os.unlink(f.registration_socket)
    _stale_socket(f.registration_socket)  # replaced by someone else before we stop
    await f.stop()
    assert not os.path.exists(f.service_socket)
    assert os.path.exists(f.registration_socket)  # not ours: left alone


async def test_a_kubelet_dir_that_is_a_file_is_a_clear_error(
    kdirs: tuple[str, str], handler: RecordingHandler
) -> None:
    registry, plugins = kdirs
    os.rmdir(registry)  # the fixture made it, as the kubelet does; here a file stands there
    with open(registry, "w") as fh:
        fh.write("not a directory")
    f = KubeletFrontEnd(DRIVER, registry, plugins, handler)
    with pytest.raises(SocketPathError) as e:
        await f.start()
    assert f"cannot serve a socket at {registry}: it is not a directory" in str(e.value)
    assert "--kubelet-registry-dir" in str(e.value)
    assert not os.path.exists(f.service_socket)  # the service socket was taken down again
