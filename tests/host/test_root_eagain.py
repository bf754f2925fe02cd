"""``openat2`` with ``RESOLVE_BENEATH`` answers ``EAGAIN`` when a ``..`` was resolved while
anything on the system renamed or mounted (openat2(2): "the caller may choose to retry").
A busy node (or a busy test machine: atomic writes are renames) hits it; :meth:`Root.open`
retries instead of losing a device from a scan. Fault injected with ``strace -e inject=``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = """
import os, sys
from vfio_dp.host.root import Root, openat2_available
r = Root(sys.argv[1])
fd = r.open(r.path("sys", "bus", "pci", "devices", "x"), os.O_RDONLY | os.O_DIRECTORY)
print("opened", fd >= 0, openat2_available())
"""


@pytest.mark.parametrize(("failures", "opens"), [(3, True), (1000, False)])
def test_eagain_from_openat2_is_retried(tmp_path: Path, failures: int, opens: bool) -> None:
    if shutil.which("strace") is None:
        pytest.fail("strace is needed (Debian package strace; scripts/setup.sh installs it)")
    (tmp_path / "sys/bus/pci/devices/x").mkdir(parents=True)
    cmd = ["strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=openat2",
           "-e", f"inject=openat2:error=EAGAIN:when=1..{failures}",
           sys.executable, "-c", PROBE, str(tmp_path)]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if "ptrace" in out.stderr and out.returncode != 0 and "opened" not in out.stdout:
        pytest.skip(f"strace cannot trace here: {out.stderr.strip()[:200]}")
    if opens:
        assert out.stdout.split() == ["opened", "True", "True"], out.stderr
    else:  # the retries are bounded; a kernel that keeps saying EAGAIN gets the walk (same rules)
        assert out.stdout.split() == ["opened", "True", "None"], out.stderr
