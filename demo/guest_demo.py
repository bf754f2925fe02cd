"""The whole story, run INSIDE the QEMU guest rig (real kernel 6.1, emulated Intel IOMMU).

Walks the toolkit through its real job on real devices and prints each step:

1. ``vfioctl groups``: the clean single-device groups and the shared group, with the reason.
2. ``vfioctl bind`` of a lone device (works), of one device of the shared group (refused,
   with the fix), then with ``--group`` (works).
3. The daemon (``vfioctl plugin``) starts against a kubelet stand-in and advertises the
   resources; a device pulled off vfio-pci underneath it turns Unhealthy within a second.
4. A KubeVirt VMI that asks for ``8086:10d3`` is translated (``vfioctl translate``), and so is
   a plain launcher Pod carrying the passthrough annotation: pod resource requests.
5. The kubelet stand-in admits that pod: GetPreferredAllocation, Allocate (env var and
   ``/dev/vfio/<N>``), PreStartContainer.
6. ``vfioctl hostdev`` turns the env into ``<hostdev>`` XML and a VM starts from it — with
   real libvirt (libvirtd + QEMU driver) when it runs here, else QEMU given exactly the device
   the XML names; the proof is the consumer holding the real VFIO group open.
7. Everything is unbound and the original drivers are back.

Then the same guest, the DRA path (``path: dra, bind: onPrepare`` for one lone e1000e):

8. ``vfioctl dra-plugin`` registers with the kubelet DRA stand-in and publishes its
   ResourceSlice to the API-server stand-in (over HTTPS on loopback, the real client).
9. A ResourceClaim is created there and allocated that e1000e's device (``status.allocation``
   written as the scheduler does); NodePrepareResources binds it to vfio-pci and writes the
   CDI spec and the KEP-5304 metadata file.
10. podman, a real CDI consumer, starts a container with the claim's CDI devices: it sees
    ``/dev/vfio/<N>`` and reads the metadata file, mounted read-only.
11. ``vfioctl hostdev --dra-metadata-dir`` resolves a VMI's claim-based ``hostDevices`` entry
    from that file into ``<hostdev managed='no'>`` and libvirt starts a VM with the device.
12. NodeUnprepareResources gives the NIC back to e1000e.
13. A VM that keeps ``deviceName``: a launcher-shaped pod asking ``devices.kubevirt.io/8086_10d3:
    1`` gets the NIC through DRA (an extended resource backed by a DeviceClass, KEP-5004): the
    scheduler stand-in makes and allocates the pod's claim, NodePrepareResources binds the NIC,
    podman sees ``/dev/vfio/<N>`` and ``PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3``,
    ``vfioctl hostdev`` turns that variable into ``<hostdev>`` and libvirt starts a VM with it;
    NodeUnprepareResources gives the NIC back; the plugin stops cleanly.

Writes ``$GUEST_RIG_OUT/demo.json`` (every step's facts) and ends with a one-line verdict;
exit status 1 if any step failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

OUT = os.environ.get("GUEST_RIG_OUT", "/tmp")
BIN = os.path.dirname(sys.executable)
VFIOCTL = os.path.join(BIN, "vfioctl")
LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
SHARED_A, SHARED_B = "0000:03:01.0", "0000:03:02.0"
NIC_RESOURCE = "devices.kubevirt.io/8086_10d3"
SHARED_RESOURCE = "devices.kubevirt.io/8086_100e"
KUBELET_DIR = "/run/kubelet-standin/device-plugins"
WORK = "/tmp/demo"

facts: dict[str, Any] = {"steps": {}}
failures: list[str] = []
#: The step running now, so a crash is reported against it ("0" = before step 1).
current: dict[str, str] = {"step": "0", "title": "start"}


def say(text: str = "") -> None:
    print(text, flush=True)


def run(
    argv: list[str],
    *,
    env: dict[str, str] | None = None,
    show: bool = True,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    shown = " ".join(a if a != VFIOCTL else "vfioctl" for a in argv)
    if show:
        say(f"$ {shown}")
    p = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=300,
        input=stdin,
        env={**os.environ, **(env or {})},
    )
    if show:
        for line in (p.stdout + p.stderr).rstrip().splitlines():
            say(f"  {line}")
        say(f"  (exit {p.returncode})")
    return p


def check(step: str, what: str, ok: bool, detail: str = "") -> bool:
    facts["steps"].setdefault(step, {"checks": []})["checks"].append(
        {"what": what, "ok": ok, "detail": detail}
    )
    say(f"  {'ok  ' if ok else 'FAIL'} {what}" + (f" — {detail}" if detail and not ok else ""))
    if not ok:
        failures.append(f"step {step}: {what}" + (f" ({detail.strip()})" if detail.strip() else ""))
    return ok


def in_guest() -> bool:
    """True inside the guest rig: the only place this script may bind devices."""
    try:
        with open("/proc/cmdline") as f:
            return "guestrig=1" in f.read().split()
    except OSError:
        return False


def verdict(n_checks: int, elapsed: float) -> str:
    """The one-line verdict: PASS, or the first failure (its step and why) and the rest."""
    if not failures:
        return (
            f"VERDICT: PASS — all {n_checks} checks held on the real kernel "
            f"({elapsed:.0f}s in the guest)"
        )
    line = f"VERDICT: FAIL — {failures[0]}"
    if len(failures) > 1:
        line += f"; {len(failures) - 1} more: " + "; ".join(failures[1:])
    return " ".join(line.split())  # one line, whatever the details hold


def driver(addr: str) -> str | None:
    p = f"/sys/bus/pci/devices/{addr}/driver"
    return os.path.basename(os.readlink(p)) if os.path.lexists(p) else None


def group(addr: str) -> int:
    return int(os.path.basename(os.readlink(f"/sys/bus/pci/devices/{addr}/iommu_group")))


def write(path: str, data: str) -> None:
    with open(path, "w") as f:
        f.write(data)


def header(n: str, title: str) -> None:
    current.update(step=n, title=title.split(" — ")[0])
    say()
    say(f"=== Step {n}: {title}")


# --------------------------------------------------------------------------------------------
def step1() -> None:
    header("1", "vfioctl groups — which devices can be passed through, and why not")
    run([VFIOCTL, "groups"])
    p = run([VFIOCTL, "groups", "-o", "json"], show=False)
    groups = {g["group"]: g for g in json.loads(p.stdout)}
    lone, shared = groups[group(LONE)], groups[group(SHARED_A)]
    facts["groups_initial"] = groups
    check("1", f"{LONE} is alone in IOMMU group {lone['group']}", lone["devices"] == [LONE])
    check(
        "1",
        f"{SHARED_A} and {SHARED_B} share group {shared['group']} with the bridge",
        {SHARED_A, SHARED_B} <= set(shared["devices"]) and len(shared["devices"]) == 3,
    )
    check(
        "1",
        "every problem names the device, its driver and the fix",
        all("vfioctl bind --group" in x["reason"] for x in shared["problems"]),
    )


def step2() -> None:
    header("2", "vfioctl bind — a lone device, one device of a shared group, then --group")
    p = run([VFIOCTL, "bind", LONE, LONE2])
    check(
        "2",
        "lone devices bound to vfio-pci",
        p.returncode == 0 and driver(LONE) == driver(LONE2) == "vfio-pci",
    )
    p = run([VFIOCTL, "bind", SHARED_A])
    check(
        "2",
        "one device of the shared group is refused, naming the sibling and the fix",
        p.returncode == 1
        and SHARED_B in p.stderr
        and f"--group {SHARED_A}" in p.stderr
        and driver(SHARED_A) == "e1000",
    )
    p = run([VFIOCTL, "bind", "--group", SHARED_A])
    check(
        "2",
        "--group binds both endpoints, never the bridge",
        p.returncode == 0 and driver(SHARED_A) == driver(SHARED_B) == "vfio-pci",
    )
    p = run([VFIOCTL, "groups", "-o", "json"], show=False)
    g = {x["group"]: x for x in json.loads(p.stdout)}[group(SHARED_A)]
    check(
        "2",
        "the kernel agrees the shared group is now viable (VFIO_GROUP_GET_STATUS)",
        g["viable"] is True and g["kernel_viable"] is True,
    )


# --------------------------------------------------------------------------------------------
async def steps_3_to_6() -> None:
    sys.path.insert(0, os.getcwd())
    from tests.deviceplugin.kubelet_standin import KubeletStandin

    header("3", "the device plugin daemon advertises the resources to the kubelet (stand-in)")
    shutil.rmtree(KUBELET_DIR, ignore_errors=True)
    kubelet = KubeletStandin(KUBELET_DIR)
    await kubelet.start()
    log = open(os.path.join(OUT, "daemon.log"), "w")  # noqa: SIM115 - closed in finally
    argv = [VFIOCTL, "plugin", "--kubelet-dir", KUBELET_DIR, "--resync", "5", "--metrics-port", "0"]
    say("$ " + " ".join(["vfioctl", *argv[1:]]) + " &")
    daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:

        def healthy(resource: str, n: int) -> Callable[[Any], bool]:
            return lambda k: list(k.devices(resource).values()).count("Healthy") == n

        secs = await kubelet.wait_for(
            "both resources registered and healthy",
            lambda k: healthy(NIC_RESOURCE, 2)(k) and healthy(SHARED_RESOURCE, 1)(k),
            timeout=120,
        )
        for r in (NIC_RESOURCE, SHARED_RESOURCE):
            say(f"  kubelet sees {r}: {kubelet.devices(r)}")
        check(
            "3",
            f"registered and listed in {secs:.1f}s: 2 x {NIC_RESOURCE}, "
            f"1 x {SHARED_RESOURCE} (one unit per IOMMU group)",
            True,
        )
        facts["registered_after_s"] = secs

        say(
            f"$ echo {SHARED_B} > /sys/bus/pci/drivers/vfio-pci/unbind; "
            f"echo e1000 > .../{SHARED_B}/driver_override; echo {SHARED_B} > drivers_probe"
            "   # what a careless tool does"
        )
        t0 = time.monotonic()
        write("/sys/bus/pci/drivers/vfio-pci/unbind", SHARED_B)
        write(f"/sys/bus/pci/devices/{SHARED_B}/driver_override", "\n")
        write("/sys/bus/pci/drivers_probe", SHARED_B)
        await kubelet.wait_for(
            "the half-bound group to turn Unhealthy",
            lambda k: list(k.devices(SHARED_RESOURCE).values()) == ["Unhealthy"],
            timeout=10,
        )
        flip = time.monotonic() - t0
        facts["half_bound_unhealthy_after_s"] = flip
        say(f"  kubelet sees {SHARED_RESOURCE}: {kubelet.devices(SHARED_RESOURCE)}")
        check(
            "3",
            f"half-bound shared group advertised Unhealthy after {flip:.2f}s (< 1 s)",
            flip < 1.0,
            f"{flip:.2f}s",
        )

        header("4", "a VM spec asking for 8086:10d3 becomes pod resource requests")
        os.makedirs(WORK, exist_ok=True)
        vmi = os.path.join(WORK, "vmi.yaml")
        write(
            vmi,
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n"
            "metadata: {name: demo, namespace: default}\nspec:\n  domain:\n"
            "    devices:\n      hostDevices:\n"
            '      - {name: nic1, deviceName: "8086:10D3"}\n',
        )
        p = run([VFIOCTL, "translate", vmi])
        check(
            "4",
            f"VMI deviceName 8086:10D3 rewritten to {NIC_RESOURCE}",
            p.returncode == 0 and f"deviceName: {NIC_RESOURCE}" in p.stdout,
        )
        pod = os.path.join(WORK, "launcher-pod.yaml")
        write(
            pod,
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: demo-launcher\n"
            "  annotations:\n    devices.kubevirt.io/passthrough: "
            '\'[{"name": "nic1", "vendor": "8086", "device": "10d3"}]\'\n'
            "spec:\n  containers:\n  - {name: compute, image: launcher}\n",
        )
        p = run([VFIOCTL, "translate", pod])
        want = f"{NIC_RESOURCE}: '1'"
        check(
            "4",
            f"launcher pod gets requests and limits {NIC_RESOURCE}: 1",
            p.returncode == 0 and p.stdout.count(want) >= 2,
            p.stdout[-400:],
        )
        write(os.path.join(WORK, "launcher-pod.translated.yaml"), p.stdout)

        header("5", "the kubelet admits the pod: GetPreferredAllocation → Allocate → PreStart")
        available = sorted(i for i, h in kubelet.devices(NIC_RESOURCE).items() if h == "Healthy")
        chosen = await kubelet.preferred(NIC_RESOURCE, available, [], 1)
        say(f"  GetPreferredAllocation({available}, size 1) → {chosen}")
        resp = await kubelet.allocate(NIC_RESOURCE, chosen)
        envs = dict(resp.envs)
        specs = [(d.host_path, d.container_path, d.permissions) for d in resp.devices]
        say(f"  Allocate({chosen}) → envs {envs}")
        say(f"                      devices {specs}")
        await kubelet.prestart(NIC_RESOURCE, chosen)
        say("  PreStartContainer → ok (devices still on vfio-pci, groups unchanged)")
        env_name = "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3"
        addr = envs.get(env_name, "")
        node = f"/dev/vfio/{group(addr)}" if addr in (LONE, LONE2) else "?"
        facts["allocate"] = {"envs": envs, "devices": specs, "chosen": chosen}
        check("5", f"{env_name}={addr} (KubeVirt's env var)", addr in (LONE, LONE2))
        check(
            "5",
            f"device specs hand over /dev/vfio/vfio and {node} with mrw, and it exists",
            ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw") in specs
            and (node, node, "mrw") in specs
            and os.path.exists(node),
        )

        header("6", "vfioctl hostdev → <hostdev> XML → a VM starts with the device")
        step6(vmi, env_name, addr)

        header("7", "SIGTERM the daemon; unbind; the original drivers are back")
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=60)
        await kubelet.wait_for(
            "the daemon's final empty lists", lambda k: not k.devices(NIC_RESOURCE), timeout=10
        )
        check(
            "7",
            "daemon exits 0 after SIGTERM, sends empty lists, removes its sockets",
            rc == 0 and not [f for f in os.listdir(KUBELET_DIR) if f.startswith("vfio_dp-")],
        )
    finally:
        if daemon.poll() is None:
            daemon.kill()
        await kubelet.stop()
        log.close()


def step6(vmi: str, env_name: str, addr: str) -> None:
    base = base_domain("demo")
    env = {env_name: addr}
    say(f"$ {env_name}={addr} vfioctl hostdev {vmi}")
    p = run([VFIOCTL, "hostdev", vmi], env=env, show=False)
    for line in p.stdout.splitlines():
        say(f"  {line}")
    m = re.search(
        r"bus=[\"']0x([0-9a-f]+)[\"'] slot=[\"']0x([0-9a-f]+)[\"'] function=[\"']0x([0-7])[\"']",
        p.stdout,
    )
    xml_addr = f"0000:{m.group(1)}:{m.group(2)}.{m.group(3)}" if m else None
    check(
        "6",
        "one <hostdev managed='no'> for the allocated address, alias ua-hostdevice-nic1",
        p.returncode == 0
        and xml_addr == addr
        and 'managed="no"' in p.stdout.replace("'", '"')
        and "ua-hostdevice-nic1" in p.stdout,
        p.stderr,
    )
    p = run([VFIOCTL, "hostdev", vmi, "--domain-xml", base], env=env, show=False)
    merged = os.path.join(WORK, "domain.merged.xml")
    write(merged, p.stdout)
    facts["hostdev_xml"] = p.stdout
    consumer = start_with_libvirt(vmi, base, env) or start_with_qemu(addr)
    facts["consumer"] = consumer
    vm_holds("6", consumer, f"/dev/vfio/{group(addr)}")


def base_domain(name: str) -> str:
    """``$WORK/<name>.xml``: the smallest q35 domain ``vfioctl hostdev --domain-xml`` merges
    a ``<hostdev>`` into (the VM is named ``name``); returns its path."""
    path = os.path.join(WORK, f"{name}.xml")
    write(
        path,
        f"<domain type='qemu'>\n  <name>{name}</name>\n  <memory unit='MiB'>128</memory>\n"
        "  <os><type arch='x86_64' machine='q35'>hvm</type></os>\n"
        "  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n"
        "    <graphics type='vnc' port='-1' autoport='yes' listen='127.0.0.1'/>\n"
        "  </devices>\n</domain>\n",
    )
    return path


def vm_holds(step: str, consumer: dict[str, Any], node: str) -> None:
    """Step ``step``'s check that the VM (``consumer``, from :func:`start_with_libvirt` or
    :func:`start_with_qemu`) holds the group ``node`` and a device fd open; then it stops
    (its ``stop`` is taken out of the facts)."""
    check(
        step,
        f"{consumer['how']} holds {node} and a vfio-device fd open — the VM has the device",
        node in consumer["fds"] and "anon_inode:[vfio-device]" in consumer["fds"],
        consumer.get("error", ""),
    )
    stop = consumer.pop("stop", None)
    if callable(stop):
        stop()


def vfio_fds(pid: int) -> list[str]:
    try:
        return sorted({os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")})
    except OSError:
        return []


def start_with_libvirt(
    vmi: str,
    base: str,
    env: dict[str, str],
    *,
    name: str = "demo",
    hostdev_args: tuple[str, ...] = (),
) -> dict[str, Any] | None:
    """Real libvirt's QEMU driver (the recipe in shared/reference/guest-rig.md): the domain
    ``name`` (as in ``base``) defined by ``vfioctl hostdev <vmi> <hostdev_args>``, started."""
    if not shutil.which("libvirtd") or not shutil.which("virsh"):
        say("  (libvirtd is not installed here; falling back to QEMU)")
        return None
    uri = "qemu:///system"
    if not libvirt_started:
        start_libvirtd(uri)
    # vfioctl defines the domain through libvirt-python (the libvirt adapter, for real)
    p = run(
        [VFIOCTL, "hostdev", vmi, *hostdev_args, "--domain-xml", base, "--connect", uri], env=env
    )
    if p.returncode != 0:
        say("  (libvirt did not accept the definition here; falling back to QEMU)")
        return None
    p = run(["virsh", "-c", uri, "start", name])
    if p.returncode != 0:
        say("  (libvirt could not start the domain here; falling back to QEMU)")
        return None
    pid = 0
    with contextlib.suppress(OSError, ValueError), open(f"/run/libvirt/qemu/{name}.pid") as f:
        pid = int(f.read().strip())
    fds: list[str] = []
    for _ in range(60):
        fds = vfio_fds(pid) if pid else []
        if "anon_inode:[vfio-device]" in fds:
            break
        time.sleep(0.5)
    run(["virsh", "-c", uri, "domstate", name])

    def stop() -> None:
        run(["virsh", "-c", uri, "destroy", name])

    return {"how": "libvirt (virsh start, QEMU driver)", "pid": pid, "fds": fds, "stop": stop}


#: libvirtd and virtlogd run (started once, by the first VM of the demo)
libvirt_started: list[bool] = []


def start_libvirtd(uri: str) -> None:
    libvirt_started.append(True)
    for d in (
        "/var/lib/libvirt/qemu",
        "/var/log/libvirt/qemu",
        "/var/cache/libvirt",
        "/run/libvirt",
    ):
        os.makedirs(d, exist_ok=True)
    with open("/etc/libvirt/qemu.conf", "a") as f:
        f.write("\nnamespaces = []\n")
    subprocess.run(["virtlogd", "-d"], check=False)
    subprocess.run(["libvirtd", "-d"], check=False)
    for _ in range(60):
        if subprocess.run(["virsh", "-c", uri, "version"], capture_output=True).returncode == 0:
            break
        time.sleep(0.5)


def start_with_qemu(addr: str) -> dict[str, Any]:
    argv = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-machine",
        "q35",
        "-m",
        "128",
        "-nodefaults",
        "-display",
        "none",
        "-serial",
        "none",
        "-monitor",
        "none",
        "-device",
        f"vfio-pci,host={addr}",
    ]
    say("$ " + " ".join(argv) + " &")
    q = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    fds: list[str] = []
    for _ in range(120):
        if q.poll() is not None:
            break
        fds = vfio_fds(q.pid)
        if "anon_inode:[vfio-device]" in fds:
            break
        time.sleep(0.5)
    err = "" if q.poll() is None else (q.stderr.read() if q.stderr else "")

    def stop() -> None:
        q.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            q.wait(timeout=30)

    return {"how": "QEMU (-device vfio-pci)", "pid": q.pid, "fds": fds, "stop": stop, "error": err}


def step7() -> None:
    if current["step"] != "7":  # steps 3-6 stopped early: step 7 still gives the devices back
        header("7", "unbind; the original drivers are back")
    p = run([VFIOCTL, "unbind", LONE, LONE2, SHARED_A, SHARED_B])
    back = {a: driver(a) for a in (LONE, LONE2, SHARED_A, SHARED_B)}
    facts["drivers_final"] = back
    check(
        "7",
        "every device is back on its original driver (e1000e, e1000)",
        p.returncode == 0
        and back == {LONE: "e1000e", LONE2: "e1000e", SHARED_A: "e1000", SHARED_B: "e1000"},
        str(back),
    )


# --------------------------------------------------------------------------------------------
# The DRA leg: the same lone e1000e, this time claimed through Dynamic Resource Allocation.
DRA_DRIVER = "vfio.dra.vfio-dp.io"  # vfioctl dra-plugin's default driver name
DRA_NODE = "guest"
DRA_NS, DRA_CLAIM, DRA_REQUEST = "default", "demo-nic", "nic"
DRA_WORK = "/var/lib/vfio-dp-demo"  # the API-server stand-in's kubeconfig and CA
CDI_DIR = "/var/run/cdi"
DRA_PLUGINS = "/var/lib/kubelet/plugins"
DRA_REGISTRY = "/var/lib/kubelet/plugins_registry"


def show_file(path: str) -> None:
    with open(path) as f:
        for line in f.read().splitlines():
            say(f"  {line}")


def reap(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def give_back_after_dra() -> None:
    """The DRA leg stopped early with the NIC on vfio-pci: give it back, never leave it."""
    if driver(LONE) != "e1000e":
        run([VFIOCTL, "unbind", LONE])
        check("12", f"{LONE} given back to e1000e after the DRA leg stopped early",
              driver(LONE) == "e1000e", str(driver(LONE)))  # fmt: skip


def dra_device_name(addr: str) -> str:
    """``pci-0000-01-00-0``: the DRA device that stands for ``addr``'s IOMMU group."""
    return "pci-" + addr.replace(":", "-").replace(".", "-")


