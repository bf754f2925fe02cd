#!/usr/bin/env python3
"""Benchmark of the DRA plugin (``vfioctl dra-plugin`` as a real subprocess).

Builds a temp sysfs tree of N PCI functions on vfio-pci, each in its own IOMMU group (so N
DRA devices, ceil(N/128) ResourceSlices), starts the API-server stand-in
(tests/dra/apiserver_standin.py; the real ``kubernetes`` client talks to it over HTTP) and the
plugin, and prints:

- start → the first complete pool on the API server;
- device change → the republished pool (target < 1 s): one function leaves vfio-pci (then
  comes back), and the bench waits until the stand-in holds a pool at a new generation
  without (with) it. A temp tree emits no kernel uevents, so the bench sends SIGUSR1, which
  takes the same ``kick`` path a netlink uevent takes (debounce, full scan with host usage,
  recompute, list + write through the API);
- slices deleted (as kubelet does at its start) → republished (target: within one resync);
- RSS (VmRSS/VmHWM) and threads of the plugin.

Read the change rows with the note printed above the table: every change rewrites every slice
at the new pool generation (slices of an older generation are ignored by the scheduler), and
each write goes through the stand-in's strict decoding and validation, in Python, in THIS
process. "first slice write answered" is the plugin's own share (debounce, full scan with host
usage, compute, one write) plus one stand-in round trip; the rest scales with slices x the
stand-in's per-write cost, not the plugin's.

    python3 bench/dra_bench.py [--devices 1024] [--changes 10] [--resync 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import vfioctl_command  # noqa: E402
from tests.dra.apiserver_standin import NODES, SLICES, ApiServerStandin  # noqa: E402
from tests.sysfs_tree import Dev, SysfsTree  # noqa: E402

NODE = "bench-node"
DRIVER = "vfio.dra.vfio-dp.io"


def build_tree(base: Path, devices: int) -> tuple[SysfsTree, list[str]]:
    tree = SysfsTree(base)
    addrs = []
    for n in range(devices):
        bus, slot, fn = 1 + n // 256, (n // 8) % 32, n % 8
        addr = f"0000:{bus:02x}:{slot:02x}.{fn}"
        tree.add(Dev(addr, "15b3", "101c", "020000", driver="vfio-pci", group=1000 + n,
                     numa=n % 2))  # fmt: skip
        addrs.append(addr)
    boot = tree.root / "proc/sys/kernel/random"  # a node has one: claims are of this boot
    boot.mkdir(parents=True, exist_ok=True)
    (boot / "boot_id").write_text("bench-boot\n")
    return tree, addrs


def rss(pid: int) -> tuple[float, float, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return (
        int(fields["VmRSS"].split()[0]) / 1024,
        int(fields["VmHWM"].split()[0]) / 1024,
        int(fields["Threads"]),
    )


def pool(api: ApiServerStandin) -> tuple[int, int]:
    """(generation, devices at it) of the bench node's pool; (0, 0) when it has none. Read
    in place under the stand-in's lock, never copied: a copy of every slice after each
    request (4,096 devices) held the lock the plugin's writes wait for, and the CPU."""
    with api.lock:
        slices = [
            o
            for (plural, _, _), o in api.store.objects.items()
            if plural == SLICES.plural and o["spec"]["nodeName"] == NODE
        ]
        return pool_of(slices)


def pool_of(slices: list[dict[str, Any]]) -> tuple[int, int]:
    if not slices:
        return 0, 0
    gen = max(s["spec"]["pool"]["generation"] for s in slices)
    current = [s for s in slices if s["spec"]["pool"]["generation"] == gen]
    if len(current) != current[0]["spec"]["pool"]["resourceSliceCount"]:
        return gen, -1  # incomplete pool
    return gen, sum(len(s["spec"]["devices"]) for s in current)


FIRST_WRITE: list[float] = []  # seconds from the last wait()'s start to its first new write


