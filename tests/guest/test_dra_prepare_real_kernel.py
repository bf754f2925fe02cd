"""The DRA Prepare handler on a real kernel with an emulated Intel IOMMU (one guest boot).

onPrepare binds a lone e1000e's group and the shared e1000 group at Prepare; podman (the real
CDI consumer) starts a container that sees /dev/vfio/<N> and reads the metadata file, mounted
read-only; Unprepare gives e1000e back; a plugin killed with SIGKILL holding a prepared claim
whose ResourceClaim is then deleted gets the driver back after restart -- and NOT while a
process holds the group open; a host-used NIC is refused.
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
    res = guest.run('"$PYTHON" tests/guest/scenarios/dra_prepare_scenario.py', timeout=1500)
    assert "dra.json" in res.files, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    out: dict[str, Any] = json.loads(res.files["dra.json"])
    assert "crash" not in out, out["crash"]
    return out


def test_on_prepare_binds_lone_and_shared_groups(run: dict[str, Any]) -> None:
    assert run["drivers_initial"][LONE] == "e1000e"
    for uid in ("uid-lone", "uid-shared"):
        assert run["prepare"][uid]["error"] == "", run["prepare"][uid]
    d = run["drivers_prepared"]
    assert d[LONE] == d[SHARED_A] == d[SHARED_B] == "vfio-pci"
    assert run["groups_of"][LONE] in run["nodes"] and run["groups_of"][SHARED_A] in run["nodes"]
    nodes = run["spec_lone"]["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": "/dev/vfio/vfio"}, {"path": f"/dev/vfio/{run['groups_of'][LONE]}"}]
    assert run["prepare_again"] == run["prepare"]["uid-lone"]


def test_podman_sees_the_group_and_reads_the_metadata(run: dict[str, Any]) -> None:
    assert run["podman_setup"]["rc"] == 0, run["podman_setup"]["stderr"]
    r = run["podman_run"]
    assert r["rc"] == 0, r["stderr"]
    ls, meta, rw = r["stdout"].split("---\n")
    assert run["groups_of"][LONE] in ls.split() and "vfio" in ls.split()
    first = json.loads(meta.splitlines()[0])
    assert first["kind"] == "DeviceMetadata"
    dev = first["requests"][0]["devices"][0]
    assert dev["attributes"]["resource.kubernetes.io/pciBusID"] == {"string": LONE}
    assert rw.strip() == "READONLY"


def test_unprepare_gives_e1000e_back(run: dict[str, Any]) -> None:
    assert run["unprepare_lone"] == {"uid-lone": ""}
    assert run["drivers_after_unprepare"][LONE] == "e1000e"


def test_sigkill_then_claim_deleted_restores_only_when_not_held(run: dict[str, Any]) -> None:
    assert run["child"]["rc"] == -9, run["child"]
    assert run["drivers_after_kill"][LONE2] == "vfio-pci"
    assert run["holder_started"] == "open"
    held = run["reconcile_held"]
    assert held["drivers"][LONE2] == "vfio-pci" and held["unprepared"] == []
    assert any("held open by pid" in k for k in held["kept"]), held
    released = run["reconcile_released"]
    assert released["kept"] == [] and released["drivers"][LONE2] == "e1000e", released


def test_shared_group_restored_when_its_claim_is_deleted(run: dict[str, Any]) -> None:
    d = run["reconcile_shared"]["drivers"]
    assert d[SHARED_A] == d[SHARED_B] == "e1000", run["reconcile_shared"]


def test_host_used_nic_refused(run: dict[str, Any]) -> None:
    h = run["host_used"]
    assert "used by the host" in h["error"] and h["drivers"][LONE] == "e1000e", h
