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
    from tests.daemon.kubelet_standin import KubeletStandin

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
    base = os.path.join(WORK, "domain.xml")
    write(
        base,
        "<domain type='qemu'>\n  <name>demo</name>\n  <memory unit='MiB'>128</memory>\n"
        "  <os><type arch='x86_64' machine='q35'>hvm</type></os>\n"
        "  <devices>\n    <emulator>/usr/bin/qemu-system-x86_64</emulator>\n"
        "    <graphics type='vnc' port='-1' autoport='yes' listen='127.0.0.1'/>\n"
        "  </devices>\n</domain>\n",
    )
    env = {env_name: addr}
    say(f"$ {env_name}={addr} vfioctl hostdev {vmi}")
    p = run([VFIOCTL, "hostdev", vmi], env=env, show=False)
    for line in p.stdout.splitlines():
        say(f"  {line}")
    m = re.search(r"bus=[\"']0x([0-9a-f]+)[\"'] slot=[\"']0x([0-9a-f]+)[\"'] function=[\"']0x([0-7])[\"']", p.stdout)
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
    node = f"/dev/vfio/{group(addr)}"
    check(
        "6",
        f"{consumer['how']} holds {node} and a vfio-device fd open — the VM has the device",
        node in consumer["fds"] and "anon_inode:[vfio-device]" in consumer["fds"],
        consumer.get("error", ""),
    )
    stop = consumer.get("stop")
    if callable(stop):
        stop()
        consumer.pop("stop", None)


def vfio_fds(pid: int) -> list[str]:
    try:
        return sorted({os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")})
    except OSError:
        return []


def start_with_libvirt(vmi: str, base: str, env: dict[str, str]) -> dict[str, Any] | None:
    """Real libvirt's QEMU driver (the recipe in shared/reference/guest-rig.md)."""
    if not shutil.which("libvirtd") or not shutil.which("virsh"):
        say("  (libvirtd is not installed here; falling back to QEMU)")
        return None
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
    uri = "qemu:///system"
    for _ in range(60):
        if subprocess.run(["virsh", "-c", uri, "version"], capture_output=True).returncode == 0:
            break
        time.sleep(0.5)
    # vfioctl defines the domain through libvirt-python (the libvirt adapter, for real)
    p = run([VFIOCTL, "hostdev", vmi, "--domain-xml", base, "--connect", uri], env=env)
    if p.returncode != 0:
        say("  (libvirt did not accept the definition here; falling back to QEMU)")
        return None
    p = run(["virsh", "-c", uri, "start", "demo"])
    if p.returncode != 0:
        say("  (libvirt could not start the domain here; falling back to QEMU)")
        return None
    pid = 0
    with contextlib.suppress(OSError, ValueError), open("/run/libvirt/qemu/demo.pid") as f:
        pid = int(f.read().strip())
    fds: list[str] = []
    for _ in range(60):
        fds = vfio_fds(pid) if pid else []
        if "anon_inode:[vfio-device]" in fds:
            break
        time.sleep(0.5)
    run(["virsh", "-c", uri, "domstate", "demo"])

    def stop() -> None:
        run(["virsh", "-c", uri, "destroy", "demo"])

    return {"how": "libvirt (virsh start, QEMU driver)", "pid": pid, "fds": fds, "stop": stop}


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
