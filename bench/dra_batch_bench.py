#!/usr/bin/env python3
"""Benchmark: one NodePrepareResources of N claims (default 1,000), each allocated one IOMMU
group already on vfio-pci, then one NodeUnprepareResources of them -- the DRA handler
in-process on a temp tree (no gRPC hop, in-memory ResourceClaim reader). kubelet gives up on
a call after about 45 s; issue 20 found 75-100 s for Prepare and 33 s for Unprepare.

``BENCH_CLAIMS`` (default 1000) claims; ``--profile`` prints the top cumulative functions.
"""

from __future__ import annotations

import asyncio
import cProfile
import os
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text

DRIVER = "vfio.example.com"
NODE = "node-a"
CONFIG = """
selectors:
  - vendor: "8086"
    device: "1533"
    path: dra
"""


def build(base: Path, n: int) -> SysfsTree:
    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "29c0", "060000", group=0))
    for i in range(n):
        bus, slot = divmod(i, 32)
        t.add(Dev(f"0000:{bus + 1:02x}:{slot:02x}.0", "8086", "1533", "020000",
                  driver="vfio-pci", group=100 + i, native_driver="igb"))  # fmt: skip
    p = t.root / "proc/sys/kernel/random"
    p.mkdir(parents=True)
    (p / "boot_id").write_text("bench\n")
    return t


def main() -> None:
    n = int(os.environ.get("BENCH_CLAIMS", "1000"))
    with tempfile.TemporaryDirectory(prefix="dra-batch") as d:
        tree = build(Path(d) / "root", n)
        host = Host(tree.root, kernel=SimulatedKernel(tree))
        config = load_config_text(CONFIG, "bench")
        objects: dict[tuple[str, str], dict[str, Any]] = {}

        async def read(ns: str, name: str) -> dict[str, Any] | None:
            return objects.get((ns, name))

        refs = []
        for i in range(n):
            bus, slot = divmod(i, 32)
            dev = f"pci-0000-{bus + 1:02x}-{slot:02x}-0"
            uid = f"uid-{i:05d}"
            objects[("default", f"c{i}")] = {
                "metadata": {"name": f"c{i}", "namespace": "default", "uid": uid},
                "status": {"allocation": {"devices": {"results": [
                    {"request": "nic", "driver": DRIVER, "pool": NODE, "device": dev}]}}},
            }  # fmt: skip
            refs.append(ClaimRef("default", uid, f"c{i}"))
        prep = ClaimPreparer(
            host=host, driver=DRIVER, node=NODE, cdi_dir=f"{d}/cdi",
            plugins_dir=f"{d}/plugins", read_claim=read, config=lambda: config,
        )  # fmt: skip
        prof = cProfile.Profile() if "--profile" in sys.argv else None
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        out = asyncio.run(prep.prepare(refs))
        t1 = time.perf_counter()
        errors = [r.error for r in out.values() if r.error]
        un = asyncio.run(prep.unprepare(refs))
        t2 = time.perf_counter()
        if prof:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(30)
        uerrors = [e for e in un.values() if e]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| case | claims | errors | seconds | max RSS MiB |")
    print("|---|---:|---:|---:|---:|")
    for label, errs, secs in (
        ("one NodePrepareResources, groups on vfio-pci", errors, t1 - t0),
        ("one NodeUnprepareResources of them", uerrors, t2 - t1),
    ):
        print(f"| {label} | {n} | {len(errs)} | {secs:.1f} | {rss:.0f} |")
    if errors or uerrors:
        print((errors + uerrors)[0])


if __name__ == "__main__":
    main()
