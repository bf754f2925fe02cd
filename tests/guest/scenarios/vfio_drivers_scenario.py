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

Between the CLI legs and the hand-bound cases, the node processes, in this one process (no
extra interpreter start-up, which is what costs under emulation):

- the device-plugin daemon with ``bind: true`` against the kubelet stand-in
  (tests/deviceplugin): it binds the NIC to the variant, advertises it, and ``Allocate`` (a
  gRPC call over its unix socket) hands ``/dev/vfio/<N>``; ``vfioctl hostdev`` turns the
  allocated address into ``<hostdev>``, real libvirt (the recipe of demo/guest_demo.py) starts
  a VM with it; ``vfioctl unbind --all`` gives the NIC back to e1000e;
- the DRA plugin with ``bind: onPrepare`` against the API-server and kubelet DRA stand-ins
  (tests/dra): the slice carries ``vfioDriver``, NodePrepareResources binds the variant,
  NodeUnprepareResources gives e1000e back.
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

sys.path.insert(0, os.getcwd())  # tests.* and demo.* (the scenario runs from the checkout)

from tests.guest import qemu_holder

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
KO_DIR = os.environ["VFIO_DP_KO_DIR"]
LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
VARIANT, PROVIDER = "vfio_dp_e1000e_vfio_pci", "acme_accel"
RESOURCE = "devices.kubevirt.io/8086_10d3"
DRA_DRIVER, NODE = "vfio.dra.vfio-dp.io", "guest"
WORK = "/run/vfio-drivers"
results: dict[str, Any] = {"secs": {}}


def sh(*cmd: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=600,
                       env={**os.environ, **(env or {})})  # fmt: skip
    return {"rc": p.returncode, "stdout": p.stdout, "stderr": p.stderr[-4000:]}


VFIOCTL = (sys.executable, "-c", "from cli.main import main; main()")


def vfioctl(*args: str) -> dict[str, Any]:
    return sh(*VFIOCTL, *args)


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


def override(addr: str) -> str:
    return read(f"/sys/bus/pci/devices/{addr}/driver_override").strip()


async def device_plugin_leg(out: dict[str, Any]) -> None:
    """``bind: true`` daemon → kubelet stand-in → Allocate → ``vfioctl hostdev`` → libvirt."""
    from tests.deviceplugin.kubelet_standin import KubeletStandin
    from vfio_dp.deviceplugin.app import Daemon, Options

    cfg = f"{WORK}/dp.yaml"
    with open(cfg, "w") as f:
        f.write(f'selectors:\n  - {{addresses: ["{LONE}"], bind: true}}\n')
    kdir = f"{WORK}/kubelet"
    kubelet = KubeletStandin(kdir)
    await kubelet.start()
    daemon = Daemon(Options(root="/", kubelet_dir=kdir, config_path=cfg, metrics_port=0,
                            uevents=False, resync=2.0, pod_resources_socket=f"{kdir}/pr.sock"))  # fmt: skip
    await daemon.start()
    try:
        await kubelet.wait_for(
            "the NIC advertised Healthy",
            lambda k: "Healthy" in k.devices(RESOURCE).values(),
            timeout=300,
        )
        out["advertised"] = kubelet.devices(RESOURCE)
        out["driver_advertised"] = driver(LONE)
        # how today's libvirt tells a VFIO variant driver (src/util/virpci.c)
        out["vfio_dev_dir"] = os.path.isdir(f"/sys/bus/pci/devices/{LONE}/vfio-dev")
        out["override_advertised"] = override(LONE)
        ids = sorted(out["advertised"])
        resp = await kubelet.allocate(RESOURCE, ids[:1])
        out["envs"] = dict(resp.envs)
        out["nodes"] = [[d.host_path, d.permissions, os.path.exists(d.host_path)]
                        for d in resp.devices]  # fmt: skip
    finally:
        await daemon.stop()
        await kubelet.stop()
    out["driver_after_stop"] = driver(LONE)

    # the KubeVirt path from here: the allocated address → <hostdev> → a VM
    t0 = time.monotonic()
    vm_from_hostdev(out["envs"], out)
    results["secs"]["vm"] = round(time.monotonic() - t0, 1)


