"""Record files that are not files, and an uninstall that never lies (issue 37, items 6-10).

A FIFO, a directory or a symlink where a record should be -- ``var/lib/vfio_dp/sriov/<pf>.json``,
``sriov/ops/<pf>.json``, ``original/<addr>.json``, ``ops/<id>.json``, the DRA checkpoint, the
process locks under ``run/vfio_dp/instances`` -- made in temp trees, with the real ``vfioctl``
run with a timeout, so a command that hangs fails the test instead of stalling it. Each must
answer within the timeout with one clear message naming the path and the fix, and no
traceback; the device plugin still starts and serves, and SIGTERM still stops it.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sysfs_tree import SysfsTree
from vfio_dp.model.address import PciAddress

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
MLX = "0000:af:00.0"  # gpu_host's SR-IOV PF: 2 VFs made by someone else
NIC = "0000:65:00.0"  # gpu_host's NIC, on vfio-pci (no record of ours)
KINDS = ["fifo", "directory", "symlink"]
#: a command that answers takes ~1 s here; one that blocks on a FIFO never does
ANSWER_WITHIN = 30.0


def vfioctl(*args: str, timeout: float = ANSWER_WITHIN) -> subprocess.CompletedProcess[str]:
    """The real ``vfioctl``; a hang fails the test (the child is killed) instead of stalling."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    try:
        return subprocess.run(
            [*VFIOCTL, *args], capture_output=True, text=True, env=env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"vfioctl {' '.join(args)} hung for {timeout:g} s")


def plant(path: Path, kind: str) -> Path:
    """A FIFO, a directory or a symlink (to a well-formed file beside it) at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "symlink":  # a link is never followed, not even to a good-looking file
        target = path.parent / f".target-{path.name}"
        target.write_text("{}")
        path.symlink_to(target.name)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))
    else:
        raise AssertionError(kind)
    return path


def clear(p: subprocess.CompletedProcess[str]) -> str:
    """Both streams, after checking there is no traceback in them."""
    out = p.stdout + p.stderr
    assert "Traceback" not in out, out
    return out


# -- 37.6: SR-IOV records and journals ------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["sriov", "sriov/ops"])
def test_sriov_commands_answer_with_an_unreadable_sriov_record(
    tree: SysfsTree, where: str, kind: str
) -> None:
    bad = plant(tree.root / "var/lib/vfio_dp" / where / f"{MLX}.json", kind)
    root = str(tree.root)
    for args in (["sriov"], ["sriov", "set", MLX, "1"], ["unbind", "--all"]):
        p = vfioctl(*args, "--root", root)
        out = clear(p)
        assert p.returncode == 1, (args, out)
        assert f"unreadable record {bad}:" in out, (args, out)
        assert "by hand" in out, (args, out)  # the fix
    assert (tree.dev_dir(MLX) / "sriov_numvfs").read_text().strip() == "2"  # untouched


@pytest.mark.parametrize("kind", KINDS)
async def test_the_plugin_with_numvfs_serves_and_stops_with_an_unreadable_sriov_record(
    tree: SysfsTree, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Before: a FIFO blocked the SR-IOV pass at start (never served, SIGTERM ignored); a
    directory or a link crashed the plugin at start."""
    from tests.deviceplugin.kubelet_standin import KubeletStandin

    bad = plant(tree.root / f"var/lib/vfio_dp/sriov/{MLX}.json", kind)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f'selectors:\n- {{addresses: ["{MLX}"], numVfs: 2}}\n- {{vendor: "8086", device: "10d3"}}\n'
    )
    kdir = Path(tempfile.mkdtemp(prefix="kdp", dir="/tmp"))  # a unix socket path is short
    request.addfinalizer(lambda: shutil.rmtree(kdir, ignore_errors=True))
    kubelet = KubeletStandin(str(kdir))
    await kubelet.start()
    proc = subprocess.Popen(
        [*VFIOCTL, "plugin", "--root", str(tree.root), "--kubelet-dir", str(kdir),
         "--config", str(cfg), "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        await kubelet.wait_for(
            "the plugin served its devices",
            lambda k: k.devices("devices.kubevirt.io/8086_10d3") == {NIC: "Healthy"},
            timeout=ANSWER_WITHIN,
        )
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, ANSWER_WITHIN)
        err = proc.communicate()[1]
    except BaseException:
        proc.kill()
        print(proc.communicate()[1])  # what the plugin said, for the failure's report
        raise
    finally:
        await kubelet.stop()
    assert rc == 0, err
    assert "Traceback" not in err, err
    assert f"unreadable record {bad}:" in err, err