def wait(api: ApiServerStandin, check: object, timeout: float) -> float:
    """Seconds until ``check()`` holds, re-checked only after each answered write request
    (polling the store itself would deep-copy every slice and slow the plugin down)."""
    start = time.monotonic()
    base = sum(r.method in ("POST", "PUT", "DELETE") for r in list(api.requests))
    seen = -1
    while True:
        writes = sum(r.method in ("POST", "PUT", "DELETE") for r in list(api.requests))
        if writes != seen:
            if seen == base:
                FIRST_WRITE.append(time.monotonic() - start)
            seen = writes
            if check():  # type: ignore[operator]
                return time.monotonic() - start
        if time.monotonic() - start > timeout:
            raise SystemExit(f"timed out after {timeout}s")
        time.sleep(0.002)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=1024)
    ap.add_argument("--changes", type=int, default=10)
    ap.add_argument("--resync", type=float, default=5.0)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vfio-dra-bench-"))
    kdir = tempfile.mkdtemp(prefix="kdb", dir="/tmp")
    for sub in ("registry", "plugins"):  # the kubelet makes them; the plugin never does
        os.makedirs(f"{kdir}/{sub}")
    t0 = time.monotonic()
    tree, addrs = build_tree(work / "root", args.devices)
    print(f"built a {args.devices}-device tree in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    api = ApiServerStandin(str(work / "api"))
    api.start()
    api.seed(NODES, {"metadata": {"name": NODE}})
    env = dict(os.environ, NODE_NAME=NODE)
    time.monotonic()
    proc = subprocess.Popen(
        [*vfioctl_command(), "dra-plugin", "--driver-name", DRIVER,
         "--kubeconfig", api.kubeconfig, "--root", str(tree.root),
         "--kubelet-registry-dir", f"{kdir}/registry", "--kubelet-plugins-dir", f"{kdir}/plugins",
         "--cdi-dir", f"{kdir}/cdi", "--resync", str(args.resync), "--metrics-port", "0", "--log-level", "warning"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    rows: list[tuple[str, str, str, str]] = []
    try:
        started = wait(api, lambda: pool(api)[1] == args.devices, 120)
        rows.append(("start -> complete pool", f"{started:.2f} s", "-", ""))
        times = []
        FIRST_WRITE.clear()
        victim = addrs[len(addrs) // 2]
        for i in range(args.changes):
            gen = pool(api)[0]
            leave = i % 2 == 0
            tree.set_driver(victim, "mlx5_core" if leave else "vfio-pci")
            want = args.devices - 1 if leave else args.devices
            t = time.monotonic()
            os.kill(proc.pid, signal.SIGUSR1)
            wait(api, lambda gen=gen, want=want: pool(api)[0] >= gen and pool(api)[1] == want, 30)
            times.append(time.monotonic() - t)
        first = statistics.median(FIRST_WRITE) if FIRST_WRITE else float("nan")
        rows.append(
            ("device change -> first slice write answered, median", f"{first * 1000:.0f} ms",
             "-", "scan, compute, 1st write answered")
        )  # fmt: skip
        med, worst = statistics.median(times), max(times)
        ok = "met" if worst < 1.0 else "NOT met"
        rows.append(("device change -> republished, median", f"{med * 1000:.0f} ms", "< 1 s", ok))
        rows.append(("device change -> republished, max", f"{worst * 1000:.0f} ms", "< 1 s", ok))
        gen = pool(api)[0]
        import kubernetes.client as k8s

        k8s.ResourceV1Api(api.client()).delete_collection_resource_slice(
            field_selector=f"spec.nodeName={NODE}"
        )
        t = time.monotonic()
        wait(api, lambda: pool(api)[0] >= gen and pool(api)[1] == args.devices, 3 * args.resync + 30)
        took = time.monotonic() - t
        ok = "met" if took <= args.resync + 1.0 else "NOT met"
        rows.append(
            ("slices deleted -> republished", f"{took:.2f} s", f"<= {args.resync:g} s+1", ok)
        )
        vm_rss, hwm, threads = rss(proc.pid)
        rows.append(("plugin RSS now / peak", f"{vm_rss:.0f}/{hwm:.0f} MB", "-", ""))
        rows.append(("plugin threads", str(threads), "-", ""))
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        api.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(kdir, ignore_errors=True)
    if proc.returncode != 0:
        print(f"plugin exited {proc.returncode}:\n{err}", file=sys.stderr)
    w = max(len(r[0]) for r in rows)
    print(f"DRA plugin, {args.devices} devices ({-(-args.devices // 128)} slices), "
          f"resync {args.resync:g} s; every change rewrites every slice at the new generation, "
          "each through the API-server stand-in's strict Python validation")  # fmt: skip
    print(f"{'measure'.ljust(w)}  {'value':>12}  {'target':>10}  result / note")
    for name, value, target, ok in rows:
        print(f"{name.ljust(w)}  {value:>12}  {target:>10}  {ok}")
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