def vm_from_hostdev(envs: dict[str, str], out: dict[str, Any]) -> None:
    """``vfioctl hostdev`` defines the domain in real libvirt (demo/guest_demo.py's recipe)
    and ``virsh start`` starts it. libvirt older than 9.7 knows no VFIO driver but vfio-pci
    for ``managed='no'`` and refuses: then QEMU gets exactly the device the XML names."""
    from demo import guest_demo as demo

    uri = "qemu:///system"
    m = re.search(r"(\d+)\.(\d+)\.\d+", sh("libvirtd", "--version")["stdout"])
    out["libvirt_version"] = [int(m[1]), int(m[2])] if m else None
    os.makedirs(demo.WORK, exist_ok=True)
    vmi = f"{WORK}/vmi.yaml"
    with open(vmi, "w") as f:
        f.write("apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n"
                "metadata: {name: variant, namespace: default}\nspec:\n  domain:\n"
                "    devices:\n      hostDevices:\n"
                f"      - {{name: nic1, deviceName: {RESOURCE}}}\n")  # fmt: skip
    base = demo.base_domain("variant")
    demo.start_libvirtd(uri)
    out["hostdev"] = sh(*VFIOCTL, "hostdev", vmi, "--domain-xml", base, "--connect", uri,
                        env=envs)  # fmt: skip
    out["vm_xml"] = sh("virsh", "-c", uri, "dumpxml", "variant")["stdout"]
    out["virsh_start"] = sh("virsh", "-c", uri, "start", "variant")
    if out["virsh_start"]["rc"] == 0:
        pid = int(read("/run/libvirt/qemu/variant.pid").strip() or 0)
        fds: list[str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "anon_inode:[vfio-device]" not in fds:
            time.sleep(0.5)  # the poll period (QEMU under TCG takes seconds to open it)
            fds = demo.vfio_fds(pid)
        out["vm"] = {"how": "libvirt", "fds": fds}
        sh("virsh", "-c", uri, "destroy", "variant")
        return
    src = re.search(r"<source>\s*<address domain=.0x(\w+). bus=.0x(\w+). slot=.0x(\w+). "
                    r"function=.0x(\w+)./>", out["vm_xml"])  # fmt: skip
    out["vm"] = {"how": "none: no <source> address in the XML", "fds": []}
    if src:
        addr = f"{int(src[1], 16):04x}:{int(src[2], 16):02x}:{int(src[3], 16):02x}.{src[4]}"
        qemu = qemu_holder.start(addr)
        fds = qemu_holder.wait_for_vfio_fds(qemu, 120)
        out["vm"] = {"how": f"QEMU -device vfio-pci,host={addr}", "fds": fds,
                     "stderr": qemu_holder.stop(qemu)}  # fmt: skip


async def dra_leg(out: dict[str, Any]) -> None:
    """``bind: onPrepare`` DRA plugin: published with ``vfioDriver``; Prepare binds the
    variant, Unprepare gives e1000e back."""
    from tests.dra.apiserver_standin import CLAIMS, NODES, SLICES, ApiServerStandin
    from tests.dra.kubelet_dra_standin import KubeletDraStandin
    from vfio_dp.dra.plugin import DraOptions, DraPlugin

    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # the stand-in's loopback
    cfg = f"{WORK}/dra.yaml"
    with open(cfg, "w") as f:
        f.write(f'selectors:\n  - {{addresses: ["{LONE}"], path: dra, bind: onPrepare}}\n')
    name = "pci-" + LONE.replace(":", "-").replace(".", "-")
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
                node_name=NODE, driver_name=DRA_DRIVER, registry_dir=f"{WORK}/registry",
                plugins_dir=f"{WORK}/plugins", cdi_dir=f"{WORK}/cdi", config_path=cfg,
                resync=5.0, metrics_port=0,
            ),
            api.client(),
        )  # fmt: skip
        await plugin.start()
        stack.push_async_callback(plugin.stop)
        await kubelet.wait_for("registration", lambda k: k.usable(DRA_DRIVER), 300)

        def published() -> dict[str, Any]:
            return {d["name"]: d for s in api.objects(SLICES) for d in s["spec"]["devices"]}

        t0 = time.monotonic()
        while name not in published() and time.monotonic() - t0 < 300:
            await asyncio.sleep(0.1)  # the poll period; the slice is written by the plugin
        out["published"] = published().get(name)
        out["driver_published"] = driver(LONE)
        m = api.seed(CLAIMS, {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm-variant", "namespace": "vms"},
            "spec": {"devices": {"requests": [
                {"name": "nic", "exactly": {"deviceClassName": DRA_DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "nic", "driver": DRA_DRIVER, "pool": NODE, "device": name}]}}},
        })["metadata"]  # fmt: skip
        ref = (m["namespace"], m["uid"], m["name"])
        ans = (await kubelet.prepare(DRA_DRIVER, [ref]))[m["uid"]]
        out["prepare"] = {"error": ans.error,
                          "cdi": [i for d in ans.devices for i in d.cdi_device_ids]}  # fmt: skip
        out["driver_prepared"] = driver(LONE)
        out["override_prepared"] = override(LONE)
        out["node_prepared"] = os.path.exists(f"/dev/vfio/{group_of(LONE)}")
        with open(f"{WORK}/cdi/{DRA_DRIVER}-{m['uid']}.json") as f:
            spec = json.load(f)
        out["cdi_nodes"] = [n["path"] for d in spec["devices"]
                            for n in d["containerEdits"].get("deviceNodes", [])]  # fmt: skip
        out["unprepare"] = await kubelet.unprepare(DRA_DRIVER, [ref])
        out["driver_unprepared"] = driver(LONE)
        out["override_unprepared"] = override(LONE)


def leg(name: str, fn: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Run the async leg ``fn`` into ``results[name]``; a crash is recorded, never raised,
    and the NIC is given back whatever happened (the later steps need it on e1000e)."""
    out: dict[str, Any] = {}
    results[name] = out
    t0 = time.monotonic()
    try:
        asyncio.run(fn(out))
    except Exception:
        out["crash"] = traceback.format_exc()
    results["secs"][name] = round(time.monotonic() - t0, 1)


T0 = time.monotonic()
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

# -- the node processes: bind: true daemon (+ hostdev → libvirt), DRA onPrepare -----------
os.makedirs(WORK, exist_ok=True)
leg("device_plugin", device_plugin_leg)
step("restore_daemon_bind", "unbind", "-o", "json", "--all")
results["override_after_restore"] = override(LONE)
leg("dra", dra_leg)
if driver(LONE) != "e1000e":  # a leg that stopped early must not spoil the hand-bound cases
    results["cleanup"] = vfioctl("unbind", "--all")

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
results["secs"]["total"] = round(time.monotonic() - T0, 1)

with open(os.path.join(OUT, "vfio_drivers.json"), "w") as f:
    json.dump(results, f, indent=1)
print("vfio drivers scenario done")
