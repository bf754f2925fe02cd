"""``vfioctl fake-node DIR --profile P`` (issue 38.3): each profile is a node every command and
the device plugin run against as the docs show; it does not react to writes, and a bind there
fails, saying so, with nothing left recorded. One builder: tests/sysfs_tree.py is the
library's (vfio_dp.host.fake_node)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.cli.test_host_commands import run
from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.deviceplugin.test_process import vfioctl
from vfio_dp.host.fake_profiles import PROFILES


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_is_a_node_the_commands_read(tmp_path: Path, profile: str) -> None:
    node = tmp_path / "node"
    made = run("fake-node", str(node), "--profile", profile)
    assert made.returncode == 0, made.stderr
    assert "does not react to writes" in made.stdout
    listed = json.loads(run("list", "--root", str(node), "-o", "json").stdout)
    assert len(listed) >= 8
    assert any(d["in_use"] for d in listed), "the host's own devices are in use"
    assert any(d["driver"] == "vfio-pci" for d in listed), "something to serve at once"
    groups = run("groups", "--root", str(node), "--no-probe", "-o", "json")
    assert groups.returncode == 0, groups.stderr
    # every line the command suggests runs as printed (vfioctl: this environment's)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for line in made.stdout.splitlines()[1:]:
        shown = subprocess.run(line.strip(), shell=True, capture_output=True, text=True,
                               timeout=60, check=False, executable="/bin/bash", env=env)  # fmt: skip
        ok = shown.returncode == 0 or (" check " in line and "NOT ready" in shown.stdout)
        assert ok and "Traceback" not in shown.stderr, (line, shown.stderr)


def test_sriov_host_has_vfs(tmp_path: Path) -> None:
    assert run("fake-node", str(tmp_path / "n"), "--profile", "sriov-host").returncode == 0
    out = run("sriov", "--root", str(tmp_path / "n"), "-o", "json")
    assert out.returncode == 0, out.stderr
    pfs = {p["address"]: p for p in json.loads(out.stdout)}
    assert pfs["0000:3b:00.0"]["numvfs"] == 4


def test_a_non_empty_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("mine")
    out = run("fake-node", str(tmp_path))
    assert out.returncode == 2 and "is not an empty directory" in out.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


def test_a_bind_on_a_fake_node_fails_and_records_nothing(tmp_path: Path) -> None:
    """What the docs say `bind` does there: no kernel moves the driver, the bind reads the
    device back, rolls back and fails."""
    node = tmp_path / "node"
    assert run("fake-node", str(node), "--profile", "nic-host").returncode == 0
    out = run("bind", "--root", str(node), "0000:02:00.1")
    assert out.returncode == 1
    assert "not vfio-pci" in out.stderr and "rolled back 0000:02:00.1" in out.stderr
    assert list((node / "var/lib/vfio_dp/original").glob("*.json")) == []


async def test_the_device_plugin_serves_a_fake_node(tmp_path: Path) -> None:
    node = tmp_path / "node"
    assert run("fake-node", str(node), "--profile", "gpu-host").returncode == 0
    kdir = Path(tempfile.mkdtemp(prefix="kfn", dir="/tmp"))  # unix socket paths are short
    kubelet = KubeletStandin(str(kdir))
    await kubelet.start()
    proc = subprocess.Popen(
        [*vfioctl(), "plugin", "--root", str(node), "--kubelet-dir", str(kdir),
         "--metrics-port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        nic = "devices.kubevirt.io/8086_10d3"
        await kubelet.wait_for(
            "the plugin registered the fake node's NIC on vfio-pci",
            lambda k: k.devices(nic) == {"0000:65:00.0": "Healthy"},
            timeout=60,
        )
        proc.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(proc.wait, 30)
        assert rc == 0, proc.communicate()[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        await kubelet.stop()
        shutil.rmtree(kdir, ignore_errors=True)
