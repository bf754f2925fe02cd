"""The one unix-socket serving helper of both front-ends (vfio_dp.core.sockets), on real
sockets in a temp directory with real gRPC servers."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from vfio_dp.core import sockets
from vfio_dp.core.sockets import SocketServer, make_room, make_socket_dir
from vfio_dp.deviceplugin import servicer
from vfio_dp.deviceplugin._pb.deviceplugin.v1beta1 import api_pb2, api_pb2_grpc
from vfio_dp.errors import SocketPathError


@pytest.fixture
def sdir() -> Iterator[Path]:
    """A short directory (unix socket paths are limited to 107 bytes; tmp_path can be long)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="vs-", dir="/tmp") as d:
        yield Path(d)


def _stale_socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.close()  # the file stays: what a killed process leaves


@pytest.mark.parametrize("what", ["directory", "regular file", "symlink", "special file"])
def test_only_nothing_or_a_socket_may_stand_where_our_socket_goes(sdir: Path, what: str) -> None:
    path = sdir / "x.sock"
    if what == "directory":
        path.mkdir()
        (path / "keep").write_text("not ours")
    elif what == "regular file":
        path.write_text("keep me")
    elif what == "symlink":
        path.symlink_to(sdir / "elsewhere")
    else:
        os.mkfifo(path)
    with pytest.raises(SocketPathError) as e:
        make_room(str(path), "--some-dir")
    assert str(e.value) == (
        f"cannot serve a socket at {path}: it is a {what}; remove it (rm -r {path}) or choose "
        "another --some-dir"
    )
    assert os.path.lexists(path)  # nothing deleted
    if what == "directory":
        assert (path / "keep").read_text() == "not ours"


def test_nothing_or_a_stale_socket_is_room(sdir: Path) -> None:
    make_room(str(sdir / "new" / "x.sock"), "--some-dir")  # the directory is made
    assert (sdir / "new").is_dir()
    _stale_socket(sdir / "new" / "x.sock")
    make_room(str(sdir / "new" / "x.sock"), "--some-dir")
    assert (sdir / "new" / "x.sock").is_socket()  # left for the atomic rename


def test_a_path_too_long_and_a_directory_that_is_a_file_are_refused(sdir: Path) -> None:
    long = str(sdir / ("d" * 120) / "x.sock")
    with pytest.raises(SocketPathError, match="unix sockets allow 107"):
        make_room(long, "--some-dir")
    assert not os.path.exists(os.path.dirname(long))
    (sdir / "file").write_text("")
    with pytest.raises(SocketPathError) as e:
        make_socket_dir(str(sdir / "file" / "sub"), "--some-dir")
    assert str(e.value).startswith(
        f"cannot serve a socket at {sdir / 'file' / 'sub'}: it is not a directory"
    )
    assert "--some-dir" in str(e.value)


class _Core:
    """The device plugin's Core protocol, answering nothing (only the transport is tested)."""

    async def allocate(self, resource: str, ids: Any) -> Any:
        raise AssertionError("not called")

    def preferred(self, resource: str, available: Any, must: Any, size: int) -> list[str]:
        return []

    async def prestart(self, resource: str, ids: Any) -> None:
        return None


def _server(path: Path) -> SocketServer:
    return servicer.socket_server("example.com/x", servicer.Feed(), _Core(), str(path))


async def test_serve_replaces_a_stale_socket_and_close_removes_only_ours(sdir: Path) -> None:
    path = sdir / "x.sock"
    _stale_socket(path)
    before = os.stat(path).st_ino
    s = _server(path)
    await s.serve()
    try:
        assert os.stat(path).st_ino != before and s.changed() is None
        assert [n for n in os.listdir(sdir) if n.startswith(".")] == []  # no hidden name left
        async with grpc.aio.insecure_channel(f"unix:{path}") as ch:
            opts = await api_pb2_grpc.DevicePluginStub(ch).GetDevicePluginOptions(
                api_pb2.Empty(), timeout=5
            )
        assert opts.pre_start_required
        os.unlink(path)
        assert s.changed() == "is gone"
        _stale_socket(path)  # someone else's socket at our path
        assert s.changed() == "was replaced"
    finally:
        await s.close()
    assert path.is_socket()  # not ours: left alone


async def test_a_socket_that_refuses_connections_is_unanswered_after_the_window(
    sdir: Path,
) -> None:
    """/healthz's check: our socket file still there but nobody listening (the server
    stopped) answers no connect; within the window that is not yet a failure."""
    path = sdir / "x.sock"
    s = _server(path)
    await s.serve()
    try:
        assert s.answers() is None and s.unanswered(0) is None
        assert s.server is not None
        await s.server.stop(None)  # gRPC unlinks the hidden name it bound, not our path
        assert path.is_socket() and s.changed() is None
        assert s.answers() == "refuses connections (Connection refused)"
        assert s.unanswered(60) is None  # first seen now: inside the window
        why = s.unanswered(0)
        assert why is not None and f"{path} refuses connections" in why and "limit 0s" in why
    finally:
        await s.close()
    assert s.unanswered(60) is None and s.answers() == "is not served"


async def test_a_message_over_the_limit_is_refused(sdir: Path) -> None:
    """Both front-ends' servers take at most MAX_MESSAGE bytes (a hostile client's huge
    request is refused by gRPC before any handler sees it)."""
    s = _server(sdir / "x.sock")
    await s.serve()
    try:
        async with grpc.aio.insecure_channel(f"unix:{s.path}") as ch:
            big = api_pb2.PreferredAllocationRequest(
                container_requests=[
                    api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=["x" * 1024] * (sockets.MAX_MESSAGE // 1024 + 1)
                    )
                ]
            )
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await api_pb2_grpc.DevicePluginStub(ch).GetPreferredAllocation(big, timeout=5)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            small = api_pb2.PreferredAllocationRequest(
                container_requests=[api_pb2.ContainerPreferredAllocationRequest()]
            )
            await api_pb2_grpc.DevicePluginStub(ch).GetPreferredAllocation(small, timeout=5)
    finally:
        await s.close()


async def test_restore_logs_a_path_it_cannot_use_once_then_serves(
    sdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = sdir / "x.sock"
    s = _server(path)
    await s.serve()
    os.unlink(path)
    path.mkdir()
    with caplog.at_level(logging.ERROR, logger="vfio_dp.deviceplugin"):
        for _ in range(3):
            assert await s.restore(f"{path} {s.changed()}") is False
    assert caplog.text.count(f"cannot serve a socket at {path}: it is a directory") == 1
    path.rmdir()
    assert await s.restore(f"{path} {s.changed()}") is True
    assert s.changed() is None and path.is_socket()
    await s.close()
    assert not os.path.lexists(path)
