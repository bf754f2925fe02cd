"""`make demo` ends with its one-line verdict whatever fails (no guest boot needed here).

The guest-side paths (the demo dying in a step inside a booted guest) are in
tests/guest/test_demo.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DEMO_JSON": str(tmp_path / "demo.json"), **env},
        check=False,
    )


def test_guest_rig_unavailable_still_ends_with_a_verdict(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-qemu"
    proc = _run([sys.executable, "demo/run.py"], tmp_path, VFIO_DP_QEMU=str(missing))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.rstrip("\n").splitlines()[-1]
    assert last.startswith("VERDICT: FAIL — before step 1 (preparing the guest rig): ")
    assert "qemu-system-x86_64 not found" in last and "qemu-system-x86" in last
    facts = json.loads((tmp_path / "demo.json").read_text())
    assert facts["verdict"] == last
    assert facts["failures"] == [last]


def test_guest_demo_refuses_to_run_outside_the_guest(tmp_path: Path) -> None:
    """It binds 0000:01:00.0 for real: on this machine it must stop before step 1, saying so."""
    proc = _run([sys.executable, "demo/guest_demo.py"], tmp_path, GUEST_RIG_OUT=str(tmp_path))
    assert proc.returncode == 1
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("VERDICT: FAIL — step 0 (start): not inside")
    assert "make demo" in lines[0]
    assert not (tmp_path / "demo.json").exists()


def test_make_demo_prints_a_verdict_when_setup_fails(tmp_path: Path) -> None:
    """The Makefile's demo target reports a failed setup.sh as a verdict too."""
    fake = tmp_path / "repo"
    (fake / "scripts").mkdir(parents=True)
    (fake / "Makefile").write_bytes((REPO / "Makefile").read_bytes())
    (fake / "scripts/setup.sh").write_text("echo 'setup: apt-get failed' >&2; exit 100\n")
    proc = subprocess.run(
        ["make", "-s", "demo"], cwd=fake, capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode != 0
    assert proc.stdout.strip().splitlines()[-1] == (
        "VERDICT: FAIL — before step 1 (setup): scripts/setup.sh exited 100 (its error is above)"
    )
