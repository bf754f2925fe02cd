"""One pool for containers and VMs on a real kernel (issue 36 item 6; one guest boot).

A plain QEMU NVMe controller (``-device nvme,serial=…,drive=…``, no nvme-subsys) whose first
block holds a marker, under a selector with ``personalities: [vm, container]``.
tests/guest/scenarios/pool_scenario.py drives Prepare/Unprepare through the claim path
(:class:`vfio_dp.dra.claimpath.prepare.ClaimPreparer`): a container claim on
``pci-…-native`` keeps nvme and podman (a real CDI consumer) reads the marker from
/dev/nvme0n1; a VM claim puts the group on vfio-pci and podman sees /dev/vfio/<N>; its
Unprepare gives nvme back and a container claim gets /dev/nvme0n1 again; an operator's
binding is refused; a stale claim's group whose native driver cannot be loaded is left
on vfio-pci with the reason, then switched once nvme is back. Switch times are recorded beside
a plain ``vfioctl bind``/``unbind`` of the same device (numbers from inside the guest:
software emulation, compare only with each other).

A second boot of its own (``refused``: another machine shape, so the other tests' NVMe stays
alone in its group) puts an NVMe and an e1000 behind one ``pcie-pci-bridge`` (one IOMMU
group) and runs tests/guest/scenarios/pool_refused_scenario.py: switches ahead that cannot
happen end in ``<driver>/failed`` and leave both functions as they were.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import Guest
from .rig import DEFAULT_MODULES, Topology

pytestmark = pytest.mark.guest

SCRIPT = '"$PYTHON" tests/guest/scenarios/pool_scenario.py'
MARKER = b"vfio-dp pool marker: block 0 of the NVMe namespace"


def nvme_args(image: Path) -> list[str]:
    return [
        "-device", "pcie-root-port,id=rpn,chassis=9",
        "-drive", f"file={image},if=none,id=nvm0,format=raw",
        "-device", "nvme,serial=pool0,drive=nvm0,bus=rpn",
    ]  # fmt: skip


def refused_args(image: Path) -> list[str]:
    """An NVMe beside the e1000 of ``Topology(lone_e1000e=0, shared_e1000=1)``, behind the
    same ``pcie-pci-bridge`` (``br1``, slot 2): conventional PCI behind a PCIe-to-PCI bridge,
    so the kernel puts the bridge, the NIC and the NVMe in one IOMMU group."""
    return [
        "-drive", f"file={image},if=none,id=nvm1,format=raw",
        "-device", "nvme,serial=pool1,drive=nvm1,bus=br1,addr=2",
    ]  # fmt: skip


#: ``strace`` makes the kernel never see the plugin daemon's first write to ``drivers_probe``
#: and answers it with success: what the kernel answers when the driver's probe refuses the
#: device (``drivers_probe`` reports success even when nothing attached)
PROBE_REFUSED = (
    'STRACE="strace -f -qq --seccomp-bpf -e signal=none -o $GUEST_RIG_OUT/strace-probe.txt '
    '-e trace=write -P /sys/bus/pci/drivers_probe -e inject=write:retval=13:when=1" '
    '"$PYTHON" tests/guest/scenarios/pool_refused_scenario.py probe'
)


@pytest.fixture(scope="module")
def refused(guest: Guest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    image = tmp_path_factory.mktemp("nvme-shared") / "nvme.img"
    with open(image, "wb") as f:
        f.truncate(16 << 20)
    g = guest.with_options(
        topology=Topology(lone_e1000e=0, shared_e1000=1),
        modules=(*DEFAULT_MODULES, "nvme"),
        extra_qemu_args=refused_args(image),
    )
    res = g.run_many(
        {
            "sibling": '"$PYTHON" tests/guest/scenarios/pool_refused_scenario.py sibling',
            "probe": PROBE_REFUSED,
        },
        timeout=900,
    )
    out: dict[str, Any] = {}
    for leg, r in res.items():
        name = f"refused-{leg}.json"
        assert name in r.files, f"{r.stdout}\n{r.stderr}\n{r.console[-3000:]}"
        out[leg] = json.loads(r.files[name])
        assert "crash" not in out[leg], out[leg]["crash"]
    out["strace"] = res["probe"].files.get("strace-probe.txt", b"").decode()
    out["plugin_log"] = res["probe"].files.get("plugin-probe.log", b"").decode()[-3000:]
    return out


@pytest.fixture(scope="module")
def run(guest: Guest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    image = tmp_path_factory.mktemp("nvme") / "nvme.img"
    with open(image, "wb") as f:
        f.write(MARKER)
        f.truncate(16 << 20)
    g = guest.with_options(
        topology=Topology(lone_e1000e=1, shared_e1000=0),
        modules=(*DEFAULT_MODULES, "nvme"),
        extra_qemu_args=nvme_args(image),
    )
    res = g.run(SCRIPT, timeout=1200)
    assert "pool.json" in res.files, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    data: dict[str, Any] = json.loads(res.files["pool.json"])
    data["guest_total_secs"] = round(res.total_elapsed, 1)
    cache = Path(os.environ.get("VFIO_DP_CACHE") or Path.home() / ".cache" / "vfio_dp")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "pool_guest.json").write_text(json.dumps(data, indent=1))  # timings, for bench/
    assert "crash" not in data, data["crash"]
    return data


def marker_read(r: dict[str, Any]) -> None:
    assert r["rc"] == 0, r["stderr"]
    ls, block = r["stdout"].split("---\n")
    assert "nvme0n1" in ls.split() and "vfio" not in ls.split()
    assert MARKER.decode() in block


def test_boot_state_and_sysfs_links(run: dict[str, Any]) -> None:
    assert run["initial"]["driver"] == "nvme"
    assert "nvme0n1" in run["initial"]["nvme_nodes"]
    links = run["sysdev_links"]
    assert {"nvme0", "nvme0n1"} <= set(links), links
    assert all(v["same"] for v in links.values()), links
    assert links["nvme0n1"]["kind"] == "block" and links["nvme0"]["kind"] == "char"
    assert run["podman_setup"]["rc"] == 0, run["podman_setup"]["stderr"]


def test_container_claim_gets_the_namespace_and_podman_reads_it(run: dict[str, Any]) -> None:
    ct = run["ct1"]
    assert ct["error"] == "" and ct["state"]["driver"] == "nvme", ct
    native = "pci-" + run["nvme"].replace(":", "-").replace(".", "-") + "-native"
    assert ct["cdi"][0] == f"vfio.example.com/vfio=uid-ct1-{native}", ct["cdi"]
    assert ct["cdi"][1:] == ["vfio.example.com/vfio=uid-ct1-metadata-dev"], ct["cdi"]
    (dev,) = [d for d in run["ct1_spec"]["devices"] if d["name"].endswith("-native")]
    paths = [n["path"] for n in dev["containerEdits"]["deviceNodes"]]
    assert "/dev/nvme0n1" in paths and "/dev/nvme0" in paths
    assert not any(p.startswith("/dev/vfio") for p in paths)
    marker_read(run["ct1_podman"])
    un = run["ct1_unprepare"]
    assert un["error"] == "" and un["state"]["driver"] == "nvme", un


def test_vm_claim_then_back_to_a_container(run: dict[str, Any]) -> None:
    vm = run["vm1"]
    assert vm["error"] == "" and vm["state"]["driver"] == "vfio-pci", vm
    assert run["group"] in vm["state"]["vfio_nodes"] and "nvme0n1" not in vm["state"]["nvme_nodes"]
    nodes = run["vm1_spec"]["devices"][0]["containerEdits"]["deviceNodes"]
    assert {"path": f"/dev/vfio/{run['group']}"} in nodes
    r = run["vm1_podman"]
    assert r["rc"] == 0, r["stderr"]
    vfio, dev = r["stdout"].split("---\n")
    assert run["group"] in vfio.split() and "nvme0n1" not in dev.split()
    un = run["vm1_unprepare"]
    assert un["error"] == "" and un["state"]["driver"] == "nvme", un
    ct = run["ct2"]
    assert ct["error"] == "" and ct["state"]["driver"] == "nvme", ct
    marker_read(run["ct2_podman"])


def test_operator_binding_is_refused_for_a_container(run: dict[str, Any]) -> None:
    b = run["vfioctl_bind"]
    assert b["rc"] == 0 and b["state"]["driver"] == "vfio-pci", b
    r = run["ct3_refused"]
    assert "bound to VFIO by operator" in r["error"], r
    assert r["state"] == b["state"]  # nothing touched
    assert run["vfioctl_unbind"]["state"]["driver"] == "nvme", run["vfioctl_unbind"]


def test_switch_refused_by_native_driver_leaves_device_as_it_was(run: dict[str, Any]) -> None:
    vmb = run["vmb"]
    assert vmb["error"] == "" and vmb["state"]["driver"] == "vfio-pci", vmb
    assert run["rmmod"] == 0
    r = run["ct4_refused"]
    assert "restore to nvme did not take (now on no driver)" in r["error"], r
    assert f"put back as it was: {run['nvme']} on vfio-pci" in r["error"], r
    assert r["state"] == vmb["state"], (r["state"], vmb["state"])  # driver, nodes, record
    assert run["modprobe"] == 0 and run["after_modprobe"]["driver"] == "vfio-pci"
    ct = run["ct4"]
    assert ct["error"] == "" and ct["state"]["driver"] == "nvme", ct
    assert ct["state"]["record"] == "None"
    marker_read(run["ct4_podman"])


def test_switch_rounds_and_times_recorded(run: dict[str, Any]) -> None:
    assert run["round_errors"] == []
    r = run["rounds"]
    for k in ("container_to_vm", "vm_to_container", "host_bind", "host_unbind"):
        assert len(r[k]) == 2 and all(t > 0 for t in r[k]), r
    assert run["vfioctl_bind_2"]["secs"] > 0 and run["vfioctl_unbind_2"]["secs"] > 0
    assert run["final"]["driver"] == "nvme", run["final"]


def test_the_claim_watch_switches_a_vm_claim_ahead_and_prepare_binds_nothing(
    run: dict[str, Any],
) -> None:
    """Issue 36 item 4 on the real kernel: the real DRA plugin's claim watch sees the VM
    claim the scheduler stand-in allocated, puts the NVMe on vfio-pci before PreBind binds
    (``<driver>/ready`` True), and the Prepare that follows calls neither ``Host.bind`` nor
    ``Host.to_native``; Unprepare gives nvme back."""
    w = run["watch"]
    assert "crash" not in w, w.get("crash")
    nvme, group = run["nvme"], run["group"]
    vm = "pci-" + nvme.replace(":", "-").replace(".", "-")
    assert vm in w["published"] and f"{vm}-native" in w["published"], w["published"]
    assert w["before"]["driver"] == "nvme", w["before"]
    (result,) = w["result"]
    assert result["device"] == vm and result["bindingConditions"] == ["watch.example.com/ready"]
    assert w["prebind"] == ["bound", ""], w["prebind"]
    assert w["after_switch"]["driver"] == "vfio-pci" and group in w["after_switch"]["vfio_nodes"]
    (entry,) = [d for d in w["status_devices"] if d["driver"] == "watch.example.com"]
    ready = {c["type"]: c for c in entry["conditions"]}["watch.example.com/ready"]
    assert ready["status"] == "True" and f"{nvme} on vfio-pci" in ready["message"]
    assert w["checkpoint_state"] == "switched"
    assert w["prepare"]["error"] == "", w["prepare"]
    assert w["prepare_host_calls"] == [], w["prepare_host_calls"]
    assert w["after_prepare"]["driver"] == "vfio-pci"
    assert w["unprepare"] == "" and w["after_unprepare"]["driver"] == "nvme"


def same_group(leg: dict[str, Any]) -> str:
    """The kernel put the NVMe and the e1000 in ONE IOMMU group (else the refusal below could
    pass for another reason): its number."""
    nvme, nic = leg["nvme"], leg["nic"]
    group = leg["group_of"][nvme]
    assert leg["group_of"][nic] == group, leg["group_of"]
    assert {nvme, nic} <= set(leg["groups"][group]), leg["groups"]
    return str(group)


def test_a_switch_a_used_sibling_blocks_says_failed_and_leaves_both_as_they_were(
    refused: dict[str, Any],
) -> None:
    """Issue 36 item 6 on the real kernel: the VM claim's group holds an e1000 whose
    interface the host brought up after the group was published; the plugin's switch ahead
    is refused (``SwitchRefused``, the NIC and the fix named), nothing is touched, and the
    scheduler stand-in deallocates."""
    s = refused["sibling"]
    same_group(s)
    nic, iface = s["nic"], s["iface"]
    (result,) = s["result"]
    vm = result["device"]  # the group's VFIO entry (named after the group's first function)
    assert {vm, f"{vm}-native"} <= set(s["published"]), (s["published"], s["publish_problem"])
    assert s["link_up"] == 0
    before = s["before"]
    assert before["nvme_driver"] == "nvme" and before["nic_driver"] == "e1000", before
    assert before["iface_up"] and "nvme0n1" in before["nvme_nodes"], before
    assert result["bindingFailureConditions"] == ["sibling.example.com/failed"], result
    assert s["prebind"] == ["deallocated", f"{vm}: sibling.example.com/failed: SwitchRefused"]
    c = s["condition"]
    assert c["status"] == "True" and c["reason"] == "SwitchRefused", c
    assert nic in c["message"] and f"network interface {iface} is up" in c["message"], c
    fix = c["message"].split(f"{iface} is up", 1)[1]
    assert fix.startswith("; fix: "), c  # the way out, not only the cause
    assert f"ip link set {iface} down" in fix or "pick another device" in fix, c
    assert s["after"] == before  # drivers, the interface, the nodes, no bind record
    assert s["checkpoint"] == "None" and s["holders"] == "{}"
    assert not s["allocation_left"]


def test_a_switch_the_driver_refuses_says_failed_and_rolls_back_on_the_real_kernel(
    refused: dict[str, Any],
) -> None:
    """The VFIO driver's probe does not take a function of the group (the kernel never sees
    the first ``drivers_probe`` write and reports success, as it does when a probe refuses):
    the group bind finds it on no driver, rolls every function back to its driver, and the
    claim says ``DriverSwitchFailed``; the scheduler stand-in deallocates."""
    p = refused["probe"]
    same_group(p)
    nvme, nic = p["nvme"], p["nic"]
    assert "(INJECTED)" in refused["strace"], refused["strace"]
    (result,) = p["result"]
    vm = result["device"]
    before = p["before"]
    assert before["nvme_driver"] == "nvme" and before["nic_driver"] == "e1000", before
    assert not before["iface_up"]
    assert p["prebind"] == [
        "deallocated",
        f"{vm}: probe.example.com/failed: DriverSwitchFailed",
    ], refused["plugin_log"]
    c = p["condition"]
    assert c["status"] == "True" and c["reason"] == "DriverSwitchFailed", c
    assert "no driver" in c["message"] and (nvme in c["message"] or nic in c["message"]), c
    assert p["after"] == before  # both back on their drivers, no record left
    assert p["checkpoint"] == "None" and p["holders"] == "{}"
    assert not p["allocation_left"]
