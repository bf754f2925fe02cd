"""No tracked file holds a merge's conflict markers (several branches land here each round;
a marker in a docstring or a page passes every other check)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MARKER = re.compile(rb"^(<{7} |>{7} |={7}$)", re.M)


def test_no_conflict_markers() -> None:
    files = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout.split(b"\0")
    bad = []
    for name in filter(None, files):
        path = REPO / name.decode()
        small = path.is_file() and path.stat().st_size < (1 << 20)
        if small and MARKER.search(path.read_bytes()):
            bad.append(name.decode())
    assert bad == [], f"merge conflict markers left in {bad}"
