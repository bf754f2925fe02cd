"""SR-IOV VFs made, held, given back and crash-recovered on the real kernel (one guest boot).

QEMU's emulated NVMe controller implements SR-IOV (QEMU 7.2; the recipe is in
``../shared/reference/guest-rig.md``): the PF ``1b36:0010`` on ``nvme`` with
``sriov_totalvfs`` 2. tests/guest/scenarios/sriov_scenario.py runs inside the guest: the node
core with ``numVfs: 2``, a held VF, ``vfioctl unbind --all``, and ``vfioctl sriov set`` killed
(strace) after each write to the PF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from vfio_dp.model.naming import kubevirt_env_var

from .conftest import Guest
from .rig import DEFAULT_MODULES, Topology

pytestmark = pytest.mark.guest

SCRIPT = '"$PYTHON" tests/guest/scenarios/sriov_scenario.py'


def nvme_args(image: Path) -> list[str]:
    return [
        "-device", "pcie-root-port,id=rpn,chassis=9",
        "-drive", f"file={image},if=none,id=nvm0,format=raw",
        "-device", "nvme-subsys,id=subsys0",
        "-device", "nvme,id=nvme0,serial=x,subsys=subsys0,bus=rpn,sriov_max_vfs=2,"
        "sriov_vq_flexible=4,sriov_vi_flexible=2,max_ioqpairs=8,msix_qsize=8",
        "-device", "nvme-ns,drive=nvm0,bus=nvme0",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def run(guest: Guest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    image = tmp_path_factory.mktemp("nvme") / "nvme.img"
    with open(image, "wb") as f:
        f.truncate(64 << 20)
    # nvme pulls nvme-core, t10-pi and the CRCs from modules.dep
    g = guest.with_options(
        topology=Topology(lone_e1000e=1, shared_e1000=0),
        modules=(*DEFAULT_MODULES, "nvme"),
        extra_qemu_args=nvme_args(image),
    )
    res = g.run(SCRIPT, timeout=900)
    assert "sriov.json" in res.files, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    data: dict[str, Any] = json.loads(res.files["sriov.json"])
    data["guest_total_secs"] = round(res.total_elapsed, 1)
    cache = Path(os.environ.get("VFIO_DP_CACHE") or Path.home() / ".cache" / "vfio_dp")
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "sriov_guest.json").write_text(json.dumps(data, indent=1))  # for a look by hand
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr[-3000:]}"
    return data


def test_boot_state(run: dict[str, Any]) -> None:
    boot = run["boot"]["state"]
    assert (boot["pf_driver"], boot["totalvfs"], boot["numvfs"]) == ("nvme", "2", "0")
    assert boot["autoprobe"] == "1" and run["errors"] == []


def test_config_asks_two_vfs_made_bound_advertised_allocated(run: dict[str, Any]) -> None:
    core = run["core_start"]
    assert core["run"]["rc"] == 0, core["run"]["stderr"]
    st = core["state"]
    assert st["numvfs"] == "2" and st["autoprobe"] == "0"
    assert len(st["vfs"]) == 2
    assert all(v["driver"] == "vfio-pci" and v["node"] for v in st["vfs"]), st["vfs"]
    assert len({v["group"] for v in st["vfs"]}) == 2  # each VF alone in its group
    assert st["sriov_records"] == [f"{run['pf']}.json"]
    dp = core["daemon"]  # advertised to the kubelet stand-in, Allocate answered
    assert dp["devices"] == {v["address"]: "Healthy" for v in st["vfs"]}
    group = next(v["group"] for v in st["vfs"] if v["address"] == dp["allocated"])
    assert dp["nodes"] == ["/dev/vfio/vfio", f"/dev/vfio/{group}"]
    assert dp["envs"][kubevirt_env_var("devices.kubevirt.io/nvme-vf")] == dp["allocated"]


def test_held_vf_blocks_count_change(run: dict[str, Any]) -> None:
    assert run["holder_said"] == "holding"
    for name in ("held_set", "held_unbind_all"):
        r = run[name]["run"]
        assert r["rc"] == 1, (name, r)
        assert "is held" in r["stderr"] and "held open by pid" in r["stderr"], (name, r)
        assert run[name]["state"]["numvfs"] == "2"
    rows = json.loads(run["held_list"]["run"]["stdout"])
    held = next(r for r in rows if r["address"] == run["pf"])["held"]
    assert len(held) == 1 and "held open by pid" in next(iter(held.values()))[0]


def test_unbind_all_restores_zero(run: dict[str, Any]) -> None:
    r = run["unbind_all"]
    assert r["run"]["rc"] == 0, r["run"]
    st = r["state"]
    assert (st["numvfs"], st["autoprobe"], st["vfs"]) == ("0", "1", [])
    assert st["sriov_records"] == st["sriov_journals"] == st["bind_records"] == []


def test_dra_plugin_makes_publishes_and_prepares_a_vf_for_podman(run: dict[str, Any]) -> None:
    """The DRA plugin's node core makes the VFs a ``path: dra`` config asks; its slices carry
    them (PF address, counters; valid, the pool consistent); a claim on one VF is prepared and
    podman, a real CDI consumer, sees its ``/dev/vfio/<N>``; Unprepare keeps it on vfio-pci
    (``bind: true``); ``unbind --all`` gives the PF back."""
    dra = run["dra"]
    assert dra["run"]["rc"] == 0, dra["run"]
    leg = dra["leg"]
    st = dra["state"]  # after the plugin stopped: the VFs it made stay until unbind --all
    assert st["numvfs"] == "2" and st["autoprobe"] == "0", st
    vfs = {v["address"] for v in st["vfs"]}
    devices = [d for s in leg["slices"] for d in s["spec"].get("devices") or []]
    assert {d["attributes"]["resource.kubernetes.io/pciBusID"]["string"] for d in devices} == vfs
    assert all(d["attributes"]["pfPciBusID"] == {"string": run["pf"]} for d in devices)
    counter_set = "pf-" + run["pf"].replace(":", "-").replace(".", "-")
    assert all(d["consumesCounters"][0]["counterSet"] == counter_set for d in devices)
    sets = [c for s in leg["slices"] for c in s["spec"].get("sharedCounters") or []]
    assert sets == [{"name": counter_set, "counters": {"vfs": {"value": "2"}}}]
    assert leg["slice_problems"] == [[]] * len(leg["slices"]) and leg["pool_problems"] == []
    prep = leg["prepare"]
    assert prep["error"] == "" and prep["address"] in vfs and prep["ids"], prep
    assert leg["podman"]["rc"] == 0, leg["podman"]
    assert prep["group"] in leg["podman"]["stdout"].split(), leg["podman"]
    assert list(leg["unprepare"]["answer"].values()) == [""], leg["unprepare"]
    assert leg["unprepare"]["driver"] == "vfio-pci", leg["unprepare"]
    assert leg["plugin_rc"] == 0, leg["plugin_log"]
    back = run["dra_unbind_all"]
    assert back["run"]["rc"] == 0, back["run"]
    assert (back["state"]["numvfs"], back["state"]["autoprobe"], back["state"]["vfs"]) == (
        "0",
        "1",
        [],
    )


@pytest.mark.parametrize("k", [1, 2, 3])
def test_sigkill_during_creation_recovered(run: dict[str, Any], k: int) -> None:
    """k=1: killed entering the count write (autoprobe already 0); k=2: right after the
    count write, before the journal commits it; k=3: after the commit, before binding."""
    assert run["clean_traced"]["run"]["rc"] == 0, run["clean_traced"]
    case = next(c for c in run["kills"] if c["k"] == k)
    assert case["run"]["rc"] == -9, case["run"]  # killed by strace
    after = case["after_kill"]
    assert after["autoprobe"] == "0"
    assert after["numvfs"] == ("0" if k == 1 else "2")
    assert all(v["driver"] is None for v in after["vfs"])  # autoprobe 0: no host driver
    listed = next(r for r in json.loads(case["list"]["stdout"]) if r["address"] == run["pf"])
    if k < 3:  # interrupted: the journal is left, no record yet
        assert after["sriov_journals"] == [f"{run['pf']}.json"] and after["sriov_records"] == []
        assert listed["interrupted"] and "writes made" in listed["interrupted"]
    else:  # committed: the record says what to give back
        assert after["sriov_journals"] == [] and after["sriov_records"] == [f"{run['pf']}.json"]
        assert listed["interrupted"] is None and listed["made_by"] == "operator"
    assert case["recovery"]["rc"] == 0, case["recovery"]
    fixed = case["after_recovery"]
    assert (fixed["numvfs"], fixed["autoprobe"], fixed["vfs"]) == ("0", "1", [])
    assert fixed["sriov_records"] == fixed["sriov_journals"] == fixed["bind_records"] == []
