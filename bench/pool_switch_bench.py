#!/usr/bin/env python3
"""Benchmark: switching one NVMe between a container and a VM, in the real-kernel guest.

Boots the QEMU guest rig (real kernel 6.1, emulated Intel IOMMU, TCG) with a plain emulated
NVMe controller under ``personalities: [vm, container]`` and runs
tests/guest/scenarios/pool_scenario.py with ``POOL_ROUNDS`` = BENCH_RUNS (default 5). Each
round, in-process (:class:`vfio_dp.dra.claimpath.prepare.ClaimPreparer`, no gRPC hop):

- container → VM: Prepare of a VM claim on ``pci-…`` (nvme → vfio-pci);
- VM → container: Unprepare of that claim (vfio-pci → nvme) and Prepare of a container
  claim on ``pci-…-native`` (waits for /dev/nvme0n1);
- once, the real DRA plugin's claim watch: a VM claim the scheduler stand-in allocated,
  switched ahead of its pod (allocation → ``<driver>/ready`` seen by PreBind), and the
  Prepare that follows (no driver work);
- beside them ``Host.bind`` / ``Host.unbind`` of the same device in the same process (what
  ``vfioctl bind`` / ``unbind`` run), and ``vfioctl bind`` / ``unbind`` as whole processes
  (interpreter start-up included: two samples from the scenario's steps).

Numbers come from inside the guest (software emulation: compare them with each other only).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.guest.rig import DEFAULT_MODULES, GuestRig, Topology
from tests.guest.test_pool_real_kernel import MARKER, nvme_args


def collect(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="pool-bench") as d:
        image = Path(d) / "nvme.img"
        with open(image, "wb") as f:
            f.write(MARKER)
            f.truncate(16 << 20)
        rig = GuestRig(
            topology=Topology(lone_e1000e=1, shared_e1000=0),
            modules=(*DEFAULT_MODULES, "nvme"),
            extra_qemu_args=tuple(nvme_args(image)),
        )
        res = rig.run(
            '"$PYTHON" tests/guest/scenarios/pool_scenario.py',
            timeout=1800,
            env={"POOL_ROUNDS": str(runs)},
        )
        if "pool.json" not in res.files:
            sys.exit(f"guest run failed:\n{res.stdout}\n{res.stderr}\n{res.console[-3000:]}")
        data: dict[str, Any] = json.loads(res.files["pool.json"])
        if "crash" in data or data.get("round_errors"):
            sys.exit(f"scenario failed: {data.get('crash') or data['round_errors']}")
        return data


def print_table(data: dict[str, Any], runs: int) -> None:
    r = data["rounds"]
    whole = [
        ("vfioctl bind (whole process)", [data["vfioctl_bind"]["secs"], data["vfioctl_bind_2"]["secs"]]),
        ("vfioctl unbind (whole process)", [data["vfioctl_unbind"]["secs"], data["vfioctl_unbind_2"]["secs"]]),
    ]  # fmt: skip
    rows = [
        ("container → VM (Prepare, nvme → vfio-pci)", r["container_to_vm"]),
        ("VM → container (Unprepare + Prepare, waits for nvme0n1)", r["vm_to_container"]),
        ("Host.bind, same device, in-process", r["host_bind"]),
        ("Host.unbind, same device, in-process", r["host_unbind"]),
        *whole,
    ]
    t = data.get("timings") or {}
    if "watch_switch_ahead" in t:  # the real plugin's claim watch, once per boot
        rows[2:2] = [
            ("container → VM ahead of the pod (allocated → ready, the claim watch)",
             [t["watch_switch_ahead"]]),
            ("Prepare after that switch (no driver work)", [t["watch_prepare"]]),
        ]  # fmt: skip
    print(
        f"\nOne NVMe between a container and a VM, QEMU guest (real kernel 6.1, TCG), "
        f"{runs} rounds (seconds)\n"
    )
    print("| what | median | min | max | samples |")
    print("|---|---|---|---|---|")
    for label, xs in rows:
        print(
            f"| {label} | {statistics.median(xs):.3f} | {min(xs):.3f} | {max(xs):.3f} | {len(xs)} |"
        )


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "5"))
    data = collect(runs)
    if "--json" in sys.argv:  # one line, last: what bench/rows.py's pool_rows reads
        print(json.dumps(data))
        return
    print_table(data, runs)


if __name__ == "__main__":
    main()