async def steps_8_to_12() -> None:
    sys.path.insert(0, os.getcwd())
    from kubernetes import client as k8s

    from tests.dra.apiserver_standin import NODES, SLICES, ApiServerStandin
    from tests.dra.kubelet_dra_standin import KubeletDraStandin
    from tests.guest.cdi_consumer import podman_setup, run_with_cdi
    from vfio_dp.model import dra_metadata as md

    header(
        "8",
        "the DRA plugin registers with the kubelet (stand-in) and publishes ResourceSlices "
        "to the API server (stand-in)",
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(give_back_after_dra)  # runs last, whatever happened
        # the API-server stand-in listens on loopback; the rig's guest starts with lo down
        run(["ip", "link", "set", "lo", "up"])
        shutil.rmtree(DRA_WORK, ignore_errors=True)
        os.makedirs(DRA_WORK)
        api = ApiServerStandin(os.path.join(DRA_WORK, "api"), tls=True)
        api.start()
        stack.callback(api.stop)
        api.seed(NODES, {"metadata": {"name": DRA_NODE}})
        client = api.client()
        stack.callback(client.close)
        os.makedirs(DRA_PLUGINS, exist_ok=True)  # the kubelet makes it when it starts
        kubelet = KubeletDraStandin(DRA_REGISTRY, DRA_NODE, api_client=client)
        await kubelet.start()
        stack.push_async_callback(kubelet.stop)
        cfg = os.path.join(DRA_WORK, "config.yaml")
        write(
            cfg,
            "selectors:\n"
            f'  - {{addresses: ["{LONE}"], vendor: "8086", device: "10d3", '
            "path: dra, bind: onPrepare}\n",
        )
        say(f"$ cat {cfg}")
        show_file(cfg)
        log = stack.enter_context(open(os.path.join(OUT, "dra-plugin.log"), "w"))  # noqa: SIM115
        argv = [VFIOCTL, "dra-plugin", "--kubeconfig", api.kubeconfig, "--config", cfg,
                "--resync", "5", "--metrics-port", "0"]  # fmt: skip
        say(f"$ NODE_NAME={DRA_NODE} " + " ".join(["vfioctl", *argv[1:]]) + " &")
        plugin = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "NODE_NAME": DRA_NODE}
        )
        stack.callback(reap, plugin)
        dev = dra_device_name(LONE)
        claim_uid = ""
        t0 = time.monotonic()
        await kubelet.wait_for("the DRA plugin's registration", lambda k: k.usable(DRA_DRIVER), 120)
        view = kubelet.plugins[DRA_DRIVER]
        say(f"  kubelet registered {DRA_DRIVER}: {view.version} at {view.endpoint}")

        def ours() -> list[dict[str, Any]]:
            return [
                s for s in api.objects(SLICES)
                if s["spec"]["nodeName"] == DRA_NODE and s["spec"]["driver"] == DRA_DRIVER
            ]  # fmt: skip

        await asyncio.to_thread(api.wait_for, "the slices", lambda _a: bool(ours()), 60)
        secs = time.monotonic() - t0
        slices = ours()
        devices = [d for s in slices for d in s["spec"].get("devices") or []]
        facts["dra_slices"] = slices
        for d in devices:
            attrs = {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
            say(f"  ResourceSlice {slices[0]['metadata']['name']}: device {d['name']} {attrs}")
        check(
            "8",
            f"registered over v1.DRAPlugin and published in {secs:.1f}s",
            view.version == "v1.DRAPlugin" and view.endpoint.endswith(f"{DRA_DRIVER}/dra.sock"),
            view.version,
        )
        pci = md.PCI_BUS_ID
        check(
            "8",
            f"the slice holds exactly {dev} (pciBusID {LONE}); it stays on e1000e until "
            "a claim is prepared (bind: onPrepare)",
            [d["name"] for d in devices] == [dev]
            and devices[0]["attributes"].get(pci) == {"string": LONE}
            and driver(LONE) == "e1000e",
            json.dumps(devices)[-400:],
        )

        header("9", "a ResourceClaim is allocated that e1000e; NodePrepareResources binds it")
        rapi = k8s.ResourceV1Api(client)
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": DRA_CLAIM, "namespace": DRA_NS},
            "spec": {
                "devices": {
                    "requests": [{"name": DRA_REQUEST, "exactly": {"deviceClassName": DRA_DRIVER}}]
                }
            },
        }

        def create() -> dict[str, Any]:
            r = rapi.create_namespaced_resource_claim(DRA_NS, body, _preload_content=False)
            created: dict[str, Any] = json.loads(r.data)
            return created

        created = await asyncio.to_thread(create)
        claim_uid = created["metadata"]["uid"]
        say(f"  created ResourceClaim {DRA_NS}/{DRA_CLAIM} (uid {claim_uid})")
        # what the scheduler writes: the allocation, through the /status subresource
        allocated = {
            **body,
            "metadata": {**body["metadata"], "resourceVersion": created["metadata"]["resourceVersion"]},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": DRA_REQUEST, "driver": DRA_DRIVER, "pool": DRA_NODE,
                             "device": dev}
                        ]
                    },
                    "nodeSelector": {
                        "nodeSelectorTerms": [
                            {"matchFields": [{"key": "metadata.name", "operator": "In",
                                              "values": [DRA_NODE]}]}
                        ]
                    },
                }
            },
        }  # fmt: skip

        def allocate() -> None:
            rapi.replace_namespaced_resource_claim_status(
                DRA_CLAIM, DRA_NS, allocated, _preload_content=False
            )

        await asyncio.to_thread(allocate)
        say(f"  status.allocation (as the scheduler writes it): {DRA_REQUEST} → "
            f"{DRA_DRIVER}/{DRA_NODE}/{dev}")  # fmt: skip
        ref = (DRA_NS, claim_uid, DRA_CLAIM)
        answer = (await kubelet.prepare(DRA_DRIVER, [ref]))[claim_uid]
        ids = [i for d in answer.devices for i in d.cdi_device_ids]
        say(f"  NodePrepareResources({DRA_NS}/{DRA_CLAIM}) → error {answer.error!r}, "
            f"devices {[d.device_name for d in answer.devices]}")  # fmt: skip
        for i in ids:
            say(f"    CDI device {i}")
        node = f"/dev/vfio/{group(LONE)}"
        check(
            "9",
            f"prepared: {LONE} on vfio-pci, {node} exists, CDI IDs for the group and the metadata",
            answer.error == ""
            and [d.device_name for d in answer.devices] == [dev]
            and len(ids) == 2
            and driver(LONE) == "vfio-pci"
            and os.path.exists(node),
            answer.error,
        )
        spec_file = os.path.join(CDI_DIR, f"{DRA_DRIVER}-{claim_uid}.json")
        with open(spec_file) as f:
            spec = json.load(f)
        facts["dra_cdi_spec"] = spec
        edits = [d["containerEdits"] for d in spec["devices"]]
        nodes = [n["path"] for e in edits for n in e.get("deviceNodes", [])]
        mounts = [m for e in edits for m in e.get("mounts", [])]
        say(f"  {spec_file}: deviceNodes {nodes}")
        for m in mounts:
            say(f"    mount {m['hostPath']} → {m['containerPath']} {m['options']}")
        want_meta = md.container_path(DRA_CLAIM, DRA_REQUEST, DRA_DRIVER)
        check(
            "9",
            "the CDI spec hands over /dev/vfio/vfio and the group, and mounts the metadata "
            "file read-only where KubeVirt reads it",
            nodes == ["/dev/vfio/vfio", node]
            and [m["containerPath"] for m in mounts] == [want_meta]
            and "ro" in mounts[0]["options"],
            json.dumps(spec)[-400:],
        )

        header("10", "a real CDI consumer: podman starts a container with the claim's devices")
        setup = podman_setup()
        if setup["rc"] != 0:
            say(setup["stderr"])
        say(f"$ podman run --rm --network none {' '.join('--device ' + i for i in ids)} bb "
            f"sh -c 'ls /dev/vfio; cat {want_meta}; echo x >> ...'")  # fmt: skip
        t1 = time.monotonic()
        r = run_with_cdi(ids, want_meta)
        facts["dra_podman"] = {"setup": setup, "run": r, "run_s": time.monotonic() - t1}
        for line in (r["stdout"] + r["stderr"]).rstrip().splitlines():
            say(f"  {line}")
        say(f"  (exit {r['rc']}, {time.monotonic() - t1:.1f}s)")
        parts = r["stdout"].split("---\n")
        ls, meta, rw = [*parts, "", "", ""][:3]
        check(
            "10",
            f"the container sees /dev/vfio/vfio and {node}",
            r["rc"] == 0 and {"vfio", str(group(LONE))} <= set(ls.split()),
            r["stderr"][-300:],
        )
        first: dict[str, Any] = {}
        with contextlib.suppress(ValueError, IndexError):
            first = json.loads(meta.splitlines()[0])
        got = [
            d.get("attributes", {}).get(md.PCI_BUS_ID)
            for q in first.get("requests", [])
            for d in q.get("devices", [])
        ]
        check(
            "10",
            f"it reads the claim's device metadata (pciBusID {LONE}), mounted read-only",
            first.get("kind") == "DeviceMetadata"
            and got == [{"string": LONE}]
            and rw.strip() == "READONLY",
            meta[:300],
        )

        header("11", "vfioctl hostdev reads the metadata file → <hostdev> → libvirt starts a VM")
        # the files as virt-launcher's pod sees them: each CDI mount at its container path
        meta_dir = os.path.join(WORK, "dra-device-attributes")
        shutil.rmtree(meta_dir, ignore_errors=True)
        for m in mounts:
            rel = os.path.relpath(m["containerPath"], md.CONTAINER_BASE)
            os.makedirs(os.path.dirname(os.path.join(meta_dir, rel)), exist_ok=True)
            shutil.copyfile(m["hostPath"], os.path.join(meta_dir, rel))
            say(f"  (the pod's view: {m['hostPath']} at {meta_dir}/{rel})")
        vmi = os.path.join(WORK, "vmi-dra.yaml")
        write(
            vmi,
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n"
            "metadata: {name: demo-dra, namespace: default}\nspec:\n  domain:\n"
            "    devices:\n      hostDevices:\n"
            f"      - {{name: nic1, claimName: nic, requestName: {DRA_REQUEST}}}\n"
            f"  resourceClaims:\n  - {{name: nic, resourceClaimName: {DRA_CLAIM}}}\n",
        )
        say(f"$ cat {vmi}")
        show_file(vmi)
        p = run([VFIOCTL, "hostdev", vmi, "--dra-metadata-dir", meta_dir])
        m2 = re.search(
            r"bus=[\"']0x([0-9a-f]+)[\"'] slot=[\"']0x([0-9a-f]+)[\"'] function=[\"']0x([0-7])[\"']",
            p.stdout,
        )
        xml_addr = f"0000:{m2.group(1)}:{m2.group(2)}.{m2.group(3)}" if m2 else None
        check(
            "11",
            f"one <hostdev managed='no'> for {LONE}, alias ua-dra-hostdevice-nic1 (virt-launcher's)",
            p.returncode == 0
            and xml_addr == LONE
            and 'managed="no"' in p.stdout.replace("'", '"')
            and "ua-dra-hostdevice-nic1" in p.stdout,
            p.stderr,
        )
        base = base_domain("demo-dra")
        consumer = start_with_libvirt(
            vmi, base, {}, name="demo-dra", hostdev_args=("--dra-metadata-dir", meta_dir)
        ) or start_with_qemu(LONE)
        facts["dra_consumer"] = consumer
        vm_holds("11", consumer, node)

        header("12", "NodeUnprepareResources gives the NIC back to e1000e")
        un = await kubelet.unprepare(DRA_DRIVER, [ref])
        say(f"  NodeUnprepareResources({DRA_NS}/{DRA_CLAIM}) → {un}")
        check(
            "12",
            f"unprepared: {LONE} back on e1000e, the CDI spec and the metadata file removed",
            un == {claim_uid: ""}
            and driver(LONE) == "e1000e"
            and not os.path.exists(spec_file)
            and not any(os.path.exists(m["hostPath"]) for m in mounts),
            f"{un} driver={driver(LONE)}",
        )
        # the pod is gone: its claim goes too, and with it the allocation of the NIC
        await asyncio.to_thread(
            k8s.ResourceV1Api(client).delete_namespaced_resource_claim, DRA_CLAIM, DRA_NS
        )
        say(f"  deleted ResourceClaim {DRA_NS}/{DRA_CLAIM} (its pod is gone)")
        await step13(api, client, kubelet, cfg)

        say("$ kill -TERM <vfioctl dra-plugin>")
        plugin.send_signal(signal.SIGTERM)
        rc = await asyncio.to_thread(plugin.wait, 60)
        check(
            "13",
            "the DRA plugin exits 0 after SIGTERM and removes both of its sockets",
            rc == 0
            and not os.path.exists(f"{DRA_REGISTRY}/{DRA_DRIVER}-reg.sock")
            and not os.path.exists(f"{DRA_PLUGINS}/{DRA_DRIVER}/dra.sock"),
            f"exit {rc}",
        )


