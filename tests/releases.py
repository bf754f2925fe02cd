"""A previous release's Python packages, taken from this checkout's git history (``git
archive``), to run as the old image would (``PYTHONPATH`` = its tree): the upgrade tests'
other side."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: the main the round of issues 33-39 started from
PREVIOUS_MAIN = "3ab829d"


def archive(
    ref: str, out: Path, packages: tuple[str, ...] = ("vfio_dp", "cli", "vm_translate")
) -> Path:
    """Extract ``packages`` of ``ref`` into ``out``; fail naming the fix when the ref is not
    in this checkout's history (a shallow clone)."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, *packages],
        capture_output=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(
            f"the previous release {ref} is not in this checkout's history "
            f"({done.stderr.decode()[:200].strip()}); clone with full history"
        )
    subprocess.run(["tar", "-x", "-C", str(out)], input=done.stdout, check=True)
    return out
