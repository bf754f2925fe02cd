"""The host layer on a real kernel with an emulated Intel IOMMU (one guest boot).

Proves on real sysfs what tests/host proves on the simulator: bind and unbind with restore,
the half-group refusal on the shared e1000 group, `vfioctl groups` agreeing with the kernel's
VFIO_GROUP_GET_STATUS for every group that has a node, and QEMU in the guest starting with a
device `vfioctl` bound (the real consumer opening the real VFIO group).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Guest

pytestmark = pytest.mark.guest

LONE, LONE2 = "0000:01:00.0", "0000:02:00.0"
SHARED_A, SHARED_B = "0000:03:01.0", "0000:03:02.0"


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    res = guest.run('"$PYTHON" tests/guest/scenarios/host_scenario.py', timeout=900)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    return json.loads(res.files["host.json"])


def groups(snap: dict[str, Any]) -> dict[int, dict[str, Any]]:
    assert snap["groups"]["rc"] == 0, snap["groups"]["stderr"]
    return {g["group"]: g for g in json.loads(snap["groups"]["stdout"])}


def test_list_on_real_sysfs(run: dict[str, Any]) -> None:
    rows = {r["address"]: r for r in json.loads(run["list"]["stdout"])}
    assert rows[LONE]["vendor"] == "8086" and rows[LONE]["device"] == "10d3"
    assert rows[LONE]["driver"] == "e1000e"
    # no --config: the daemon would serve only devices already on vfio-pci, so none here yet
    assert rows[LONE]["resource"] is None and rows[LONE]["path"] is None
    assert rows[SHARED_A]["iommu_group"] == rows[SHARED_B]["iommu_group"]


def test_the_modalias_built_from_the_scan_is_the_kernels(run: dict[str, Any]) -> None:
    # the VFIO driver choice matches modules.alias against it instead of reading the file
    assert run["modalias_disagreements"] == {}


def test_initial_groups(run: dict[str, Any]) -> None:
    g = groups(run["s0_initial"])
    lone = g[int(run["groups_of"][LONE])]
    assert lone["devices"] == [LONE] and lone["viable"] is False  # on e1000e
    shared = g[int(run["groups_of"][SHARED_A])]
    assert {SHARED_A, SHARED_B} <= set(shared["devices"]) and len(shared["devices"]) == 3


def test_bind_lone_device(run: dict[str, Any]) -> None:
    assert "driver_override" in run["dry_run"]["stdout"]
    assert run["dry_run"]["drivers_after"][LONE] == "e1000e"  # dry run changed nothing
    assert run["bind_lone"]["rc"] == 0, run["bind_lone"]["stderr"]
    assert json.loads(run["bind_lone"]["stdout"])["bound"] == [LONE]
    assert run["bind_lone"]["drivers_after"][LONE] == "vfio-pci"
    assert run["vfio_node_after_bind"] and run["record_after_bind"]
    assert run["bind_lone_again"]["rc"] == 0 and "already" in run["bind_lone_again"]["stdout"]


def test_half_group_refused(run: dict[str, Any]) -> None:
    r = run["bind_half"]
    assert r["rc"] == 1
    assert f"shares IOMMU group {run['groups_of'][SHARED_A]}" in r["stderr"]
    assert f"vfioctl bind --group {SHARED_A}" in r["stderr"]
    assert r["drivers_after"][SHARED_A] == r["drivers_after"][SHARED_B] == "e1000"


def test_half_bound_group_flagged_like_the_kernel(run: dict[str, Any]) -> None:
    g = groups(run["s1_half_bound"])[int(run["groups_of"][SHARED_A])]
    assert g["viable"] is False and g["kernel_viable"] is False
    assert [p["address"] for p in g["problems"]] == [SHARED_B]
    check = json.loads(run["check_half"]["stdout"])[0]
    assert run["check_half"]["rc"] == 1 and not check["ready"]
    assert any(SHARED_B in r for r in check["reasons"])


def test_group_bind(run: dict[str, Any]) -> None:
    r = run["bind_group"]
    assert r["rc"] == 0, r["stderr"]
    out = json.loads(r["stdout"])
    assert out["bound"] == [SHARED_B] and out["already"] == [SHARED_A]
    g = groups(run["s2_group_bound"])[int(run["groups_of"][SHARED_A])]
    assert g["viable"] is True and g["kernel_viable"] is True
    assert run["check_lone"]["rc"] == 0


def test_groups_agree_with_kernel_everywhere(run: dict[str, Any]) -> None:
    compared = 0
    for snap in ("s0_initial", "s1_half_bound", "s2_group_bound", "s4_restored"):
        for g in groups(run[snap]).values():
            if g["kernel_viable"] is not None:
                assert g["viable"] == g["kernel_viable"], (snap, g)
                compared += 1
    assert compared >= 3


def test_qemu_starts_with_the_bound_device(run: dict[str, Any]) -> None:
    assert run["qemu_running"], run["qemu_stderr"]
    fds = run["qemu_fds"]
    assert f"/dev/vfio/{run['groups_of'][LONE]}" in fds and "/dev/vfio/vfio" in fds
    assert "anon_inode:[vfio-device]" in fds
    g = groups(run["s3_qemu_holds_lone"])[int(run["groups_of"][LONE])]
    assert g["in_use"] is True  # EBUSY
    r = run["unbind_while_qemu"]
    assert r["rc"] == 1 and "in use" in r["stderr"] and r["drivers_after"][LONE] == "vfio-pci"
    assert run["check_while_qemu"]["rc"] == 1


def test_unbind_restores_original_drivers(run: dict[str, Any]) -> None:
    """By address (LONE, and SHARED_A, which a raw write put on vfio-pci without a record),
    then `unbind --all` gives back every device with a record: SHARED_B."""
    r = run["unbind_lone"]
    assert r["rc"] == 0, r["stderr"]
    assert r["drivers_after"][LONE] == "e1000e" and r["drivers_after"][SHARED_A] == "e1000"
    assert run["records_before_all"] == [f"{SHARED_B}.json"]
    r = run["unbind_all"]
    assert r["rc"] == 0, r["stderr"]
    assert json.loads(r["stdout"])["restored"] == [{"address": SHARED_B, "driver": "e1000"}]
    assert r["drivers_after"] == {
        LONE: "e1000e",
        LONE2: "e1000e",
        SHARED_A: "e1000",
        SHARED_B: "e1000",
    }
    assert run["records_left"] == []
