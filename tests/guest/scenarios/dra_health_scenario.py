"""Runs INSIDE the guest (real kernel, emulated IOMMU): DRA device health on real sysfs.

The DRA plugin (in process, real kernel uevents, ``--resync 5``) with the kubelet DRA stand-in
(official protos, following DRAResourceHealth) and the API-server stand-in on loopback. Two
claims are prepared (``bind: onPrepare``): the lone e1000e and the shared e1000 group. Then,
underneath the plugin:

1. the e1000e is unbound from vfio-pci → the times until the kubelet stand-in has UNHEALTHY,
   the slice carries the taint, and the claim's Ready condition is False; rebound → HEALTHY,
   taint gone, condition True;
2. one e1000 function is moved to the host driver e1000 → the same, with the reason; the CDI
   spec and ``/dev/vfio/<N>`` stay (nothing withdrawn); moved back.

Results (timings in seconds, messages, taints) go to $GUEST_RIG_OUT/dra_health.json for
tests/guest/test_dra_health_real_kernel.py; nothing here decides pass/fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.getcwd())

from tests.dra.apiserver_standin import CLAIMS, NODES, SLICES, ApiServerStandin
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from vfio_dp.dra.plugin import DraOptions, DraPlugin

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
LONE, SHARED_A, SHARED_B = "0000:01:00.0", "0000:03:01.0", "0000:03:02.0"
DRIVER = "vfio.dra.vfio-dp.io"
NODE = "guest"
WORK = "/var/lib/vfio-dp-health"
CONFIG = f"""
selectors:
  - {{addresses: ["{LONE}"], vendor: "8086", device: "10d3", path: dra, bind: onPrepare}}
  - {{vendor: "8086", device: "100e", path: dra, bind: onPrepare}}