async def step13(api: Any, client: Any, kubelet: Any, cfg: str) -> None:
    """KEP-5004 on the real kernel: the launcher pod names a resource, never a claim."""
    from kubernetes import client as k8s

    from tests.dra.apiserver_standin import PODS, schedule_extended_resources
    from tests.guest.cdi_consumer import podman
    from vfio_dp.dra.deviceclasses import device_classes
    from vfio_dp.model.config import load_config_text
    from vfio_dp.model.naming import kubevirt_env_var

    header(
        "13",
        f"deviceName kept: a launcher pod asking {NIC_RESOURCE}: 1 is served through DRA "
        "(extended resource, KEP-5004); then the plugin stops",
    )
    with open(cfg) as f:
        conf = load_config_text(f.read(), cfg)
    rapi = k8s.ResourceV1Api(client)
    for c in device_classes(conf, DRA_DRIVER, [("8086", "10d3")]):
        await asyncio.to_thread(rapi.create_device_class, c)
        say(f"  DeviceClass {c['metadata']['name']} (extendedResourceName "
            f"{c['spec'].get('extendedResourceName')}), as `vfioctl deviceclasses` makes it")  # fmt: skip
    pod_name = "virt-launcher-vm-ext"
    res = {NIC_RESOURCE: "1"}
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod_name, "namespace": DRA_NS},
        "spec": {"containers": [{"name": "compute", "image": "x",
                                 "resources": {"limits": res, "requests": dict(res)}}]},
    }  # fmt: skip
    await asyncio.to_thread(k8s.CoreV1Api(client).create_namespaced_pod, DRA_NS, pod)
    claim = await asyncio.to_thread(schedule_extended_resources, api, DRA_NS, pod_name, DRA_NODE)
    stored = [p for p in api.objects(PODS, DRA_NS) if p["metadata"]["name"] == pod_name]
    if claim is None or not stored:
        check("13", "the scheduler (stand-in) made the pod's extended-resource claim", False)
        return
    say(f"  the scheduler made ResourceClaim {claim['metadata']['name']} for the pod's "
        f"{NIC_RESOURCE}: 1 and allocated it")  # fmt: skip
    ids = (await kubelet.prepare_pod(stored[0], [claim]))["compute"]
    node = f"/dev/vfio/{group(LONE)}"
    check(
        "13",
        f"NodePrepareResources of the pod's claim: {LONE} on vfio-pci, CDI devices for it",
        driver(LONE) == "vfio-pci" and bool(ids) and os.path.exists(node),
        f"ids={ids} driver={driver(LONE)}",
    )
    var = kubevirt_env_var(NIC_RESOURCE)
    say(f"$ podman run --rm --network none {' '.join('--device ' + i for i in ids)} bb "
        "sh -c 'ls /dev/vfio; echo ---; env'")  # fmt: skip
    args = ["run", "--rm", "--network", "none"]
    for i in ids:
        args += ["--device", i]
    r = podman(*args, "bb", "sh", "-c", "ls /dev/vfio; echo ---; env")
    ls, _, env_out = r["stdout"].partition("---\n")
    env = dict(line.split("=", 1) for line in env_out.splitlines() if "=" in line)
    facts["ext_podman"] = r
    say(f"  ls /dev/vfio: {' '.join(ls.split())}; {var}={env.get(var)}")
    check(
        "13",
        f"the container sees {node} and {var}={LONE} (what virt-launcher reads)",
        r["rc"] == 0 and str(group(LONE)) in ls.split() and env.get(var) == LONE,
        r["stderr"][-300:],
    )
    vmi = os.path.join(WORK, "vmi-ext.yaml")
    write(
        vmi,
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\n"
        "metadata: {name: demo-ext, namespace: default}\nspec:\n  domain:\n"
        "    devices:\n      hostDevices:\n"
        f"      - {{name: nic1, deviceName: {NIC_RESOURCE}}}\n",
    )
    base = base_domain("demo-ext")
    say(f"$ {var}={env.get(var)} vfioctl hostdev {vmi}")
    consumer = start_with_libvirt(
        vmi, base, {var: env.get(var, "")}, name="demo-ext"
    ) or start_with_qemu(LONE)
    facts["ext_consumer"] = consumer
    vm_holds("13", consumer, node)
    ref = (DRA_NS, claim["metadata"]["uid"], claim["metadata"]["name"])
    un = await kubelet.unprepare(DRA_DRIVER, [ref])
    say(f"  NodeUnprepareResources({claim['metadata']['name']}) → {un}")
    check(
        "13",
        f"unprepared: {LONE} back on e1000e",
        un == {ref[1]: ""} and driver(LONE) == "e1000e",
        f"{un} driver={driver(LONE)}",
    )


