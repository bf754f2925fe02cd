"""Runs INSIDE the guest (real kernel 6.1): mediated devices made and removed for real.

The rig built the kernel's sample mdev driver ``mtty`` for this kernel
(tests/guest/mdev_rig.py, ``$VFIO_DP_KO_DIR``); here ``modprobe mdev`` and ``insmod mtty.ko``
give the parent ``mtty`` with types ``mtty-1`` and ``mtty-2``. Each step runs the real
``vfioctl`` (or the node core's mdev pass, :class:`vfio_dp.core.mdev_reconcile.MdevPass`,
for a config) and records what it printed and what the kernel then shows, into
$GUEST_RIG_OUT/mdev.json for tests/guest/test_mdev_real_kernel.py. Crash points: strace
SIGKILLs ``vfioctl mdev create`` on entering its sysfs write (after its journal), and on
the record's rename (after the sysfs write). Nothing here decides pass/fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
KO_DIR = os.environ["VFIO_DP_KO_DIR"]
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
U3 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1003"
U4 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1004"
TYPES = "/sys/class/mdev_bus/mtty/mdev_supported_types"
VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
results: dict[str, Any] = {}


def sh(*cmd: str) -> dict[str, Any]:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}


def instances() -> list[str]:
    d = "/sys/bus/mdev/devices"
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def available(type_id: str) -> int:
    with open(f"{TYPES}/{type_id}/available_instances") as f:
        return int(f.read())


def step(name: str, *args: str) -> None:
    results[name] = {**sh(*VFIOCTL, *args), "instances_after": instances(),
                     "journals_after": sorted(os.listdir(OPS)) if os.path.isdir(OPS) else []}  # fmt: skip


def killed(name: str, inject: list[str], *args: str) -> None:
    trace = ["strace", "-f", "-qq", "-o", os.devnull, *inject]
    results[name] = {**sh(*trace, *VFIOCTL, *args), "instances_after": instances(),
                     "journals_after": sorted(os.listdir(OPS)) if os.path.isdir(OPS) else []}  # fmt: skip


OPS = "/var/lib/vfio_dp/mdev/ops"

# -- the modules ---------------------------------------------------------------------------
results["modprobe_mdev"] = sh("modprobe", "mdev")
results["modprobe_vfio"] = sh("modprobe", "vfio_iommu_type1")
results["insmod_mtty"] = sh("insmod", f"{KO_DIR}/mtty.ko")
results["list"] = sh(*VFIOCTL, "mdev", "-o", "json")

# -- vfioctl mdev create / remove -----------------------------------------------------------
step("create_dry_run", "mdev", "create", "--dry-run", "mtty", "mtty-2", "--uuid", U1)
avail_before = available("mtty-2")
step("create", "mdev", "create", "mtty", "mtty-2", "--uuid", U1)
results["available_2"] = [avail_before, available("mtty-2")]
results["list_after_create"] = sh(*VFIOCTL, "mdev", "-o", "json")
step("create_taken", "mdev", "create", "mtty", "mtty-2", "--uuid", U1)
step("create_unknown_type", "mdev", "create", "mtty", "mtty-9")
# made by hand (someone else): refused without --force
with open(f"{TYPES}/mtty-1/create", "w") as f:
    f.write(U2)
step("remove_others", "mdev", "remove", U2)

# -- a held instance refuses removal ---------------------------------------------------------
group = os.path.basename(os.readlink(f"/sys/bus/mdev/devices/{U1}/iommu_group"))
results["group"] = group
holder = subprocess.Popen(
    [sys.executable, "-c", f"import os, time; fd = os.open('/dev/vfio/{group}', os.O_RDWR); "
     "print('open', flush=True); time.sleep(120)"],
    stdout=subprocess.PIPE, text=True,
)  # fmt: skip
results["holder_open"] = holder.stdout.readline().strip() if holder.stdout else ""
step("remove_held", "mdev", "remove", "--force", U1)
holder.kill()
holder.wait()
step("remove_dry_run", "mdev", "remove", "--dry-run", U1)
step("remove", "mdev", "remove", U1)
step("remove_others_forced", "mdev", "remove", "--force", U2)

# -- crash points: SIGKILL on entering the sysfs write, and right after it --------------------
killed("kill_before_write",
       ["-P", f"{os.path.realpath(TYPES)}/mtty-2/create", "-e", "trace=write",
        "-e", "inject=write:signal=KILL:when=1"],
       "mdev", "create", "mtty", "mtty-2", "--uuid", U3)  # fmt: skip
step("after_kill_before", "mdev", "create", "mtty", "mtty-1", "--uuid", U4)
killed("kill_after_write",
       ["-e", "trace=renameat,renameat2,rename",
        "-e", "inject=renameat,renameat2,rename:signal=KILL:when=2"],
       "mdev", "create", "mtty", "mtty-2", "--uuid", U3)  # fmt: skip
step("after_kill_after", "mdev", "remove", U4)
results["record_u3"] = os.path.exists(f"/var/lib/vfio_dp/mdev/{U3}.json")
step("remove_u3", "mdev", "remove", U3)

# -- the node core's pass, from a config ------------------------------------------------------
PASS = """
import json, sys
from vfio_dp.core.mdev_reconcile import MdevPass
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text
p = MdevPass(Host("/", runner="device-plugin"), "device-plugin", "devicePlugin")
print(json.dumps(p.reconcile_sync(load_config_text(sys.argv[1], "config"), {})))
"""


def reconcile(name: str, config: str) -> None:
    t = time.monotonic()
    results[name] = {**sh(sys.executable, "-c", PASS, config), "instances_after": instances(),
                     "seconds": time.monotonic() - t}  # fmt: skip


reconcile("config_two", "mdev:\n- {parent: mtty, type: mtty-1, count: 2}\n")
reconcile("config_steady", "mdev:\n- {parent: mtty, type: mtty-1, count: 2}\n")
reconcile("config_one", "mdev:\n- {parent: mtty, type: mtty-1, count: 1}\n")
# a reboot: the instance goes, its record stays; the next pass makes it with its UUID
left = instances()
for u in left:
    with open(f"/sys/bus/mdev/devices/{u}/remove", "w") as f:
        f.write("1")
results["gone_before_remake"] = instances()
reconcile("config_remake", "mdev:\n- {parent: mtty, type: mtty-1, count: 1}\n")
results["remade_same"] = instances() == left
reconcile("config_gone", 'selectors: [{vendor: "8086"}]\n')
results["records_left"] = sorted(os.listdir("/var/lib/vfio_dp/mdev"))

with open(f"{OUT}/mdev.json", "w") as f:
    json.dump(results, f, indent=1)
print("mdev scenario done")
