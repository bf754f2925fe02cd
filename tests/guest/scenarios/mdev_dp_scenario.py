"""Runs INSIDE the guest (real kernel 6.1), after mdev_scenario.py in the same boot: mediated
devices on the device-plugin path, for real.

``mtty`` is loaded (again, if the first scenario did not) and the REAL ``vfioctl plugin``
daemon runs as its own process against the kubelet stand-in (tests/deviceplugin, this
process, over the real unix sockets), with a config ``mdev:`` entry (``mtty-2``, count 2,
``path: devicePlugin``, the default resource name from the type's ``name``) and
``--cdi-dir``:

- it makes the two instances, advertises them Healthy, ``Allocate`` answers ``/dev/vfio/<N>``,
  ``MDEV_PCI_RESOURCE_<R>`` and the CDI names whose spec files name the nodes;
- a process holding an instance's ``/dev/vfio/<N>`` open makes ``vfioctl mdev remove --force``
  refuse;
- ``vfioctl hostdev`` turns Allocate's env into ``<hostdev type='mdev'>``, defined in the real
  libvirt of the guest, and ``virsh start`` starts the VM; while it runs, its QEMU holds the
  instance and ``vfioctl mdev remove --force`` refuses again;
- crash points of the config-driven path: the daemon SIGKILLed (``strace -e inject``) on
  entering the sysfs write of a create (count 2 -> 3) and of a remove (3 -> 2); each next
  daemon run finishes or undoes the journal and reaches the config's count; a config
  without the entry gives every instance back.

Everything observed goes into $GUEST_RIG_OUT/mdev_dp.json for
tests/guest/test_mdev_real_kernel.py; nothing here decides pass/fail (a crash of the leg is
recorded as ``crash``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
import traceback
from typing import Any

sys.path.insert(0, os.getcwd())  # tests.* and demo.* (the scenario runs from the checkout)

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
KO_DIR = os.environ["VFIO_DP_KO_DIR"]
TYPES = "/sys/class/mdev_bus/mtty/mdev_supported_types"
DEVICES = "/sys/bus/mdev/devices"
OPS = "/var/lib/vfio_dp/mdev/ops"
RESOURCE = "devices.kubevirt.io/Dual_port_serial"  # the default name of "Dual port serial"
WORK = "/run/mdev-dp"
KDIR = f"{WORK}/kubelet"
CDI = f"{WORK}/cdi"
VFIOCTL = [sys.executable, "-c", "from cli.main import main; main()"]
results: dict[str, Any] = {"secs": {}}
LOGS: dict[int, str] = {}  # a daemon's pid -> the file its output goes to


def sh(*cmd: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600,
                       env={**os.environ, **(env or {})})  # fmt: skip
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}


def instances() -> list[str]:
    return sorted(os.listdir(DEVICES)) if os.path.isdir(DEVICES) else []


def journals() -> list[str]:
    return sorted(os.listdir(OPS)) if os.path.isdir(OPS) else []


def group_of(uuid: str) -> str:
    return os.path.basename(os.readlink(f"{DEVICES}/{uuid}/iommu_group"))


def config(count: int | None) -> str:
    path = f"{WORK}/config-{count}.yaml"
    with open(path, "w") as f:
        if count is None:
            f.write("selectors: [{vendor: '8086', device: '10d3'}]\n")  # the entry is gone
        else:
            f.write(f"mdev:\n- {{parent: mtty, type: mtty-2, count: {count}}}\n")
    return path


async def start_plugin(cfg: str, trace: list[str] | None = None) -> asyncio.subprocess.Process:
    """``vfioctl plugin`` (under ``strace`` with ``trace``'s options), its stderr to a file."""
    argv = [*VFIOCTL, "plugin", "--kubelet-dir", KDIR, "--config", cfg, "--cdi-dir", CDI,
            "--metrics-port", "0", "--resync", "2",
            "--pod-resources-socket", f"{WORK}/no-pod-resources.sock"]  # fmt: skip
    if trace is not None:
        argv = ["strace", "-f", "-qq", "-o", os.devnull, *trace, *argv]
    path = f"{WORK}/plugin-{len(LOGS)}.log"
    with open(path, "wb") as log:
        p = await asyncio.create_subprocess_exec(*argv, stdout=log, stderr=log)
    LOGS[p.pid] = path
    return p


async def stop_plugin(p: asyncio.subprocess.Process) -> dict[str, Any]:
    if p.returncode is None:
        p.terminate()
    try:
        rc = await asyncio.wait_for(p.wait(), 120)
    except TimeoutError:
        p.kill()
        rc = await p.wait()
    with open(LOGS[p.pid]) as f:
        log = f.read()
    return {"rc": rc, "log": log[-6000:]}


async def until(what: str, pred: Any, timeout: float = 300) -> bool:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        await asyncio.sleep(0.2)  # the poll period; the daemon writes sysfs on its own
    results.setdefault("timeouts", []).append(what)
    return False


async def device_plugin_leg(out: dict[str, Any]) -> None:
    from tests.deviceplugin.kubelet_standin import KubeletStandin

    kubelet = KubeletStandin(KDIR)
    await kubelet.start()
    try:
        await served_and_allocated(kubelet, out)
        await crash_points(out)
    finally:
        await kubelet.stop()


async def served_and_allocated(kubelet: Any, out: dict[str, Any]) -> None:
    t0 = time.monotonic()
    plugin = await start_plugin(config(2))
    try:
        await kubelet.wait_for(
            "two instances advertised Healthy",
            lambda k: list(k.devices(RESOURCE).values()) == ["Healthy"] * 2,
            timeout=400,
        )
        results["secs"]["advertised"] = round(time.monotonic() - t0, 1)
        out["advertised"] = kubelet.devices(RESOURCE)
        out["instances"] = instances()
        out["list"] = sh(*VFIOCTL, "mdev", "-o", "json")
        ids = sorted(out["advertised"])
        resp = await kubelet.allocate(RESOURCE, ids)
        out["envs"] = dict(resp.envs)
        out["nodes"] = [[d.host_path, d.container_path, d.permissions, os.path.exists(d.host_path)]
                        for d in resp.devices]  # fmt: skip
        out["groups"] = {u: group_of(u) for u in ids}
        out["cdi_devices"] = [c.name for c in resp.cdi_devices]
        out["cdi_specs"] = {}
        for name in sorted(os.listdir(CDI)):
            with open(f"{CDI}/{name}") as f:
                out["cdi_specs"][name] = json.load(f)

        # a held instance refuses removal: a process holds its /dev/vfio/<N> open
        u = ids[0]
        holder = subprocess.Popen(
            [sys.executable, "-c", f"import os, time; fd = os.open('/dev/vfio/{group_of(u)}', "
             "os.O_RDWR); print('open', flush=True); time.sleep(300)"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        out["holder_open"] = holder.stdout.readline().strip() if holder.stdout else ""
        out["remove_held"] = {**sh(*VFIOCTL, "mdev", "remove", "--force", u),
                              "instances_after": instances()}  # fmt: skip
        holder.kill()
        holder.wait()

        # the KubeVirt path from here: Allocate's env -> <hostdev type='mdev'> -> a VM
        t1 = time.monotonic()
        vm_from_hostdev(out["envs"], u, out)
        results["secs"]["vm"] = round(time.monotonic() - t1, 1)
        out["advertised_at_end"] = kubelet.devices(RESOURCE)
    finally:
        out["plugin"] = await stop_plugin(plugin)
    out["instances_after_stop"] = instances()  # stopping never removes what the config wants


def vm_from_hostdev(envs: dict[str, str], uuid: str, out: dict[str, Any]) -> None:
    """``vfioctl hostdev`` defines the domain in real libvirt (demo/guest_demo.py's recipe);
    ``virsh start`` starts it; its QEMU then holds the instance's group."""
    from demo import guest_demo as demo

    uri = "qemu:///system"
    m = re.search(r"(\d+)\.(\d+)\.\d+", sh("libvirtd", "--version")["stdout"])
    out["libvirt_version"] = [int(m[1]), int(m[2])] if m else None
    os.makedirs(demo.WORK, exist_ok=True)
    vmi = f"{WORK}/vmi.yaml"
    with open(vmi, "w") as f:
        f.write("apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n"
                "metadata: {name: serial, namespace: default}\nspec:\n  domain:\n"
                "    devices:\n      hostDevices:\n"
                f"      - {{name: serial1, deviceName: {RESOURCE}}}\n")  # fmt: skip
    base = demo.base_domain("serial")
    demo.start_libvirtd(uri)
    env = {k: v for k, v in envs.items() if k.startswith("MDEV_PCI_RESOURCE_")}
    env = {**env, RESOURCE_ENV: envs[RESOURCE_ENV].split(",")[0]}  # one instance, one hostdev
    out["hostdev"] = sh(*VFIOCTL, "hostdev", vmi, "--config", config(2), "--domain-xml", base,
                        "--connect", uri, env=env)  # fmt: skip
    out["vm_xml"] = sh("virsh", "-c", uri, "dumpxml", "serial")["stdout"]
    out["nodedev_mdev"] = sh("virsh", "-c", uri, "nodedev-list", "--cap", "mdev")
    out["virsh_start"] = sh("virsh", "-c", uri, "start", "serial")
    out["vm"] = {"fds": []}
    if out["virsh_start"]["rc"] == 0:
        pid = 0
        try:
            with open("/run/libvirt/qemu/serial.pid") as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            pass
        fds: list[str] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and "anon_inode:[vfio-device]" not in fds:
            time.sleep(0.5)  # the poll period (QEMU under TCG takes seconds to open it)
            fds = demo.vfio_fds(pid) if pid else []
        out["vm"] = {"fds": fds, "domstate": sh("virsh", "-c", uri, "domstate", "serial")}
        out["remove_while_vm"] = {**sh(*VFIOCTL, "mdev", "remove", "--force", uuid),
                                  "instances_after": instances()}  # fmt: skip
        out["virsh_destroy"] = sh("virsh", "-c", uri, "destroy", "serial")
    else:
        out["libvirtd_log"] = sh("tail", "-n", "40", "/var/log/libvirt/qemu/serial.log")


RESOURCE_ENV = "MDEV_PCI_RESOURCE_DEVICES_KUBEVIRT_IO_DUAL_PORT_SERIAL"


async def crash_points(out: dict[str, Any]) -> None:
    """The daemon SIGKILLed on entering the sysfs write of a config-driven create, then of a
    remove; the next run of the same config finishes or undoes it."""
    before = instances()
    create = os.path.realpath(f"{TYPES}/mtty-2/create")
    p = await start_plugin(config(3), ["-P", create, "-e", "trace=write",
                                       "-e", "inject=write:signal=KILL:when=1"])  # fmt: skip
    out["kill_create"] = {**await stop_plugin_when_dead(p), "instances_after": instances(),
                          "journals_after": journals()}  # fmt: skip
    p = await start_plugin(config(3))
    await until("3 instances, no journal", lambda: len(instances()) == 3 and not journals())
    out["after_kill_create"] = {**await stop_plugin(p), "instances_after": instances(),
                                "journals_after": journals(), "before": before}  # fmt: skip

    three = instances()
    removes = [x for u in three for x in ("-P", os.path.realpath(f"{DEVICES}/{u}/remove"))]
    p = await start_plugin(config(2), [*removes, "-e", "trace=write",
                                       "-e", "inject=write:signal=KILL:when=1"])  # fmt: skip
    out["kill_remove"] = {**await stop_plugin_when_dead(p), "instances_after": instances(),
                          "journals_after": journals()}  # fmt: skip
    p = await start_plugin(config(2))
    await until("2 instances, no journal", lambda: len(instances()) == 2 and not journals())
    out["after_kill_remove"] = {**await stop_plugin(p), "instances_after": instances(),
                                "journals_after": journals(), "three": three}  # fmt: skip

    p = await start_plugin(config(None))
    await until("no instance", lambda: not instances() and not journals())
    out["entry_gone"] = {**await stop_plugin(p), "instances_after": instances(),
                         "journals_after": journals()}  # fmt: skip
    out["records_left"] = sorted(n for n in os.listdir("/var/lib/vfio_dp/mdev")
                                 if n.endswith(".json"))  # fmt: skip


async def stop_plugin_when_dead(p: asyncio.subprocess.Process) -> dict[str, Any]:
    """Wait for the SIGKILL (it comes at the sysfs write); stop it if it never comes."""
    try:
        await asyncio.wait_for(p.wait(), 400)
    except TimeoutError:
        results.setdefault("timeouts", []).append("the strace kill never came")
    return await stop_plugin(p)


T0 = time.monotonic()
os.makedirs(KDIR, exist_ok=True)
os.makedirs(CDI, exist_ok=True)
if not os.path.isdir("/sys/class/mdev_bus/mtty"):
    results["modprobe_mdev"] = sh("modprobe", "mdev")
    results["modprobe_vfio"] = sh("modprobe", "vfio_iommu_type1")
    results["insmod_mtty"] = sh("insmod", f"{KO_DIR}/mtty.ko")
results["instances_at_start"] = instances()
leg: dict[str, Any] = {}
results["device_plugin"] = leg
try:
    asyncio.run(device_plugin_leg(leg))
except Exception:
    leg["crash"] = traceback.format_exc()
results["secs"]["total"] = round(time.monotonic() - T0, 1)
with open(os.path.join(OUT, "mdev_dp.json"), "w") as f:
    json.dump(results, f, indent=1)
print("mdev device-plugin scenario done")
