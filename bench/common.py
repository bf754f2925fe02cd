"""What the benchmark scripts share."""

from __future__ import annotations

import os
import sys


def vfioctl_command() -> list[str]:
    """The ``vfioctl`` installed beside this interpreter (the project's venv), not whatever
    ``vfioctl`` comes first on PATH: a shim or another install would time something else."""
    exe = os.path.join(os.path.dirname(sys.executable), "vfioctl")
    if os.access(exe, os.X_OK):
        return [exe]
    return [sys.executable, "-c", "from cli.main import main; main()"]
