"""Runs INSIDE the guest: vfioctl side by side with driverctl and dpdk-devbind.py.

Same kernel, same devices (topology: 4 lone e1000e + a shared e1000 group), same moment.
Records raw observations (exit codes, drivers after, kernel group verdicts, wall times) to
$GUEST_RIG_OUT/compare.json; bench/compare_tools.py turns them into tables and
tests/guest/test_compare_tools.py asserts the facts.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
RUNS = int(os.environ.get("COMPARE_RUNS", "5"))
L = ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]
S1, S2 = "0000:05:01.0", "0000:05:02.0"


def _bridge_of(addr: str) -> str:
    """The PCIe-to-PCI bridge in the shared group (its address moves with the topology)."""
    grp = os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group")
    members = os.listdir(os.path.join(f"/sys/bus/pci/devices/{addr}", grp, "devices"))
    for m in members:
        with open(f"/sys/bus/pci/devices/{m}/class") as f:
            if f.read().strip().startswith("0x0604"):
                return m
    raise SystemExit(f"no bridge in the group of {addr}: {members}")


BRIDGE = _bridge_of(S1)
NATIVE = {**{a: "e1000e" for a in L}, S1: "e1000", S2: "e1000"}
VFIOCTL = os.path.join(os.path.dirname(sys.executable), "vfioctl")
TOOLS = ("vfioctl", "driverctl", "dpdk-devbind")


def sh(args: list[str]) -> dict[str, Any]:
    t0 = time.perf_counter()
    p = subprocess.run(args, capture_output=True, text=True, timeout=300)
    return {
        "argv": args,
        "rc": p.returncode,
        "out": p.stdout[-1500:],
        "err": p.stderr[-1500:],
        "secs": time.perf_counter() - t0,
    }


def driver(a: str) -> str | None:
    p = f"/sys/bus/pci/devices/{a}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def group(a: str) -> str:
    return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{a}/iommu_group"))


def kernel_viable(a: str) -> bool | None:
    try:
        fd = os.open(f"/dev/vfio/{group(a)}", os.O_RDWR)
    except OSError:
        return None
    try:
        buf = bytearray(struct.pack("<II", 8, 0))
        fcntl.ioctl(fd, 0x3B67, buf)
        return bool(struct.unpack("<II", buf)[1] & 1)
    finally:
        os.close(fd)


def write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


def reset() -> None:
    """Every device back on its native driver, no override, no records (between runs)."""
    for a, native in NATIVE.items():
        write(f"/sys/bus/pci/devices/{a}/driver_override", "\n")
        d = driver(a)
        if d != native:
            if d:
                write(f"/sys/bus/pci/drivers/{d}/unbind", a)
            write("/sys/bus/pci/drivers_probe", a)
    shutil.rmtree("/var/lib/vfio_dp/original", ignore_errors=True)
    assert all(driver(a) == n for a, n in NATIVE.items()), {a: driver(a) for a in NATIVE}


def bind_cmds(tool: str, addrs: list[str]) -> list[list[str]]:
    if tool == "vfioctl":
        return [[VFIOCTL, "bind", *addrs]]
    if tool == "driverctl":
        return [["driverctl", "--nosave", "set-override", a, "vfio-pci"] for a in addrs]
    return [["dpdk-devbind.py", "-b", "vfio-pci", *addrs]]


def restore_cmds(tool: str, addrs: list[str]) -> list[list[str]]:
    if tool == "vfioctl":
        return [[VFIOCTL, "unbind", *addrs]]
    if tool == "driverctl":
        return [["driverctl", "--nosave", "unset-override", a] for a in addrs]
    # dpdk-devbind keeps no record: the user must name the original driver
    return [["dpdk-devbind.py", "-b", NATIVE[addrs[0]], *addrs]]


def run_all(cmds: list[list[str]]) -> dict[str, Any]:
    res = [sh(c) for c in cmds]
    return {
        "rc": max(r["rc"] for r in res),
        "secs": sum(r["secs"] for r in res),
        "out": "".join(r["out"] for r in res),
        "err": "".join(r["err"] for r in res),
    }


def behaviour(tool: str) -> dict[str, Any]:
    b: dict[str, Any] = {}
    reset()
    r = run_all(bind_cmds(tool, [L[0]]))
    b["bind"] = {**r, "driver_after": driver(L[0])}
    r = run_all(restore_cmds(tool, [L[0]]))
    b["restore"] = {**r, "driver_after": driver(L[0])}
    reset()
    r = run_all(bind_cmds(tool, [S1]))
    b["half_group"] = {
        **r,
        "drivers_after": [driver(S1), driver(S2)],
        "kernel_viable_after": kernel_viable(S1),
    }
    reset()
    # a device the host is using: its interface is up with an address (no traffic: -net none)
    ifname = os.listdir(f"/sys/bus/pci/devices/{L[1]}/net")[0]
    sh(["ip", "addr", "add", "192.0.2.1/24", "dev", ifname])
    sh(["ip", "link", "set", ifname, "up"])
    r = run_all(bind_cmds(tool, [L[1]]))
    b["host_used"] = {**r, "driver_after": driver(L[1]), "ifname": ifname}
    reset()
    for name in os.listdir(f"/sys/bus/pci/devices/{L[1]}/net"):
        sh(["ip", "addr", "flush", "dev", name])
        sh(["ip", "link", "set", name, "down"])
    r = run_all(bind_cmds(tool, [L[2], BRIDGE]))
    b["failed_multi"] = {**r, "drivers_after": [driver(L[2]), driver(BRIDGE)]}
    reset()
    r = run_all(bind_cmds(tool, ["0000:99:00.0"]))
    b["missing_device"] = r
    reset()
    return b


def timed(tool: str, addrs: list[str]) -> dict[str, float]:
    binds, restores = [], []
    for _ in range(RUNS):
        reset()
        r = run_all(bind_cmds(tool, addrs))
        assert r["rc"] == 0 and all(driver(a) == "vfio-pci" for a in addrs), (tool, r)
        binds.append(r["secs"])
        r = run_all(restore_cmds(tool, addrs))
        assert r["rc"] == 0 and all(driver(a) == NATIVE[a] for a in addrs), (tool, r)
        restores.append(r["secs"])
    return {"bind": statistics.median(binds), "restore": statistics.median(restores), "runs": RUNS}


def main() -> None:
    results: dict[str, Any] = {"tools": {}, "reports": {}}
    # load the module once so no tool pays for it inside a timing
    sh(["modprobe", "vfio-pci"])
    for tool in TOOLS:
        results["tools"][tool] = {"behaviour": behaviour(tool)}
    results["reports"]["vfioctl"] = sh([VFIOCTL, "groups", "-o", "json"])
    results["reports"]["driverctl"] = sh(["driverctl", "list-devices"])
    results["reports"]["dpdk-devbind"] = sh(["dpdk-devbind.py", "--status-dev", "net"])
    step: Callable[[str, list[str]], dict[str, float]] = timed
    for tool in TOOLS:
        results["tools"][tool]["timing_1"] = step(tool, L[:1])
        results["tools"][tool]["timing_4"] = step(tool, L)
    reset()
    with open(os.path.join(OUT, "compare.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("compare scenario done")


if __name__ == "__main__":
    main()
