"""Runs INSIDE the guest (real kernel 6.1, emulated IOMMU): a switch ahead that cannot happen.

The machine (tests/guest/test_pool_real_kernel.py, ``refused_args``): a plain QEMU NVMe
controller and an e1000 NIC, both conventional PCI behind one ``pcie-pci-bridge``, so the
kernel puts the bridge, the NIC and the NVMe in ONE IOMMU group; the selector takes the
NVMe only (``class: "0108"``, ``personalities: [vm, container]``), the NIC is its group
sibling. The real DRA plugin runs in this process (its claim watch, its claim path, root
``/``) over the API-server stand-in; the scheduler stand-in allocates a VM claim on the
NVMe and waits in PreBind (tests/guest/scenarios/pool_scenario.py's ``claim_watch_leg``
does the same for the switch that succeeds).

``python pool_refused_scenario.py sibling``: the group is published while the NIC's
interface is down; then the host brings it up (``ip link set <if> up``) and a VM claim is
allocated: the switch must be refused (``<driver>/failed``, ``SwitchRefused``), nothing
touched, and the scheduler deallocates.

``python pool_refused_scenario.py probe``: the plugin is the real daemon (``vfioctl
dra-plugin``, a process of its own) run under ``$STRACE`` (``strace -P
/sys/bus/pci/drivers_probe -e inject=write:retval=13:when=1``: the kernel never sees the
daemon's first ``drivers_probe`` write and it "succeeds", as it does when the driver's probe
refuses the device); the interface is down, the VM claim's group bind finds a function on no
driver, rolls back, and the claim says ``DriverSwitchFailed``; both functions are back on
their drivers.

Results go to ``$GUEST_RIG_OUT/refused-<leg>.json``; nothing here decides pass/fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.getcwd())

from tests.dra.apiserver_standin import CLAIMS, DEVICE_CLASSES, NODES, ApiServerStandin
from tests.dra.scheduler_standin import SchedulerStandin
from vfio_dp.dra.options import DraOptions
from vfio_dp.dra.plugin import DraPlugin
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
NODE = "guest"
LEG = sys.argv[1] if len(sys.argv) > 1 else "sibling"
DRIVER = f"{LEG}.example.com"  # a checkpoint of its own per leg


def by_class(prefix: str) -> str:
    for a in sorted(os.listdir("/sys/bus/pci/devices")):
        with open(f"/sys/bus/pci/devices/{a}/class") as f:
            if f.read().strip().startswith(prefix):
                return a
    raise SystemExit(f"no PCI function of class {prefix} in the guest")


NVME, NIC = by_class("0x0108"), by_class("0x0200")
IFACE = sorted(os.listdir(f"/sys/bus/pci/devices/{NIC}/net"))[0]


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def iommu_groups() -> dict[str, list[str]]:
    """``/sys/kernel/iommu_groups/<N>/devices/*`` as the kernel has them."""
    base = "/sys/kernel/iommu_groups"
    return {g: sorted(os.listdir(f"{base}/{g}/devices")) for g in sorted(os.listdir(base))}


def state() -> dict[str, Any]:
    """Both functions as a test sees them: drivers, the interface's flags, the nodes, the
    NVMe's bind record."""
    with open(f"/sys/class/net/{IFACE}/flags") as f:
        flags = int(f.read().strip(), 16)
    return {
        "nvme_driver": driver(NVME),
        "nic_driver": driver(NIC),
        "iface_up": bool(flags & 1),
        "nvme_nodes": sorted(n for n in os.listdir("/dev") if n.startswith(("nvme", "ng"))),
        "vfio_nodes": sorted(os.listdir("/dev/vfio")) if os.path.isdir("/dev/vfio") else [],
        "records": [repr(Host("/").ledger.record(PciAddress.parse(a))) for a in (NVME, NIC)],
    }


def link(up: bool) -> int:
    return subprocess.run(
        ["ip", "link", "set", IFACE, "up" if up else "down"], capture_output=True, timeout=60
    ).returncode


async def leg() -> dict[str, Any]:
    out: dict[str, Any] = {"nvme": NVME, "nic": NIC, "iface": IFACE, "groups": iommu_groups()}
    out["group_of"] = {
        a: os.path.basename(os.readlink(f"/sys/bus/pci/devices/{a}/iommu_group"))
        for a in (NVME, NIC)
    }
    work = tempfile.mkdtemp(prefix=f"pool-{LEG}")
    for sub in ("registry", "plugins", "cdi"):
        os.makedirs(f"{work}/{sub}")
    with open(f"{work}/config.yaml", "w") as f:
        f.write('selectors:\n  - class: "0108"\n    path: dra\n    bind: onPrepare\n'
                "    personalities: [vm, container]\n")  # fmt: skip
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # the stand-ins' loopback
    out["link_down"] = link(False)  # published while nothing of the group is in use
    api = ApiServerStandin(f"{work}/api")
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    api.seed(DEVICE_CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vm"},
        "spec": {"selectors": [{"cel": {"expression":
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].kind == "vfio"'}}]},
    })  # fmt: skip
    if LEG == "probe":
        return await in_a_process(out, api, work)
    plugin = DraPlugin(
        DraOptions(
            node_name=NODE, driver_name=DRIVER, registry_dir=f"{work}/registry",
            plugins_dir=f"{work}/plugins", cdi_dir=f"{work}/cdi",
            config_path=f"{work}/config.yaml", root="/", resync=3600, metrics_port=0,
            uevents=False,
        ),
        api.client(),
    )  # fmt: skip
    await plugin.start()
    try:
        sched = SchedulerStandin(api, binding_timeout=120, interval=0.5)
        out["published"] = await published(sched, lambda: bool(
            plugin.claim_watch and plugin.claim_watch.synced))  # fmt: skip
        out["publish_problem"] = plugin.publisher.problem
        out["link_up"] = link(True)  # the host starts using the sibling after publication
        await allocate_and_prebind(out, api, sched)
        out["checkpoint"] = repr(plugin.claims.checkpoint.get(out["uid"]))
    finally:
        await plugin.stop()
        api.stop()
    out["holders"] = repr(Host("/").record_holders())
    return out


async def published(sched: SchedulerStandin, synced: Callable[[], bool]) -> list[str]:
    """The pool's device names once the group is published in both ways (and ``synced``)."""
    t0 = time.perf_counter()
    names: set[str] = set()
    while time.perf_counter() - t0 < 120:
        names = {
            d["name"]
            for slices in sched.pools(NODE).values()
            for sl in slices
            for d in sl["spec"].get("devices") or []
        }
        if {n for n in names if f"{n}-native" in names} and synced():
            break
        await asyncio.sleep(0.2)
    return sorted(names)


async def allocate_and_prebind(
    out: dict[str, Any], api: ApiServerStandin, sched: SchedulerStandin
) -> None:
    """The scheduler stand-in allocates a VM claim on the group and waits in PreBind."""
    out["before"] = state()
    api.seed(CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "vm", "namespace": "pool"},
        "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
            "deviceClassName": "vm", "allocationMode": "ExactCount", "count": 1}}]}},
    })  # fmt: skip
    stored = sched.allocate("pool", "vm", NODE)
    out["result"] = stored["status"]["allocation"]["devices"]["results"]
    out["uid"] = stored["metadata"]["uid"]
    t0 = time.perf_counter()
    decision = await asyncio.to_thread(sched.prebind, "pool", "vm")
    out["prebind_secs"] = round(time.perf_counter() - t0, 2)
    out["prebind"] = [decision.outcome, decision.why]
    out["condition"] = decision.condition
    out["after"] = state()
    (claim,) = [c for c in api.objects(CLAIMS, "pool") if c["metadata"]["name"] == "vm"]
    out["allocation_left"] = "allocation" in (claim.get("status") or {})


async def in_a_process(out: dict[str, Any], api: ApiServerStandin, work: str) -> dict[str, Any]:
    """The real daemon, ``vfioctl dra-plugin``, as a process of its own under ``$STRACE``
    (the fault of this leg; the stand-ins stay in this process, untraced); SIGTERM ends it."""
    vfioctl = os.path.join(os.path.dirname(sys.executable), "vfioctl")
    cmd = [
        *shlex.split(os.environ.get("STRACE", "")), vfioctl, "dra-plugin",
        "--kubeconfig", str(api.kubeconfig), "--node-name", NODE, "--driver-name", DRIVER,
        "--kubelet-registry-dir", f"{work}/registry", "--kubelet-plugins-dir",
        f"{work}/plugins", "--cdi-dir", f"{work}/cdi", "--config", f"{work}/config.yaml",
        "--resync", "3600", "--metrics-port", "0",
    ]  # fmt: skip
    with open(f"{OUT}/plugin-{LEG}.log", "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        sched = SchedulerStandin(api, binding_timeout=120, interval=0.5)
        out["published"] = await published(sched, lambda: True)  # a list of claims follows
        await allocate_and_prebind(out, api, sched)
    finally:
        plugin = [proc.pid]  # the daemon itself: strace's child, when traced
        with contextlib.suppress(OSError), open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            plugin = [int(x) for x in f.read().split()] or plugin
        for pid in plugin:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        out["plugin_exit"] = proc.wait(timeout=120)
        api.stop()
    path = f"/var/lib/vfio_dp/dra-{DRIVER}.checkpoint.json"
    with contextlib.suppress(FileNotFoundError), open(path) as f:
        out["checkpoint_file"] = json.load(f)
    out["checkpoint"] = repr((out.get("checkpoint_file") or {}).get("claims", {}).get(out["uid"]))
    out["holders"] = repr(Host("/").record_holders())
    return out


if __name__ == "__main__":
    try:
        results = asyncio.run(leg())
    except Exception:
        results = {"crash": traceback.format_exc()}
    with open(os.path.join(OUT, f"refused-{LEG}.json"), "w") as f:
        json.dump(results, f, indent=1)
