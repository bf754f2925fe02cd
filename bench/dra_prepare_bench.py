#!/usr/bin/env python3
"""Benchmark: NodePrepareResources / NodeUnprepareResources of the DRA handler on a temp tree.

Builds a node with four lone NICs (each its own IOMMU group) plus the usual host devices, and
times :class:`vfio_dp.dra.claimpath.prepare.ClaimPreparer` in-process (the gRPC hop is not included):

- Prepare/Unprepare of a claim whose group is already on vfio-pci (``bind: false``): the
  handler's own cost -- ResourceClaim read (an in-memory reader), the read of the claim's
  IOMMU group (with host use), CDI spec and metadata file (replaced atomically, not synced:
  every Prepare rewrites them), checkpoint (durable: fsync);
- Prepare/Unprepare with ``bind: onPrepare`` of 1 and of 4 groups through the kernel
  SIMULATOR (tests/kernel_sim.py: no driver probe time), next to ``Host.bind`` /
  ``Host.unbind`` of the same groups (what ``vfioctl bind --group`` runs).

Where the files go, as on a node: the CDI specs in a tmpfs (the DaemonSet's ``/var/run/cdi``
is the host's ``/run``, a tmpfs on systemd hosts; here ``/dev/shm``), the metadata files and
the checkpoint on the disk of the temp dir (``/var/lib/kubelet/plugins``, ``/var/lib/vfio_dp``).
The floor under the no-bind row is printed with it: one durable atomic write on that disk
(temp file, ``fsync``, ``rename``, ``fsync`` of the directory), of which a Prepare makes one
(the checkpoint).

``--guest``: the same rows in the QEMU guest rig (real kernel 6.1, emulated Intel IOMMU, a
topology of four lone e1000e NICs), binding for real -- e1000e's probe included.
BENCH_RUNS (default 30 on the temp tree, 5 in the guest) rounds each; p50 and p99 in ms.
``--json``: the temp-tree figures as one JSON object (for bench/rows.py).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# BENCH_CODE: the tree whose vfio_dp (and test helpers) to time (bench/against.py: a git ref)
sys.path.insert(0, os.environ.get("BENCH_CODE") or str(Path(__file__).resolve().parents[1]))

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
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


Row = tuple[str, list[float], list[float]]


def measure_all(
    host: Host,
    base: str,
    runs: int,
    nics: list[str],
    no_bind: str | None,
    cdi_dir: str | None = None,
    config_text: str = CONFIG,
    no_bind_label: str = "Prepare, group already on vfio-pci (no bind)",
) -> list[Row]:
    """The table's rows on ``host`` (a temp tree with the simulator, or the guest's real
    kernel); ``base`` holds the plugin dir (and the CDI dir unless ``cdi_dir``); ``no_bind``:
    a device on vfio-pci with ``bind: false`` for the no-binding row; ``nics``: the lone
    groups for the ``onPrepare`` rows (none: no such rows)."""
    config = load_config_text(config_text, "bench")
    rows: list[Row] = []
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    where = "simulator" if isinstance(host.kernel, SimulatedKernel) else "real kernel"

    async def read(ns: str, name: str) -> dict[str, Any] | None:
        return objects.get((ns, name))

    prep = ClaimPreparer(
        host=host, driver=DRIVER, node=NODE, cdi_dir=cdi_dir or f"{base}/cdi",
        plugins_dir=f"{base}/plugins", read_claim=read, config=lambda: config,
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

    if no_bind:
        asyncio.run(measure(no_bind_label, [no_bind]))
    for n in (1, len(nics)) if nics else ():
        asyncio.run(measure(f"Prepare, onPrepare bind of {n} group(s) ({where})", nics[:n]))
        measure_host(f"Host.bind --group of the same {n} group(s) ({where})", nics[:n])
    return rows


#: the big host of bench/host_bench.py: 64 PFs with 64 VFs each on vfio-pci, each VF its own
#: IOMMU group (4,160 functions); its VFs on the DRA path
BIG_CONFIG = """
selectors:
  - vendor: "15b3"
    device: "101c"
    path: dra
