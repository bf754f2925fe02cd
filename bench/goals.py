#!/usr/bin/env python3
"""``make bench``: every row of the performance table (issue 25) for the working tree, with
its goal and whether it is met, and where the remaining time goes (from profiles).

    python3 bench/goals.py [--rounds 5] [--skip daemons,webhook] [--fleet-small]

Medians of ``--rounds`` rounds (the measurements of ``bench/rows.py``: whole processes for
the commands, the real daemons on temp trees with the kubelet and API-server stand-ins, the
webhook over TLS). Exit 1 when a goal is not met. To compare with an earlier commit in the
same run, use ``bench/against.py`` instead.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rows import (
    ANCHORS,
    FIGURES,
    FLEET_NOT_MEASURED,
    GUEST_ANCHORS,
    GUEST_FIGURES,
    Side,
    floor_note,
    measure,
    met,
)

#: where the time of each row goes, from profiles (py-spy, cProfile) of this code
WHERE = {
    "list_big": "system calls: ~12 per device (openat2 of its dir, uevent, numa_node, "
    "driver_override, 2 links, close; ~45 % of the run, split over the CPUs); the serving "
    "rules and the DRA view (~25 %, dataclasses made per device); imports (~12 %), JSON",
    "list_big_1cpu": "as above, in one process (the split across CPUs needs a second one)",
    "list_small": "start-up: the interpreter (~10 ms), click (~30 ms: inspect, uuid, "
    "platform), then vfio_dp's modules, ~17 dataclasses at ~0.5 ms each (Python 3.11 "
    "compiles each generated method with exec); the scan itself ~2 ms. A read-only list "
    "loads nothing that binds (checked by tests/cli/test_main.py)",
    "help": "the interpreter and click (the floor printed beside the row, measured in this "
    "run), then click rendering the help from cli.main (no subcommand module is imported); "
    "a goal under that floor would need a help text rendered without click (not done)",
    "check_big": "start-up as for --help; then the VF's own IOMMU group read (bind, unbind "
    "and check read the groups they act on, not the host's 4,160 functions: a full scan is "
    "~0.2 s here) and its /dev/vfio node probed",
    "dp_idle": "per resync: four directory listings of ~4,096 entries (bus/pci/devices, "
    "drivers/vfio-pci, iommu_groups, /dev/vfio: ~8 ms, half of it); gRPC's own threads; "
    "the kubelet dir and --config are watched by inotify (a look every 5 s besides); a full scan every "
    "10 min",
    "dra_idle": "the same listings, the host's use of devices (~1 ms), the /proc holder "
    "scan (no request: a watch keeps the pool's versions); the event loop reuses every list it built. "
    "The tree's /proc is a stand-in with one process: a busy node's holder scan is the "
    "dra_holders row, on top of this one",
    "alloc_p99": "gRPC (grpc.aio) both ways in Python: a bare servicer answering the same "
    "call here is p50 0.49 / p99 0.60 ms; the record is written after the answer",
    "wh_p99": "TLS (asyncio's ssl objects) and aiohttp's request handling: ~75 % of the "
    "server's CPU; the review itself (parse, depth check, translation, patch) ~20 %. The "
    "load generator shares the 2 CPUs",
    "prep_p99": "the checkpoint's durable write (the floor row says what one costs on this "
    "disk; ~40 % of a Prepare), creating and renaming the metadata file on the same disk "
    "(not synced: every Prepare rewrites it), the CDI spec, the read of the claim's IOMMU "
    "group with the host's use of it (~0.3 ms), one hop to a worker thread",
    "prep_on1": "the bind itself, plus the checkpoint written before it (crash safety) and "
    "after, the metadata file and the CDI spec; the claim's group read once, the bind plans "
    "from it. The floor beside the row is Host.bind plus those two durable writes, measured "
    "in this run",
    "prep_on4": "as above, four groups",
    "prep_big": "as prep_p99: the Prepare reads its claim's IOMMU group, not the host's "
    "4,160 functions (a full scan: ~0.2 s here)",
    "dra_holders": "one readlink per open descriptor of the host (relative to each "
    "process's fd dir; most of the row), one listing per process, and a Python test of each "
    "link's text; at --resync 5 a scan of S ms is S/50 % of a CPU on top of dra_idle",
    "dra_republish": "debounce, the refresh, every slice rewritten at the new generation "
    "through the API-server stand-in (its strict validation runs in the bench's own "
    "process: about half of the figure)",
    "fleet_*": "docs/performance.md, 'Fleet scale': where each fleet row's time goes",
    "pool_*": "one guest boot (bench/pool_switch_bench.py, QEMU TCG: compare the rows with "
    "their anchors only): a switch is the bind or unbind of the same device plus the claim "
    "path (checkpoint, CDI spec, metadata) and, towards a container, the wait for its nodes",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--skip",
        default="",
        help="groups to leave out: process,prepare,webhook,daemons,fleet,pool (pool: the "
        "real-kernel guest rows, one QEMU boot of minutes)",
    )
    ap.add_argument(
        "--fleet-small", action="store_true", help="the fleet rows at small sizes (a test)"
    )
    args = ap.parse_args()
    tree = Side("tree")
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    skip = {s for s in args.skip.split(",") if s}
    results = measure(
        [tree], args.rounds, skip, fleet_small=args.fleet_small, guest="pool" not in skip
    )
    load = os.getloadavg()
    print(
        f"\n{started}, {platform.node()}: {os.cpu_count()} CPUs, load {load[0]:.1f}; "
        f"medians of {args.rounds} rounds"
    )
    head = f"{'row':52} {'median':>9} {'unit':6} {'goal':18} verdict"
    print(head)
    print("-" * len(head))
    missed = 0
    for fig in (*FIGURES, *GUEST_FIGURES):
        values = results.get(fig.key, {}).get(tree.label)
        if not values:
            why = next(iter(tree.broken.values()), "skipped")
            print(f"{fig.what:52} {'-':>9} {fig.unit:6} {fig.goal:18} not measured: {why[:80]}")
            continue
        m = statistics.median(values)
        anchors: dict[str, float] = {}
        note = ""
        if fig.anchor and fig.anchor in results:
            per = results[fig.anchor]
            a_values = per.get(tree.label) or per.get("anchor")
            if a_values:
                anchors[fig.anchor] = statistics.median(a_values)
                note = f" ({m / anchors[fig.anchor]:.2f}x)"
        floor = floor_note(fig.key, results, tree.label)
        if floor:
            note += f" ({floor})"
        ok = met(fig.key, m, anchors)
        verdict = "-" if ok is None else ("met" if ok else "NOT met")
        missed += ok is False
        value = f"{m:.3f}" if fig.unit == "s" else f"{m:.0f}" if fig.unit == "req/s" else f"{m:.2f}"
        print(f"{fig.what:52} {value:>9} {fig.unit:6} {fig.goal:18} {verdict}{note}")
    if args.fleet_small:
        print("(the fleet rows ran at their SMALL sizes: their figures and verdicts mean nothing)")
    for what, why in FLEET_NOT_MEASURED.items():
        print(f"{what:52} {'-':>9} {'':6} {'':18} not measured: {why}")
    print()
    for key, what in {**ANCHORS, **GUEST_ANCHORS}.items():
        for side, values in results.get(key, {}).items():
            print(f"anchor: {what}: {statistics.median(values):.3f} [{side}]")
    print("\nwhere the time goes:")
    for key, text in WHERE.items():
        print(f"  {key}: {text}")
    for group, why in tree.broken.items():
        print(f"could not run {group}: {why[:300]}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
