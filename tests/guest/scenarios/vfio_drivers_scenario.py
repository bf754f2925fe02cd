"""Runs INSIDE the guest (real kernel 6.1, emulated IOMMU): VFIO drivers other than vfio-pci.

The rig built two modules of ours for this kernel (tests/guest/modules, ``$VFIO_DP_KO_DIR``):
``vfio_dp_e1000e_vfio_pci``, a variant driver on vfio_pci_core whose
``PCI_DRIVER_OVERRIDE_DEVICE_VFIO`` entry matches the e1000e (8086:10d3), and
``acme_accel``, a stand-in for a vendor VFIO provider (same registration, no alias). They
are put into the module tree through a writable overlay and ``depmod`` runs, so
``modules.alias`` gains the variant's ``vfio_pci:`` line beside vfio_pci's catch-all.

Each step runs the real ``vfioctl`` and records what it printed and what the kernel then
shows, into $GUEST_RIG_OUT/vfio_drivers.json for tests/guest/test_vfio_drivers_real_kernel.py.
Nothing here decides pass/fail.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.getcwd())  # run from the checkout: tests.guest is importable

from tests.guest import qemu_holder

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
KO_DIR = os.environ["VFIO_DP_KO_DIR"]
LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
VARIANT, PROVIDER = "vfio_dp_e1000e_vfio_pci", "acme_accel"
results: dict[str, Any] = {}


def sh(*cmd: str) -> dict[str, Any]:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}


def vfioctl(*args: str) -> dict[str, Any]:
    return sh(sys.executable, "-c", "from cli.main import main; main()", *args)


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def group_of(addr: str) -> str:
    return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group"))


def step(name: str, *args: str) -> None:
    results[name] = {**vfioctl(*args), "drivers_after": {a: driver(a) for a in (LONE, LONE2)}}


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def raw_write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


# -- our modules into the module tree (a writable overlay over the shared, read-only one) --
kver = os.uname().release
moddir = os.path.realpath(f"/lib/modules/{kver}")
os.makedirs("/run/mods/up", exist_ok=True)
os.makedirs("/run/mods/work", exist_ok=True)
results["overlay"] = sh(
    "mount", "-t", "overlay", "overlay",
    "-o", f"lowerdir={moddir},upperdir=/run/mods/up,workdir=/run/mods/work", moddir,
)  # fmt: skip
os.makedirs(f"{moddir}/extra", exist_ok=True)
for ko in glob.glob(f"{KO_DIR}/*.ko"):
    shutil.copy(ko, f"{moddir}/extra/")
results["depmod"] = sh("depmod", "-a", kver)
with open(f"{moddir}/modules.alias") as f:
    results["alias_lines"] = [x.strip() for x in f if x.startswith("alias vfio_pci:")]
results["modprobe_R"] = sh(
    "modprobe", "-R", "vfio_" + read(f"/sys/bus/pci/devices/{LONE}/modalias").strip()
)

# -- the variant, chosen by the kernel's rule ----------------------------------------------
results["groups_of"] = {a: group_of(a) for a in (LONE, LONE2)}
step("check_before", "check", LONE)
step("dry_run", "bind", "--dry-run", LONE)
step("bind_variant", "bind", "-o", "json", LONE)
results["override_after_bind"] = read(f"/sys/bus/pci/devices/{LONE}/driver_override")
results["node_after_bind"] = os.path.exists(f"/dev/vfio/{group_of(LONE)}")
step("groups_after_bind", "groups", "-o", "json")
step("check_after_bind", "check", "-o", "json", LONE)
step("list_after_bind", "list", "-o", "json")
step("bind_again", "bind", LONE)

# the real consumer: QEMU opens the group of the device on the variant
qemu = qemu_holder.start(LONE)
fds = qemu_holder.wait_for_vfio_fds(qemu, 90)
results["qemu_running"] = qemu.poll() is None
results["qemu_vfio_device"] = qemu_holder.has_vfio_device(fds)
results["qemu_stderr"] = qemu_holder.stop(qemu)

step("unbind_variant", "unbind", "-o", "json", LONE)
results["override_after_unbind"] = read(f"/sys/bus/pci/devices/{LONE}/driver_override")
net = f"/sys/bus/pci/devices/{LONE}/net"
results["netdev_after_unbind"] = os.listdir(net) if os.path.isdir(net) else []

# -- vfioDriver: vfio-pci forces plain vfio-pci ----------------------------------------------
step("bind_plain", "bind", "-o", "json", "--vfio-driver", "vfio-pci", LONE)
step("unbind_plain", "unbind", LONE)

# -- the variant bound by hand: ready, never rebound -----------------------------------------
raw_write(f"/sys/bus/pci/devices/{LONE}/driver_override", VARIANT)
raw_write("/sys/bus/pci/drivers/e1000e/unbind", LONE)
raw_write("/sys/bus/pci/drivers_probe", LONE)
results["by_hand_variant"] = driver(LONE)
step("check_by_hand_variant", "check", "-o", "json", LONE)
step("bind_by_hand_variant", "bind", "-o", "json", LONE)

# -- a vendor VFIO provider (no alias, an unlike name), bound by hand ------------------------
results["modprobe_provider"] = sh("modprobe", PROVIDER)
raw_write(f"/sys/bus/pci/devices/{LONE2}/driver_override", PROVIDER)
raw_write("/sys/bus/pci/drivers/e1000e/unbind", LONE2)
raw_write("/sys/bus/pci/drivers_probe", LONE2)
results["provider_driver"] = driver(LONE2)
results["provider_node"] = os.path.exists(f"/dev/vfio/{group_of(LONE2)}")
step("check_provider", "check", "-o", "json", LONE2)
step("groups_provider", "groups", "-o", "json")
step("bind_provider", "bind", "-o", "json", LONE2)
step("unbind_all", "unbind", "-o", "json", "--all")
results["dmesg"] = sh("dmesg")["stdout"][-3000:]

with open(os.path.join(OUT, "vfio_drivers.json"), "w") as f:
    json.dump(results, f, indent=1)
print("vfio drivers scenario done")
