"""A busy port is one line naming the flag (issue 21 item 4): the daemons use hostNetwork,
so a clash with something on the node is realistic."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.sysfs_tree import SysfsTree

VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]


@pytest.fixture
def busy_port() -> Iterator[int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def _one_line_error(argv: list[str]) -> str:
    p = subprocess.run([*VFIOCTL, *argv], capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2, p
    assert "Traceback" not in p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("vfioctl: ")]
    assert len(errors) == 1, p.stderr
    return errors[0]


def test_busy_metrics_port(busy_port: int, tmp_path: Path) -> None:
    SysfsTree(tmp_path / "root")
    (tmp_path / "kubelet").mkdir()
    line = _one_line_error(
        ["plugin", "--root", str(tmp_path / "root"), "--kubelet-dir", str(tmp_path / "kubelet"),
         "--metrics-host", "127.0.0.1", "--metrics-port", str(busy_port)]
    )  # fmt: skip
    assert line.startswith(f"vfioctl: --metrics-port {busy_port}: cannot listen on 127.0.0.1:")
    assert "Address already in use" in line and "pick another --metrics-port" in line


def test_busy_webhook_port(busy_port: int) -> None:
    line = _one_line_error(
        ["webhook", "--self-signed", "--san", "localhost", "--address", "127.0.0.1",
         "--port", str(busy_port)]
    )  # fmt: skip
    assert line == (
        f"vfioctl: --port {busy_port}: cannot listen on 127.0.0.1:{busy_port}: Address already "
        f"in use; another process may hold it (ss -ltnp 'sport = :{busy_port}'): pick another "
        "--port or stop it"
    )
