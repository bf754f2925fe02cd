#!/usr/bin/env python3
"""vfioctl side by side with driverctl and dpdk-devbind.py, in the real-kernel guest.

Boots the QEMU guest rig (real kernel, emulated Intel IOMMU) with 4 lone e1000e and a shared
e1000 group, runs tests/guest/scenarios/compare_scenario.py in it, and prints:

1. a behaviour table (binds; restores the original driver; half-bound group; host-used
   device; partial state after a failed multi-device bind; group viability report; exit
   codes; machine-readable output), read from what each tool actually did;
2. timings (whole process, median of COMPARE_RUNS runs): bind + restore of 1 and 4 devices —
   vfioctl with one call each way, driverctl with one call per device, dpdk-devbind with one.

Numbers come from inside the guest (software emulation: everything is slow there; compare the
tools with each other, never with numbers from outside).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.guest.rig import Topology, run_in_guest

TOOLS = ("vfioctl", "driverctl", "dpdk-devbind")


def collect(runs: int) -> dict[str, Any]:
    res = run_in_guest(
        '"$PYTHON" tests/guest/scenarios/compare_scenario.py',
        timeout=1800,
        env={"COMPARE_RUNS": str(runs)},
        topology=Topology(lone_e1000e=4, shared_e1000=2),
    )
    if res.returncode != 0 or "compare.json" not in res.files:
        raise SystemExit(f"scenario failed ({res.returncode}):\n{res.stdout}\n{res.stderr}")
    data: dict[str, Any] = json.loads(res.files["compare.json"])
    return data


def yes(flag: bool, note: str = "") -> str:
    return ("yes" if flag else "NO") + (f" ({note})" if note else "")


def behaviour_rows(data: dict[str, Any]) -> list[tuple[str, list[str]]]:
    t = {name: data["tools"][name]["behaviour"] for name in TOOLS}
    rows: list[tuple[str, list[str]]] = []
    rows.append(
        ("binds to vfio-pci", [yes(t[n]["bind"]["driver_after"] == "vfio-pci") for n in TOOLS])
    )
    rows.append(
        (
            "restores the original driver",
            [
                yes(t["vfioctl"]["restore"]["driver_after"] == "e1000e", "recorded at bind"),
                yes(t["driverctl"]["restore"]["driver_after"] == "e1000e", "kernel re-probe"),
                yes(t["dpdk-devbind"]["restore"]["driver_after"] == "e1000e", "user must name it"),
            ],
        )
    )

    def half(n: str) -> str:
        h = t[n]["half_group"]
        left = "group left NOT viable" if h["kernel_viable_after"] is False else "nothing changed"
        return f"{'refused' if h['rc'] else 'did it'}, exit {h['rc']}, {left}"

    rows.append(("one device of a shared IOMMU group", [half(n) for n in TOOLS]))

    def used(n: str) -> str:
        h = t[n]["host_used"]
        took = h["driver_after"] == "vfio-pci"
        return f"{'TOOK it' if took else 'refused'}, exit {h['rc']}"

    rows.append(("device the host uses (interface up, address)", [used(n) for n in TOOLS]))

    def partial(n: str) -> str:
        h = t[n]["failed_multi"]
        left = h["drivers_after"][0] == "vfio-pci"
        return f"exit {h['rc']}, {'LEFT first device on vfio-pci' if left else 'no partial state'}"

    rows.append(("bind lone device + a bridge (fails)", [partial(n) for n in TOOLS]))
    rows.append(
        (
            "reports IOMMU group viability",
            [
                yes(
                    data["reports"]["vfioctl"]["rc"] == 0
                    and '"viable"' in data["reports"]["vfioctl"]["out"]
                ),
                yes("viable" in data["reports"]["driverctl"]["out"]),
                yes("viable" in data["reports"]["dpdk-devbind"]["out"]),
            ],
        )
    )
    rows.append(
        (
            "exit code, device that does not exist",
            [str(t[n]["missing_device"]["rc"]) for n in TOOLS],
        )
    )
    rows.append(("machine-readable output", ["yes (-o json)", "no", "no"]))
    return rows


def print_tables(data: dict[str, Any]) -> None:
    rows = behaviour_rows(data)
    w0 = max(len(r[0]) for r in rows)
    widths = [max(len(n), *(len(r[1][i]) for r in rows)) for i, n in enumerate(TOOLS)]
    print("\nBehaviour (observed in the guest, real kernel 6.1, emulated Intel IOMMU)\n")
    print(f"| {'':{w0}} | " + " | ".join(f"{n:{widths[i]}}" for i, n in enumerate(TOOLS)) + " |")
    print(f"|{'-' * (w0 + 2)}|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for name, cells in rows:
        print(
            f"| {name:{w0}} | " + " | ".join(f"{c:{widths[i]}}" for i, c in enumerate(cells)) + " |"
        )
    runs = data["tools"]["vfioctl"]["timing_1"]["runs"]
    print(f"\nTimings in the guest, whole process, median of {runs} runs (seconds)\n")
    print("| tool | bind 1 | restore 1 | bind 4 | restore 4 | calls for 4 |")
    print("|---|---|---|---|---|---|")
    calls = {"vfioctl": "1 + 1", "driverctl": "4 + 4", "dpdk-devbind": "1 + 1"}
    for n in TOOLS:
        a, b = data["tools"][n]["timing_1"], data["tools"][n]["timing_4"]
        print(
            f"| {n} | {a['bind']:.2f} | {a['restore']:.2f} | {b['bind']:.2f} | "
            f"{b['restore']:.2f} | {calls[n]} |"
        )


def main() -> None:
    runs = int(os.environ.get("COMPARE_RUNS", "5"))
    data = collect(runs)
    out = Path(os.environ.get("COMPARE_JSON", "/tmp/vfio_dp_compare.json"))
    out.write_text(json.dumps(data, indent=1))
    print_tables(data)
    print(f"\nraw observations: {out}")


if __name__ == "__main__":
    main()
