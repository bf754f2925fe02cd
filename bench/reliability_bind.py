#!/usr/bin/env python3
"""Reliability table, area "bind": faults injected into real binds on a real kernel.

Every row comes from one run of tests/guest/scenarios/crash_scenario.py inside the QEMU
guest rig (kernel 6.1, emulated Intel IOMMU, e1000e + shared e1000 group), with strace as
the external fault injector: ``vfioctl bind``, ``vfioctl unbind`` and the daemon's
``bind: true`` path SIGKILLed right after each sysfs write, the state directory full
(ENOSPC) or read-only (EROFS), a sysfs write hung for 30 s. For each: was it answered
correctly (the kill left a journal that ``vfioctl list`` named, and recovery put every
device back on its original driver with the records intact; the refusals came before the
first sysfs write with a clear error; the hang was timed out, named and rolled back), and
how many devices were left without a driver after recovery (must be 0).

Where the results come from (said in each row's note):

- the results saved by the last guest test run (``pytest
  tests/guest/test_crash_real_kernel.py`` keeps them in
  ``$VFIO_DP_CACHE/reliability_bind.json``; the note says when it ran), else a fresh guest
  run: every case (about 10 minutes under emulation), or with ``--quick`` a subset (the
  lone device's bind at every kill point, ENOSPC, EROFS, the hang: about 3 minutes);
- ``--rerun``: a fresh guest run even when saved results exist.

``rows() -> list[dict[str, object]]`` is what the reliability aggregator calls.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

AREA = "bind"
SCRIPT = '"$PYTHON" tests/guest/scenarios/crash_scenario.py'


def results_cache() -> Path:
    base = os.environ.get("VFIO_DP_CACHE") or os.path.join(Path.home(), ".cache", "vfio_dp")
    return Path(base) / "reliability_bind.json"


def run_guest(quick: bool) -> dict[str, Any]:
    """Boot the guest once and run the crash scenario; its results (crash.json)."""
    from tests.guest.rig import GuestRig

    env = {"CRASH_QUICK": "1"} if quick else {}
    res = GuestRig().run(SCRIPT, timeout=1500, env=env)
    if "crash.json" not in res.files:
        raise SystemExit(f"the guest run left no results:\n{res.stdout}\n{res.stderr[-3000:]}")
    data: dict[str, Any] = json.loads(res.files["crash.json"])
    data["guest_total_secs"] = round(res.total_elapsed, 1)
    return data


def load(*, rerun: bool = False, quick: bool = False) -> tuple[dict[str, Any], str]:
    """The scenario's results and where they came from."""
    path = results_cache()
    if not rerun and path.is_file():
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(path.stat().st_mtime))
        return json.loads(path.read_text()), f"guest test run of {when}"
    data = run_guest(quick)
    return data, "fresh guest run" + (" (--quick)" if quick else "")


def _without_driver(drivers: dict[str, str | None]) -> int:
    return sum(1 for d in drivers.values() if d is None)


