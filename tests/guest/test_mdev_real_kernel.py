"""Mediated devices on a real kernel (issue 35 items 2 and 6, creation): one guest boot.

The rig builds the kernel's sample mdev driver ``mtty`` from Debian's ``linux-source-6.1``
against the guest kernel's headers (tests/guest/mdev_rig.py, with the rig's one module
builder); the guest loads ``mdev`` and ``mtty`` and runs tests/guest/scenarios/mdev_scenario.py:
``vfioctl mdev`` lists the types, ``create`` and ``remove`` make and take instances for real
(refusals, a held instance, one made by hand), a create SIGKILLed before and after its sysfs
write is undone and finished by the next run, and the node core's mdev pass makes, lowers,
re-makes (with the recorded UUID) and gives back instances from a config.

In the same boot, tests/guest/scenarios/mdev_dp_scenario.py runs the device-plugin path (issue
35 items 3, 5 and 6): the real ``vfioctl plugin`` daemon with a config ``mdev:`` entry makes
the instances, advertises them to the kubelet stand-in, ``Allocate`` hands them out (env,
nodes, CDI), a held instance refuses removal, ``vfioctl hostdev`` -> libvirt starts a VM with
one, and the daemon SIGKILLed at the sysfs write of a create and of a remove is finished or
undone by its next run.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Guest
from .mdev_rig import build_mtty

pytestmark = pytest.mark.guest

U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
U3 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1003"
U4 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1004"


RESOURCE = "devices.kubevirt.io/Dual_port_serial"  # the default name of "Dual port serial"
ENV = "MDEV_PCI_RESOURCE_DEVICES_KUBEVIRT_IO_DUAL_PORT_SERIAL"
CDI_KIND = "deviceplugin.vfio-dp.io/vfio"


@pytest.fixture(scope="module")
def boot(guest: Guest) -> dict[str, Any]:
    """One boot: the CLI and core scenario, then the device-plugin one."""
    ko_dir = build_mtty(guest.kernel.version)
    res = guest.run(
        '"$PYTHON" tests/guest/scenarios/mdev_scenario.py && '
        '"$PYTHON" tests/guest/scenarios/mdev_dp_scenario.py',
        timeout=1500,
        env={"VFIO_DP_KO_DIR": str(ko_dir)},
    )
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    out = {name: json.loads(res.files[name]) for name in ("mdev.json", "mdev_dp.json")}
    dp = out["mdev_dp.json"]
    print(f"\nsecs {dp['secs']}; libvirt {dp['device_plugin'].get('libvirt_version')}")
    return out


@pytest.fixture(scope="module")
def run(boot: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = boot["mdev.json"]
    return out


@pytest.fixture(scope="module")
def dp(boot: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = boot["mdev_dp.json"]["device_plugin"]
    assert "crash" not in out, out["crash"]
    assert not boot["mdev_dp.json"].get("timeouts"), boot["mdev_dp.json"]["timeouts"]
    return out


def test_mtty_loads_and_its_types_are_listed(run: dict[str, Any]) -> None:
    assert run["modprobe_mdev"]["rc"] == 0, run["modprobe_mdev"]
    assert run["insmod_mtty"]["rc"] == 0, run["insmod_mtty"]
    (mtty,) = [p for p in json.loads(run["list"]["stdout"]) if p["parent"] == "mtty"]
    types = {t["type"]: t for t in mtty["types"]}
    assert types["mtty-1"]["name"] == "Single port serial"
    assert types["mtty-2"]["name"] == "Dual port serial"
    assert types["mtty-1"]["available"] == 24 and types["mtty-2"]["available"] == 12
    assert types["mtty-2"]["deviceApi"] == "vfio-pci" and mtty["address"] is None


def test_create_makes_a_real_instance(run: dict[str, Any]) -> None:
    dry = run["create_dry_run"]
    assert dry["stdout"].strip() == (
        f"echo {U1} > /sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create"
    )
    assert dry["instances_after"] == []
    assert run["create"]["rc"] == 0, run["create"]["stderr"]
    assert run["create"]["instances_after"] == [U1] and run["create"]["journals_after"] == []
    assert run["available_2"] == [12, 11]
    (mtty,) = [p for p in json.loads(run["list_after_create"]["stdout"]) if p["parent"] == "mtty"]
    (inst,) = mtty["instances"]
    assert inst["uuid"] == U1 and inst["type"] == "mtty-2" and inst["madeBy"] == "operator"
    assert inst["vfioNode"] == f"/dev/vfio/{inst['iommuGroup']}"


def test_refusals_name_the_value_and_the_fix(run: dict[str, Any]) -> None:
    assert run["create_taken"]["rc"] != 0
    assert f"an mdev {U1} already exists" in run["create_taken"]["stderr"]
    assert "mdev parent mtty has no type 'mtty-9'" in run["create_unknown_type"]["stderr"]
    r = run["remove_others"]
    assert r["rc"] != 0 and U2 in r["instances_after"]
    assert f"mdev {U2} was not made by vfio_dp (no record): left alone" in r["stderr"]


def test_a_held_instance_refuses_removal(run: dict[str, Any]) -> None:
    assert run["holder_open"] == "open"
    r = run["remove_held"]
    assert r["rc"] != 0 and U1 in r["instances_after"]
    assert f"mdev {U1} is held: /dev/vfio/{run['group']} is held open by pid" in r["stderr"]
    assert run["remove_dry_run"]["stdout"].strip() == f"echo 1 > /sys/bus/mdev/devices/{U1}/remove"
    assert run["remove"]["rc"] == 0 and U1 not in run["remove"]["instances_after"]
    assert run["remove_others_forced"]["rc"] == 0
    assert run["remove_others_forced"]["instances_after"] == []


def test_a_killed_create_is_undone_or_finished_by_the_next_run(run: dict[str, Any]) -> None:
    k = run["kill_before_write"]
    assert (
        k["rc"] in (-9, 137)
        and k["instances_after"] == []
        and k["journals_after"] == [f"{U3}.json"]
    )
    a = run["after_kill_before"]
    assert a["rc"] == 0 and f"undid the interrupted mdev create of {U3}" in a["stderr"]
    assert a["instances_after"] == [U4] and a["journals_after"] == []
    k = run["kill_after_write"]  # made, not yet recorded
    assert k["rc"] in (-9, 137) and U3 in k["instances_after"] and k["journals_after"]
    a = run["after_kill_after"]
    assert f"finished the interrupted mdev create of {U3}" in a["stderr"], a["stderr"]
    assert run["record_u3"] and a["journals_after"] == []
    assert run["remove_u3"]["rc"] == 0 and run["remove_u3"]["instances_after"] == []


def test_the_core_pass_makes_what_the_config_asks(run: dict[str, Any]) -> None:
    two = run["config_two"]
    assert two["rc"] == 0, two["stderr"]
    assert len(two["instances_after"]) == 2
    assert json.loads(run["config_steady"]["stdout"]) == []
    assert run["config_steady"]["instances_after"] == two["instances_after"]
    one = run["config_one"]["instances_after"]
    assert len(one) == 1 and set(one) <= set(two["instances_after"])
    assert run["gone_before_remake"] == []
    assert run["remade_same"], run["config_remake"]
    assert run["config_gone"]["instances_after"] == []
    # no record is left (the killed create's atomic-write temp file may be: never read)
    assert [n for n in run["records_left"] if n.endswith(".json")] == []


# -- the device-plugin path (mdev_dp_scenario.py) ---------------------------------------------
def test_the_daemon_makes_and_advertises_the_configs_instances(dp: dict[str, Any]) -> None:
    assert len(dp["instances"]) == 2, dp["plugin"]["log"]
    assert dp["advertised"] == dict.fromkeys(dp["instances"], "Healthy")
    (mtty,) = [p for p in json.loads(dp["list"]["stdout"]) if p["parent"] == "mtty"]
    made = {i["uuid"]: (i["type"], i["madeBy"]) for i in mtty["instances"]}
    assert made == dict.fromkeys(dp["instances"], ("mtty-2", "device-plugin"))
    # stopping the daemon never takes what the config wants
    assert dp["plugin"]["rc"] == 0, dp["plugin"]["log"]
    assert dp["instances_after_stop"] == dp["instances"]


def test_allocate_hands_out_the_instances_with_kubevirts_env_and_cdi(dp: dict[str, Any]) -> None:
    ids = sorted(dp["advertised"])
    assert dp["envs"] == {ENV: ",".join(ids)}
    nodes = ["/dev/vfio/vfio", *(f"/dev/vfio/{dp['groups'][u]}" for u in ids)]
    assert dp["nodes"] == [[n, n, "mrw", True] for n in nodes]
    assert dp["cdi_devices"] == [f"{CDI_KIND}=mdev-{u}" for u in ids]
    for u in ids:
        spec = dp["cdi_specs"][f"deviceplugin.vfio-dp.io_mdev-{u}.json"]
        (dev,) = spec["devices"]
        assert spec["kind"] == CDI_KIND and dev["name"] == f"mdev-{u}"
        assert dev["containerEdits"]["deviceNodes"] == [
            {"path": "/dev/vfio/vfio"},
            {"path": f"/dev/vfio/{dp['groups'][u]}"},
        ]


def test_a_held_instance_of_the_daemon_refuses_removal(dp: dict[str, Any]) -> None:
    u = sorted(dp["advertised"])[0]
    assert dp["holder_open"] == "open"
    r = dp["remove_held"]
    assert r["rc"] != 0 and u in r["instances_after"], r
    assert f"mdev {u} is held: /dev/vfio/{dp['groups'][u]} is held open by pid" in r["stderr"]


def test_hostdev_gives_libvirt_the_mdev_and_the_vm_starts(dp: dict[str, Any]) -> None:
    u = sorted(dp["advertised"])[0]
    assert dp["hostdev"]["rc"] == 0, dp["hostdev"]
    xml = dp["vm_xml"]
    assert "<hostdev mode='subsystem' type='mdev'" in xml and "model='vfio-pci'" in xml, xml
    assert f"<address uuid='{u}'/>" in xml, xml
    assert dp["virsh_start"]["rc"] == 0, (dp["virsh_start"], dp.get("libvirtd_log"))
    assert f"/dev/vfio/{dp['groups'][u]}" in dp["vm"]["fds"], dp["vm"]
    assert "anon_inode:[vfio-device]" in dp["vm"]["fds"], dp["vm"]
    # the VM's QEMU holds the instance: removal refused, even with --force
    r = dp["remove_while_vm"]
    assert r["rc"] != 0 and u in r["instances_after"], r
    assert f"mdev {u} is held: /dev/vfio/{dp['groups'][u]} is held open by pid" in r["stderr"]
    assert dp["virsh_destroy"]["rc"] == 0, dp["virsh_destroy"]
    assert dp["advertised_at_end"] == dp["advertised"]


def test_a_killed_daemon_create_or_remove_is_undone_by_its_next_run(dp: dict[str, Any]) -> None:
    k = dp["kill_create"]  # count 2 -> 3, SIGKILLed entering the sysfs write of the create
    assert k["rc"] in (-9, 137), k["log"]
    assert k["instances_after"] == dp["instances"] and len(k["journals_after"]) == 1, k
    (journal,) = k["journals_after"]
    a = dp["after_kill_create"]
    assert f"undid the interrupted mdev create of {journal[:-5]}" in a["log"], a["log"]
    assert len(a["instances_after"]) == 3 and a["journals_after"] == [], a
    assert set(dp["instances"]) < set(a["instances_after"])

    k = dp["kill_remove"]  # count 3 -> 2, SIGKILLed entering the sysfs write of the remove
    assert k["rc"] in (-9, 137), k["log"]
    assert k["instances_after"] == dp["after_kill_remove"]["three"], k
    assert len(k["journals_after"]) == 1, k
    (journal,) = k["journals_after"]
    a = dp["after_kill_remove"]
    assert f"undid the interrupted mdev remove of {journal[:-5]}" in a["log"], a["log"]
    assert len(a["instances_after"]) == 2 and a["journals_after"] == [], a
    assert set(a["instances_after"]) < set(a["three"])

    gone = dp["entry_gone"]  # the entry leaves the config: every instance given back
    assert gone["instances_after"] == [] and gone["journals_after"] == [], gone
    assert dp["records_left"] == []
