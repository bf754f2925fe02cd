"""Mediated devices on a real kernel (issue 35 items 2 and 6, creation): one guest boot.

The rig builds the kernel's sample mdev driver ``mtty`` from Debian's ``linux-source-6.1``
against the guest kernel's headers (tests/guest/mdev_rig.py, with the rig's one module
builder); the guest loads ``mdev`` and ``mtty`` and runs tests/guest/scenarios/mdev_scenario.py:
``vfioctl mdev`` lists the types, ``create`` and ``remove`` make and take instances for real
(refusals, a held instance, one made by hand), a create SIGKILLed before and after its sysfs
write is undone and finished by the next run, and the node core's mdev pass makes, lowers,
re-makes (with the recorded UUID) and gives back instances from a config.
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


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    ko_dir = build_mtty(guest.kernel.version)
    res = guest.run(
        '"$PYTHON" tests/guest/scenarios/mdev_scenario.py',
        timeout=900,
        env={"VFIO_DP_KO_DIR": str(ko_dir)},
    )
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    return json.loads(res.files["mdev.json"])


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
    assert k["rc"] in (-9, 137) and k["instances_after"] == [] and k["journals_after"] == [
        f"{U3}.json"
    ]
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
