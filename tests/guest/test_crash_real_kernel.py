"""Crash-proof binding on the real kernel: SIGKILL after EACH sysfs write (one guest boot).

strace is the fault injector (tests/guest/scenarios/crash_scenario.py runs inside the guest):
`vfioctl bind` and `vfioctl unbind` on the lone e1000e and on the shared e1000 group, and the
daemon's `bind: true` path on both, each killed right after every sysfs write it makes;
then `vfioctl list` must name the interrupted operation, recovery (`vfioctl unbind`, or
`Host.recover(runner="device-plugin")` that the daemon runs at start) must put every device back on
its original driver, and the records must have stayed intact. Also the state directory
full (ENOSPC) or read-only (EROFS): refused before the first sysfs write; and a sysfs write
that hangs: timed out, named, rolled back.

The results are kept in ``$VFIO_DP_CACHE/reliability_bind.json`` for
``bench/reliability_bind.py`` (which prints them as the reliability table).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from .conftest import Guest

pytestmark = pytest.mark.guest

SCRIPT = '"$PYTHON" tests/guest/scenarios/crash_scenario.py'


def results_cache() -> Path:
    base = os.environ.get("VFIO_DP_CACHE") or os.path.join(Path.home(), ".cache", "vfio_dp")
    return Path(base) / "reliability_bind.json"


@pytest.fixture(scope="module")
def run(guest: Guest) -> dict[str, Any]:
    res = guest.run(SCRIPT, timeout=1500)
    assert "crash.json" in res.files, f"{res.stdout}\n{res.stderr}\n{res.console[-3000:]}"
    data: dict[str, Any] = json.loads(res.files["crash.json"])
    data["guest_total_secs"] = round(res.total_elapsed, 1)
    path = results_cache()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr[-3000:]}"
    return data


def kills(run: dict[str, Any], kind: str | None = None) -> list[dict[str, Any]]:
    return [c for c in run["cases"] if "k" in c and (kind is None or c["kind"] == kind)]


def test_strace_and_openat2_in_the_guest(run: dict[str, Any]) -> None:
    assert run["strace"] and run["strace"][0].startswith("strace -- version")
    assert run["openat2"] == "True"  # kernel 6.1: Root.open uses openat2
    assert run["errors"] == []


def test_every_command_was_killed_after_every_sysfs_write(run: dict[str, Any]) -> None:
    dry = run["dry_runs"]
    expected = {
        "lone e1000e/bind": 3,
        "shared e1000 group/bind": 6,
        "lone e1000e/unbind": 3,
        "shared e1000 group/unbind": 6,
        "lone e1000e/daemon": 3,
        "shared e1000 group/daemon": 6,
    }
    for name, n in expected.items():
        assert len(dry[name]["writes"]) == n, (name, dry[name])
        assert not any("new_id" in w or "remove_id" in w for w in dry[name]["writes"])
    assert dry["lone e1000e/bind"]["writes"] == [
        "driver_override <- 'vfio-pci'",
        "e1000e/unbind <- '0000:01:00.0'",
        "drivers_probe <- '0000:01:00.0'",
    ]
    for name, n in expected.items():
        area, kind = name.split("/")
        done = sorted(c["k"] for c in kills(run, kind) if c["area"] == area)
        assert done == ([0] if name == "lone e1000e/bind" else []) + list(range(1, n + 1)), name


def test_each_kill_landed_right_after_its_write(run: dict[str, Any]) -> None:
    for c in kills(run):
        assert c["run"]["rc"] in (-9, 137), (c["fault"], c["run"])
        dry = run["dry_runs"][f"{c['area']}/{c['kind']}"]["writes"]
        if c["k"] < c["n"]:  # every write up to k made, write k+1 never
            assert c["writes_made"] == dry[: c["k"]], c["fault"]
        else:  # traced only the last write's file: its last write was made
            assert c["writes_made"] and c["writes_made"][-1] == dry[-1], c["fault"]


def test_list_shows_the_interrupted_operation(run: dict[str, Any]) -> None:
    for c in kills(run):
        lst = c["list"]
        assert lst["rc"] == 0, lst["stderr"]
        runner = "device-plugin" if c["kind"] == "daemon" else "vfioctl"
        verb = "unbind" if c["kind"] == "unbind" else "bind"
        assert f"INTERRUPTED {verb} by {runner}" in lst["stderr"], (c["fault"], lst["stderr"])
        assert "vfioctl unbind " in lst["stderr"]
        assert lst["json_ok"]  # stdout stays the JSON list


def test_records_intact_after_every_kill(run: dict[str, Any]) -> None:
    for c in kills(run):
        st = c["state_after_kill"]
        assert st["unparsable"] == [], c["fault"]
        assert len(st["journals"]) == 1, c["fault"]
        # every record names the device's driver from before the operation
        for addr, drv in st["records"].items():
            assert drv == run["original"][addr], (c["fault"], addr, drv)


def test_recovery_brings_every_device_back_and_none_is_left_without_driver(
    run: dict[str, Any],
) -> None:
    without_driver_seen = 0
    for c in kills(run):
        without_driver_seen += sum(v is None for v in c["drivers_after_kill"].values())
        assert c["recovery"]["rc"] == 0, (c["fault"], c["recovery"])
        assert c["drivers_after_recovery"] == run["original"], c["fault"]
        assert set(c["overrides_after_recovery"].values()) == {"(null)"}, c["fault"]
        after = c["state_after_recovery"]
        assert after["journals"] == [] and after["records"] == {}, c["fault"]
    assert without_driver_seen > 0  # the kills did leave devices without a driver
    assert run["final_drivers"] == run["original"]


def test_full_or_read_only_state_dir_refuses_before_the_first_write(
    run: dict[str, Any],
) -> None:
    cases = [c for c in run["cases"] if c["area"] == "state dir"]
    assert len(cases) == 2
    for c, why in zip(cases, ("No space left on device", "Read-only file system"), strict=True):
        assert c["run"]["rc"] == 1, c["run"]
        err = c["run"]["stderr"]
        assert "refused before the first sysfs write (nothing was changed)" in err, err
        assert why in err and "/var/lib/vfio_dp/" in err
        assert "Traceback" not in err
        assert c["writes_made"] == []
        assert c["drivers_after"] == run["original"]


def test_hung_write_times_out_is_named_and_rolled_back(run: dict[str, Any]) -> None:
    (c,) = [c for c in run["cases"] if c["area"] == "hung write"]
    err = c["run"]["stderr"]
    assert c["run"]["rc"] == 1, c["run"]
    assert "did not return in 10s" in err and "drivers/e1000e/unbind" in err
    assert "rolled back 0000:01:00.0" in err
    assert c["drivers_after"] == run["original"]
    assert set(c["overrides_after"].values()) == {"(null)"}
    assert c["state_after"]["journals"] == [] and c["state_after"]["records"] == {}
    assert 10 <= c["run"]["first_stderr_secs"] < 25  # the 10 s timeout, then the rollback
