"""Runs INSIDE the guest (real kernel, emulated IOMMU, QEMU's NVMe with SR-IOV): VFs made.

The PF is QEMU's emulated NVMe controller (``1b36:0010`` on ``nvme``, ``sriov_totalvfs`` 2).
In order, each step's observations into $GUEST_RIG_OUT/sriov.json (nothing decided here):

1. the device-plugin daemon (its node core) starts with a config asking ``numVfs: 2`` of the
   PF: the VFs are made and bound to vfio-pci, advertised to the kubelet stand-in under the
   selector's resource, and ``Allocate`` of one hands ``/dev/vfio/<N>``;
2. a process holds one VF's ``/dev/vfio/<N>`` open: ``vfioctl sriov set PF 1`` and
   ``vfioctl unbind --all`` are refused, ``vfioctl sriov -o json`` names the holder;
3. once it lets go, ``vfioctl unbind --all`` gives the PF back: 0 VFs, autoprobe 1;
3b. the DRA plugin (``vfioctl dra-plugin``, API-server and kubelet stand-ins) starts with a
   ``path: dra`` config asking ``numVfs: 2``: it makes and binds the VFs, publishes them
   (``pfPciBusID``, ``pcieRoot``, each consuming its PF's ``vfs`` counter); a claim on one is
   prepared and podman (a real CDI consumer) sees its ``/dev/vfio/<N>``; Unprepare; SIGTERM;
   ``vfioctl unbind --all`` gives the PF back again;
4. ``vfioctl sriov set PF 2`` is SIGKILLed (strace ``inject``) right after each of its
   writes to the PF; ``vfioctl sriov`` names the interrupted change and ``vfioctl unbind
   --all`` puts the PF back to 0 VFs / autoprobe 1.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
STATE = "/var/lib/vfio_dp"
results: dict[str, Any] = {"errors": []}


def save() -> None:
    with open(os.path.join(OUT, "sriov.json"), "w") as f:
        json.dump(results, f, indent=1)


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def link(path: str) -> str | None:
    return os.path.basename(os.readlink(path)) if os.path.lexists(path) else None


def find_pf() -> str:
    for d in sorted(glob.glob("/sys/bus/pci/devices/*")):
        ids = (read(f"{d}/vendor"), read(f"{d}/device"))
        if ids == ("0x1b36", "0x0010") and os.path.exists(f"{d}/sriov_totalvfs"):
            return os.path.basename(d)
    raise SystemExit("no SR-IOV NVMe PF in this guest")


PF = find_pf()
PFDIR = f"/sys/bus/pci/devices/{PF}"


def state() -> dict[str, Any]:
    vfs = []
    for v in sorted(glob.glob(f"{PFDIR}/virtfn*")):
        a = link(v)
        g = link(f"/sys/bus/pci/devices/{a}/iommu_group")
        vfs.append(
            {
                "address": a,
                "driver": link(f"/sys/bus/pci/devices/{a}/driver"),
                "group": g,
                "node": os.path.exists(f"/dev/vfio/{g}"),
            }
        )
    return {
        "pf_driver": link(f"{PFDIR}/driver"),
        "totalvfs": read(f"{PFDIR}/sriov_totalvfs"),
        "numvfs": read(f"{PFDIR}/sriov_numvfs"),
        "autoprobe": read(f"{PFDIR}/sriov_drivers_autoprobe"),
        "vfs": vfs,
        "sriov_records": sorted(os.path.basename(p) for p in glob.glob(f"{STATE}/sriov/*.json")),
        "sriov_journals": sorted(
            os.path.basename(p) for p in glob.glob(f"{STATE}/sriov/ops/*.json")
        ),
        "bind_records": sorted(os.path.basename(p) for p in glob.glob(f"{STATE}/original/*.json")),
    }


def run(cmd: list[str], timeout: float = 300) -> dict[str, Any]:
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return {"rc": p.returncode, "stdout": p.stdout[-4000:], "stderr": p.stderr[-4000:],
            "secs": round(time.monotonic() - t0, 2)}  # fmt: skip


def step(name: str, cmd: list[str] | None = None, timeout: float = 300) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if cmd is not None:
        out["run"] = run(cmd, timeout)
    out["state"] = state()
    results[name] = out
    save()
    return out


DAEMON = r"""
import asyncio, json, sys, tempfile
from tests.deviceplugin.kubelet_standin import KubeletStandin
from vfio_dp.deviceplugin.app import Daemon, Options

