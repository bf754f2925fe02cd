#!/usr/bin/env python3
"""Benchmark of the device-plugin daemon (``vfioctl plugin`` as a real subprocess).

Builds a temp sysfs tree of 4,096 PCI functions on vfio-pci, each in its own IOMMU group,
spread over 64 vendor:device IDs (so 64 resources, 64 sockets), starts the kubelet stand-in
(tests/deviceplugin/kubelet_standin.py) and the daemon, and prints:

- Allocate latency over the unix socket, p50/p99 (target p99 < 2 ms; each Allocate also
  rewrites the allocation record atomically with fsync);
- device state change → the new ListAndWatch message at the kubelet stand-in (target < 1 s).
  A temp tree emits no kernel uevents, so the bench sends SIGUSR1, which goes through the
  same ``kick`` path a netlink uevent takes (then: full rescan of 4,096 devices, recompute,
  publish); a second row shows the resync-only worst case for comparison;
- a kubelet restart (every socket in the dir wiped, a fresh ``kubelet.sock``) → every resource
  registered and listed again (target < 2 s; the daemon notices the new ``kubelet.sock``);
- RSS (VmRSS/VmHWM) and thread count of the daemon serving 64 resources (target < 80 MB).

    python3 bench/plugin_bench.py [--devices 4096] [--resources 64] [--allocs 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.common import vfioctl_command  # noqa: E402
from tests.deviceplugin.kubelet_standin import KubeletStandin  # noqa: E402
from tests.sysfs_tree import Dev, SysfsTree  # noqa: E402


def build_tree(base: Path, devices: int, resources: int) -> tuple[SysfsTree, list[str]]:
    tree = SysfsTree(base)
    names = []
    per = devices // resources
    n = 0
    for r in range(resources):
        dev_id = f"{0x1000 + r:04x}"
        names.append(f"devices.kubevirt.io/8086_{dev_id}")
        for i in range(per):
            bus, slot, fn = 1 + n // 256, (n // 8) % 32, n % 8
            tree.add(
                Dev(
                    f"0000:{bus:02x}:{slot:02x}.{fn}",
                    "8086",
                    dev_id,
                    "020000",
                    driver="vfio-pci",
                    group=1000 + n,
                    numa=n % 2,
                )
            )
            n += 1
            del i
    return tree, names


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


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=4096)
    ap.add_argument("--resources", type=int, default=64)
    ap.add_argument("--allocs", type=int, default=1000)
    ap.add_argument("--resync", type=float, default=5.0)
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="vfio-bench-"))
    kdir = tempfile.mkdtemp(prefix="kb", dir="/tmp")
    t0 = time.monotonic()
    tree, names = build_tree(work / "root", args.devices, args.resources)
    print(f"built a {args.devices}-device tree in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    kubelet = KubeletStandin(kdir)
    await kubelet.start()
    cmd = vfioctl_command()
    log = open(work / "daemon.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            *cmd,
            "plugin",
            "--root",
            str(tree.root),
            "--kubelet-dir",
            kdir,
            "--resync",
            str(args.resync),
            "--metrics-port",
            "0",
            "--log-level",
            "warning",
        ],
        stdout=log,
        stderr=log,
    )
    rows: list[tuple[str, str, str, str]] = []
    try:
        per = args.devices // args.resources
        t0 = time.monotonic()
        await kubelet.wait_for(
            f"{args.resources} resources listed",
            lambda k: (
                len(k.plugins) == args.resources
                and all(len(v.devices) == per for v in k.plugins.values())
            ),
            timeout=120,
        )
        startup = time.monotonic() - t0
        rows.append(("start → all resources registered and listed", f"{startup:.2f} s", "-", ""))

        # Allocate latency over the socket
        res = names[0]
        ids = sorted(kubelet.devices(res))
        lat: list[float] = []
        for i in range(args.allocs):
            t = time.perf_counter()
            await kubelet.allocate(res, [ids[i % len(ids)]])
            lat.append((time.perf_counter() - t) * 1000)
        p50, p99 = pct(lat, 50), pct(lat, 99)
        rows.append(("Allocate latency p50", f"{p50:.2f} ms", "-", ""))
        rows.append(
            ("Allocate latency p99", f"{p99:.2f} ms", "< 2 ms", "ok" if p99 < 2 else "MISSED")
        )

        # state change → ListAndWatch (event path: SIGUSR1 = the uevent kick)
        target = ids[1]
        took: list[float] = []
        for i in range(6):
            driver = "e1000e" if i % 2 == 0 else "vfio-pci"
            want = "Unhealthy" if driver == "e1000e" else "Healthy"
            tree.set_driver(target, driver)
            t = time.monotonic()
            proc.send_signal(signal.SIGUSR1)
            await kubelet.wait_for(
                f"{target} {want}", lambda k, w=want: k.devices(res).get(target) == w, timeout=10
            )
            took.append(time.monotonic() - t)
        worst = max(took)
        rows.append(
            (
                "state change → ListAndWatch (event), median",
                f"{statistics.median(took) * 1000:.0f} ms",
                "-",
                "",
            )
        )
        rows.append(
            (
                "state change → ListAndWatch (event), worst of 6",
                f"{worst * 1000:.0f} ms",
                "< 1 s",
                "ok" if worst < 1 else "MISSED",
            )
        )
        tree.set_driver(target, "e1000e")
        t = time.monotonic()
        await kubelet.wait_for(
            "resync", lambda k: k.devices(res).get(target) == "Unhealthy", timeout=args.resync * 3
        )
        rows.append(
            (
                "state change → ListAndWatch (no event, resync only)",
                f"{(time.monotonic() - t) * 1000:.0f} ms",
                f"≤ --resync {args.resync:g} s",
                "",
            )
        )

        # kubelet restart → registered and listed again
        t = time.monotonic()
        await kubelet.restart()
        await kubelet.wait_for(
            f"{args.resources} resources listed again",
            lambda k: (
                len(k.plugins) == args.resources
                and all(len(v.devices) == per for v in k.plugins.values())
            ),
            timeout=60,
        )
        again = time.monotonic() - t
        rows.append(
            (
                "kubelet restart → all resources listed again",
                f"{again * 1000:.0f} ms",
                "< 2 s",
                "ok" if again < 2 else "MISSED",
            )
        )

        cur, peak, threads = rss(proc.pid)
        rows.append(
            (
                f"daemon RSS, {args.resources} resources / {args.devices} devices",
                f"{cur:.1f} MB",
                "< 80 MB",
                "ok" if cur < 80 else "MISSED",
            )
        )
        rows.append(("daemon peak RSS (VmHWM)", f"{peak:.1f} MB", "-", ""))
        rows.append(("daemon threads", str(threads), "bounded", ""))
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        rows.append(("SIGTERM → exit", f"code {rc}", "0", "ok" if rc == 0 else "MISSED"))
        await kubelet.stop()
        log.close()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(kdir, ignore_errors=True)

    w = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(w)}  {'value':>10}  {'target':>14}  result")
    for name, value, target_, ok in rows:
        print(f"{name.ljust(w)}  {value:>10}  {target_:>14}  {ok}")
    return 0 if all(r[3] != "MISSED" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