"""
BIG_VF = "0000:10:00.1"


class NoWrites:
    """The kernel of the big row: its Prepare binds nothing, so any sysfs write is a bug of
    the bench (and the tree may be shared: ``BENCH_BIG_TREE``)."""

    def write(self, path: str, data: str) -> None:
        raise AssertionError(f"the no-bind Prepare wrote {data!r} to {path}")

    def modprobe(self, module: str) -> None:
        raise AssertionError(f"the no-bind Prepare loaded {module}")


def measure_big(base: Path, runs: int, cdi_dir: str | None) -> Row:
    """Prepare/Unprepare of one VF's group on the 4,160-function host: what a Prepare reads
    of a big host (its claim's group, or every device). ``BENCH_BIG_TREE``: that tree, built
    already (bench/rows.py builds it once for every side and round: building it takes from
    ~10 s to a minute); the plugin's state in it is removed before and after."""
    given = os.environ.get("BENCH_BIG_TREE")
    if given:
        root = Path(given)
    else:
        from bench.host_bench import build as build_big

        root = build_big(base / "big").root
        os.sync()  # the tree's ~60,000 new files written back now, not under the timed fsyncs
    state = root / "var" / "lib" / "vfio_dp"
    shutil.rmtree(state, ignore_errors=True)
    try:
        (row,) = measure_all(
            Host(root, kernel=NoWrites()), str(base), runs, [], BIG_VF, cdi_dir,
            config_text=BIG_CONFIG,
            no_bind_label="Prepare, group already on vfio-pci, 4,160-function host",
        )  # fmt: skip
    finally:
        shutil.rmtree(state, ignore_errors=True)
    return row


def tmpfs_dir() -> str | None:
    """A fresh directory in a tmpfs (``/dev/shm`` or ``/run``), like a node's /var/run/cdi;
    None when neither is a tmpfs here."""
    with open("/proc/self/mounts") as f:
        tmpfs = {line.split()[1] for line in f if line.split()[2:3] == ["tmpfs"]}
    for where in ("/dev/shm", "/run"):
        if where in tmpfs and os.access(where, os.W_OK):
            return tempfile.mkdtemp(prefix="dra-bench-cdi", dir=where)
    return None


def durable_writes(base: str, runs: int) -> list[float]:
    """Seconds per durable atomic write of a 1 KiB file in ``base`` (the project's one writer,
    :func:`vfio_dp.host.atomic.write_atomic`): the disk's floor under each Prepare."""
    from vfio_dp.host.atomic import write_atomic

    out = []
    for i in range(runs + 1):
        t0 = time.perf_counter()
        write_atomic(os.path.join(base, "floor", "probe.json"), b"x" * 1024 + str(i).encode())
        out.append(time.perf_counter() - t0)
    return out[1:]


def print_table(title: str, rows: list[Row]) -> None:
    print(title)
    print()
    print("| case | prepare/bind p50 | p99 | unprepare/unbind p50 | p99 |")
    print("|---|---:|---:|---:|---:|")
    for label, p, u in rows:
        print(
            f"| {label} | {statistics.median(p) * 1000:.1f} | {pct(p, 0.99):.1f} "
            f"| {statistics.median(u) * 1000:.1f} | {pct(u, 0.99):.1f} |"
        )


def main() -> None:
    if "--in-guest" in sys.argv:  # inside the QEMU guest: the real kernel, four lone e1000e
        runs = int(os.environ.get("BENCH_RUNS", "5"))
        nics = [f"0000:0{i}:00.0" for i in range(1, 5)]
        with tempfile.TemporaryDirectory(prefix="dra-bench") as d:
            rows = measure_all(Host("/"), d, runs, nics, None)
        out = os.path.join(os.environ.get("GUEST_RIG_OUT", "/tmp"), "bench.json")
        with open(out, "w") as f:
            json.dump(rows, f)
        return
    if "--guest" in sys.argv:
        from tests.guest.rig import GuestRig, Topology

        rig = GuestRig(topology=Topology(lone_e1000e=4, shared_e1000=0))
        runs = os.environ.get("BENCH_RUNS", "5")
        res = rig.run(
            f'BENCH_RUNS={runs} "$PYTHON" bench/dra_prepare_bench.py --in-guest', timeout=1800
        )
        if "bench.json" not in res.files:
            sys.exit(f"guest run failed:\n{res.stdout}\n{res.stderr}\n{res.console[-3000:]}")
        rows = [(label, p, u) for label, p, u in json.loads(res.files["bench.json"])]
        print_table(
            f"DRA handler in the QEMU guest (real kernel 6.1, emulated: TCG), {runs} rounds "
            "each (ms; in-process, no gRPC hop)",
            rows,
        )
        return
    runs = int(os.environ.get("BENCH_RUNS", "30"))
    cdi = tmpfs_dir()
    try:
        with tempfile.TemporaryDirectory(prefix="dra-bench") as d:
            big = measure_big(Path(d), min(runs, 20), cdi)
            tree = build(Path(d) / "root")
            host = Host(tree.root, kernel=SimulatedKernel(tree))
            rows = measure_all(host, d, runs, NICS, "0000:09:00.0", cdi)
            floor = durable_writes(d, runs)
            rows.append(big)
    finally:
        if cdi:
            shutil.rmtree(cdi, ignore_errors=True)
        os.sync()  # the big tree's removal written back before the next process times fsync
    if "--json" in sys.argv:
        (_, nb, _), (_, on1, _), (_, b1, _), (_, on4, _), (_, b4, _), (_, big, _) = rows
        med = statistics.median
        figures = {"prep_p50": med(nb) * 1000, "prep_p99": pct(nb, 0.99),
                   "prep_on1": med(on1) * 1000, "bind_1": med(b1) * 1000,
                   "prep_on4": med(on4) * 1000, "bind_4": med(b4) * 1000,
                   "durable_p50": med(floor) * 1000, "durable_p99": pct(floor, 0.99),
                   "prep_big": med(big) * 1000}  # fmt: skip
        print(json.dumps(figures))
        return
    print_table(
        f"DRA handler on a temp tree, {runs} rounds each (ms; in-process, no gRPC hop); CDI "
        f"specs in {'a tmpfs' if cdi else 'the temp dir (no tmpfs found)'}",
        rows,
    )
    print(
        f"\nfloor: one durable atomic write on the temp dir's disk, p50 "
        f"{statistics.median(floor) * 1000:.2f} / p99 {pct(floor, 0.99):.2f} ms (a Prepare "
        "makes one: the checkpoint; the metadata file and the CDI spec are replaced atomically, "
        "not synced)"
    )


if __name__ == "__main__":
    main()
