"""Runs INSIDE the guest (real kernel, emulated IOMMU): the host layer on real sysfs.

Each step runs the real `vfioctl` as a user would and records what it printed and what the
kernel then shows; the results go to $GUEST_RIG_OUT/host.json for tests/guest/
test_host_real_kernel.py to assert on. Nothing here decides pass/fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.getcwd())  # run from the checkout: tests.guest is importable

from tests.guest import qemu_holder

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
SHARED_A, SHARED_B = "0000:03:01.0", "0000:03:02.0"
results: dict[str, Any] = {}


def vfioctl(*args: str) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def drivers() -> dict[str, str | None]:
    return {a: driver(a) for a in (LONE, LONE2, SHARED_A, SHARED_B)}


def group_of(addr: str) -> str:
    return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group"))


def raw_write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


def snapshot(name: str) -> None:
    results[name] = {"groups": vfioctl("groups", "-o", "json"), "drivers": drivers()}


def step(name: str, *args: str) -> None:
    results[name] = {**vfioctl(*args), "drivers_after": drivers()}


results["groups_of"] = {a: group_of(a) for a in (LONE, LONE2, SHARED_A, SHARED_B)}
results["list"] = vfioctl("list", "-o", "json")


def modalias_disagreements() -> dict[str, list[str]]:
    """Each device whose modalias built from the scanned IDs (what the VFIO driver choice
    matches modules.alias against) differs from the kernel's ``<bdf>/modalias``."""
    sys.path.insert(0, os.getcwd())  # the project (the rig runs us from its top)
    from vfio_dp.host.host import Host
    from vfio_dp.model.vfio_driver import modalias_of

    out = {}
    for addr, dev in Host("/").scan(usage=False).devices.items():
        with open(f"/sys/bus/pci/devices/{addr}/modalias") as f:
            kernel = f.read().strip()
        if modalias_of(dev) != kernel:
            out[str(addr)] = [modalias_of(dev), kernel]
    return out


results["modalias_disagreements"] = modalias_disagreements()
snapshot("s0_initial")
step("dry_run", "bind", "--dry-run", LONE)
step("bind_lone", "bind", "-o", "json", LONE)
results["vfio_node_after_bind"] = os.path.exists(f"/dev/vfio/{group_of(LONE)}")
results["record_after_bind"] = os.path.exists(f"/var/lib/vfio_dp/original/{LONE}.json")
step("bind_lone_again", "bind", LONE)
step("bind_half", "bind", SHARED_A)
# what driverctl / dpdk-devbind do without a word: bind ONE function of the shared group
raw_write(f"/sys/bus/pci/devices/{SHARED_A}/driver_override", "vfio-pci")
raw_write("/sys/bus/pci/drivers/e1000/unbind", SHARED_A)
raw_write("/sys/bus/pci/drivers_probe", SHARED_A)
snapshot("s1_half_bound")
step("check_half", "check", "-o", "json", SHARED_A)
step("bind_group", "bind", "--group", "-o", "json", SHARED_A)
snapshot("s2_group_bound")
step("check_lone", "check", "-o", "json", LONE)

# the real consumer: QEMU opens the group vfioctl bound
qemu = qemu_holder.start(LONE)
fds = qemu_holder.wait_for_vfio_fds(qemu, 60)
results["qemu_running"] = qemu.poll() is None
results["qemu_fds"] = fds
snapshot("s3_qemu_holds_lone")
step("unbind_while_qemu", "unbind", LONE)
step("check_while_qemu", "check", "-o", "json", LONE)
results["qemu_stderr"] = qemu_holder.stop(qemu)

# SHARED_A went to vfio-pci by a raw write (no record): it is given back by address
step("unbind_lone", "unbind", "-o", "json", LONE, SHARED_A)
results["records_before_all"] = sorted(os.listdir("/var/lib/vfio_dp/original"))
step("unbind_all", "unbind", "-o", "json", "--all")
results["records_left"] = sorted(os.listdir("/var/lib/vfio_dp/original"))
snapshot("s4_restored")

with open(os.path.join(OUT, "host.json"), "w") as f:
    json.dump(results, f, indent=1)
print("host scenario done")