# -- 37.7: bind records, journals, the DRA checkpoint ---------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_list_and_unbind_all_answer_with_an_unreadable_bind_record(
    tree: SysfsTree, kind: str
) -> None:
    bad = plant(tree.root / f"var/lib/vfio_dp/original/{NIC}.json", kind)
    p = vfioctl("list", "--root", str(tree.root))
    assert p.returncode == 0 and f"unreadable record {bad}:" in clear(p), clear(p)
    p = vfioctl("unbind", "--all", "--root", str(tree.root))
    assert p.returncode == 1 and f"unreadable record {bad}:" in clear(p), clear(p)


@pytest.mark.parametrize("kind", KINDS)
def test_list_and_unbind_all_answer_with_an_unreadable_journal(tree: SysfsTree, kind: str) -> None:
    bad = plant(tree.root / "var/lib/vfio_dp/ops/18f0a-812.json", kind)
    for args in (["list"], ["unbind", "--all"]):
        p = vfioctl(*args, "--root", str(tree.root))
        assert p.returncode == 0, clear(p)
        assert f"unreadable record {bad}:" in clear(p), (args, clear(p))


@pytest.mark.parametrize("kind", KINDS)
def test_an_unreadable_dra_checkpoint_holds_every_vf_and_blocks_nothing(
    tree: SysfsTree, kind: str
) -> None:
    """The holds reader (SR-IOV changes ask it which VFs claims hold) opened the checkpoint
    blocking: a FIFO hung ``sriov`` and ``unbind --all``. Now read through the checkpoint's
    own reader: a checkpoint that cannot be read holds every VF, said by its path."""
    bad = plant(tree.root / "var/lib/vfio_dp/dra-vfio.example.com.checkpoint.json", kind)
    p = vfioctl("sriov", "--root", str(tree.root), "-o", "json")
    assert p.returncode == 0, clear(p)
    p = vfioctl("sriov", "set", "--root", str(tree.root), MLX, "0")
    assert p.returncode == 1 and f"cannot read the DRA checkpoint {bad}" in clear(p), clear(p)
    p = vfioctl("unbind", "--all", "--root", str(tree.root))
    assert p.returncode == 0 and "nothing to restore" in clear(p), clear(p)


