"""Runs INSIDE the guest (real kernel 6.1, emulated IOMMU): one pool for containers and VMs.

A plain QEMU NVMe controller (``1b36:0010``, class 010802, alone in its IOMMU group) under a
selector with ``personalities: [vm, container]``. Claims come from a JSON file standing in
for the API server; Prepare/Unprepare are driven directly through the claim path
(:class:`ClaimPreparer`), as tests/guest/scenarios/dra_prepare_scenario.py does. Real: sysfs,
the nvme driver, /dev/nvme0n1, /dev/vfio/<N>, podman as the CDI consumer. Results go to
$GUEST_RIG_OUT/pool.json for tests/guest/test_pool_real_kernel.py; nothing here decides
pass/fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.getcwd())

from tests.guest.cdi_consumer import podman, podman_setup
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
DRIVER, OTHER = "vfio.example.com", "other.example.com"
NODE = "guest"
STATE = "/var/lib/vfio-dp-pool-scenario"
CLAIMS = f"{STATE}/claims.json"
CDI_DIR = "/var/run/cdi"
PLUGINS = "/var/lib/kubelet/plugins"
NO_NVME = "/etc/modprobe.d/vfio-dp-pool-scenario.conf"
ROUNDS = int(os.environ.get("POOL_ROUNDS", "2"))
VFIOCTL = os.path.join(os.path.dirname(sys.executable), "vfioctl")
CONFIG = load_config_text(
    """
selectors:
  - class: "0108"
    path: dra
    bind: onPrepare
    personalities: [vm, container]
""",
    "pool-scenario",
)
results: dict[str, Any] = {"timings": {}}


def nvme_address() -> str:
    for a in sorted(os.listdir("/sys/bus/pci/devices")):
        with open(f"/sys/bus/pci/devices/{a}/class") as f:
            if f.read().strip() == "0x010802":
                return a
    raise SystemExit("no NVMe controller (class 0x010802) in the guest")


NVME = nvme_address()


def driver() -> str | None:
    p = f"/sys/bus/pci/devices/{NVME}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def group() -> str:
    return os.path.basename(os.readlink(f"/sys/bus/pci/devices/{NVME}/iommu_group"))


def entry(native: bool) -> str:
    d, b, rest = NVME.split(":")
    s, f = rest.split(".")
    return f"pci-{d}-{b}-{s}-{f}" + ("-native" if native else "")


def state() -> dict[str, Any]:
    """The device as a test sees it: its driver, the nodes under /dev, its bind record."""
    rec = Host("/").ledger.record(PciAddress.parse(NVME))
    return {
        "driver": driver(),
        "nvme_nodes": sorted(n for n in os.listdir("/dev") if n.startswith(("nvme", "ng"))),
        "vfio_nodes": sorted(os.listdir("/dev/vfio")) if os.path.isdir("/dev/vfio") else [],
        "record": repr(rec),
    }


def sysdev_links() -> dict[str, Any]:
    """Every ``dev`` file below the device: does ``/sys/dev/{block,char}/<maj:min>`` lead
    back to the same directory (what host/devnodes.py relies on)?"""
    out: dict[str, Any] = {}
    top = f"/sys/bus/pci/devices/{NVME}"
    for d, dirs, files in os.walk(top):
        dirs[:] = [x for x in dirs if not os.path.islink(os.path.join(d, x)) and x != "subsystem"]
        if "dev" not in files:
            continue
        with open(os.path.join(d, "dev")) as f:
            mm = f.read().strip()
        sub = os.path.basename(os.path.realpath(os.path.join(d, "subsystem")))
        kind = "block" if sub == "block" else "char"
        link = f"/sys/dev/{kind}/{mm}"
        out[os.path.basename(d)] = {
            "kind": kind,
            "same": os.path.realpath(link) == os.path.realpath(d),
        }
    return out


def load() -> dict[str, Any]:
    try:
        with open(CLAIMS) as f:
            data: dict[str, Any] = json.load(f)
            return data
    except FileNotFoundError:
        return {}


def add_claim(name: str, uid: str, device: str, drv: str = DRIVER) -> ClaimRef:
    data = load()
    result = {"request": "dev", "driver": drv, "pool": NODE, "device": device}
    data[name] = {
        "metadata": {"name": name, "namespace": "pool", "uid": uid},
        "status": {"allocation": {"devices": {"results": [result]}}},
    }
    os.makedirs(STATE, exist_ok=True)
    with open(CLAIMS, "w") as f:
        json.dump(data, f)
    return ClaimRef("pool", uid, name)


async def read(namespace: str, name: str) -> dict[str, Any] | None:
    obj: dict[str, Any] | None = load().get(name)
    return obj


def preparer(drv: str = DRIVER) -> ClaimPreparer:
    return ClaimPreparer(
        host=Host("/"),
        driver=drv,
        node=NODE,
        cdi_dir=CDI_DIR,
        plugins_dir=PLUGINS,
        read_claim=read,
        config=lambda: CONFIG,
    )


async def prepare(p: ClaimPreparer, ref: ClaimRef, key: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    res = (await p.prepare([ref]))[ref.uid]
    results["timings"][key] = round(time.perf_counter() - t0, 3)
    return {
        "error": res.error,
        "cdi": [x for d in res.devices for x in d.cdi_device_ids],
        "state": state(),
    }


async def unprepare(p: ClaimPreparer, ref: ClaimRef, key: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    err = (await p.unprepare([ref]))[ref.uid]
    results["timings"][key] = round(time.perf_counter() - t0, 3)
    return {"error": err, "state": state()}


def spec(uid: str, drv: str = DRIVER) -> Any:
    with open(f"{CDI_DIR}/{drv}-{uid}.json") as f:
        return json.load(f)


def read_block(cdi: list[str]) -> dict[str, Any]:
    """A container given the claim's CDI devices lists its device nodes and reads the
    namespace's first block."""
    args = ["run", "--rm", "--network", "none"]
    for i in cdi:
        args += ["--device", i]
    script = (
        "busybox ls /dev; echo ---; "
        "busybox dd if=/dev/nvme0n1 bs=512 count=1 2>/dev/null | busybox head -c 64"
    )
    return podman(*args, "bb", "sh", "-c", script)