R = "devices.kubevirt.io/nvme-vf"

async def main():
    kdir = tempfile.mkdtemp(prefix="kdp", dir="/tmp")
    kubelet = KubeletStandin(kdir)
    await kubelet.start()
    d = Daemon(Options(root="/", kubelet_dir=kdir, config_path=sys.argv[1], metrics_port=0,
                       uevents=False, resync=2.0, pod_resources_socket=kdir + "/pr.sock"))
    await d.start()
    try:
        await kubelet.wait_for("2 VFs", lambda k: len(k.devices(R)) == 2, timeout=180)
        devices = kubelet.devices(R)
        first = sorted(devices)[0]
        resp = await kubelet.allocate(R, [first])
        print(json.dumps({"devices": devices, "allocated": first, "envs": dict(resp.envs),
                          "nodes": [x.host_path for x in resp.devices]}))
    finally:
        await d.stop()
        await kubelet.stop()

asyncio.run(main())
"""


DRA_LEG = r"""
import asyncio, json, os, signal, subprocess, sys, time
from kubernetes import client as k8s
from tests.dra.apiserver_standin import NODES, SLICES, ApiServerStandin, pool_counter_problems, validate_slice
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.guest.cdi_consumer import podman, podman_setup

CFG, WORK, NODE, DRIVER = sys.argv[1], "/run/sriov/dra", "guest", "vfio.dra.vfio-dp.io"
out = {}

