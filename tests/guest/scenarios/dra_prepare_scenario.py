"""Runs INSIDE the guest (real kernel, emulated IOMMU): the DRA Prepare handler on real sysfs.

ResourceClaims come from a JSON file standing in for the API server (the kubelet/API-server
stand-ins are proven outside); everything else is real: sysfs writes, /dev/vfio nodes, a
process holding a group open, podman as the CDI consumer. Results go to
$GUEST_RIG_OUT/dra.json for tests/guest/test_dra_prepare_real_kernel.py; nothing here
decides pass/fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import traceback
from typing import Any

sys.path.insert(0, os.getcwd())

from tests.guest.cdi_consumer import podman_setup, run_with_cdi
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
SHARED_A, SHARED_B = "0000:03:01.0", "0000:03:02.0"
DRIVER = "vfio.example.com"
NODE = "guest"
STATE = "/var/lib/vfio-dp-scenario"
CLAIMS = f"{STATE}/claims.json"
CDI_DIR = "/var/run/cdi"
PLUGINS = "/var/lib/kubelet/plugins"
CONFIG = load_config_text(
    """
selectors:
  - vendor: "8086"
    device: "10d3"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "100e"
    path: dra
    bind: onPrepare
""",
    "scenario",
)
results: dict[str, Any] = {}


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def drivers() -> dict[str, str | None]:
    return {a: driver(a) for a in (LONE, LONE2, SHARED_A, SHARED_B)}


def group_of(addr: str) -> str:
    return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group"))


def name_of(addr: str) -> str:
    d, b, rest = addr.split(":")
    s, f = rest.split(".")
    return f"pci-{d}-{b}-{s}-{f}"


def load() -> dict[str, Any]:
    try:
        with open(CLAIMS) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except FileNotFoundError:
        return {}


def save(data: dict[str, Any]) -> None:
    os.makedirs(STATE, exist_ok=True)
    with open(CLAIMS, "w") as f:
        json.dump(data, f)


def add_claim(name: str, uid: str, addr: str) -> ClaimRef:
    data = load()
    data[name] = {
        "metadata": {"name": name, "namespace": "vms", "uid": uid},
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
    save(data)
    return ClaimRef("vms", uid, name)


def delete_claim(name: str) -> None:
    data = load()
    data.pop(name, None)
    save(data)


async def read(namespace: str, name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = load().get(name)
    return obj


def preparer() -> ClaimPreparer:
    return ClaimPreparer(
        host=Host("/"),
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


async def main() -> None:
    results["groups_of"] = {a: group_of(a) for a in (LONE, LONE2, SHARED_A, SHARED_B)}
    results["drivers_initial"] = drivers()
    p = preparer()
    a = add_claim("vm-lone", "uid-lone", LONE)
    b = add_claim("vm-shared", "uid-shared", SHARED_A)
    out = await p.prepare([a, b])
    results["prepare"] = {uid: answer(r) for uid, r in out.items()}
    results["drivers_prepared"] = drivers()
    results["nodes"] = sorted(os.listdir("/dev/vfio"))
    with open(f"{CDI_DIR}/{DRIVER}-uid-lone.json") as f:
        results["spec_lone"] = json.load(f)
    again = await p.prepare([a])
    results["prepare_again"] = answer(again["uid-lone"])

    # the real CDI consumer
    results["podman_setup"] = podman_setup()
    if results["podman_setup"]["rc"] == 0:
        ids = [x for d in results["prepare"]["uid-lone"]["devices"] for x in d["cdi"]]
        meta = results["spec_lone"]["devices"][-1]["containerEdits"]["mounts"][0]["containerPath"]
        results["podman_run"] = run_with_cdi(ids, meta)

    un = await p.unprepare([a])
    results["unprepare_lone"] = un
    results["drivers_after_unprepare"] = drivers()

    # SIGKILL with a prepared claim; its ResourceClaim deleted; a process holding the group
    c = add_claim("vm-killed", "uid-killed", LONE2)
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    results["child"] = {"rc": child.returncode, "stderr": child.stderr[-2000:]}
    results["drivers_after_kill"] = drivers()
    node = f"/dev/vfio/{group_of(LONE2)}"
    holder = subprocess.Popen(  # the scenario: a process holding the group open until killed
        [sys.executable, "-c",
         f"import os,time; fd=os.open({node!r}, os.O_RDWR); print('open', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    results["holder_started"] = holder.stdout.readline().strip() if holder.stdout else ""
    delete_claim("vm-killed")
    restarted = preparer()
    rep = await restarted.reconcile()
    results["reconcile_held"] = {"kept": rep.kept, "unprepared": rep.unprepared,
                                 "errors": rep.errors, "drivers": drivers()}  # fmt: skip
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    rep = await restarted.reconcile()
    results["reconcile_released"] = {"kept": rep.kept, "unprepared": rep.unprepared,
                                     "errors": rep.errors, "drivers": drivers()}  # fmt: skip
    del c

    delete_claim("vm-shared")
    rep = await restarted.reconcile()
    results["reconcile_shared"] = {"unprepared": rep.unprepared, "drivers": drivers()}

    # a host-used device (interface up with an address) is refused, nothing touched
    ifaces = os.listdir(f"/sys/bus/pci/devices/{LONE}/net") if driver(LONE) == "e1000e" else []
    if ifaces:
        subprocess.run(["ip", "link", "set", ifaces[0], "up"], check=False)
        subprocess.run(["ip", "addr", "add", "10.9.9.1/24", "dev", ifaces[0]], check=False)
        subprocess.run(["ip", "route", "add", "10.8.0.0/16", "dev", ifaces[0]], check=False)
        d = add_claim("vm-used", "uid-used", LONE)
        out = await restarted.prepare([d])
        results["host_used"] = {"iface": ifaces[0], **answer(out["uid-used"]),
                                "drivers": drivers()}  # fmt: skip


def child_prepare_then_die() -> None:
    async def go() -> None:
        p = preparer()
        out = await p.prepare([ClaimRef("vms", "uid-killed", "vm-killed")])
        print(json.dumps(answer(out["uid-killed"])), file=sys.stderr, flush=True)

    asyncio.run(go())
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    child_prepare_then_die()
elif __name__ == "__main__":
    shutil.rmtree(STATE, ignore_errors=True)
    try:
        asyncio.run(main())
    except Exception:
        results["crash"] = traceback.format_exc()
    with open(os.path.join(OUT, "dra.json"), "w") as f:
        json.dump(results, f, indent=1)
