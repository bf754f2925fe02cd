#!/usr/bin/env python3
"""Benchmark: `list` and `groups` over a synthetic 4,096-function PCI tree.

Builds (with the test fixture, real files and relative links) 64 root ports, each with an
SR-IOV PF and its 63 VFs (64 x 64 = 4,096 functions plus the bridges), then prints a table:
in-process time of the library calls behind `vfioctl list` and `vfioctl groups`, and
whole-command times next to `lspci -D -k` reading the same tree
(`lspci -A linux-sysfs -O sysfs.path=<tree>/sys/bus/pci`), in interleaved rounds. Medians of
several runs (BENCH_RUNS, default 7). The in-process figures use one process; the commands
split a big scan across the CPUs they may use (at most 4), as `vfioctl` does on a node.
Targets: < 0.3 s in-process each; whole command no slower than lspci.

One more row: a sysfs write that never returns (a FIFO without a reader stands in for an
unbind a held device blocks) ends in ``WriteTimeoutError`` after the writer's timeout (0.2 s
here); target: within 0.5 s of it.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import vfioctl_command
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import WriteTimeoutError
from vfio_dp.host import Host
from vfio_dp.host.kernel import RealKernel

PFS, VFS = 64, 63


def build(base: Path) -> SysfsTree:
    t = SysfsTree(base)
    group = 0
    for pf in range(PFS):
        port = f"0000:00:{pf // 8 + 1:02x}.{pf % 8}"
        t.add(Dev(port, "8086", "a110", "060400", driver="pcieport", group=group))
        group += 1
        bus = pf + 0x10
        pfa = f"0000:{bus:02x}:00.0"
        t.add(
            Dev(
                pfa,
                "15b3",
                "101b",
                "020000",
                driver="mlx5_core",
                group=group,
                parent=port,
                numa=pf % 2,
                sriov_totalvfs=VFS,
                sriov_numvfs=VFS,
            )
        )
        group += 1
        for vf in range(1, VFS + 1):
            addr = f"0000:{bus:02x}:{vf // 8:02x}.{vf % 8}"
            t.add(
                Dev(
                    addr,
                    "15b3",
                    "101c",
                    "020000",
                    driver="vfio-pci",
                    group=group,
                    parent=port,
                    numa=pf % 2,
                    physfn=pfa,
                )
            )
            group += 1
    return t


def median_time(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


WRITE_TIMEOUT = 0.2


def stuck_write(base: Path) -> float:
    """Seconds until a write that never returns gives up (RealKernel's timeout)."""
    fifo = base / "stuck-unbind"
    if not fifo.exists():
        os.mkfifo(fifo)  # opening a FIFO for writing blocks like a stuck unbind
    k = RealKernel(timeout=WRITE_TIMEOUT)
    t0 = time.perf_counter()
    try:
        k.write(str(fifo), "0000:01:00.0")
    except WriteTimeoutError:
        took = time.perf_counter() - t0
    else:
        raise RuntimeError(f"a write to {fifo} without a reader returned")
    os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # let the stuck writer thread go
    return took


def main() -> None:
    runs = int(os.environ.get("BENCH_RUNS", "7"))
    base = Path(tempfile.mkdtemp(prefix="vfio_bench_"))
    try:
        t0 = time.perf_counter()
        tree = build(base)
        n = len(tree.devs)
        print(
            f"built {n} PCI functions ({PFS} PFs x {VFS} VFs + {PFS} bridges) "
            f"in {time.perf_counter() - t0:.1f}s under {base}"
        )
        host = Host(tree.root)
        rows: list[tuple[str, float, str]] = []
        rows.append(
            (
                "list in-process, 1 process (scan + host use + pci.ids names)",
                median_time(lambda: host.names(host.scan()), runs),
                "< 0.300",
            )
        )
        rows.append(
            (
                "groups in-process, 1 process (scan + group analysis)",
                median_time(lambda: host.scan(usage=False).groups, runs),
                "< 0.300",
            )
        )
        env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
        vfioctl = vfioctl_command()
        root = str(tree.root)
        whole: dict[str, list[str]] = {
            "vfioctl list -o json (whole command)": [
                *vfioctl,
                "list",
                "--root",
                root,
                "-o",
                "json",
            ],
            "vfioctl groups -o json (whole command)": [
                *vfioctl,
                "groups",
                "--root",
                root,
                "-o",
                "json",
            ],
        }
        lspci = shutil.which("lspci")
        if lspci:
            sysfs_path = f"sysfs.path={root}/sys/bus/pci"
            whole["lspci -D -k (same tree)"] = [
                lspci,
                "-D",
                "-k",
                "-A",
                "linux-sysfs",
                "-O",
                sysfs_path,
            ]
        # interleaved rounds: a noisy neighbour slows every command alike, not one of them
        times: dict[str, list[float]] = {what: [] for what in whole}
        for _ in range(runs):
            for what, args in whole.items():
                t0 = time.perf_counter()
                subprocess.run(
                    args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
                )
                times[what].append(time.perf_counter() - t0)
        lspci_t = statistics.median(times["lspci -D -k (same tree)"]) if lspci else None
        target = f"<= {lspci_t:.3f}" if lspci_t else "lspci missing"
        for what, ts in times.items():
            rows.append(
                (what, statistics.median(ts), "reference" if what.startswith("lspci") else target)
            )
        rows.append(
            (
                f"stuck sysfs write -> WriteTimeoutError (timeout {WRITE_TIMEOUT:g} s)",
                median_time(lambda: stuck_write(base), runs),
                f"< {WRITE_TIMEOUT + 0.5:.3f}",
            )
        )
        print(f"CPUs for the commands: {len(os.sched_getaffinity(0))}")
        print(f"\n{'what':58} {'median s':>9}  target")
        for what, secs, tgt in rows:
            print(f"{what:58} {secs:9.3f}  {tgt}")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