def _kill_row(run: dict[str, Any], c: dict[str, Any], source: str) -> dict[str, object]:
    what = {"bind": "vfioctl bind", "unbind": "vfioctl unbind", "daemon": "daemon bind: true"}
    runner = "daemon" if c["kind"] == "daemon" else "vfioctl"
    verb = "unbind" if c["kind"] == "unbind" else "bind"
    dry = run["dry_runs"][f"{c['area']}/{c['kind']}"]["writes"]
    k, n = int(c["k"]), int(c["n"])
    landed = c["writes_made"] == dry[:k] if k < n else bool(c["writes_made"])
    listed = f"INTERRUPTED {verb} by {runner}" in c["list"]["stderr"]
    st = c["state_after_kill"]
    intact = not st["unparsable"] and all(
        run["original"].get(a) == d for a, d in st["records"].items()
    )
    after = c["state_after_recovery"]
    recovered = (
        c["recovery"]["rc"] == 0
        and c["drivers_after_recovery"] == run["original"]
        and set(c["overrides_after_recovery"].values()) == {"(null)"}
        and not after["journals"]
        and not after["records"]
    )
    killed = c["run"]["rc"] in (-9, 137)
    ok = killed and landed and listed and intact and recovered
    left = _without_driver(c["drivers_after_kill"])
    recovery = "Host.recover(runner=daemon)" if c["kind"] == "daemon" else "vfioctl unbind"
    note = (
        f"{c['area']}; {left} device(s) without a driver after the kill; list named it: "
        f"{'yes' if listed else 'NO'}; records intact: {'yes' if intact else 'NO'}; "
        f"recovered by {recovery}: {'yes' if recovered else 'NO'}; {source}"
    )
    return {
        "area": AREA,
        "case": f"{what[c['kind']]} on the {c['area']}",
        "fault_or_load": c["fault"],
        "answered_correctly": ok,
        "devices_without_driver": _without_driver(c["drivers_after_recovery"]),
        "rss_peak_mb": "n/a",
        "note": note,
    }


def _other_row(run: dict[str, Any], c: dict[str, Any], source: str) -> dict[str, object]:
    err = c["run"]["stderr"]
    if c["area"] == "state dir":
        ok = (
            c["run"]["rc"] == 1
            and "refused before the first sysfs write" in err
            and not c["writes_made"]
            and "Traceback" not in err
        )
        note = f"sysfs writes made: {len(c['writes_made'])}; {source}"
        case = "vfioctl bind on the lone e1000e, state directory unusable"
    else:
        ok = (
            c["run"]["rc"] == 1
            and "did not return in" in err
            and "rolled back" in err
            and not c["state_after"]["journals"]
        )
        answered = c["run"].get("first_stderr_secs")
        note = (
            f"error printed {answered} s after the start (write timeout 10 s), process gone "
            f"after {c['run']['secs']} s (its exit waits for the thread held in the write); "
            f"{source}"
        )
        case = "vfioctl bind on the lone e1000e, a sysfs write hangs"
    ok = ok and c["drivers_after"] == run["original"]
    last = [ln for ln in err.strip().splitlines() if ln.strip()]
    return {
        "area": AREA,
        "case": case,
        "fault_or_load": c["fault"],
        "answered_correctly": ok,
        "devices_without_driver": _without_driver(c["drivers_after"]),
        "rss_peak_mb": "n/a",
        "note": note + (f"; said: {last[0][:160]}" if last else ""),
    }


def rows(*, rerun: bool = False, quick: bool = False) -> list[dict[str, object]]:
    """One row per fault injected (see the module docstring)."""
    run, source = load(rerun=rerun, quick=quick)
    out: list[dict[str, object]] = []
    for c in run["cases"]:
        out.append(_kill_row(run, c, source) if "k" in c else _other_row(run, c, source))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a fresh run covers a subset only")
    ap.add_argument("--rerun", action="store_true", help="a fresh guest run, not saved results")
    ap.add_argument("-o", "--output", choices=["table", "json"], default="table")
    args = ap.parse_args()
    table = rows(rerun=args.rerun, quick=args.quick)
    if args.output == "json":
        print(json.dumps(table, indent=1))
        return
    cols = ["case", "fault_or_load", "answered_correctly", "devices_without_driver"]
    widths = [max(len(c), *(len(str(r[c])) for r in table)) for c in cols]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for r in table:
        print("  ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)))
    bad = [r for r in table if r["answered_correctly"] is not True]
    left = sum(int(str(r["devices_without_driver"])) for r in table)
    print(
        f"\n{len(table)} faults injected; answered correctly: {len(table) - len(bad)}; "
        f"devices left without a driver after recovery: {left}"
    )
    if table:
        print(f"source: {str(table[0]['note']).rsplit('; ', 1)[-1]}")


if __name__ == "__main__":
    main()