def list_vfio(cdi: list[str]) -> dict[str, Any]:
    args = ["run", "--rm", "--network", "none"]
    for i in cdi:
        args += ["--device", i]
    return podman(*args, "bb", "sh", "-c", "busybox ls /dev/vfio; echo ---; busybox ls /dev")


def vfioctl(*args: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    p = subprocess.run([VFIOCTL, *args], capture_output=True, text=True, timeout=300)
    return {
        "rc": p.returncode,
        "err": p.stderr[-1500:],
        "secs": round(time.perf_counter() - t0, 3),
        "state": state(),
    }


async def claim_watch_leg() -> dict[str, Any]:
    """The real DRA plugin in this process (its claim watch, its claim path, root ``/``)
    over the API-server stand-in; the scheduler stand-in allocates a VM claim on the NVMe
    and waits in PreBind; the plugin switches nvme -> vfio-pci and writes
    ``<driver>/ready``; then Prepare: ``Host.bind`` and ``Host.to_native`` are counted
    (wrapped here, in the test's process) and must not run. Driver ``watch.example.com``:
    a checkpoint of its own."""
    import tempfile

    from tests.dra.apiserver_standin import CLAIMS as CLAIM_KIND
    from tests.dra.apiserver_standin import DEVICE_CLASSES, NODES, ApiServerStandin
    from tests.dra.scheduler_standin import SchedulerStandin
    from vfio_dp.dra.options import DraOptions
    from vfio_dp.dra.plugin import DraPlugin

    drv = "watch.example.com"
    out: dict[str, Any] = {}
    work = tempfile.mkdtemp(prefix="pool-watch")
    for sub in ("registry", "plugins"):
        os.makedirs(f"{work}/{sub}")
    with open(f"{work}/config.yaml", "w") as f:
        f.write('selectors:\n  - class: "0108"\n    path: dra\n    bind: onPrepare\n'
                "    personalities: [vm, container]\n")  # fmt: skip
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # the stand-in's loopback
    api = ApiServerStandin(f"{work}/api")
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    api.seed(DEVICE_CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "vm"},
        "spec": {"selectors": [{"cel": {"expression":
            f'device.driver == "{drv}" && device.attributes["{drv}"].kind == "vfio"'}}]},
    })  # fmt: skip
    host = Host("/")
    calls: list[str] = []
    for name in ("bind", "to_native"):
        real = getattr(host, name)

        def counted(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            calls.append(_name)
            return _real(*a, **k)

        setattr(host, name, counted)
    plugin = DraPlugin(
        DraOptions(
            node_name=NODE, driver_name=drv, registry_dir=f"{work}/registry",
            plugins_dir=f"{work}/plugins", cdi_dir=CDI_DIR, config_path=f"{work}/config.yaml",
            root="/", resync=3600, metrics_port=0, uevents=False,
        ),
        api.client(),
        host=host,
    )  # fmt: skip
    await plugin.start()
    try:
        sched = SchedulerStandin(api, binding_timeout=120, interval=0.5)
        t0 = time.perf_counter()
        names: set[str] = set()
        while time.perf_counter() - t0 < 120:  # the whole pool at its newest generation
            names = {
                d["name"]
                for slices in sched.pools(NODE).values()
                for sl in slices
                for d in sl["spec"].get("devices") or []
            }
            if entry(False) in names and plugin.claim_watch and plugin.claim_watch.synced:
                break
            await asyncio.sleep(0.2)
        out["published"] = sorted(names)
        out["publish_problem"] = plugin.publisher.problem
        out["before"] = state()
        api.seed(CLAIM_KIND, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vmw", "namespace": "pool"},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
                "deviceClassName": "vm", "allocationMode": "ExactCount", "count": 1}}]}},
        })  # fmt: skip
        stored = sched.allocate("pool", "vmw", NODE)
        out["result"] = stored["status"]["allocation"]["devices"]["results"]
        t0 = time.perf_counter()
        decision = await asyncio.to_thread(sched.prebind, "pool", "vmw")
        results["timings"]["watch_switch_ahead"] = round(time.perf_counter() - t0, 3)
        out["prebind"] = [decision.outcome, decision.why]
        out["after_switch"] = state()
        (claim,) = [c for c in api.objects(CLAIM_KIND, "pool") if c["metadata"]["name"] == "vmw"]
        out["status_devices"] = (claim.get("status") or {}).get("devices") or []
        uid = claim["metadata"]["uid"]
        out["checkpoint_state"] = getattr(plugin.claims.checkpoint.get(uid), "state", None)
        calls.clear()
        ref = ClaimRef("pool", uid, "vmw")
        t0 = time.perf_counter()
        res = (await plugin.prepare([ref]))[uid]
        results["timings"]["watch_prepare"] = round(time.perf_counter() - t0, 3)
        out["prepare"] = {"error": res.error, "cdi": [x for d in res.devices
                                                      for x in d.cdi_device_ids]}  # fmt: skip
        out["prepare_host_calls"] = list(calls)
        out["after_prepare"] = state()
        out["unprepare"] = (await plugin.unprepare([ref]))[uid]
        sched.deallocate("pool", "vmw")
        out["after_unprepare"] = state()
    finally:
        await plugin.stop()
        api.stop()
    return out


