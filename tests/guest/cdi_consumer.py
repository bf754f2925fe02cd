"""podman as a real CDI consumer, INSIDE the guest rig (recipe: shared/reference/dra.md).

Shared by the DRA scenario (tests/guest/scenarios/dra_prepare_scenario.py) and the demo's
DRA leg (demo/guest_demo.py). Everything lives under the guest's fresh ``/tmp/ctr``: vfs
storage (overlay needs fuse, absent here) and a one-file busybox image named ``bb``.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

STORAGE_CONF = "/tmp/ctr/storage.conf"
PODMAN = ["podman", "--cgroup-manager=cgroupfs", "--events-backend=none"]


def podman(*args: str, timeout: float = 240) -> dict[str, Any]:
    """``podman <args>`` → ``{rc, stdout, stderr (tail)}``."""
    env = {**os.environ, "CONTAINERS_STORAGE_CONF": STORAGE_CONF}
    p = subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, env=env)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-3000:]}


def podman_setup() -> dict[str, Any]:
    """Mount /dev/shm and cgroup2 if the rig has not, write the storage config and import the
    busybox image ``bb``. Returns ``{rc, stdout, stderr (tail)}``."""
    sh = f"""
set -e
mountpoint -q /dev/shm || mount -t tmpfs shm /dev/shm
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 none /sys/fs/cgroup
mkdir -p /tmp/ctr/bb/bin
printf '[storage]\\ndriver = "vfs"\\nrunroot = "/tmp/ctr/run"\\ngraphroot = "/tmp/ctr/graph"\\n' > {STORAGE_CONF}
cp "$(command -v busybox)" /tmp/ctr/bb/bin/busybox
ln -sf busybox /tmp/ctr/bb/bin/sh
tar -C /tmp/ctr/bb -cf /tmp/ctr/bb.tar .
CONTAINERS_STORAGE_CONF={STORAGE_CONF} {" ".join(PODMAN)} import -q /tmp/ctr/bb.tar bb
"""
    p = subprocess.run(["bash", "-c", sh], capture_output=True, text=True, timeout=300)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-3000:]}


def run_with_cdi(cdi_ids: list[str], metadata_path: str) -> dict[str, Any]:
    """A container given ``cdi_ids`` (``--device``, no network) lists ``/dev/vfio``, prints
    the metadata file at ``metadata_path`` and tries to append to it; stdout is the three
    parts separated by ``---`` lines, the last ``READONLY`` or ``WRITABLE``."""
    args = ["run", "--rm", "--network", "none"]
    for i in cdi_ids:
        args += ["--device", i]
    script = (
        f"ls /dev/vfio; echo ---; cat {metadata_path}; echo ---; "
        f"echo x >> {metadata_path} && echo WRITABLE || echo READONLY"
    )
    return podman(*args, "bb", "sh", "-c", script)
