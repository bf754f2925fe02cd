"""Runs INSIDE the guest (real kernel, emulated IOMMU): a persistent bind survives a "boot".

The boot order is re-enacted on the real kernel with a real udevd (``systemd-udevd`` of this
machine, with every rule Debian ships, ``80-drivers.rules`` loading modules included):

1. ``vfioctl bind --persist`` the lone e1000e 01:00.0; a second record names 02:00.0 with
   IDs it does not have (a different card in that slot since);
2. both NICs are removed from the PCI bus and e1000e and vfio-pci are unloaded: no driver
   can take a device before udev has seen it -- as at boot;
3. udevd starts and the bus is rescanned: the kernel announces both NICs, udev runs the
   rules (ours sets ``driver_override``; Debian's load e1000e by modalias; ours loads
   vfio-pci); the scenario waits until both NICs have a driver (``udevadm settle`` refuses
   to run in the rig's chroot);
4. ``vfioctl unbind`` gives 01:00.0 back and removes the rule.

Results go to $GUEST_RIG_OUT/persist.json for tests/guest/test_persist_real_kernel.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.getcwd())

from vfio_dp.model.address import PciAddress
from vfio_dp.model.persist import PersistedBind, from_json, to_json, udev_rules

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
RECORD = "/var/lib/vfio_dp/persist.json"
RULES = "/etc/udev/rules.d/05-vfio-dp-persist.rules"
results: dict[str, Any] = {}


def sh(*args: str) -> dict[str, Any]:
    p = subprocess.run(list(args), capture_output=True, text=True, timeout=120)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr}


def vfioctl(*args: str) -> dict[str, Any]:
    return sh(sys.executable, "-c", "from cli.main import main; main()", *args)


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def until(cond: Any, seconds: float) -> float | None:
    """Seconds until ``cond()`` held, polling; None when it did not within ``seconds``."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        if cond():
            return round(time.monotonic() - start, 2)
        time.sleep(0.05)
    return None


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


try:
    results["bind"] = vfioctl("bind", "--persist", LONE)
    results["after_bind"] = {LONE: driver(LONE), LONE2: driver(LONE2)}
    # a record for 02:00.0 whose device ID no longer matches the card there
    with open(RECORD, "rb") as f:
        records = from_json(f.read())
    records[PciAddress.parse(LONE2)] = PersistedBind(
        PciAddress.parse(LONE2), "8086", "beef", "8086", "0000"
    )
    write(RECORD, to_json(records.values()).decode())
    write(RULES, udev_rules(records.values()))
    results["rules"] = read(RULES)

    # "power off": the NICs leave the bus, no driver module stays loaded
    write("/sys/bus/pci/drivers/vfio-pci/unbind", LONE)
    for a in (LONE, LONE2):
        write(f"/sys/bus/pci/devices/{a}/remove", "1")
    results["rmmod"] = sh("rmmod", "e1000e", "vfio_pci")
    results["gone"] = {a: os.path.exists(f"/sys/bus/pci/devices/{a}") for a in (LONE, LONE2)}
    results["modules_before"] = sh("sh", "-c", "lsmod | grep -E '^(e1000e|vfio_pci) ' || true")

    # "boot": udevd with Debian's rules and ours, then the kernel announces the devices
    results["udevd"] = sh("/lib/systemd/systemd-udevd", "--daemon")
    # --daemon returns before udevd listens, and `udevadm settle`/`control --ping` refuse to
    # run in the rig's chroot ("Running in chroot, ignoring request"): wait for udevd's
    # control socket, then for udev to have handled both NICs (each has a driver), instead
    results["listening"] = until(lambda: os.path.exists("/run/udev/control"), 30)
    write("/sys/bus/pci/rescan", "1")
    results["settled"] = until(lambda: bool(driver(LONE) and driver(LONE2)), 60)
    results["after_boot"] = {LONE: driver(LONE), LONE2: driver(LONE2)}
    results["override_after_boot"] = {
        a: read(f"/sys/bus/pci/devices/{a}/driver_override").strip() for a in (LONE, LONE2)
    }
    grp = os.path.basename(os.readlink(f"/sys/bus/pci/devices/{LONE}/iommu_group"))
    results["vfio_node"] = os.path.exists(f"/dev/vfio/{grp}")
    results["list"] = vfioctl("list", "-o", "json")

    # the operator gives it back: the rule goes with its last matching record
    results["unbind"] = vfioctl("unbind", LONE, LONE2)
    results["after_unbind"] = {LONE: driver(LONE), LONE2: driver(LONE2)}
    results["unbind_all"] = vfioctl("unbind", "--all")
    results["rules_left"] = os.path.exists(RULES)
    results["record_left"] = os.path.exists(RECORD)
finally:
    sh("udevadm", "control", "--exit")
    with open(os.path.join(OUT, "persist.json"), "w") as f:
        json.dump(results, f, indent=1)
