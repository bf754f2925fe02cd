"""QEMU as the real consumer of a VFIO device, INSIDE the guest rig.

Shared by the host scenario (tests/guest/scenarios/host_scenario.py: a group held open while
``unbind`` and ``check`` run) and the VFIO-driver scenario
(tests/guest/scenarios/vfio_drivers_scenario.py: a variant driver's device opened by QEMU).
QEMU runs under TCG, stopped (``-S``), with only ``-device vfio-pci,host=<bdf>``: it opens
``/dev/vfio/<N>`` and the device (an ``anon_inode:[vfio-device]`` fd) and holds them until
it is stopped.
"""

from __future__ import annotations

import os
import subprocess
import time


def start(address: str) -> subprocess.Popen[str]:
    """``qemu-system-x86_64`` holding the device ``address`` (``0000:01:00.0``) through VFIO."""
    return subprocess.Popen(
        ["qemu-system-x86_64", "-accel", "tcg", "-machine", "q35", "-m", "64", "-nodefaults",
         "-display", "none", "-serial", "none", "-monitor", "none", "-S",
         "-device", f"vfio-pci,host={address}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def has_vfio_device(fds: list[str]) -> bool:
    """Whether one of QEMU's fds (``/proc/<pid>/fd`` link texts) is an open VFIO device."""
    return any(f.startswith("anon_inode:[vfio-device]") for f in fds)


def wait_for_vfio_fds(qemu: subprocess.Popen[str], timeout: float) -> list[str]:
    """QEMU's fds (``/proc/<pid>/fd`` link texts) once it holds the VFIO device open, or as
    they were when it exited or ``timeout`` seconds passed."""
    fds: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and qemu.poll() is None:
        try:
            fds = [
                os.readlink(f"/proc/{qemu.pid}/fd/{n}") for n in os.listdir(f"/proc/{qemu.pid}/fd")
            ]
        except OSError:
            fds = []
        if has_vfio_device(fds):
            break
        time.sleep(0.5)  # the poll period (QEMU under TCG takes seconds to open the device)
    return fds


def stop(qemu: subprocess.Popen[str]) -> str:
    """Stop QEMU (SIGTERM, SIGKILL after 30 s); the last 2,000 characters of its stderr."""
    qemu.terminate()
    try:
        _, qerr = qemu.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        qemu.kill()
        _, qerr = qemu.communicate()
    return qerr[-2000:]
