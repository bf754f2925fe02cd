"""``kubectl vfio`` against the API-server stand-in, through the real kubectl's plugin lookup:
how each failure ends -- a failing command, a write command, no node named, a node without our
pod, RBAC refusing exec, a server unreachable or silent (what the commands show:
tests/cli/test_kubectl_vfio.py; the cluster: tests/cli/kubectl_cluster.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.cli.kubectl_cluster import cluster, kubectl
from tests.dra.apiserver_standin import ApiServerStandin

__all__ = ["cluster"]  # a fixture


def test_a_failing_command_fails_the_plugin_with_its_exit_code(cluster: Any) -> None:
    api, _ = cluster
    done = kubectl(api, "--node", "node-a", "check", "0000:3b:00.0")
    assert done.returncode == 1  # vfioctl check's own "not ready" exit, through the error channel
    assert "0000:3b:00.0" in done.stdout + done.stderr


def test_write_commands_are_refused_before_any_exec(cluster: Any) -> None:
    api, _ = cluster
    for args in (["bind", "0000:3b:00.0"], ["sriov", "set", "0000:af:00.0", "2"], ["plugin"]):
        done = kubectl(api, "--all-nodes", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert "not a read command" in done.stderr
    assert not [r for r in api.requests if r.path.endswith("/exec")]


def test_node_or_all_nodes_must_be_named(cluster: Any) -> None:
    api, _ = cluster
    done = kubectl(api, "list")
    assert done.returncode == 2 and "--node NODE" in done.stderr


def test_a_node_without_our_pod_is_named(cluster: Any) -> None:
    api, _ = cluster
    done = kubectl(api, "--node", "node-z", "list")
    assert done.returncode == 1
    assert "no running vfio-dp DaemonSet pod on node node-z" in done.stderr


def test_exec_refused_by_rbac_says_what_is_missing(cluster: Any) -> None:
    api, _ = cluster
    api.rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}]
    done = kubectl(api, "--node", "node-a", "list")
    assert done.returncode == 1
    assert "403" in done.stderr and "pods/exec" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    api.stop()  # the kubeconfig stays, naming a port nobody listens on
    done = kubectl(api, "status", timeout=120)
    assert done.returncode == 1
    assert "did not answer" in done.stderr and api.url in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1


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
        done = kubectl(api, "--request-timeout", "2", "--node", "node-a", "list", timeout=60)
        took = time.monotonic() - t0
    finally:
        silent.close()
    assert done.returncode == 1, done.stderr
    assert "did not answer" in done.stderr and "Traceback" not in done.stderr
    assert took < 30, f"{took:.1f} s"
