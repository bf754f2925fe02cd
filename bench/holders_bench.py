#!/usr/bin/env python3
"""Benchmark: the DRA plugin's ``/proc`` holder scan on a busy node, on this machine's REAL /proc.

Every resync the DRA plugin asks which processes hold a published group's ``/dev/vfio/<N>``
open (:func:`vfio_dp.host.holders.scan_holders`: one ``readlink`` per descriptor of every
process of the host). The idle-daemon rows run the plugin on a temp tree whose ``/proc`` is a
stand-in with one process, so they do not show this cost; a node running pods has hundreds of
processes and tens of thousands of open descriptors. This script makes such a process table
for real: ``BENCH_PROCS`` (default 500) ``sleep`` processes, each inheriting
``BENCH_FDS`` (default 40) descriptors of ``/dev/null``, and times the scan for 4,096 group
nodes nobody holds (the 4,096-device pool of the idle rows) through ``Root("/")``.

Read-only: the scan never opens a node, and nothing here writes outside the sleepers' own
descriptors. The figure is per resync; at ``--resync 5`` a scan of S ms costs S / 50 % of a CPU.

``--json``: ``{"dra_holders": median ms, "holder_fds": descriptors seen}`` (bench/rows.py).
BENCH_CODE: the tree whose ``vfio_dp`` to time (bench/against.py: a git ref).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.environ.get("BENCH_CODE") or str(Path(__file__).resolve().parents[1]))

from vfio_dp.host.holders import scan_holders
from vfio_dp.host.root import Root

NODES = [f"/dev/vfio/{n}" for n in range(4096)]


def open_descriptors() -> int:
    """Descriptors of every process this process may read (what one scan readlinks)."""
    total = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                total += len(os.listdir(f"/proc/{pid}/fd"))
            except OSError:
                continue
    return total


def main() -> None:
    procs, fds, runs = (int(os.environ.get(k, d)) for k, d in
                        (("BENCH_PROCS", "500"), ("BENCH_FDS", "40"), ("BENCH_RUNS", "15")))  # fmt: skip
    held = []
    for _ in range(fds):
        fd = os.open("/dev/null", os.O_RDONLY)
        os.set_inheritable(fd, True)
        held.append(fd)
    sleepers = [subprocess.Popen(["sleep", "600"], close_fds=False) for _ in range(procs)]
    try:
        time.sleep(0.5)
        seen = open_descriptors()
        root = Root("/")
        times = []
        for _ in range(runs + 1):
            t0 = time.perf_counter()
            scan = scan_holders(root, NODES)
            times.append(time.perf_counter() - t0)
            if scan.by_node:
                sys.exit(f"a group node is held on this machine: {scan.by_node}")
        ms = statistics.median(times[1:]) * 1000
    finally:
        for p in sleepers:
            p.kill()
        for p in sleepers:
            p.wait()
        for fd in held:
            os.close(fd)
    if "--json" in sys.argv:
        print(json.dumps({"dra_holders": ms, "holder_fds": seen}))
        return
    print(f"| processes | descriptors | scan per resync, median of {runs} | at --resync 5 |")
    print("|---:|---:|---:|---:|")
    print(f"| {procs} + this machine's | {seen:,} | {ms:.1f} ms | {ms / 50:.2f} % of a CPU |")


if __name__ == "__main__":
    main()
