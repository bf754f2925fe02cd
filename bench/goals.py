#!/usr/bin/env python3
"""``make bench``: every row of the performance table (issue 25) for the working tree, with
its goal and whether it is met, and where the remaining time goes (from profiles).

    python3 bench/goals.py [--rounds 5] [--skip daemons,webhook]

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

from bench.rows import ANCHORS, FIGURES, Side, measure, met

#: where the time of each row goes, from profiles (py-spy, cProfile) of this code
WHERE = {
    "list_big": "system calls: ~12 per device (openat2 of its dir, uevent, numa_node, "
    "driver_override, 2 links, close); then start-up (click, imports), JSON",
    "list_big_1cpu": "as above, in one process (the split across CPUs needs a second one)",
    "list_small": "start-up: the interpreter, click (~25 ms), vfio_dp's modules and "
    "their dataclasses; the scan itself ~2 ms",
    "help": "the interpreter and click; no subcommand module is imported",
    "dp_idle": "per resync: a few directory listings (bus/pci/devices, drivers, "
    "iommu_groups, /dev/vfio); the gRPC and asyncio loops; a full scan every 10 min",
    "dra_idle": "per resync: the listings, the host's use of devices, and the front-end's "
    "reconcile (ResourceSlices listed from the API server, claims checked)",
    "alloc_p99": "gRPC (grpc.aio) both ways and the allocation record written with fsync",
    "wh_p99": "TLS and aiohttp request handling in one process; the translation is small",
    "prep_p99": "the claim read, CDI spec, metadata file and checkpoint, each fsynced",
    "prep_on1": "the bind (journal, locks, driver writes) plus the Prepare's own files",
    "prep_on4": "as above, four groups",
    "dra_republish": "debounce, the full scan with host usage, every slice rewritten at the "
    "new generation through the API-server stand-in (its strict validation runs in the "
    "bench's own process)",
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--skip", default="", help="groups to leave out: process,prepare,webhook,daemons"
    )
    args = ap.parse_args()
    tree = Side("tree")
    started = time.strftime("%Y-%m-%d %H:%M %Z")
    results = measure([tree], args.rounds, {s for s in args.skip.split(",") if s})
    load = os.getloadavg()
    print(
        f"\n{started}, {platform.node()}: {os.cpu_count()} CPUs, load {load[0]:.1f}; "
        f"medians of {args.rounds} rounds"
    )
    head = f"{'row':52} {'median':>9} {'unit':6} {'goal':18} verdict"
    print(head)
    print("-" * len(head))
    missed = 0
    for fig in FIGURES:
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
        ok = met(fig.key, m, anchors)
        verdict = "-" if ok is None else ("met" if ok else "NOT met")
        missed += ok is False
        value = f"{m:.3f}" if fig.unit == "s" else f"{m:.0f}" if fig.unit == "req/s" else f"{m:.2f}"
        print(f"{fig.what:52} {value:>9} {fig.unit:6} {fig.goal:18} {verdict}{note}")
    print()
    for key, what in ANCHORS.items():
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