def main() -> int:
    t0 = time.monotonic()
    if not in_guest():
        # It binds 0000:01:00.0 and friends: on a real host those are real devices.
        failures.append(
            "step 0 (start): not inside the guest rig (no guestrig=1 on the kernel command "
            "line); this script binds devices for real, run it with `make demo`"
        )
        say(verdict(0, 0.0))
        return 1
    say(f"vfio_dp demo on a real kernel ({os.uname().release}) with an emulated Intel IOMMU")
    steps: list[tuple[str, Callable[[], None]]] = [
        ("1", step1),
        ("2", step2),
        ("3", lambda: asyncio.run(steps_3_to_6())),
        ("7", step7),
        ("8", lambda: asyncio.run(steps_8_to_12())),
    ]
    for _, step in steps:
        try:
            step()
        except Exception as e:  # a crash is a failed step, reported like one; go on
            import traceback

            traceback.print_exc()
            failures.append(f"step {current['step']} ({current['title']}): crashed: {e!r}")
    facts["failures"] = failures
    facts["elapsed_s"] = time.monotonic() - t0
    n = sum(len(s["checks"]) for s in facts["steps"].values())
    line = verdict(n, facts["elapsed_s"])
    facts["verdict"] = line
    with open(os.path.join(OUT, "demo.json"), "w") as f:
        json.dump(facts, f, indent=1, default=str)
    say()
    say(line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