# -- 37.8: the process locks ----------------------------------------------------------------
@pytest.fixture
def kubeconfig(tmp_path: Path) -> Iterator[str]:
    """A kubeconfig naming an API server nobody answers at: the lock comes before any call."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    yield str(path)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "socket", "instances-file"])
def test_an_unusable_process_lock_is_one_clear_error(
    tmp_path: Path, kind: str, kubeconfig: str, request: pytest.FixtureRequest
) -> None:
    from vfio_dp.host.instance import lock_name
    from vfio_dp.model.naming import DEFAULT_DRA_DRIVER

    k = Path(tempfile.mkdtemp(prefix="kdp", dir="/tmp"))  # a unix socket path is short
    request.addfinalizer(lambda: shutil.rmtree(k, ignore_errors=True))
    root = k / "r"  # short: a unix socket's path is at most 107 bytes
    instances = root / "run/vfio_dp/instances"
    if kind == "instances-file":
        instances.parent.mkdir(parents=True)
        instances.write_text("")
        bad = {"plugin": instances, "dra": instances, "unbind": instances}
    else:
        bad = {
            "plugin": plant(instances / "device-plugin.lock", kind),
            "dra": plant(instances / lock_name("dra-plugin", DEFAULT_DRA_DRIVER), kind),
            "unbind": instances / "device-plugin.lock",
        }
    runs = {
        "plugin": ["plugin", "--kubelet-dir", str(k / "dp"), "--create-dirs",
                   "--metrics-port", "0"],
        "dra": ["dra-plugin", "--kubeconfig", kubeconfig, "--node-name", "n1",
                "--kubelet-registry-dir", str(k / "reg"), "--kubelet-plugins-dir",
                str(k / "plugins"), "--cdi-dir", str(tmp_path / "cdi"), "--create-dirs",
                "--metrics-port", "0"],
        "unbind": ["unbind", "--all"],
    }  # fmt: skip
    for what, args in runs.items():
        p = vfioctl(*args, "--root", str(root))
        out = clear(p)
        assert p.returncode == 1, (what, out)
        assert f"cannot take a process lock of ours at {bad[what]}: it is " in out, (what, out)
        assert f"remove it (rm -r {bad[what]}) and start again" in out, (what, out)


# -- 37.9 and 37.10: the uninstall never lies -----------------------------------------------
def test_unbind_all_fails_naming_an_unreadable_bind_record_every_time(tree: SysfsTree) -> None:
    """Before: exit 0 with the device left on vfio-pci, then "nothing to restore" -- the
    uninstall pod went Ready with a device still bound."""
    rec = tree.root / f"var/lib/vfio_dp/original/{NIC}.json"
    rec.parent.mkdir(parents=True)
    rec.write_text('{"address": "0000:65:00.0", "driver": ')  # torn by a disk error
    for _ in range(2):  # and the next run says the same: it is still not done
        p = vfioctl("unbind", "--all", "--root", str(tree.root))
        out = clear(p)
        assert p.returncode == 1, out
        assert "1 bind record(s) cannot be read" in out and f"unreadable record {rec}:" in out
        assert f"vfioctl unbind --driver NAME {NIC}" in out  # names the device and the fix
        assert "nothing to restore" not in out
        assert tree.driver_of(NIC) == "vfio-pci" and rec.exists()
    p = vfioctl("unbind", "--all", "--dry-run", "--root", str(tree.root))
    assert p.returncode == 0 and f"warning: unreadable record {rec}:" in clear(p)
    assert "nothing to restore" not in p.stdout


def _in_process_unbind_all(tree: SysfsTree, monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    """``vfioctl unbind --all`` run in this process on the kernel simulator (a temp tree's
    sysfs files do not move drivers), with no kubelet to ask (no pod-resources socket)."""
    from click.testing import CliRunner

    from cli import host_cmds
    from cli.main import vfioctl as cli
    from tests.kernel_sim import SimulatedKernel
    from vfio_dp.host import Host

    kernel = SimulatedKernel(tree)
    monkeypatch.setattr(host_cmds, "host_for", lambda root: Host(root, kernel=kernel))
    monkeypatch.setattr(
        "vfio_dp.deviceplugin.podresources.DEFAULT_SOCKET", str(tree.root / "no-kubelet.sock")
    )
    r = CliRunner().invoke(cli, ["unbind", "--all", "--root", str(tree.root)])
    return r.exit_code, r.output


def test_one_unreadable_sriov_record_does_not_stop_the_other_devices(
    tree: SysfsTree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: exit 1 with none of the bound devices given back. Now: every other device
    restored, then exit 1 naming the record it could not read."""
    from tests.kernel_sim import SimulatedKernel
    from vfio_dp.host import Host

    bound = ["0000:3b:00.0", "0000:3b:00.1", "0000:03:01.0", "0000:03:02.0", "0000:00:03.0"]
    Host(tree.root, kernel=SimulatedKernel(tree)).bind(
        [PciAddress.parse(a) for a in bound], force=True
    )
    assert all(tree.driver_of(a) == "vfio-pci" for a in bound)
    bad = tree.root / f"var/lib/vfio_dp/sriov/{MLX}.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps({"address": MLX, "before": "two"}))
    code, out = _in_process_unbind_all(tree, monkeypatch)
    assert code == 1, out
    assert f"unreadable record {bad}:" in out
    assert {a: tree.driver_of(a) for a in bound} == {
        "0000:3b:00.0": "nvidia",
        "0000:3b:00.1": "snd_hda_intel",
        "0000:03:01.0": "e1000",
        "0000:03:02.0": "e1000",
        "0000:00:03.0": "virtio-pci",
    }
    assert bad.exists()  # kept, for the operator


@pytest.mark.parametrize("kind", KINDS)
def test_the_allocation_record_is_read_without_blocking(tmp_path: Path, kind: str) -> None:
    """The device plugin's ``allocations.json`` is read through the records' one reader
    too: a FIFO there no longer blocks the plugin's start; it is said and treated as empty."""
    import threading

    from vfio_dp.deviceplugin.allocation_store import AllocationStore
    from vfio_dp.host.root import Root

    bad = plant(tmp_path / "var/lib/vfio_dp/allocations.json", kind)
    store = AllocationStore(Root(tmp_path))
    t = threading.Thread(target=store.load, daemon=True)
    t.start()
    t.join(ANSWER_WITHIN)
    if t.is_alive():  # unblock the old code's open() so the thread ends
        os.close(os.open(bad, os.O_WRONLY | os.O_NONBLOCK))
        t.join(5)
        pytest.fail("loading the allocation record blocked")
    assert store.record == {} and store.problem is not None
    why = {"fifo": "not a regular file (a FIFO)", "directory": "not a regular file (a directory)"}
    assert str(bad) in store.problem
    assert why.get(kind, "is a symbolic link") in store.problem
