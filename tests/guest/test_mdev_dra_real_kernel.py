"""DRA claims on mediated devices on a real kernel (issue 35 items 4 and 6, the DRA leg): one
guest boot with the sample driver ``mtty`` (built by tests/guest/mdev_rig.py).

tests/guest/scenarios/mdev_dra_scenario.py: the pool has 12 ``mtty-2`` slots consuming 2 of
mtty's 24 ports each; a claim's Prepare makes the instance with the UUID it checkpointed,
podman (the real CDI consumer) sees its ``/dev/vfio/<N>`` and reads the metadata with
``mdevUUID``; Unprepare of a held instance is refused and the retry removes it once free; a
Prepare SIGKILLed (strace) on its create write leaks nothing, and the retry makes the UUID the
checkpoint holds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from .conftest import Guest
from .mdev_rig import build_mtty

pytestmark = pytest.mark.guest

SLOT = "mdev-mtty-mtty-2-0"


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    ko_dir = build_mtty(guest.kernel.version)
    res = guest.run(
        '"$PYTHON" tests/guest/scenarios/mdev_dra_scenario.py',
        timeout=1200,
        env={"VFIO_DP_KO_DIR": str(ko_dir)},
    )
    assert "mdev_dra.json" in res.files, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    out: dict[str, Any] = json.loads(res.files["mdev_dra.json"])
    assert "crash" not in out, out["crash"]
    return out


def test_the_pool_has_counted_slots(run: dict[str, Any]) -> None:
    assert run["insmod_mtty"]["rc"] == 0, run["insmod_mtty"]
    names = [d["name"] for d in run["pool"]]
    assert names == sorted(f"mdev-mtty-mtty-2-{k}" for k in range(12))
    slot = next(d for d in run["pool"] if d["name"] == SLOT)
    assert slot["consumesCounters"] == [
        {"counterSet": "mdev-mtty", "counters": {"units": {"value": "2"}}}
    ]
    assert slot["attributes"]["kind"] == {"string": "mdev"}
    assert "vendorID" not in slot["attributes"]


def test_prepare_makes_the_instance_podman_sees_it_and_the_metadata_has_the_uuid(
    run: dict[str, Any],
) -> None:
    assert run["prepare_a"]["error"] == "", run["prepare_a"]
    u = run["uuid_a"]
    assert run["instances_prepared"] == [u]
    nodes = run["spec_a"]["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [{"path": "/dev/vfio/vfio"}, {"path": f"/dev/vfio/{run['group_a']}"}]
    assert run["podman_setup"]["rc"] == 0, run["podman_setup"]["stderr"]
    r = run["podman_run"]
    assert r["rc"] == 0, r["stderr"]
    ls, meta, rw = r["stdout"].split("---\n")
    assert run["group_a"] in ls.split() and "vfio" in ls.split()
    dev = json.loads(meta.splitlines()[0])["requests"][0]["devices"][0]
    assert dev["attributes"]["mdevUUID"] == {"string": u}
    assert rw.strip() == "READONLY"


def test_a_held_instance_is_kept_and_removed_once_free(run: dict[str, Any]) -> None:
    u = run["uuid_a"]
    assert run["holder_open"] == "open"
    err = run["unprepare_held"]["uid-a"]
    assert f"mdev {u} is held" in err and "stop its user first" in err
    assert run["instances_held"] == [u]
    assert run["reconcile_free"]["instances"] == [], run["reconcile_free"]
    assert not run["reconcile_free"]["errors"]


def test_unprepare_removes_the_instance(run: dict[str, Any]) -> None:
    assert run["prepare_b"]["error"] == ""
    assert len(run["instances_b"]) == 1
    assert run["unprepare_b"] == {"uid-b": ""}
    assert run["instances_after_b"] == []


def test_a_prepare_killed_on_its_create_leaks_nothing(run: dict[str, Any]) -> None:
    assert run["killed"]["rc"] != 0, run["killed"]
    assert run["instances_after_kill"] == []
    cp = run["checkpoint_after_kill"]
    assert cp is not None and cp["state"] == "preparing" and cp["uuid"]
    assert run["prepare_k"]["error"] == "", run["prepare_k"]
    assert run["uuid_k"] == cp["uuid"] and run["instances_k"] == [cp["uuid"]]
    assert run["unprepare_k"] == {"uid-k": ""}
    assert run["instances_end"] == []
