"""Runs INSIDE the guest (real kernel 6.1, the sample mdev driver ``mtty``): DRA claims on
mediated devices, prepared and unprepared for real.

The rig built ``mtty.ko`` for this kernel (tests/guest/mdev_rig.py, ``$VFIO_DP_KO_DIR``).
ResourceClaims come from a JSON file standing in for the API server (the kubelet and
API-server stand-ins are proven outside, tests/dra/test_mdev_plugin.py); everything else is
real: the pool read from /sys/class/mdev_bus, ``<type>/create`` and ``remove`` writes, the
instance's /dev/vfio/<N>, a process holding it open, podman as the CDI consumer, strace
SIGKILLing a Prepare on its create write. Results go to $GUEST_RIG_OUT/mdev_dra.json for
tests/guest/test_mdev_dra_real_kernel.py; nothing here decides pass/fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import traceback
from typing import Any

sys.path.insert(0, os.getcwd())

from tests.guest.cdi_consumer import podman_setup, run_with_cdi
from vfio_dp.dra.claimpath import mdev
from vfio_dp.dra.claimpath.checkpoint import Checkpoint
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.host.mdev_ops import Mdevs
from vfio_dp.model.config import load_config_text

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
KO_DIR = os.environ.get("VFIO_DP_KO_DIR", "")
DRIVER = "vfio.example.com"
NODE = "guest"
STATE = "/var/lib/vfio-dp-mdev-dra-scenario"
CLAIMS = f"{STATE}/claims.json"
CDI_DIR = "/var/run/cdi"
PLUGINS = "/var/lib/kubelet/plugins"
TYPES = "/sys/class/mdev_bus/mtty/mdev_supported_types"
CONFIG = load_config_text(
    "mdev:\n- {parent: mtty, type: mtty-2, count: all, create: onPrepare, path: dra}\n",
    "scenario",
)
SLOT = "mdev-mtty-mtty-2-0"
results: dict[str, Any] = {}


def sh(*cmd: str) -> dict[str, Any]:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600)
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}


def instances() -> list[str]:
    d = "/sys/bus/mdev/devices"
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def load() -> dict[str, Any]:
    try:
        with open(CLAIMS) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except FileNotFoundError:
        return {}


def add_claim(name: str, uid: str, device: str) -> ClaimRef:
    data = load()
    data[name] = {
        "metadata": {"name": name, "namespace": "vms", "uid": uid},
        "status": {"allocation": {"devices": {"results": [
            {"request": "serial", "driver": DRIVER, "pool": NODE, "device": device}]}}},
    }  # fmt: skip
    os.makedirs(STATE, exist_ok=True)
    with open(CLAIMS, "w") as f:
        json.dump(data, f)
    return ClaimRef("vms", uid, name)


def delete_claim(name: str) -> None:
    data = load()
    data.pop(name, None)
    with open(CLAIMS, "w") as f:
        json.dump(data, f)


async def read(namespace: str, name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = load().get(name)
    return obj


def preparer() -> ClaimPreparer:
    return ClaimPreparer(
        host=Host("/", runner="dra-plugin"),
        driver=DRIVER,
        node=NODE,
        cdi_dir=CDI_DIR,
        plugins_dir=PLUGINS,
        read_claim=read,
        config=lambda: CONFIG,
    )


def answer(res: Any) -> dict[str, Any]:
    return {
        "error": res.error,
        "devices": [{"device": d.device_name, "cdi": list(d.cdi_device_ids)} for d in res.devices],
    }


def uuid_of(p: ClaimPreparer, uid: str) -> str | None:
    rec = p.checkpoint.get(uid)
    return rec.devices[0].mdev_uuid if rec is not None and rec.devices else None


async def main() -> None:
    results["modprobe_mdev"] = sh("modprobe", "mdev")
    results["modprobe_vfio"] = sh("modprobe", "vfio_iommu_type1")
    results["insmod_mtty"] = sh("insmod", f"{KO_DIR}/mtty.ko")
    pool = mdev.pool(Host("/"), CONFIG, {}, {})
    results["pool"] = [m.device.to_json() for m in pool]

    # a claim on a slot: the instance made at Prepare, with the UUID checkpointed first
    p = preparer()
    a = add_claim("tty-a", "uid-a", SLOT)
    out = await p.prepare([a])
    results["prepare_a"] = answer(out["uid-a"])
    u = uuid_of(p, "uid-a")
    results["uuid_a"] = u
    results["instances_prepared"] = instances()
    group = os.path.basename(os.readlink(f"/sys/bus/mdev/devices/{u}/iommu_group")) if u else ""
    results["group_a"] = group
    with open(f"{CDI_DIR}/{DRIVER}-uid-a.json") as f:
        results["spec_a"] = json.load(f)
    results["podman_setup"] = podman_setup()
    if results["podman_setup"]["rc"] == 0:
        ids = [x for d in results["prepare_a"]["devices"] for x in d["cdi"]]
        meta = results["spec_a"]["devices"][-1]["containerEdits"]["mounts"][0]["containerPath"]
        results["podman_run"] = run_with_cdi(ids, meta)

    # held open: Unprepare refuses, and the retry once it is free removes it
    holder = subprocess.Popen(
        [sys.executable, "-c", f"import os, time; fd = os.open('/dev/vfio/{group}', os.O_RDWR); "
         "print('open', flush=True); time.sleep(300)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    results["holder_open"] = holder.stdout.readline().strip() if holder.stdout else ""
    results["unprepare_held"] = await p.unprepare([a])
    results["instances_held"] = instances()
    holder.kill()
    holder.wait()
    delete_claim("tty-a")
    rep = await p.reconcile()
    results["reconcile_free"] = {"unprepared": rep.unprepared, "kept": rep.kept,
                                 "errors": rep.errors, "instances": instances()}  # fmt: skip

    # a plain Unprepare removes the instance
    b = add_claim("tty-b", "uid-b", SLOT)
    results["prepare_b"] = answer((await p.prepare([b]))["uid-b"])
    results["instances_b"] = instances()
    results["unprepare_b"] = await p.unprepare([b])
    results["instances_after_b"] = instances()

    # SIGKILL on the create write (after the checkpoint): nothing leaks; the retry makes the
    # UUID the checkpoint holds
    add_claim("tty-k", "uid-k", SLOT)
    trace = ["strace", "-f", "-qq", "-o", os.devnull, "-P", f"{os.path.realpath(TYPES)}/mtty-2/create",
             "-e", "trace=write", "-e", "inject=write:signal=KILL:when=1"]  # fmt: skip
    results["killed"] = sh(*trace, sys.executable, os.path.abspath(__file__), "--child")
    results["instances_after_kill"] = instances()
    recorded = Checkpoint(Host("/").fs, DRIVER).load().get("uid-k")
    results["checkpoint_after_kill"] = (
        None
        if recorded is None
        else {"state": recorded.state, "uuid": recorded.devices[0].mdev_uuid}
    )
    results["recover"] = Mdevs(Host("/", runner="dra-plugin"), by="dra-plugin").recover()
    again = preparer()
    k = ClaimRef("vms", "uid-k", "tty-k")
    results["prepare_k"] = answer((await again.prepare([k]))["uid-k"])
    results["uuid_k"] = uuid_of(again, "uid-k")
    results["instances_k"] = instances()
    results["unprepare_k"] = await again.unprepare([k])
    results["instances_end"] = instances()


def child() -> None:
    async def go() -> None:
        await preparer().prepare([ClaimRef("vms", "uid-k", "tty-k")])

    asyncio.run(go())


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    child()
elif __name__ == "__main__":
    shutil.rmtree(STATE, ignore_errors=True)
    try:
        asyncio.run(main())
    except Exception:
        results["crash"] = traceback.format_exc()
    with open(os.path.join(OUT, "mdev_dra.json"), "w") as f:
        json.dump(results, f, indent=1)