async def main() -> None:
    results["nvme"] = NVME
    results["group"] = group()
    results["initial"] = state()
    results["sysdev_links"] = sysdev_links()
    results["podman_setup"] = podman_setup()
    p = preparer()

    # 1. a container claim: nvme stays, /dev/nvme0n1 in the CDI spec, podman reads a block
    ct1 = add_claim("ct1", "uid-ct1", entry(True))
    results["ct1"] = await prepare(p, ct1, "container_prepare_on_native")
    results["ct1_spec"] = spec("uid-ct1")
    results["ct1_podman"] = read_block(results["ct1"]["cdi"])
    results["ct1_unprepare"] = await unprepare(p, ct1, "container_unprepare")

    # 2. a VM claim: container -> VM; podman sees /dev/vfio/<N>; back to nvme; a container again
    vm1 = add_claim("vm1", "uid-vm1", entry(False))
    results["vm1"] = await prepare(p, vm1, "container_to_vm")
    results["vm1_spec"] = spec("uid-vm1")
    results["vm1_podman"] = list_vfio(results["vm1"]["cdi"])
    results["vm1_unprepare"] = await unprepare(p, vm1, "vm_unprepare_to_native")
    ct2 = add_claim("ct2", "uid-ct2", entry(True))
    results["ct2"] = await prepare(p, ct2, "container_prepare_after_vm")
    results["ct2_podman"] = read_block(results["ct2"]["cdi"])
    results["ct2_unprepare"] = await unprepare(p, ct2, "container_unprepare_2")

    # 2b. the claim watch: a VM claim switched ahead of its pod (binding conditions), the
    # scheduler stand-in's PreBind, then a Prepare that binds nothing (its own report)
    try:  # a loop of its own: the plugin makes its executor the loop's default and stops it
        results["watch"] = await asyncio.to_thread(lambda: asyncio.run(claim_watch_leg()))
    except Exception:
        results["watch"] = {"crash": traceback.format_exc()}

    # 3a. the operator's binding (a plain vfioctl bind) is refused for a container claim
    results["vfioctl_bind"] = vfioctl("bind", NVME)
    ct3 = add_claim("ct3", "uid-ct3", entry(True))
    results["ct3_refused"] = await prepare(p, ct3, "container_refused_operator")
    results["vfioctl_unbind"] = vfioctl("unbind", NVME)
    results["vfioctl_bind_2"] = vfioctl("bind", NVME)
    results["vfioctl_unbind_2"] = vfioctl("unbind", NVME)
    await p.unprepare([ct3])

    # 3b. a stale claim's group (another plugin's VM claim) whose native driver cannot be
    # loaded (nvme removed, modprobe made to fail): the switch to the native driver fails with
    # the reason and the device stays as it was
    other = preparer(OTHER)
    vmb = add_claim("vmb", "uid-vmb", entry(False), OTHER)
    results["vmb"] = await prepare(other, vmb, "other_vm_prepare")
    results["rmmod"] = subprocess.run(
        ["rmmod", "nvme"], capture_output=True, text=True, timeout=60
    ).returncode
    with open(NO_NVME, "w") as f:
        f.write("install nvme /bin/false\n")
    ct4 = add_claim("ct4", "uid-ct4", entry(True))
    results["ct4_refused"] = await prepare(p, ct4, "container_switch_refused")
    os.unlink(NO_NVME)
    results["modprobe"] = subprocess.run(
        ["modprobe", "nvme"], capture_output=True, text=True, timeout=60
    ).returncode
    results["after_modprobe"] = state()
    # 3c. nvme back: the same claim now switches the stale VM group to nvme (Host.to_native)
    results["ct4"] = await prepare(p, ct4, "vm_to_container_switch")
    results["ct4_podman"] = read_block(results["ct4"]["cdi"])
    results["ct4_unprepare"] = await unprepare(p, ct4, "container_unprepare_3")

    # 4. rounds of the switches, beside an in-process plain bind / unbind of the same device
    # (no interpreter start-up; vfioctl's whole-process times are in 3a)
    h = Host("/")
    addr = PciAddress.parse(NVME)
    rounds: dict[str, list[float]] = {}
    errors: list[str] = []

    def took(key: str, t0: float) -> None:
        rounds.setdefault(key, []).append(round(time.perf_counter() - t0, 3))

    for i in range(ROUNDS):
        vm = add_claim(f"vmr{i}", f"uid-vmr{i}", entry(False))
        ct = add_claim(f"ctr{i}", f"uid-ctr{i}", entry(True))
        t0 = time.perf_counter()
        errs = [(await p.prepare([vm]))[vm.uid].error]
        took("container_to_vm", t0)
        t0 = time.perf_counter()
        errs.append((await p.unprepare([vm]))[vm.uid])
        errs.append((await p.prepare([ct]))[ct.uid].error)
        took("vm_to_container", t0)
        errs.append((await p.unprepare([ct]))[ct.uid])
        t0 = time.perf_counter()
        h.bind([addr])
        took("host_bind", t0)
        t0 = time.perf_counter()
        h.unbind([addr])
        took("host_unbind", t0)
        errors.extend(e for e in errs if e)
    results["rounds"] = rounds
    results["round_errors"] = errors
    results["final"] = state()


if __name__ == "__main__":
    shutil.rmtree(STATE, ignore_errors=True)
    try:
        asyncio.run(main())
    except Exception:
        results["crash"] = traceback.format_exc()
    with open(os.path.join(OUT, "pool.json"), "w") as f:
        json.dump(results, f, indent=1)
