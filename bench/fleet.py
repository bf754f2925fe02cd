#!/usr/bin/env python3
"""Fleet-scale rows (issue 39): a node of a thousand devices, prepared claims by the
thousand, each row with its goal (met / NOT met).

    python3 bench/fleet.py [--small] [--json] [--soak SECONDS] [--only 1,2,3,3c,3f,5,6]

Rows (the issue's numbers; ``--small`` runs each at a small size in seconds, for
tests/test_bench_harness.py: its figures mean nothing, its goals are not judged):

1. **health at scale**: N prepared groups (one VF per group, 1,024) leave their VFIO driver
   at once on the tree (as an outside actor's rebind does) → UNHEALTHY for all N on the
   kubelet stand-in's health stream, and a slice write with all N tainted (median and
   worst over the rounds); the same change seen by the device plugin's ListAndWatch (its
   daemon, 1,024 devices, SIGUSR1 as a uevent's kick). The DRA plugin runs in this process
   with the kubelet DRA stand-in (gRPC, real sockets), as ``bench/dra_health_bench.py``;
   the API-server stand-in in a process of its own (``bench/apiserver_proc.py``), as the
   real one is; a temp tree emits no uevents, so the plugin is kicked as one kicks it.
2. **claims at scale**: one NodePrepareResources of 1,000 claims whose groups are on
   vfio-pci, the same NodeUnprepareResources, and a kubelet restart re-preparing 500 --
   the DRA handler in-process (``bench/dra_batch_bench.py``; no gRPC hop, ResourceClaims
   from memory: the claim reads are the API server's, not the node's).
3. **publication at scale**: the DRA daemon (``vfioctl dra-plugin``) on 1,024 devices: one
   device changes → its pool republished (median), and the slice writes that change made,
   counted in the API-server stand-in; 3f: on 4,096 devices, start → every device published
   (the API-server stand-in in a process of its own; ``--only 3f`` runs only this one).
   3c: ``numVfs: 256`` on 4 PFs, the DRA plugin in this process on the kernel simulator
   (its tree on a tmpfs, as sysfs is in memory; the API-server stand-in a process of its
   own): start → the slice write holding every VF.
4. **webhook at cluster scale**: the real ``vfioctl webhook --check-nodes`` against 100 nodes
   x 64 devices in the API-server stand-in (its own process), 64 TLS connections from two
   load-generator processes (``bench/webhook_load.py``): closed loop (saturating) and an
   offered 500 reviews/s (open loop); a trivial TLS server's closed loop as the floor.
5. **memory**: each daemon's RSS at 4,096 devices (the DRA daemon after a Prepare of 1,000
   claims through the kubelet stand-in), then ``--soak`` seconds of one device change a
   second (default 60, small 5; the issue's one-hour soak is ``--soak 3600``): the growth
   judged is the one after a warm-up (a third of the soak, at most 60 s): the median RSS of
   the last quarter of the changes after it less that of the first quarter (one sample at
   each change; a daemon's RSS swings with each scan, so two single samples would judge the
   swing); the warm-up's own and an RSS sample every 10 changes are logged.
6. **idle**: both daemons at 4,096 devices, ``--resync 5``, the DRA plugin with the kubelet
   stand-in's health stream open: % of one CPU over six resync periods (30 s: about one
   refresh of the health stream's unchanged list, every 30-35 s, in a window).

``BENCH_CODE``: the tree whose ``vfio_dp`` to measure (bench/against.py: a git ref); the
stand-ins and trees are this tree's. ``--json``: the figures as one JSON object
(bench/rows.py). Measured on a loaded machine, every figure is noisy: re-measure idle.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("BENCH_CODE") or str(Path(__file__).resolve().parents[1]))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))

import vfio_dp  # noqa: F401  (first: the side's, before a bench module puts this tree first)
from bench.rows import (
    FIGURES,
    FLEET_NOT_MEASURED,
    RESYNC,
    DevicePluginRig,
    DraRig,
    LoopThread,
    Side,
    cpu_ns,
    met,
    rss_mb,
    vm_claim,
)

#: row 6's window, seconds
IDLE_WINDOW = 6 * RESYNC
#: a tmpfs for row 3c's tree (sysfs is in memory); ``BENCH_SYSFS_DIR`` another (or a disk's)
SYSFS_TMPFS = os.environ.get("BENCH_SYSFS_DIR", "/dev/shm")


def log(msg: str) -> None:
    print(f"  fleet: {msg}", file=sys.stderr, flush=True)


async def until(cond: Callable[[], bool], timeout: float, what: str) -> float:
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        await asyncio.sleep(0.005)
    return time.monotonic() - start


# -- row 1: health at scale (DRA plugin in-process) ---------------------------------------------
async def health_row(work: Path, n: int, rounds: int) -> list[float]:
    from bench.apiserver_proc import ApiServerProcess
    from bench.dra_health_bench import CONFIG, DRIVER, NODE, build_tree, name_of
    from tests.dra.apiserver_standin import CLAIMS, NODES
    from tests.dra.kubelet_dra_standin import KubeletDraStandin
    from vfio_dp.dra.options import DraOptions
    from vfio_dp.dra.plugin import DraPlugin
    from vfio_dp.host import Host

    kdir = tempfile.mkdtemp(prefix="kfh", dir="/tmp")
    tree, addrs = build_tree(work / "root", n)
    (work / "config.yaml").write_text(CONFIG)
    api = ApiServerProcess(str(work / "api"))  # a process of its own, as the real one
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
    names = {name_of(a) for a in addrs}
    tainted: list[tuple[float, int]] = []  # (time, devices of ours tainted) per publication

    def published(generation: int, slices: list[dict[str, Any]]) -> None:
        bad = sum(
            1
            for s in slices
            for d in s["spec"].get("devices") or []
            if d["name"] in names and d.get("taints")
        )
        tainted.append((time.monotonic(), bad))

    def count(health: str) -> int:
        seen = kubelet.health.get(DRIVER, {})
        return sum(1 for (_, dev), s in seen.items() if dev in names and s.health == health)

    plugin.publisher.on_published.append(published)
    out: list[float] = []
    try:
        await plugin.start()
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins, 120)
        await until(lambda: count("Healthy") == n, 300, "every device healthy")
        bodies = []
        for i, a in enumerate(addrs):
            bodies.append(vm_claim(i, name_of(a), DRIVER, NODE))
        seeded = api.seed(CLAIMS, *bodies)
        pairs = [(c["metadata"]["uid"], c["metadata"]["name"]) for c in seeded]
        await kubelet.run_pod(DRIVER, "vm", "vms", pairs)  # one Prepare of every claim
        log(f"row 1: {n} claims prepared")
        for r in range(2 * rounds):
            bad = r % 2 == 0
            for a in addrs:
                tree.set_driver(a, None if bad else "vfio-pci")
            t, cpu, api_cpu = time.monotonic(), time.process_time(), cpu_ns(api.pid)
            plugin.core.kick("uevent bench")
            want = "Unhealthy" if bad else "Healthy"
            seen = await until(lambda w=want: count(w) == n, 60, f"{n} {want}")  # type: ignore[misc]
            goal = n if bad else 0
            await until(
                lambda g=goal, t=t: any(w > t and x == g for w, x in tainted),  # type: ignore[misc]
                60,
                "the slices",
            )
            written = next(w for w, x in tainted if w > t and x == goal) - t
            if bad:
                out.append(max(seen, written))
                # the CPU of this process (the plugin and the kubelet stand-in, every
                # thread) meanwhile, and of the API-server stand-in's
                log(
                    f"row 1 round {r // 2 + 1}: stream {seen:.2f} s, slices {written:.2f} s, "
                    f"CPU {time.process_time() - cpu:.2f} s (API-server stand-in "
                    f"{(cpu_ns(api.pid) - api_cpu) / 1e9:.2f} s), load {os.getloadavg()[0]:.1f}"
                )
    finally:
        await plugin.stop()
        await kubelet.stop()
        api.stop()
        shutil.rmtree(kdir, ignore_errors=True)
    return out


# -- row 4: the webhook at cluster scale ---------------------------------------------------------
def webhook_tree(pid: int) -> dict[int, tuple[int, float]]:
    """CPU so far (ns) and RSS (MB) of the webhook ``pid`` and of each of its descendants
    (its serving workers with ``--workers``, the node-list child), by pid."""
    out: dict[int, tuple[int, float]] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError):
            out[p] = (cpu_ns(p), rss_mb(p))
            for task in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(k) for k in f.read().split()]
    return out


def tree_cpu_ms(before: dict[int, tuple[int, float]], after: dict[int, tuple[int, float]]) -> float:
    """CPU (ms) the webhook's processes spent between two :func:`webhook_tree` looks."""
    return sum(c - before.get(p, (0, 0.0))[0] for p, (c, _) in after.items()) / 1e6