"""
results: dict[str, Any] = {}


def sysfs_write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def group_of(addr: str) -> str:
    return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group"))


def name_of(addr: str) -> str:
    return "pci-" + addr.replace(":", "-").replace(".", "-")


def claim(name: str, addr: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "vms"},
        "spec": {
            "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "nic", "driver": DRIVER, "pool": NODE, "device": name_of(addr)}
                    ]
                }
            }
        },
    }


async def until(what: str, cond: Callable[[], bool], t0: float, timeout: float = 60) -> float:
    """Seconds from ``t0`` until ``cond()`` (polled every 10 ms); -1 on timeout."""
    while not cond():
        if time.monotonic() - t0 > timeout:
            results.setdefault("timeouts", []).append(what)
            return -1.0
        await asyncio.sleep(0.01)
    return round(time.monotonic() - t0, 3)


async def main() -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    with open(f"{WORK}/config.yaml", "w") as f:
        f.write(CONFIG)
    async with contextlib.AsyncExitStack() as stack:
        api = ApiServerStandin(f"{WORK}/api")
        api.start()
        stack.callback(api.stop)
        api.seed(NODES, {"metadata": {"name": NODE}})
        kubelet = KubeletDraStandin(f"{WORK}/registry", NODE, api_client=api.client())
        await kubelet.start()
        stack.push_async_callback(kubelet.stop)
        plugin = DraPlugin(
            DraOptions(
                node_name=NODE, driver_name=DRIVER, registry_dir=f"{WORK}/registry",
                plugins_dir=f"{WORK}/plugins", cdi_dir=f"{WORK}/cdi",
                config_path=f"{WORK}/config.yaml", resync=5.0, metrics_port=0,
            ),
            api.client(),
        )  # fmt: skip
        await plugin.start()
        stack.push_async_callback(plugin.stop)
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins, 300)
        results["health_version"] = kubelet.plugins[DRIVER].health_version
        lone, shared = name_of(LONE), name_of(SHARED_A)

        def devices() -> dict[str, dict[str, Any]]:
            return {d["name"]: d for s in api.objects(SLICES) for d in s["spec"]["devices"]}

        def health(dev: str) -> tuple[str, str]:
            return kubelet.health_of(DRIVER, NODE, dev)

        def ready(name: str) -> str | None:
            obj = next(c for c in api.objects(CLAIMS, "vms") if c["metadata"]["name"] == name)
            for d in (obj.get("status") or {}).get("devices") or []:
                if d["driver"] == DRIVER:
                    return str(d["conditions"][0]["status"])
            return None

        t0 = time.monotonic()
        await until("published", lambda: {lone, shared} <= set(devices()), t0, 300)
        await until("healthy", lambda: health(lone)[0] == health(shared)[0] == "Healthy", t0, 300)
        results["initial"] = {"lone": health(lone), "shared": health(shared)}
        refs = {}
        for name, addr in (("vm-lone", LONE), ("vm-shared", SHARED_A)):
            m = api.seed(CLAIMS, claim(name, addr))["metadata"]
            refs[name] = (m["namespace"], m["uid"], m["name"])
            await kubelet.run_pod(DRIVER, f"pod-{name}", "vms", [(m["uid"], name)])
        results["drivers_prepared"] = {a: driver(a) for a in (LONE, SHARED_A, SHARED_B)}
        # the claim's status is written after Prepare answers (never on its path): wait for it
        await until("ready", lambda: all(ready(n) == "True" for n in refs), time.monotonic())
        results["ready_prepared"] = {n: ready(n) for n in refs}

        # 1. the lone e1000e unbound underneath the plugin
        t0 = time.monotonic()
        sysfs_write("/sys/bus/pci/drivers/vfio-pci/unbind", LONE)
        results["unbind"] = {
            "stream": await until("unhealthy", lambda: health(lone)[0] == "Unhealthy", t0),
            "taint": await until("taint", lambda: bool(devices().get(lone, {}).get("taints")), t0),
            "condition": await until("condition", lambda: ready("vm-lone") == "False", t0),
            "message": health(lone)[1],
            "taints": devices().get(lone, {}).get("taints"),
            "published": lone in devices(),
            "pod": kubelet.pods["pod-vm-lone"].status,
        }
        t0 = time.monotonic()
        sysfs_write("/sys/bus/pci/drivers/vfio-pci/bind", LONE)
        results["rebind"] = {
            "stream": await until("healthy", lambda: health(lone)[0] == "Healthy", t0),
            "taint": await until(
                "untaint", lambda: "taints" not in devices().get(lone, {"taints": 1}), t0
            ),
            "condition": await until("condition", lambda: ready("vm-lone") == "True", t0),
            "driver": driver(LONE),
        }

        # 2. one function of the shared e1000 group goes to the host driver
        t_first = time.monotonic()
        sysfs_write(f"/sys/bus/pci/devices/{SHARED_B}/driver_override", "\n")
        sysfs_write("/sys/bus/pci/drivers/vfio-pci/unbind", SHARED_B)
        sysfs_write("/sys/bus/pci/drivers/e1000/bind", SHARED_B)
        # timed from the moment e1000 has it (its probe under emulation takes a while; the
        # plugin sees the unbind first, then the bind: two verdicts, each confirmed)
        t0 = time.monotonic()
        results["host_driver"] = {
            "writes": round(t0 - t_first, 3),
            "driver": driver(SHARED_B),
            "stream": await until("unhealthy", lambda: health(shared)[0] == "Unhealthy", t0),
            "taint": await until(
                "taint", lambda: bool(devices().get(shared, {}).get("taints")), t0
            ),
            "condition": await until("condition", lambda: ready("vm-shared") == "False", t0),
            "message": health(shared)[1],
            "taints": devices().get(shared, {}).get("taints"),
            "devnode": os.path.exists(f"/dev/vfio/{group_of(SHARED_A)}"),
            "cdi_spec": os.path.exists(f"{WORK}/cdi/{DRIVER}-{refs['vm-shared'][1]}.json"),
        }
        t0 = time.monotonic()
        sysfs_write("/sys/bus/pci/drivers/e1000/unbind", SHARED_B)
        sysfs_write(f"/sys/bus/pci/devices/{SHARED_B}/driver_override", "vfio-pci")
        sysfs_write("/sys/bus/pci/drivers/vfio-pci/bind", SHARED_B)
        results["host_driver_back"] = {
            "stream": await until("healthy", lambda: health(shared)[0] == "Healthy", t0),
            "taint": await until(
                "untaint", lambda: "taints" not in devices().get(shared, {"taints": 1}), t0
            ),
        }
        out = await kubelet.unprepare(DRIVER, list(refs.values()))
        results["unprepare"] = out
        results["drivers_after"] = {a: driver(a) for a in (LONE, SHARED_A, SHARED_B)}
        # our status entries are removed after Unprepare answers, likewise
        await until("status gone", lambda: all(ready(n) is None for n in refs), time.monotonic())
        results["status_after"] = {n: ready(n) for n in refs}


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception:
        results["crash"] = traceback.format_exc()
    with open(os.path.join(OUT, "dra_health.json"), "w") as f:
        json.dump(results, f, indent=1, default=str)
    time.sleep(0.1)
