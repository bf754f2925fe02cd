#!/usr/bin/env python3
"""Benchmark: NodePrepareResources / NodeUnprepareResources of the DRA handler on a temp tree.

Builds a node with four lone NICs (each its own IOMMU group) plus the usual host devices, and
times :class:`vfio_dp.dra.prepare.ClaimPreparer` in-process (the gRPC hop is not included):

- Prepare/Unprepare of a claim whose group is already on vfio-pci (``bind: false``): the
  handler's own cost -- ResourceClaim read (an in-memory reader), sysfs scan, CDI spec,
  metadata file, checkpoint (each written with fsync);
- Prepare/Unprepare with ``bind: onPrepare`` of 1 and of 4 groups through the kernel
  SIMULATOR (tests/kernel_sim.py: no driver probe time), next to ``Host.bind`` /
  ``Host.unbind`` of the same groups (what ``vfioctl bind --group`` runs).

Real-kernel figures (the guest rig, e1000e's probe) are NOT measured by this script.
BENCH_RUNS (default 30) rounds each; prints p50 and p99 in milliseconds.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.kubelet import ClaimRef
from vfio_dp.dra.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text

DRIVER = "vfio.example.com"
NODE = "node-a"
NICS = [f"0000:0{i + 1}:00.0" for i in range(4)]
CONFIG = """
selectors:
  - vendor: "8086"
    device: "10d3"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "1533"
    path: dra
"""


def build(base: Path) -> SysfsTree:
    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "29c0", "060000", group=0))
    for i, nic in enumerate(NICS):
        port = f"0000:00:1{i}.0"
        t.add(Dev(port, "8086", "a110", "060400", driver="pcieport", group=10 + i))
        t.add(Dev(nic, "8086", "10d3", "020000", driver="e1000e", group=20 + i, parent=port))
    t.add(Dev("0000:00:1f.0", "8086", "a111", "060400", driver="pcieport", group=30))
    t.add(Dev("0000:09:00.0", "8086", "1533", "020000", driver="vfio-pci", group=31,
              parent="0000:00:1f.0", native_driver="igb"))  # fmt: skip
    p = t.root / "proc/sys/kernel/random"
    p.mkdir(parents=True)
    (p / "boot_id").write_text("bench\n")
    return t


def name_of(bdf: str) -> str:
    a = PciAddress.parse(bdf)
    return f"pci-{a.domain:04x}-{a.bus:02x}-{a.slot:02x}-{a.function:x}"


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] * 1000


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "30"))
    config = load_config_text(CONFIG, "bench")
    rows: list[tuple[str, list[float], list[float]]] = []
    with tempfile.TemporaryDirectory(prefix="dra-bench") as d:
        tree = build(Path(d) / "root")
        kernel = SimulatedKernel(tree)
        host = Host(tree.root, kernel=kernel)
        objects: dict[tuple[str, str], dict[str, Any]] = {}

        async def read(ns: str, name: str) -> dict[str, Any] | None:
            return objects.get((ns, name))

        prep = ClaimPreparer(
            host=host, driver=DRIVER, node=NODE, cdi_dir=f"{d}/cdi",
            plugins_dir=f"{d}/plugins", read_claim=read, config=lambda: config,
        )  # fmt: skip

        def claim(uid: str, devices: list[str]) -> ClaimRef:
            results = [
                {"request": f"r{i}", "driver": DRIVER, "pool": NODE, "device": name_of(b)}
                for i, b in enumerate(devices)
            ]
            objects[("default", uid)] = {
                "metadata": {"name": uid, "namespace": "default", "uid": uid},
                "status": {"allocation": {"devices": {"results": results}}},
            }
            return ClaimRef("default", uid, uid)

        async def cycle(ref: ClaimRef) -> tuple[float, float]:
            t0 = time.perf_counter()
            out = await prep.prepare([ref])
            t1 = time.perf_counter()
            assert out[ref.uid].error == "", out[ref.uid].error
            un = await prep.unprepare([ref])
            t2 = time.perf_counter()
            assert un[ref.uid] == "", un[ref.uid]
            return t1 - t0, t2 - t1

        async def measure(label: str, devices: list[str]) -> None:
            ref = claim(f"bench-{len(rows)}", devices)
            await cycle(ref)  # warm
            p, u = [], []
            for _ in range(runs):
                a, b = await cycle(ref)
                p.append(a)
                u.append(b)
            rows.append((label, p, u))

        def measure_host(label: str, devices: list[str]) -> None:
            addrs = [PciAddress.parse(b) for b in devices]
            p, u = [], []
            for _ in range(runs + 1):
                t0 = time.perf_counter()
                host.bind(addrs, group=True, probe=False)
                t1 = time.perf_counter()
                host.unbind(addrs)
                t2 = time.perf_counter()
                p.append(t1 - t0)
                u.append(t2 - t1)
            rows.append((label, p[1:], u[1:]))

        asyncio.run(measure("Prepare, group already on vfio-pci (no bind)", ["0000:09:00.0"]))
        asyncio.run(measure("Prepare, onPrepare bind of 1 group (simulator)", NICS[:1]))
        measure_host("Host.bind --group of the same 1 group (simulator)", NICS[:1])
        asyncio.run(measure("Prepare, onPrepare bind of 4 groups (simulator)", NICS))
        measure_host("Host.bind --group of the same 4 groups (simulator)", NICS)

    print(f"DRA handler on a temp tree, {runs} rounds each (ms; in-process, no gRPC hop)")
    print()
    print("| case | prepare/bind p50 | p99 | unprepare/unbind p50 | p99 |")
    print("|---|---:|---:|---:|---:|")
    for label, p, u in rows:
        print(
            f"| {label} | {statistics.median(p) * 1000:.1f} | {pct(p, 0.99):.1f} "
            f"| {statistics.median(u) * 1000:.1f} | {pct(u, 0.99):.1f} |"
        )


if __name__ == "__main__":
    main()
