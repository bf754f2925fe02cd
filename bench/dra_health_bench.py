#!/usr/bin/env python3
"""Benchmark of DRA device health: a prepared device goes bad → the health stream and the
tainted slice, and back.

A temp sysfs tree of N functions on vfio-pci, each its own IOMMU group (N DRA devices); the
DRA plugin in THIS process (asyncio) with the kubelet DRA stand-in following
``DRAResourceHealth.NodeWatchResources`` (official protos, real unix socket) and the
API-server stand-in (real ``kubernetes`` client over HTTP, strict validation of the taints).
One claim is prepared; then, ``--changes`` times, its function is unbound (then rebound) on
the tree and the plugin is kicked the way a kernel uevent kicks it (a temp tree emits none):
debounce 50 ms, a full scan with host usage, the core health model, a confirming scan 0.2 s
later (debounce: a held group's state must hold for one scan), the stream, the slices.

Printed: change → UNHEALTHY (HEALTHY) seen by the kubelet stand-in, and change → the slice
write holding (dropping) the taint, median and worst; target < 1 s.

    python3 bench/dra_health_bench.py [--devices 256] [--changes 10]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.dra.apiserver_standin import CLAIMS, NODES, ApiServerStandin  # noqa: E402
from tests.dra.kubelet_dra_standin import KubeletDraStandin  # noqa: E402
from tests.sysfs_tree import Dev, SysfsTree  # noqa: E402
from vfio_dp.dra.plugin import DraOptions, DraPlugin  # noqa: E402
from vfio_dp.host import Host  # noqa: E402

NODE = "bench-node"
DRIVER = "vfio.dra.vfio-dp.io"
CONFIG = 'selectors:\n  - {vendor: "15b3", device: "101c", path: dra}\n'


def build_tree(base: Path, devices: int) -> tuple[SysfsTree, list[str]]:
    tree = SysfsTree(base)
    addrs = []
    for n in range(devices):
        bus, slot, fn = 1 + n // 256, (n // 8) % 32, n % 8
        addr = f"0000:{bus:02x}:{slot:02x}.{fn}"
        tree.add(Dev(addr, "15b3", "101c", "020000", driver="vfio-pci", group=1000 + n))
        addrs.append(addr)
    boot = tree.root / "proc/sys/kernel/random"  # a node has one: claims are of this boot
    boot.mkdir(parents=True, exist_ok=True)
    (boot / "boot_id").write_text("bench-boot\n")
    return tree, addrs


def name_of(addr: str) -> str:
    return "pci-" + addr.replace(":", "-").replace(".", "-")


async def until(cond: Any, timeout: float = 30.0) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout}s")
        await asyncio.sleep(0.002)
    return time.monotonic() - start


async def run(devices: int, changes: int) -> list[tuple[str, list[float]]]:
    work = Path(tempfile.mkdtemp(prefix="vfio-dra-health-bench-"))
    kdir = tempfile.mkdtemp(prefix="kdh", dir="/tmp")
    tree, addrs = build_tree(work / "root", devices)
    (work / "config.yaml").write_text(CONFIG)
    api = ApiServerStandin(str(work / "api"))
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    kubelet = KubeletDraStandin(f"{kdir}/registry", NODE, api_client=api.client())
    await kubelet.start()
    plugin = DraPlugin(
        DraOptions(
            node_name=NODE, driver_name=DRIVER, registry_dir=f"{kdir}/registry",
            plugins_dir=f"{kdir}/plugins", cdi_dir=str(work / "cdi"),
            config_path=str(work / "config.yaml"), root=str(tree.root), resync=60.0,
            metrics_port=0, uevents=False,
        ),
        api.client(),
        host=Host(tree.root),
    )  # fmt: skip
    victim = addrs[len(addrs) // 2]
    device = name_of(victim)
    writes: list[tuple[float, bool]] = []  # (time, the victim tainted) per slice write

    def published(generation: int, slices: list[dict[str, Any]]) -> None:
        for s in slices:
            for d in s["spec"].get("devices") or []:
                if d["name"] == device:
                    writes.append((time.monotonic(), bool(d.get("taints"))))

    plugin.publisher.on_published.append(published)
    out: dict[str, list[float]] = {k: [] for k in ("unhealthy", "tainted", "healthy", "untainted")}
    try:
        await plugin.start()
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins, 60)
        await until(lambda: kubelet.health_of(DRIVER, NODE, device)[0] == "Healthy", 120)
        body = {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "vm", "namespace": "vms"},
            "spec": {"devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": DRIVER}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "nic", "driver": DRIVER, "pool": NODE, "device": device}]}}},
        }  # fmt: skip
        m = api.seed(CLAIMS, body)["metadata"]
        await kubelet.run_pod(DRIVER, "vm", "vms", [(m["uid"], "vm")])
        for i in range(changes):
            bad = i % 2 == 0
            want = "Unhealthy" if bad else "Healthy"
            tree.set_driver(victim, None if bad else "vfio-pci")
            t = time.monotonic()
            plugin.core.kick("uevent bench")
            seen = await until(lambda w=want: kubelet.health_of(DRIVER, NODE, device)[0] == w)
            await until(lambda t=t, b=bad: any(w > t and x == b for w, x in writes))
            slice_at = next(w for w, x in writes if w > t and x == bad) - t
            out["unhealthy" if bad else "healthy"].append(seen)
            out["tainted" if bad else "untainted"].append(slice_at)
    finally:
        await plugin.stop()
        await kubelet.stop()
        api.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(kdir, ignore_errors=True)
    return [
        ("function unbound -> UNHEALTHY at the kubelet stand-in", out["unhealthy"]),
        ("function unbound -> slice write with the taint", out["tainted"]),
        ("function rebound -> HEALTHY at the kubelet stand-in", out["healthy"]),
        ("function rebound -> slice write without the taint", out["untainted"]),
    ]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=256)
    ap.add_argument("--changes", type=int, default=10)
    args = ap.parse_args()
    logging.basicConfig(level=logging.ERROR)
    rows = asyncio.run(run(args.devices, args.changes))
    print(
        f"DRA health, {args.devices} devices, one prepared; {args.changes} changes (half bad, "
        "half good); plugin, kubelet stand-in and API-server stand-in in one process"
    )
    w = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(w)}  {'median':>8}  {'worst':>8}  {'target':>6}  result")
    for name, xs in rows:
        med, worst = statistics.median(xs), max(xs)
        ok = "met" if worst < 1.0 else "NOT met"
        print(f"{name.ljust(w)}  {med * 1000:6.0f}ms  {worst * 1000:6.0f}ms  {'< 1 s':>6}  {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