#: row 4's offered rate (open loop): the closed loop's p99 at 64 connections is the queue of
#: 64 reviews on the cores (~64 x the CPU of one / the cores serving), what a saturating
#: client makes of any server
WEBHOOK_RATE = 500.0
#: row 4's ``vfioctl webhook --workers`` (deploy/base's default); BENCH_WEBHOOK_WORKERS=1 for
#: a tree without the flag (main before it)
WEBHOOK_WORKERS = 2


def webhook_row(
    work: Path, nodes: int, devices: int, reviews: int, rate: float = 0.0, paced_s: float = 20.0
) -> dict[str, float]:
    """The real ``vfioctl webhook --self-signed --check-nodes --workers 2`` (TLS, a
    subprocess) against the API-server stand-in (a process of its own) holding ``nodes``
    Nodes that each advertise ``devices`` of one device plugin resource, and a DeviceClass of
    ours with a slice of ``devices`` DRA devices per node (the DRA-aware lookup, KEP-5004).
    ``--node-cache-seconds 1``: the 100 nodes and 6,400 devices are listed again every second
    of the run. ``reviews`` AdmissionReviews (a VMI asking for both) at 64 connections in a
    closed loop from ``wrk`` (each connection sends its next review when the answer is in:
    the server saturated; bench/webhook_load.py ``run_wrk``), and at ``rate`` reviews/s for
    ``paced_s`` seconds from two Python load-generator processes (open loop: wrk has none;
    0: not run); the same closed loop against a trivial TLS server (the floor: what the load
    generator and TLS cost). p99, the CPU per review of the webhook's processes (serving
    workers and node-list child), their RSS after a warm-up and after the reviews, the API
    reads."""
    from bench.webhook_bench import start_server
    from bench.webhook_load import run_drivers, run_wrk

    standin = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "webhook_load.py"), "standin",
         "--dir", str(work / "api"), "--nodes", str(nodes), "--devices", str(devices)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert standin.stdin is not None and standin.stdout is not None
    kubeconfig = standin.stdout.readline().strip()
    certs = work / "certs"
    workers = int(os.environ.get("BENCH_WEBHOOK_WORKERS", WEBHOOK_WORKERS))
    flags = ("--check-nodes", "--node-cache-seconds", "1")
    flags += ("--workers", str(workers)) if workers != 1 else ()
    proc, url, _ = start_server(str(certs), flags, {"KUBECONFIG": kubeconfig})
    ca = str(certs / "ca.crt")
    out: dict[str, float] = {}

    def api_reads() -> dict[str, int]:
        assert standin.stdin is not None and standin.stdout is not None
        standin.stdin.write("\n")
        standin.stdin.flush()
        got: dict[str, int] = json.loads(standin.stdout.readline())["gets"]
        return got

    try:
        run_wrk(url, 64, 1280)  # warm-up: connections, caches, every worker
        tree0, reads0 = webhook_tree(proc.pid), api_reads()
        got = run_wrk(url, 64, reviews)
        tree1 = webhook_tree(proc.pid)
        own = tree_cpu_ms(tree0, tree1) / got["reviews"]
        grew = sum(r for _, r in tree1.values()) - sum(r for _, r in tree0.values())
        rss = sum(r for _, r in tree1.values())
        each = ", ".join(
            f"{(c - tree0.get(p, (0, 0.0))[0]) / 1e6 / got['reviews']:.3f}"
            for p, (c, _) in tree1.items()
        )
        reads = {k: v - reads0.get(k, 0) for k, v in api_reads().items()}
        node_reads = sum(v for k, v in reads.items() if k.endswith("/nodes"))
        log(f"row 4 closed loop (wrk, {workers} worker(s)): {got['reviews']:.0f} reviews, p50 "
            f"{got['p50_ms']:.1f} ms, p99 {got['p99_ms']:.1f} ms, mean {got['mean_ms']:.1f} ms, "
            f"{got['rps']:.0f}/s; webhook CPU {own:.3f} ms a review (its processes: {each}); "
            f"wrk CPU {got['driver_cpu_ms']:.3f} ms a review; RSS of the webhook's "
            f"{len(tree1)} processes {rss:.0f} MB {grew:+.1f} MB; node list read {node_reads} "
            f"times in {got['elapsed']:.1f} s; load {os.getloadavg()[0]:.1f}")  # fmt: skip
        out = {"fleet_webhook_p99": got["p99_ms"], "fleet_webhook_rss_growth": grew}
        if rate > 0:
            tree0 = webhook_tree(proc.pid)
            paced = run_drivers(url, ca, 64, int(rate * paced_s), rate)
            log(f"row 4 open loop at {rate:.0f}/s: p50 {paced['p50_ms']:.1f} ms, p99 "
                f"{paced['p99_ms']:.1f} ms, max {paced['max_ms']:.1f} ms, {paced['rps']:.0f}/s; "
                f"webhook CPU {tree_cpu_ms(tree0, webhook_tree(proc.pid)) / paced['reviews']:.3f} "
                f"ms a review; load {os.getloadavg()[0]:.1f}")  # fmt: skip
            out["fleet_webhook_p99_paced"] = paced["p99_ms"]
    finally:
        proc.terminate()  # SIGTERM: every worker and the node-list child end with it
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        standin.stdin.close()
        standin.wait()
    trivial = subprocess.Popen(
        [sys.executable, str(Path(__file__).parent / "webhook_load.py"), "trivial",
         "--cert", str(certs / "tls.crt"), "--key", str(certs / "tls.key")],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert trivial.stdout is not None
    try:
        floor_url = trivial.stdout.readline().strip()
        run_wrk(floor_url, 64, 1280)  # warm-up, as the webhook's
        cpu0 = cpu_ns(trivial.pid)
        floor = run_wrk(floor_url, 64, min(reviews, 20_000))
        log(f"row 4 floor (trivial TLS server, one process, closed loop, wrk): p50 "
            f"{floor['p50_ms']:.1f} ms, p99 {floor['p99_ms']:.1f} ms, {floor['rps']:.0f}/s; "
            f"server CPU {(cpu_ns(trivial.pid) - cpu0) / 1e6 / floor['reviews']:.3f} ms a "
            f"review; wrk {floor['driver_cpu_ms']:.3f} ms a review")  # fmt: skip
        if rate > 0:
            paced = run_drivers(floor_url, ca, 64, int(rate * paced_s), rate)
            log(f"row 4 floor at {rate:.0f}/s (open loop): p50 {paced['p50_ms']:.1f} ms, p99 "
                f"{paced['p99_ms']:.1f} ms; load {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        trivial.kill()
        trivial.wait()
    return out


# -- row 3c: numVfs on the simulator (the DRA plugin in-process) ---------------------------------
async def sriov_row(work: Path, pfs: int, vfs: int) -> dict[str, float]:
    """``numVfs: <vfs>`` on ``pfs`` SR-IOV PFs (QEMU NVMe ids, on ``nvme``) of a temp tree with
    the kernel simulator (tests/kernel_sim.py: writing ``sriov_numvfs`` makes the VFs, on no
    driver), the tree on a tmpfs (:data:`SYSFS_TMPFS`) when there is one; the API-server
    stand-in in a process of its own: the DRA plugin starts; its core's SR-IOV pass makes
    the VFs, its bind pass puts them on vfio-pci, and the slices are written. Timed from the
    start to the slice write that holds every VF (and the CPU of every thread of this
    process, and of the stand-in's)."""
    from bench.apiserver_proc import ApiServerProcess
    from tests.dra.apiserver_standin import NODES
    from tests.kernel_sim import SimulatedKernel
    from tests.sysfs_tree import Dev, SysfsTree
    from vfio_dp.dra.options import DraOptions
    from vfio_dp.dra.plugin import DraPlugin
    from vfio_dp.host import Host

    node, driver = "bench-node", "vfio.dra.vfio-dp.io"
    work.mkdir(parents=True, exist_ok=True)
    # the tree in memory where there is a tmpfs, as sysfs is (kernfs): on a disk, the
    # simulator making 1,024 VFs' ~40,000 files and links (ext4 metadata, journaled) was
    # ~2/3 of the row's CPU, a cost no kernel pays. The plugin's records live under the same
    # root, so their fsyncs cost nothing there: said beside the row in docs/performance.md
    mem = Path(tempfile.mkdtemp(prefix="vfio-fleet-sysfs-", dir=SYSFS_TMPFS)) if (
        os.path.isdir(SYSFS_TMPFS) and os.access(SYSFS_TMPFS, os.W_OK)
    ) else work  # fmt: skip
    tree = SysfsTree(mem / "root")
    addrs = []
    for i in range(pfs):
        port, pf = f"0000:00:{0x10 + i:02x}.0", f"0000:{0x10 * (i + 1):02x}:00.0"
        tree.add(Dev(port, "8086", "a113", "060400", driver="pcieport", group=10 + i))
        tree.add(Dev(pf, "1b36", "0010", "010802", driver="nvme", group=100 + i, parent=port,
                     sriov_totalvfs=vfs, sriov_numvfs=0))  # fmt: skip
        addrs.append(pf)
    (work / "config.yaml").write_text(
        f"selectors:\n- addresses: {json.dumps(addrs)}\n  numVfs: {vfs}\n  path: dra\n"
        "  bind: true\n"
    )
    kdir = tempfile.mkdtemp(prefix="kfs", dir="/tmp")
    api = ApiServerProcess(str(work / "api"))  # a process of its own, as the real one
    api.seed(NODES, {"metadata": {"name": node}})
    plugin = DraPlugin(
        DraOptions(
            node_name=node, driver_name=driver, registry_dir=f"{kdir}/registry",
            plugins_dir=f"{kdir}/plugins", cdi_dir=str(work / "cdi"),
            config_path=str(work / "config.yaml"), root=str(tree.root), resync=60.0,
            metrics_port=0, uevents=False,
        ),
        api.client(),
        host=Host(tree.root, kernel=SimulatedKernel(tree)),
    )  # fmt: skip
    done: list[float] = []

    def published(generation: int, slices: list[dict[str, Any]]) -> None:
        if sum(len(s["spec"].get("devices") or []) for s in slices) >= pfs * vfs and not done:
            done.append(time.monotonic())

    plugin.publisher.on_published.append(published)
    t, cpu, api_cpu = time.monotonic(), time.process_time(), cpu_ns(api.pid)
    try:
        await plugin.start()
        await until(lambda: bool(done), 300, f"{pfs * vfs} VFs published")
        took = done[0] - t
        log(f"row 3c: {pfs} x {vfs} VFs made and published in {took:.2f} s, "
            f"CPU {time.process_time() - cpu:.2f} s (the plugin and the kernel simulator; "
            f"the API-server stand-in {(cpu_ns(api.pid) - api_cpu) / 1e9:.2f} s), "
            f"load {os.getloadavg()[0]:.1f}")  # fmt: skip
    finally:
        await plugin.stop()
        api.stop()
        shutil.rmtree(kdir, ignore_errors=True)
        if mem != work:
            shutil.rmtree(mem, ignore_errors=True)
    return {"fleet_sriov": took}


def dp_health_row(side: Side, work: Path, n: int, rounds: int) -> list[float]:
    """The device plugin daemon on ``n`` devices: all leave vfio-pci, SIGUSR1 → every
    device reported not Healthy (or withdrawn) on ListAndWatch; and back."""
    loop = LoopThread()
    rig = DevicePluginRig(side, work / "dp", loop, devices=n)
    out: list[float] = []
    try:
        rig.wait_ready()
        addrs = sorted(rig.tree.devs)

        def healthy() -> int:
            return sum(
                1
                for v in rig.kubelet.plugins.values()
                for h in v.devices.values()
                if h == "Healthy"
            )

        for r in range(2 * rounds):
            bad = r % 2 == 0
            for a in addrs:
                rig.tree.set_driver(a, None if bad else "vfio-pci")
            t = time.monotonic()
            os.kill(rig.proc.pid, signal.SIGUSR1)
            goal = 0 if bad else n
            took = loop.run(until(lambda g=goal: healthy() == g, 60, "ListAndWatch"), 90)  # type: ignore[misc]
            del t
            if bad:
                out.append(took)
    finally:
        rig.stop()
        loop.stop()
    return out


# -- row 2: claims at scale (the handler in-process) ---------------------------------------------
def claims_row(work: Path, n: int) -> dict[str, float]:
    from bench.dra_batch_bench import CONFIG, DRIVER, NODE, build
    from vfio_dp.dra.claimpath.claims import ClaimRef
    from vfio_dp.dra.claimpath.prepare import ClaimPreparer
    from vfio_dp.host import Host
    from vfio_dp.model.config import load_config_text

    tree = build(work / "root", n)
    os.sync()  # the tree's files written back before anything times an fsync
    config = load_config_text(CONFIG, "bench")
    objects: dict[tuple[str, str], dict[str, Any]] = {}
    refs = []
    for i in range(n):
        bus, slot = divmod(i, 32)
        uid = f"uid-{i:05d}"
        objects[("default", f"c{i}")] = {
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "nic", "driver": DRIVER, "pool": NODE,
                 "device": f"pci-0000-{bus + 1:02x}-{slot:02x}-0"}]}}},
        }  # fmt: skip
        refs.append(ClaimRef("default", uid, f"c{i}"))

    async def read(ns: str, name: str) -> dict[str, Any] | None:
        return objects.get((ns, name))

    prep = ClaimPreparer(
        host=Host(tree.root), driver=DRIVER, node=NODE, cdi_dir=str(work / "cdi"),
        plugins_dir=str(work / "plugins"), read_claim=read, config=lambda: config,
    )  # fmt: skip

    def timed(coro: Any) -> tuple[float, Any]:
        t, c = time.perf_counter(), time.process_time()
        result = asyncio.run(coro)
        took = time.perf_counter() - t
        # the CPU it used, every thread: what a loaded machine cannot inflate much
        log(f"row 2: {took:.2f} s, CPU {time.process_time() - c:.2f} s")
        return took, result

    half = refs[: n // 2]
    took_p, out = timed(prep.prepare(refs))
    errors = [r.error for r in out.values() if r.error]
    took_r, out = timed(prep.prepare(half))  # kubelet restarted: it prepares them again
    errors += [r.error for r in out.values() if r.error]
    took_u, un = timed(prep.unprepare(refs))
    errors += [e for e in un.values() if e]
    if errors:
        raise RuntimeError(f"{len(errors)} claims failed: {errors[0]}")
    return {"fleet_prepare": took_p, "fleet_unprepare": took_u, "fleet_reprepare": took_r}


# -- rows 3, 5, 6: the daemons from outside --------------------------------------------------------
def slice_writes(rig: DraRig, since: int) -> int:
    return sum(
        1
        for r in list(rig.api.requests)[since:]
        if r.method in ("POST", "PUT", "PATCH") and "resourceslices" in r.path
    )


def republish_row(side: Side, work: Path, n: int, rounds: int) -> dict[str, float]:
    rig = DraRig(side, work / "dra1k", n)
    try:
        rig.wait_ready()
        times, writes = [], []
        for _ in range(rounds):
            mark = len(rig.api.requests)
            times.append(rig.republish() * 1000)
            time.sleep(0.3)  # a late second write of the same change is counted too
            writes.append(slice_writes(rig, mark))
    finally:
        rig.stop()
    return {"fleet_republish": statistics.median(times),
            "fleet_republish_writes": statistics.median(writes)}  # fmt: skip


def first_row(side: Side, work: Path, n: int) -> dict[str, float]:
    """Row 3's first publication: ``vfioctl dra-plugin`` started on ``n`` devices -> every
    device published (the node's pool complete at its newest generation), the API-server
    stand-in in a process of its own (as the real API server is: its CPU is not the
    daemon's, nor this process's, which only waits for its answer)."""
    dra = DraRig(side, work / "dra-first", n, api_process=True)
    try:
        took = dra.wait_ready() - dra.started
        assert dra.api_proc is not None
        log(
            f"row 3: first publication of {n} devices {took:.2f} s; CPU: the daemon "
            f"{cpu_ns(dra.proc.pid) / 1e9:.2f} s (now), the API-server stand-in "
            f"{cpu_ns(dra.api_proc.pid) / 1e9:.2f} s (with its start); load "
            f"{os.getloadavg()[0]:.1f}"
        )
    finally:
        dra.stop()
    return {"fleet_first": took}


def rss_growth(after: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Each daemon's RSS growth over the samples taken after the warm-up: the median of
    the last quarter less the median of the first (None under 4 samples). A daemon's RSS
    swings by several MB with each scan (a scan's objects live beside the inventory they
    replace), so two single samples say more about the swing than about a leak; a leak
    moves the quarters' medians (by three quarters of what it added over the span)."""
    q = len(after) // 4
    if q == 0:
        return None
    first, last = after[:q], after[-q:]
    return (
        statistics.median(a for a, _ in last) - statistics.median(a for a, _ in first),
        statistics.median(b for _, b in last) - statistics.median(b for _, b in first),
    )


def daemons_rows(
    side: Side, work: Path, n: int, claims: int, soak: float, window: float = IDLE_WINDOW
) -> dict[str, float]:
    """Rows 6 (idle, over ``window`` s) and 5 (memory, soak) on one pair of daemons."""
    from bench.dra_bench import DRIVER
    from bench.dra_health_bench import name_of
    from tests.dra.apiserver_standin import CLAIMS
    from tests.dra.kubelet_dra_standin import KubeletDraStandin

    out: dict[str, float] = {}
    loop = LoopThread()
    dra = DraRig(side, work / "dra", n)  # builds its tree, then starts the daemon
    dp: DevicePluginRig | None = None
    kubelet: KubeletDraStandin | None = None
    try:
        dra.wait_ready()
        dp = DevicePluginRig(side, work / "dp4k", loop, devices=n)
        dp.wait_ready()
        kubelet = KubeletDraStandin(
            f"{dra.kdir}/registry", DraRig.NODE, api_client=dra.api.client()
        )
        loop.run(kubelet.start())
        k = kubelet
        loop.run(k.wait_for("registration", lambda s: DRIVER in s.plugins, 120), 150)
        loop.run(until(lambda: k.health_responses > 0, 60, "the health stream"), 90)
        time.sleep(RESYNC + 1)  # start-up work settled
        # IDLE_WINDOW, six resyncs: about one refresh of the health stream's unchanged list
        # (every 30-35 s), as the daemon's long run has (two resyncs held one or none)
        before = {p: cpu_ns(p) for p in (dra.proc.pid, dp.proc.pid)}
        t = time.monotonic()
        time.sleep(window)
        took = time.monotonic() - t
        out["fleet_idle_dra"] = (cpu_ns(dra.proc.pid) - before[dra.proc.pid]) / 1e9 / took * 100
        out["fleet_idle_dp"] = (cpu_ns(dp.proc.pid) - before[dp.proc.pid]) / 1e9 / took * 100
        pairs = []
        for i, a in enumerate(dra.addrs[:claims]):
            body = vm_claim(i, name_of(a), DRIVER, DraRig.NODE)
            pairs.append((dra.api.seed(CLAIMS, body)["metadata"]["uid"], f"vm-{i}"))
        loop.run(k.run_pod(DRIVER, "vm", "vms", pairs), 600)
        log(f"rows 5: {claims} claims prepared in the DRA daemon")
        out["fleet_rss_dra"], out["fleet_rss_dp"] = rss_mb(dra.proc.pid), rss_mb(dp.proc.pid)
        victim = dra.addrs[-1]  # not a prepared one: a claim's device leaving is row 1's
        dp_victim = sorted(dp.tree.devs)[-1]
        # a warm-up first (a third of the soak, at most 60 s): caches, pools and the
        # allocator's arenas fill with the first changes; the growth judged is what follows
        warm = min(60.0, soak / 3)
        start = time.monotonic()
        i, warmed = 0, None
        samples: list[tuple[float, float, float]] = []  # (seconds in, RSS DRA, RSS DP)
        after: list[tuple[float, float]] = []  # RSS (DRA, DP) at every change after the warm-up
        while time.monotonic() - start < soak:
            if warmed is None and time.monotonic() - start >= warm:
                warmed = (i, time.monotonic(), rss_mb(dra.proc.pid), rss_mb(dp.proc.pid))
            now = (rss_mb(dra.proc.pid), rss_mb(dp.proc.pid))
            if warmed is not None:
                after.append(now)
            if i % 10 == 0:
                samples.append((time.monotonic() - start, *now))
            gone = i % 2 == 0
            dra.tree.set_driver(victim, "mlx5_core" if gone else "vfio-pci")
            dp.tree.set_driver(dp_victim, None if gone else "vfio-pci")
            os.kill(dra.proc.pid, signal.SIGUSR1)
            os.kill(dp.proc.pid, signal.SIGUSR1)
            i += 1
            time.sleep(1.0)
        if warmed is None:
            warmed = (i, time.monotonic(), rss_mb(dra.proc.pid), rss_mb(dp.proc.pid))
        end = (rss_mb(dra.proc.pid), rss_mb(dp.proc.pid))
        after.append(end)
        grew = rss_growth(after) or (end[0] - warmed[2], end[1] - warmed[3])
        out["fleet_rss_growth"] = sum(grew)  # both daemons, after the warm-up
        log(
            f"row 5: warm-up {warm:.0f} s ({warmed[0]} changes): RSS DRA "
            f"{warmed[2] - out['fleet_rss_dra']:+.1f} MB, device plugin "
            f"{warmed[3] - out['fleet_rss_dp']:+.1f} MB; then {time.monotonic() - warmed[1]:.0f} s "
            f"({i - warmed[0]} changes): DRA {grew[0]:+.1f} MB, device plugin {grew[1]:+.1f} MB "
            "(the last quarter's median RSS less the first quarter's); "
            "RSS every 10 changes (s, DRA, DP): "
            + ", ".join(f"{t:.0f} {a:.1f} {b:.1f}" for t, a, b in samples)
        )
    finally:
        if kubelet is not None:
            loop.run(kubelet.stop())
        if dp is not None:
            dp.stop()
        dra.stop()
        loop.stop()
    return out


# -- all -------------------------------------------------------------------------------------------
def measure(
    small: bool,
    soak: float | None,
    only: set[str],
    devices: int | None = None,
    reviews: int | None = None,
    step_name: str | None = None,
) -> tuple[dict[str, float], dict[str, str]]:
    """Each row in a fresh process of its own (``--step``), unless ``step_name``: that row
    here. In one process a row took more CPU after others (row 3c: 3.8 s alone, 13.2 s in
    the full run; measured under one load: CPU 6.1 s alone, 7.8 s after row 2, 10.7 s after
    row 1) though nothing of theirs ran any more (after row 1: 3 ms of CPU in 5 s idle;
    after row 2: no thread left): what the in-process rows leave is state (a heap of 130,000
    objects, the stand-ins' idle request threads, the clients' pools), not work."""
    side = Side("tree", Path(os.environ["BENCH_CODE"]) if os.environ.get("BENCH_CODE") else None)
    big, k1, claims, rounds = (256, 64, 100, 2) if small else (4096, 1024, 1000, 3)
    k1 = devices or k1
    soak = soak if soak is not None else (5.0 if small else 60.0)
    work = Path(tempfile.mkdtemp(prefix="vfio-fleet-"))
    figures: dict[str, float] = {}
    broken: dict[str, str] = {}

    def step(name: str, fn: Callable[[], dict[str, float]]) -> None:
        row = name.split()[0]  # "3c": --only 3 runs every row 3, --only 3c that one
        if step_name is not None and name != step_name:
            return
        if only and row not in only and row[0] not in only:
            return
        t = time.monotonic()
        log(f"{name} ...")
        try:
            figures.update(fn() if step_name is not None else in_child(name))
        except Exception as e:  # said in the table, never silent
            broken[name] = f"{type(e).__name__}: {str(e)[:300]}"
        log(f"{name}: {time.monotonic() - t:.0f} s")

    def in_child(name: str) -> dict[str, float]:
        """The row ``name`` in a fresh ``bench/fleet.py --step`` process: its figures."""
        args = [sys.executable, str(Path(__file__).resolve()), "--json", "--step", name]
        args += ["--small"] if small else []
        args += ["--soak", str(soak)]
        args += ["--devices", str(devices)] if devices is not None else []
        args += ["--reviews", str(reviews)] if reviews is not None else []
        done = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=False)
        try:
            out = json.loads(done.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise RuntimeError(f"the row's process exited {done.returncode}, no figures") from None
        if out["broken"]:
            raise RuntimeError("; ".join(out["broken"].values()))
        return {k: float(v) for k, v in out["figures"].items()}

    try:
        step("2 claims", lambda: claims_row(work / "claims", claims))
        step("1 health", lambda: {
            "fleet_health_med": statistics.median(h := asyncio.run(
                health_row(work / "health", k1, rounds))),
            "fleet_health_worst": max(h)})  # fmt: skip
        step("1 device plugin", lambda: {
            "fleet_dp_health": statistics.median(dp_health_row(side, work, k1, rounds))})  # fmt: skip
        step("3c SR-IOV", lambda: asyncio.run(
            sriov_row(work / "sriov", 2 if small else 4, 16 if small else 256)))  # fmt: skip
        step("4 webhook", lambda: webhook_row(
            work / "webhook", 100 if not small else 10, 64 if not small else 8,
            reviews or (300 if small else 20_000), 50.0 if small else WEBHOOK_RATE,
            4.0 if small else 20.0))  # fmt: skip
        step("3 republish", lambda: republish_row(side, work, k1, 2 * rounds + 1))
        step("3f first publication", lambda: first_row(side, work, big))
        step("6 daemons", lambda: daemons_rows(
            side, work, big, claims, soak, 2 * RESYNC if small else IDLE_WINDOW))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures, broken


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="every row at a small size (seconds)")
    ap.add_argument("--json", action="store_true", help="the figures as one JSON object")
    ap.add_argument("--soak", type=float, default=None, help="row 5's soak, seconds")
    ap.add_argument("--only", default="", help="rows to run, e.g. 1,2 or 3c (3: every row 3; "
                    "3f: the first publication only)")  # fmt: skip
    ap.add_argument("--devices", type=int, default=None, help="rows 1 and 3: devices (1,024)")
    ap.add_argument("--reviews", type=int, default=None,
                    help="row 4: reviews (20,000; the issue's 100,000 is --reviews 100000)")  # fmt: skip
    ap.add_argument("--step", default=None, help="one row, e.g. '3c SR-IOV', in this process")
    args = ap.parse_args()
    logging.basicConfig(level=logging.CRITICAL)
    started = time.monotonic()
    figures, broken = measure(
        args.small,
        args.soak,
        {s for s in args.only.split(",") if s},
        args.devices,
        args.reviews,
        args.step,
    )
    if args.json:
        print(json.dumps({"figures": figures, "broken": broken}))
        return 0
    load = os.getloadavg()[0]
    size = "SMALL sizes (figures mean nothing)" if args.small else "full sizes"
    print(f"\nfleet rows, {size}; {os.cpu_count()} CPUs, load {load:.1f}; "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    head = f"{'row':62} {'value':>9} {'unit':6} {'goal':14} verdict"
    print(head)
    print("-" * len(head))
    missed = 0
    for fig in (f for f in FIGURES if f.key.startswith("fleet_")):
        what = fig.what.removeprefix("fleet ")
        if fig.key not in figures:
            print(f"{what:62} {'-':>9} {fig.unit:6} {fig.goal:14} not measured")
            continue
        v = figures[fig.key]
        ok = None if args.small else met(fig.key, v, {})
        missed += ok is False
        verdict = "-" if ok is None else ("met" if ok else "NOT met")
        print(f"{what:62} {v:9.3f} {fig.unit:6} {fig.goal:14} {verdict}")
    for what, why in FLEET_NOT_MEASURED.items():
        print(f"{what.removeprefix('fleet '):62} not measured: {why}")
    for name, why in broken.items():
        print(f"could not run {name}: {why}")
    return 1 if missed or broken else 0


if __name__ == "__main__":
    sys.exit(main())
