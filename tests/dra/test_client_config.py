"""The DRA plugin's client config in kubectl's order, and an unreachable API server said once
per attempt (issue 21 item 7)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.dra.topologies import dra_host
from tests.waiting import wait_until
from vfio_dp.dra.apiserver.publisher import client_config_source


def _serving(proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    """Wait until the plugin serves (its registration socket exists: its start, whose own
    list of the slices may wait for its deadline, is over) -- a condition, not a time: a
    loaded machine may take seconds just to import it."""
    reg = Path(proc.args[proc.args.index("--kubelet-registry-dir") + 1])  # type: ignore[index, union-attr, arg-type]
    deadline = time.monotonic() + timeout
    while not (reg / "vfio.dra.vfio-dp.io-reg.sock").exists():
        assert proc.poll() is None, "the plugin exited"
        assert time.monotonic() < deadline, "the plugin never served"
        time.sleep(0.05)


def spawn_plugin(tmp_path: Path, server: str) -> tuple[subprocess.Popen[str], Path]:
    """`vfioctl dra-plugin` as a process, its client pointed at ``server`` (a URL), and the
    kubelet dir it serves in (short: unix socket paths)."""
    kc = tmp_path / "kubeconfig"
    kc.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: '{server}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
    )
    tree = dra_host(tmp_path / "root")
    kdir = Path(tempfile.mkdtemp(prefix="kdra", dir="/tmp"))  # short: unix socket paths
    for d in ("plugins_registry", "plugins"):
        (kdir / d).mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "dra-plugin",
         "--node-name", "n1", "--kubeconfig", str(kc), "--root", str(tree.root),
         "--kubelet-registry-dir", str(kdir / "plugins_registry"),
         "--kubelet-plugins-dir", str(kdir / "plugins"), "--metrics-port", "0",
         "--cdi-dir", str(tmp_path / "cdi")],
        stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    return proc, kdir


def _spawn_plugin(tmp_path: Path, port: int) -> subprocess.Popen[str]:
    """`vfioctl dra-plugin` as a process, its client pointed at 127.0.0.1:<port> (plain HTTP)."""
    return spawn_plugin(tmp_path, f"http://127.0.0.1:{port}")[0]


def test_kubectls_order(tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert client_config_source("/x/kc", {"KUBECONFIG": "/y"}, str(home)) == ("flag", "/x/kc")
    assert client_config_source(None, {"KUBECONFIG": "/y:/z"}, str(home)) == ("env", "/y:/z")
    assert client_config_source(None, {}, str(home)) == ("in-cluster", None)
    (home / ".kube").mkdir(parents=True)
    (home / ".kube/config").write_text("{}")
    assert client_config_source(None, {}, str(home)) == ("home", str(home / ".kube/config"))
    assert client_config_source(None, {"KUBECONFIG": ""}, str(home))[0] == "home"


def test_an_unreachable_api_server_is_one_line_per_attempt(tmp_path: Path) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    proc = _spawn_plugin(tmp_path, port)
    _serving(proc)
    time.sleep(6)  # the scenario: the API server stays down for a while
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert "Retrying (Retry" not in err, err[-2000:]
    attempts = [ln for ln in err.splitlines() if "ResourceSlices not published:" in ln]
    assert attempts, err[-2000:]
    assert all("next try in" in ln for ln in attempts)
    assert len(attempts) <= 8, attempts  # backed off: 0.2, 0.4, 0.8 ... not a tight loop


def test_sigterm_ends_the_plugin_while_the_api_server_hangs(tmp_path: Path) -> None:
    """An API server that accepts and never answers (issue 20 item 1): SIGTERM still ends the
    process promptly — threads blocked in its calls are not waited for (before: ~17 s here)."""
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    proc = _spawn_plugin(tmp_path, srv.getsockname()[1])
    try:
        _serving(proc)
        served_with = len(held)
        # the scenario: up, with its API calls hanging (10 s deadlines): a call it started
        # after it served is held open by the server (a condition, not 2 s of sleep)
        wait_until(
            lambda: len(held) > served_with,
            what="a call the serving plugin started, held by the server",
            state=lambda: (len(held), proc.poll()),
        )
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=5)  # before: up to 10 s more, joining stuck threads
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        srv.close()
        for c in held:
            c.close()
    assert proc.returncode == 0, err[-2000:]
    assert "Traceback" not in err