async def main():
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)
    os.makedirs(WORK, exist_ok=True)
    os.makedirs("/var/lib/kubelet/plugins", exist_ok=True)
    api = ApiServerStandin(os.path.join(WORK, "api"), tls=True)
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    client = api.client()
    kubelet = KubeletDraStandin("/var/lib/kubelet/plugins_registry", NODE, api_client=client)
    await kubelet.start()
    log = open(os.path.join(WORK, "plugin.log"), "w")
    plugin = subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "dra-plugin",
         "--kubeconfig", api.kubeconfig, "--config", CFG, "--resync", "5", "--metrics-port", "0"],
        stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NODE_NAME": NODE})
    try:
        await kubelet.wait_for("registration", lambda k: k.usable(DRIVER), 180)

        def ours():
            return [s for s in api.objects(SLICES)
                    if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER]

        def vfs_published(_a):
            sl = ours()
            gen = max((s["spec"]["pool"]["generation"] for s in sl), default=-1)
            sl = [s for s in sl if s["spec"]["pool"]["generation"] == gen]
            return len([d for s in sl for d in s["spec"].get("devices") or []]) == 2 and \
                len(sl) == sl[0]["spec"]["pool"]["resourceSliceCount"]

        await asyncio.to_thread(api.wait_for, "2 VFs published", vfs_published, 180)
        slices = ours()
        out["slices"] = slices
        out["slice_problems"] = [validate_slice(s, None) for s in slices]
        out["pool_problems"] = pool_counter_problems(slices, allocated={d["name"] for s in slices for d in s["spec"].get("devices") or []})
        devices = sorted((d for s in slices for d in s["spec"].get("devices") or []),
                         key=lambda d: d["name"])
        dev = devices[0]
        rapi = k8s.ResourceV1Api(client)
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": "vf", "namespace": "default"},
                "spec": {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": DRIVER}}]}}}
        created = json.loads(rapi.create_namespaced_resource_claim("default", body, _preload_content=False).data)
        body["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
        body["status"] = {"allocation": {"devices": {"results": [
            {"request": "vf", "driver": DRIVER, "pool": NODE, "device": dev["name"]}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}}}
        rapi.replace_namespaced_resource_claim_status("vf", "default", body, _preload_content=False)
        uid = created["metadata"]["uid"]
        ref = ("default", uid, "vf")
        ans = (await kubelet.prepare(DRIVER, [ref]))[uid]
        ids = [i for d in ans.devices for i in d.cdi_device_ids]
        addr = dev["attributes"]["resource.kubernetes.io/pciBusID"]["string"]
        group = os.path.basename(os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group"))
        out["prepare"] = {"error": ans.error, "device": dev["name"], "address": addr,
                          "group": group, "ids": ids}
        setup = podman_setup()
        out["podman_setup"] = setup["rc"]
        args = ["run", "--rm", "--network", "none"]
        for i in ids:
            args += ["--device", i]
        out["podman"] = podman(*args, "bb", "sh", "-c", "ls /dev/vfio")
        un = await kubelet.unprepare(DRIVER, [ref])
        drv = f"/sys/bus/pci/devices/{addr}/driver"
        out["unprepare"] = {"answer": un, "driver": os.path.basename(os.readlink(drv)) if os.path.lexists(drv) else None}
    finally:
        plugin.send_signal(signal.SIGTERM)
        try:
            out["plugin_rc"] = plugin.wait(60)
        except subprocess.TimeoutExpired:
            plugin.kill()
            out["plugin_rc"] = "killed"
        await kubelet.stop()
        client.close()
        api.stop()
        log.close()
        out["plugin_log"] = open(os.path.join(WORK, "plugin.log")).read()[-3000:]
        with open(os.path.join(WORK, "leg.json"), "w") as f:
            json.dump(out, f)

asyncio.run(main())
"""


def proc_field(pid: int, name: str) -> str:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return line.split()[1]
    return ""


def traced(args: list[str], trace: list[str]) -> dict[str, Any]:
    """``vfioctl <args>`` with strace attached once its modules are imported (tracing Python's
    start-up under emulation would cost half a minute)."""
    code = (
        "import os, signal, json; import cli.main, cli.sriov_cmd, vfio_dp.host.sriov, "
        "vfio_dp.host.host, vfio_dp.host.bind, vfio_dp.dra.claimpath.holds, vfio_dp.model.plan; "
        "os.kill(os.getpid(), signal.SIGSTOP); cli.main.main()"
    )
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 240
    while proc_field(p.pid, "State") != "T" and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    tracer = subprocess.Popen([*trace, "-p", str(p.pid)])
    while proc_field(p.pid, "TracerPid") in ("0", "") and p.poll() is None:
        if tracer.poll() is not None or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGCONT)
    out, err = p.communicate(timeout=300)
    tracer.wait(timeout=60)
    return {"rc": p.returncode, "stdout": out[-3000:], "stderr": err[-3000:]}


t0 = time.monotonic()
results["pf"] = PF
step("boot")
os.makedirs("/run/sriov", exist_ok=True)
CFG = "/run/sriov/config.yaml"
with open(CFG, "w") as f:
    f.write(f'selectors:\n- addresses: ["{PF}"]\n  numVfs: 2\n  resourceName: nvme-vf\n')

# 1. the device-plugin daemon (its node core) makes and binds them, advertises them to the
#    kubelet stand-in, and Allocate hands /dev/vfio/<N>
core = step("core_start", [sys.executable, "-c", DAEMON, CFG])
try:
    core["daemon"] = json.loads(core["run"]["stdout"].strip().splitlines()[-1])
except (ValueError, IndexError) as e:
    results["errors"].append(f"daemon: {e}")
save()

# 2. a held VF blocks any count change
vfs = core["state"]["vfs"]
holder = None
if vfs and vfs[0]["node"]:
    node = f"/dev/vfio/{vfs[0]['group']}"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os,time; fd=os.open({node!r}, os.O_RDWR); "
            "print('holding', flush=True); time.sleep(900)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    results["holder_said"] = holder.stdout.readline().strip() if holder.stdout else ""
    step("held_set", [*VFIOCTL, "sriov", "set", PF, "1"])
    step("held_list", [*VFIOCTL, "sriov", "-o", "json", "--config", CFG])
    step("held_unbind_all", [*VFIOCTL, "unbind", "--all"])
    holder.kill()
    holder.wait()
else:
    results["errors"].append("no VF with a /dev/vfio node after the core started")

# 3. given back
step("unbind_all", [*VFIOCTL, "unbind", "--all"])

# 3b. the DRA plugin makes the VFs, publishes them (with their PF's counters), prepares a claim
#     on one for podman, gives it back at Unprepare; then the PF is given back again
CFG_DRA = "/run/sriov/config-dra.yaml"
with open(CFG_DRA, "w") as f:
    f.write(f'selectors:\n- addresses: ["{PF}"]\n  numVfs: 2\n  path: dra\n')
dra = step("dra", [sys.executable, "-c", DRA_LEG, CFG_DRA], timeout=600)
try:
    with open("/run/sriov/dra/leg.json") as f:
        dra["leg"] = json.load(f)
except (OSError, ValueError) as e:
    results["errors"].append(f"dra leg: {e}")
save()
step("dra_unbind_all", [*VFIOCTL, "unbind", "--all"])

# 4. SIGKILL after each write to the PF during creation
numvfs_path = os.path.realpath(f"{PFDIR}/sriov_numvfs")
auto_path = os.path.realpath(f"{PFDIR}/sriov_drivers_autoprobe")
results["kills"] = []


def first_after_write(log: str, syscall: str, only: str = "") -> int | None:
    """The per-thread count (strace's ``when`` counts per thread) of the first ``syscall``
    (on a file whose name contains ``only``) after the write to sriov_numvfs that no thread
    had reached before that write."""
    counts: dict[str, int] = {}
    reached: set[int] = set()
    written = False
    with open(log) as f:
        for line in f:
            tid, _, call = line.strip().partition(" ")
            call = call.lstrip()
            if call.startswith("write(") and "sriov_numvfs>" in call.split(",")[0]:
                written = True
                reached = {n for c in counts.values() for n in range(1, c + 1)}
            elif call.startswith(f"{syscall}(") and only in call.split(",")[0]:
                counts[tid] = counts.get(tid, 0) + 1
                if written and counts[tid] not in reached:
                    return counts[tid]
    return None


clean_log = "/run/sriov/clean.log"
clean = traced(["sriov", "set", "--no-bind", PF, "2"],
               ["strace", "-f", "-qq", "-y", "-o", clean_log, "-e", "trace=write,fsync,close",
                "-e", "signal=none"])  # fmt: skip
# k=2: the journal's next fsync after the count write (the change is made, not committed);
# k=3: the close of sriov_numvfs after it (committed: record written, journal removed)
points = {2: ("fsync", first_after_write(clean_log, "fsync")),
          3: ("close", first_after_write(clean_log, "close", "sriov_numvfs>"))}  # fmt: skip
results["clean_traced"] = {"run": clean, "points": points}
run([*VFIOCTL, "unbind", "--all"])
for k in (1, 2, 3):
    log = f"/run/sriov/kill{k}.log"
    if k == 1:  # on entering the 2nd write to the PF's files
        spec = ["strace", "-f", "-qq", "-y", "-o", log, "-P", numvfs_path, "-P", auto_path,
                "-e", "trace=write", "-e", "inject=write:signal=KILL:when=2"]  # fmt: skip
    else:
        name, when = points[k]
        if when is None:
            results["errors"].append(f"no {name} after the count write in {clean_log}")
            continue
        spec = ["strace", "-f", "-qq", "-y", "-o", log, "-e", f"trace={name}",
                "-e", f"inject={name}:signal=KILL:when={when}"]  # fmt: skip
        if name == "close":  # only sriov_numvfs's closes were counted for it
            spec[6:6] = ["-P", numvfs_path]
    case: dict[str, Any] = {"k": k, "run": traced(["sriov", "set", PF, "2"], spec)}
    case["after_kill"] = state()
    case["list"] = run([*VFIOCTL, "sriov", "-o", "json"])
    case["recovery"] = run([*VFIOCTL, "unbind", "--all"])
    case["after_recovery"] = state()
    results["kills"].append(case)
    save()

results["secs"] = round(time.monotonic() - t0, 1)
save()
print(f"sriov scenario done in {results['secs']} s")
