"""The rows of the performance table (issue 25), measured for one or more *sides* at once.

A side is the code under test: the working tree (the venv's editable install) or a git ref
unpacked into a temp dir (``git archive``) and put first on ``PYTHONPATH``. Everything else
is the instrument and comes from the working tree, the same for every side: the sysfs trees
(``tests/sysfs_tree.py``), the kubelet and API-server stand-ins, the webhook client, the
interpreter and its packages. Each side reads its own copy of each tree (the daemons write
their records under the root).

Every figure is measured in rounds; in each round every side is measured once, the sides'
order alternating between rounds, so a neighbour's noise hits all sides alike. The result
of :func:`measure` is, per figure, per side, the list of per-round values; the anchors
(``lspci``) are measured in the same rounds as a side of their own.

Rows (figure keys; ``lower`` is better unless said):

- ``list_big`` / ``list_big_1cpu``: ``vfioctl list -o json`` on the 4,160-function tree of
  ``bench/host_bench.py`` (whole process, seconds), on every CPU and under ``taskset -c 0``;
  anchors ``lspci -D -k`` on the same tree the same way;
- ``list_small`` (a 10-function host; anchor lspci) and ``help`` (``vfioctl --help``), with
  the start-up floor beside them (``py_bare``, ``py_click``: the venv's interpreter alone,
  and importing click);
- ``check_big``: ``vfioctl check`` of one VF of the 4,160-function tree (ms);
- ``dp_idle`` / ``dra_idle``: % of one CPU the device-plugin / DRA daemon uses while nothing
  happens, 4,096 devices, ``--resync 5`` (summed ``/proc/<pid>/task/*/schedstat`` over
  windows of two resync periods);
- ``alloc_p50`` / ``alloc_p99``: Allocate over the unix socket from the kubelet stand-in;
- ``wh_p99`` / ``wh_rps`` (higher is better) / ``wh_rss``: the webhook over TLS keep-alive
  at 64 concurrent connections;
- ``prep_p50`` / ``prep_p99``: DRA Prepare of a claim whose group is already on vfio-pci,
  in-process; ``prep_on1`` / ``prep_on4``: Prepare with ``bind: onPrepare`` of 1 / 4 groups
  as a multiple of ``Host.bind`` of the same groups in the same process (simulator);
  ``prep_big``: the no-bind Prepare of one VF's group on the 4,160-function tree;
- ``dra_republish``: a device leaves (or comes back to) vfio-pci → the pool republished at a
  new generation, 1,024 devices;
- ``dra_holders``: the DRA plugin's per-resync ``/proc`` holder scan on this machine's real
  ``/proc`` made busy (``bench/holders_bench.py``: 500 processes, ~20,000 descriptors), which
  the idle rows' stand-in ``/proc`` (one process) does not show.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
LSPCI = shutil.which("lspci")
RESYNC = 5.0


@dataclass(frozen=True)
class Figure:
    key: str
    what: str
    unit: str
    goal: str  # as printed
    lower_better: bool = True
    anchor: str | None = None  # key of the anchor figure (lspci, Host.bind), if any


FIGURES = [
    Figure("list_big", "vfioctl list -o json, 4,160 functions, 2 CPUs", "s", "<= 1.0x lspci",
           anchor="lspci_big"),
    Figure("list_big_1cpu", "vfioctl list -o json, 4,160 functions, taskset -c 0", "s",
           "<= 1.0x lspci", anchor="lspci_big_1cpu"),
    Figure("list_small", "vfioctl list -o json, a 10-function host", "ms", "<= 4.5x lspci",
           anchor="lspci_small"),
    Figure("help", "vfioctl --help", "ms", "<= 40 ms"),
    Figure("check_big", "vfioctl check of one VF, 4,160 functions", "ms", "-"),
    Figure("dp_idle", "device-plugin daemon idle, 4,096 devices, resync 5 s", "% CPU",
           "< 0.5 %"),
    Figure("dra_idle", "DRA plugin idle, 4,096 devices, resync 5 s", "% CPU", "< 0.5 %"),
    Figure("alloc_p50", "Allocate over the socket, p50", "ms", "-"),
    Figure("alloc_p99", "Allocate over the socket, p99", "ms", "< 1 ms"),
    Figure("wh_p99", "webhook TLS keep-alive c=64, p99", "ms", "< 20 ms"),
    Figure("wh_rps", "webhook TLS keep-alive c=64, throughput", "req/s", "hold it",
           lower_better=False),
    Figure("wh_rss", "webhook RSS after the rounds", "MB", "bounded"),
    Figure("prep_p50", "DRA Prepare, group on vfio-pci, in-process, p50", "ms", "-"),
    Figure("prep_p99", "DRA Prepare, group on vfio-pci, in-process, p99", "ms", "< 2 ms"),
    Figure("prep_big", "DRA Prepare, group on vfio-pci, 4,160-function host, p50", "ms", "-"),
    Figure("prep_on1", "DRA Prepare onPrepare, 1 group (simulator)", "ms", "<= 1.2x Host.bind",
           anchor="bind_1"),
    Figure("prep_on4", "DRA Prepare onPrepare, 4 groups (simulator)", "ms", "<= 1.2x Host.bind",
           anchor="bind_4"),
    Figure("dra_republish", "DRA republish after a change, 1,024 devices", "ms", "median < 500 ms"),
    Figure("dra_holders", "DRA plugin's /proc holder scan per resync, busy node", "ms", "-"),
    # bench/fleet.py (issue 39), one run per side: its own rounds give the medians
    Figure("fleet_health_med", "fleet 1: 1,024 groups go bad -> UNHEALTHY+tainted, median",
           "s", "< 1 s"),
    Figure("fleet_health_worst", "fleet 1: 1,024 groups go bad -> UNHEALTHY+tainted, worst",
           "s", "< 1.5 s"),
    Figure("fleet_dp_health", "fleet 1: the same seen by ListAndWatch (device plugin)", "s",
           "< 1 s"),
    Figure("fleet_prepare", "fleet 2: one NodePrepareResources of 1,000 claims", "s", "< 3 s"),
    Figure("fleet_unprepare", "fleet 2: one NodeUnprepareResources of 1,000 claims", "s",
           "< 3 s"),
    Figure("fleet_reprepare", "fleet 2: kubelet restart re-preparing 500 claims", "s", "< 2 s"),
    Figure("fleet_republish", "fleet 3: republish after one change among 1,024, median", "ms",
           "< 300 ms"),
    Figure("fleet_republish_writes", "fleet 3: slice writes per change (1: its slice only)",
           "n", "1"),
    Figure("fleet_first", "fleet 3: first publication of 4,096 devices, from start", "s",
           "< 2 s"),
    Figure("fleet_webhook_p99", "fleet 4: webhook review p99 at c=64, 100 nodes x 64 devices",
           "ms", "< 20 ms"),
    Figure("fleet_webhook_p99_paced", "fleet 4: the same at an offered 500 reviews/s (open loop)",
           "ms", "< 20 ms"),
    Figure("fleet_webhook_rss_growth", "fleet 4: webhook RSS growth over the reviews", "MB",
           "flat (< 5 MB)"),
    Figure("fleet_sriov", "fleet 3: numVfs: 256 on 4 PFs made and published (simulator)", "s",
           "< 10 s"),
    Figure("fleet_rss_dra", "fleet 5: DRA daemon RSS, 4,096 devices + 1,000 claims", "MB",
           "stated"),
    Figure("fleet_rss_dp", "fleet 5: device-plugin daemon RSS, 4,096 devices", "MB", "stated"),
    Figure("fleet_rss_growth", "fleet 5: RSS growth over the soak, both daemons", "MB",
           "flat (< 5 MB)"),
    Figure("fleet_idle_dra", "fleet 6: DRA daemon idle, 4,096 devices, health stream", "% CPU",
           "< 0.5 %"),
    Figure("fleet_idle_dp", "fleet 6: device-plugin daemon idle, 4,096 devices", "% CPU",
           "< 0.5 %"),
]  # fmt: skip
#: the guest bench's rows (bench/pool_switch_bench.py: the QEMU guest rig, a real kernel);
#: ``make bench`` runs them as the group ``pool``; never in bench/against.py (a ref's tree
#: has no guest rig to boot with its own code)
GUEST_FIGURES = [
    Figure("pool_to_vm", "pool switch, real kernel: container -> VM (Prepare)", "s",
           "stated", anchor="pool_bind"),
    Figure("pool_to_ct", "pool switch, real kernel: VM -> container (Unprepare+Prepare)", "s",
           "stated", anchor="pool_unbind"),
]  # fmt: skip
GUEST_ANCHORS = {
    "pool_bind": "Host.bind of the same NVMe in the guest (same process)",
    "pool_unbind": "Host.unbind of the same NVMe in the guest (same process)",
}

#: what bench/fleet.py does not measure yet (printed under the table with why)
FLEET_NOT_MEASURED: dict[str, str] = {}
ANCHORS = {
    "lspci_big": "lspci -D -k, same tree, 2 CPUs",
    "lspci_big_1cpu": "lspci -D -k, same tree, taskset -c 0",
    "lspci_small": "lspci -D -k, the 10-function host",
    "bind_1": "Host.bind --group, 1 group (same process)",
    "bind_4": "Host.bind --group, 4 groups (same process)",
    "py_bare": "floor of every vfioctl command: the venv's python -c pass, ms",
    "py_click": "floor of every vfioctl command: python -c 'import click', ms",
    "durable_p50": "one durable atomic write on the bench's disk, p50, ms (a Prepare makes one)",
    "durable_p99": "one durable atomic write on the bench's disk, p99, ms",
    "holder_fds": "descriptors the holder scan read (this machine's /proc + 500 sleepers)",
}


#: rows whose goal is measured against a floor no vfioctl command can go below (the
#: interpreter starting and importing click, the CLI library this project chose)
FLOORS = {"help": "py_click", "list_small": "py_click", "check_big": "py_click"}


def floor_note(key: str, results: dict[str, dict[str, list[float]]], side: str) -> str:
    """What the row cannot go below, measured in the same run, as a note ("" when the row has
    no floor or it was not measured): the start-up of any vfioctl command (:data:`FLOORS`);
    for ``onPrepare``, ``Host.bind`` of the same groups plus the two durable checkpoint
    writes crash safety needs (``preparing`` before the first bind, ``prepared`` before
    kubelet is answered)."""
    if key in FLOORS:
        values = results.get(FLOORS[key], {}).get("anchor")
        if values:
            return f"floor: python + import click {statistics.median(values):.1f} ms"
    fig = next((f for f in FIGURES if f.key == key), None)
    if key in ("prep_on1", "prep_on4") and fig is not None and fig.anchor:
        bind = results.get(fig.anchor, {}).get(side)
        durable = results.get("durable_p50", {}).get(side)
        if bind and durable:
            b, d = statistics.median(bind), statistics.median(durable)
            return f"floor: Host.bind + 2 durable writes = {(b + 2 * d) / b:.2f}x"
    return ""


def met(key: str, value: float, anchors: dict[str, float]) -> bool | None:
    """Whether a median meets its goal (None: no goal to meet)."""
    fig = next(f for f in (*FIGURES, *GUEST_FIGURES) if f.key == key)
    a = anchors.get(fig.anchor or "")
    goals: dict[str, Callable[[], bool]] = {
        "list_big": lambda: a is not None and value <= a,
        "list_big_1cpu": lambda: a is not None and value <= a,
        "list_small": lambda: a is not None and value <= 4.5 * a,
        "help": lambda: value <= 40,
        "dp_idle": lambda: value < 0.5,
        "dra_idle": lambda: value < 0.5,
        "alloc_p99": lambda: value < 1.0,
        "wh_p99": lambda: value < 20,
        "prep_p99": lambda: value < 2.0,
        "prep_on1": lambda: a is not None and value <= 1.2 * a,
        "prep_on4": lambda: a is not None and value <= 1.2 * a,
        "dra_republish": lambda: value < 500,
        "fleet_health_med": lambda: value < 1.0,
        "fleet_health_worst": lambda: value < 1.5,
        "fleet_dp_health": lambda: value < 1.0,
        "fleet_prepare": lambda: value < 3.0,
        "fleet_unprepare": lambda: value < 3.0,
        "fleet_reprepare": lambda: value < 2.0,
        "fleet_republish": lambda: value < 300,
        "fleet_republish_writes": lambda: value <= 1,
        "fleet_first": lambda: value < 2.0,
        "fleet_sriov": lambda: value < 10.0,
        "fleet_webhook_p99": lambda: value < 20.0,
        "fleet_webhook_p99_paced": lambda: value < 20.0,
        "fleet_webhook_rss_growth": lambda: value < 5.0,
        "fleet_rss_growth": lambda: value < 5.0,
        "fleet_idle_dra": lambda: value < 0.5,
        "fleet_idle_dp": lambda: value < 0.5,
    }
    return goals[key]() if key in goals else None


# -- sides ----------------------------------------------------------------------------------
@dataclass
class Side:
    """The code under test: ``code`` None = the working tree, else an unpacked git ref."""

    label: str
    code: Path | None = None
    broken: dict[str, str] = field(default_factory=dict)  # figure group -> why it cannot run

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # as installed: bytecode cached
        if self.code is not None:
            env["PYTHONPATH"] = str(self.code)
        env.update(extra)
        return env

    def vfioctl(self) -> list[str]:
        """The same launcher for every side: the venv's ``vfioctl`` script, whose ``cli``
        package comes from PYTHONPATH when set (before the editable install's path)."""
        return [str(VENV_BIN / "vfioctl")]

    @property
    def tree(self) -> Path:
        return REPO if self.code is None else self.code


def unpack_ref(ref: str, into: Path) -> tuple[Path, str]:
    """``git archive`` of ``ref`` unpacked under ``into``; (its dir, the full commit)."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    dest = into / commit[:12]
    dest.mkdir(parents=True)
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise SystemExit(f"git archive {ref} failed")
    return dest, commit


def compile_side(side: Side) -> None:
    """Byte-compile the side's packages first, as ``pip install`` does: a process row then
    measures start-up from cached bytecode on every side (an environment with
    ``PYTHONDONTWRITEBYTECODE`` would otherwise compile every changed module, or the whole
    unpacked ref, in every timed process)."""
    pkgs = [str(side.tree / p) for p in ("cli", "vfio_dp", "vm_translate")]
    subprocess.run(
        [str(VENV_BIN / "python"), "-m", "compileall", "-q", *pkgs],
        check=True, stdout=subprocess.DEVNULL, env=side.env(),
    )  # fmt: skip


# -- small helpers ----------------------------------------------------------------------------
def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def run_timed(args: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """Seconds of one whole process (output discarded); raises on a non-zero exit."""
    t0 = time.perf_counter()
    r = subprocess.run(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)  # fmt: skip
    took = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])}... exited {r.returncode}: {r.stderr[-500:]!r}")
    return took


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far (ns, from schedstat)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as f:
            total += int(f.read().split()[0])
    return total


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class LoopThread:
    """An asyncio loop in a thread (the kubelet stand-in's gRPC server lives there)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# -- the process rows: list, --help ----------------------------------------------------------
def build_small(base: Path) -> Path:
    """A small host: host bridge, two root ports, a NIC, a GPU with its audio function, NVMe,
    USB, SATA, an ISA bridge and SMBus (10 functions)."""
    from tests.sysfs_tree import Dev, SysfsTree

    t = SysfsTree(base)
    t.add(Dev("0000:00:00.0", "8086", "3e30", "060000", group=0))
    t.add(Dev("0000:00:01.0", "8086", "1901", "060400", driver="pcieport", group=1))
    t.add(Dev("0000:01:00.0", "10de", "1eb8", "030000", driver="nvidia", group=1,
              parent="0000:00:01.0"))  # fmt: skip
    t.add(Dev("0000:01:00.1", "10de", "10f8", "040300", driver="snd_hda_intel", group=1,
              parent="0000:00:01.0"))  # fmt: skip
    t.add(Dev("0000:00:14.0", "8086", "a36d", "0c0330", driver="xhci_hcd", group=2))
    t.add(Dev("0000:00:17.0", "8086", "a352", "010601", driver="ahci", group=3))
    t.add(Dev("0000:00:1b.0", "8086", "a340", "060400", driver="pcieport", group=4))
    t.add(Dev("0000:02:00.0", "144d", "a808", "010802", driver="nvme", group=4,
              parent="0000:00:1b.0"))  # fmt: skip
    t.add(Dev("0000:00:1f.0", "8086", "a306", "060100", group=5))
    t.add(Dev("0000:00:1f.4", "8086", "a323", "0c0500", driver="i801_smbus", group=5))
    return t.root


def lspci_args(root: Path) -> list[str]:
    assert LSPCI
    return [LSPCI, "-D", "-k", "-A", "linux-sysfs", "-O", f"sysfs.path={root}/sys/bus/pci"]


PIN = ["taskset", "-c", "0"]
#: a VF of the big tree (on vfio-pci, its own group): what ``vfioctl check`` is timed on
CHECK_VF = "0000:10:00.1"


def process_rows(
    sides: list[Side], rounds: int, work: Path, big_tree: Callable[[], Path]
) -> dict[str, dict[str, list[float]]]:
    big = big_tree()
    small = build_small(work / "small")
    out: dict[str, dict[str, list[float]]] = {}

    def add(key: str, who: str, value: float) -> None:
        out.setdefault(key, {}).setdefault(who, []).append(value)

    lspci_env = dict(os.environ)
    python = str(VENV_BIN / "python")
    floor_env = Side("floor").env()  # no side's code on the path: the interpreter and click
    for r in range(rounds):
        order = sides if r % 2 == 0 else sides[::-1]
        # what any vfioctl command costs before a line of it runs, measured beside it
        add("py_bare", "anchor", run_timed([python, "-c", "pass"], floor_env) * 1000)
        add("py_click", "anchor", run_timed([python, "-c", "import click"], floor_env) * 1000)
        if LSPCI:
            add("lspci_big", "anchor", run_timed(lspci_args(big), lspci_env))
            add("lspci_big_1cpu", "anchor", run_timed(PIN + lspci_args(big), lspci_env))
            add("lspci_small", "anchor", run_timed(lspci_args(small), lspci_env) * 1000)
        for side in order:
            env = side.env()
            cmd = side.vfioctl()
            try:
                add(
                    "list_big",
                    side.label,
                    run_timed([*cmd, "list", "--root", str(big), "-o", "json"], env),
                )
                add(
                    "list_big_1cpu",
                    side.label,
                    run_timed([*PIN, *cmd, "list", "--root", str(big), "-o", "json"], env),
                )
                add(
                    "list_small",
                    side.label,
                    run_timed([*cmd, "list", "--root", str(small), "-o", "json"], env) * 1000,
                )
                add("help", side.label, run_timed([*cmd, "--help"], env) * 1000)
                add(
                    "check_big",
                    side.label,
                    run_timed([*cmd, "check", "--root", str(big), CHECK_VF], env) * 1000,
                )
            except RuntimeError as e:
                side.broken["process"] = str(e)
    return out


# -- the daemons -------------------------------------------------------------------------------
class DevicePluginRig:
    """``vfioctl plugin`` of one side on its own 4,096-device tree, kubelet stand-in."""

    def __init__(self, side: Side, base: Path, loop: LoopThread, devices: int = 4096) -> None:
        from bench.plugin_bench import build_tree
        from tests.deviceplugin.kubelet_standin import KubeletStandin

        self.side, self.loop, self.devices = side, loop, devices
        self.tree, self.names = build_tree(base / "root", devices, 64)
        self.kdir = tempfile.mkdtemp(prefix="kb", dir="/tmp")
        self.kubelet = KubeletStandin(self.kdir)
        loop.run(self.kubelet.start())
        self.log = open(base / "daemon.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [*side.vfioctl(), "plugin", "--root", str(self.tree.root), "--kubelet-dir",
             self.kdir, "--resync", str(RESYNC), "--metrics-port", "0", "--log-level",
             "warning"],
            env=side.env(), stdout=self.log, stderr=self.log,
        )  # fmt: skip

    def wait_ready(self) -> None:
        per = self.devices // 64
        self.loop.run(
            self.kubelet.wait_for(
                "all resources listed",
                lambda k: (
                    len(k.plugins) == 64 and all(len(v.devices) == per for v in k.plugins.values())
                ),
                timeout=180,
            ),
            200,
        )
        self.ids = sorted(self.kubelet.devices(self.names[0]))

    def allocate(self, n: int) -> list[float]:
        async def go() -> list[float]:
            lat = []
            for i in range(n):
                t = time.perf_counter()
                await self.kubelet.allocate(self.names[0], [self.ids[i % len(self.ids)]])
                lat.append((time.perf_counter() - t) * 1000)
            return lat

        result: list[float] = self.loop.run(go())
        return result

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.loop.run(self.kubelet.stop())
        self.log.close()
        shutil.rmtree(self.kdir, ignore_errors=True)


def vm_claim(i: int, device: str, driver: str, pool: str) -> dict[str, Any]:
    """The ResourceClaim ``vms/vm-<i>``, allocated ``device`` of ``driver`` in ``pool`` (the
    fleet rows' claims: one request ``nic``, one device)."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": f"vm-{i}", "namespace": "vms"},
        "spec": {"devices": {"requests": [
            {"name": "nic", "exactly": {"deviceClassName": driver}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "nic", "driver": driver, "pool": pool, "device": device}]}}},
    }  # fmt: skip


class DraRig:
    """``vfioctl dra-plugin`` of one side on its own tree, with its own API-server stand-in:
    in this process (``api_process`` False: :meth:`republish` reads its store in place), or
    in a process of its own (:class:`bench.apiserver_proc.ApiServerProcess`, as the real API
    server is: its CPU is not this process's; :meth:`wait_ready` only)."""

    NODE = "bench-node"

    def __init__(self, side: Side, base: Path, devices: int, *, api_process: bool = False) -> None:
        from bench.apiserver_proc import ApiServerProcess
        from bench.dra_bench import DRIVER, build_tree
        from tests.dra.apiserver_standin import NODES, ApiServerStandin

        self.side, self.devices = side, devices
        self.tree, self.addrs = build_tree(base / "root", devices)
        self.kdir = tempfile.mkdtemp(prefix="kdb", dir="/tmp")
        for sub in ("registry", "plugins"):  # the kubelet makes them; the plugin never does
            os.makedirs(f"{self.kdir}/{sub}")
        self.api: Any = None
        self.api_proc: ApiServerProcess | None = None
        if api_process:
            self.api_proc = ApiServerProcess(str(base / "api"))
            self.api_proc.seed(NODES, {"metadata": {"name": self.NODE}})
            kubeconfig = self.api_proc.kubeconfig
        else:
            self.api = ApiServerStandin(str(base / "api"))
            self.api.start()
            self.api.seed(NODES, {"metadata": {"name": self.NODE}})
            kubeconfig = self.api.kubeconfig
        self.log = open(base / "dra.log", "w")  # noqa: SIM115
        self.started = time.monotonic()  # the daemon's exec is counted
        self.proc = subprocess.Popen(
            [*side.vfioctl(), "dra-plugin", "--driver-name", DRIVER, "--node-name", self.NODE,
             "--kubeconfig", kubeconfig, "--root", str(self.tree.root),
             "--kubelet-registry-dir", f"{self.kdir}/registry",
             "--kubelet-plugins-dir", f"{self.kdir}/plugins", "--cdi-dir", str(base / "cdi"),
             "--resync", str(RESYNC), "--metrics-port", "0", "--log-level", "warning"],
            env=side.env(), stdout=self.log, stderr=self.log,
        )  # fmt: skip
        self.changes = 0

    def _pool(self) -> tuple[int, int]:
        from bench.dra_bench import pool

        return pool(self.api)

    def _wait(self, check: Callable[[], bool], timeout: float) -> float:
        start = time.monotonic()
        seen = -1
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dra-plugin exited {self.proc.returncode}")
            writes = len(self.api.requests)
            if writes != seen:
                seen = writes
                if check():
                    return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise RuntimeError(f"timed out after {timeout}s")
            time.sleep(0.002)

    def wait_ready(self) -> float:
        """Wait until every device is published; the ``time.monotonic()`` when it was."""
        if self.api_proc is not None:
            return self.api_proc.pool_complete(self.NODE, self.devices, 180, self._alive)
        self._wait(lambda: self._pool()[1] == self.devices, 180)
        return time.monotonic()

    def _alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"dra-plugin exited {self.proc.returncode}")

    def republish(self) -> float:
        """One change (a function leaves vfio-pci, or comes back) → seconds to the new pool."""
        victim = self.addrs[len(self.addrs) // 2]
        leave = self.changes % 2 == 0
        self.changes += 1
        gen = self._pool()[0]  # kept when one slice changes (upstream), bumped otherwise
        self.tree.set_driver(victim, "mlx5_core" if leave else "vfio-pci")
        want = self.devices - 1 if leave else self.devices
        t = time.monotonic()
        os.kill(self.proc.pid, signal.SIGUSR1)
        self._wait(lambda: (p := self._pool())[0] >= gen and p[1] == want, 30)
        return time.monotonic() - t

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        (self.api_proc or self.api).stop()
        self.log.close()
        shutil.rmtree(self.kdir, ignore_errors=True)


def _start_all(make: dict[str, Callable[[], Any]], sides: list[Side], group: str) -> dict[str, Any]:
    rigs: dict[str, Any] = {}
    for label, fn in make.items():
        side = next(s for s in sides if s.label == label)
        try:
            rig = fn()
            rigs[label] = rig
        except Exception as e:
            side.broken[group] = f"{type(e).__name__}: {e}"
    for label, rig in list(rigs.items()):
        side = next(s for s in sides if s.label == label)
        try:
            rig.wait_ready()
        except (Exception, AssertionError) as e:
            side.broken[group] = f"{type(e).__name__}: {str(e)[:300]}"
            rig.stop()
            del rigs[label]
    return rigs


def daemon_rows(sides: list[Side], rounds: int, work: Path) -> dict[str, dict[str, list[float]]]:
    out: dict[str, dict[str, list[float]]] = {}

    def add(key: str, who: str, value: float) -> None:
        out.setdefault(key, {}).setdefault(who, []).append(value)

    loop = LoopThread()
    dp: dict[str, Any] = {}
    dra: dict[str, Any] = {}
    try:
        dp = _start_all(
            {s.label: (lambda s=s, i=i: DevicePluginRig(s, work / f"dp-{i}", loop))
             for i, s in enumerate(sides)}, sides, "device-plugin")  # fmt: skip
        dra = _start_all(
            {s.label: (lambda s=s, i=i: DraRig(s, work / f"dra-{i}", 4096))
             for i, s in enumerate(sides)}, sides, "dra")  # fmt: skip
        time.sleep(RESYNC + 1)  # let start-up work (first resyncs, slices) settle
        procs = {("dp_idle", k): r.proc.pid for k, r in dp.items()}
        procs.update({("dra_idle", k): r.proc.pid for k, r in dra.items()})
        window = 2 * RESYNC
        for _ in range(rounds):
            before = {k: cpu_ns(p) for k, p in procs.items()}
            t0 = time.monotonic()
            time.sleep(window)
            took = time.monotonic() - t0
            for k, p in procs.items():
                add(k[0], k[1], (cpu_ns(p) - before[k]) / 1e9 / took * 100)
        for label in list(dra):
            dra.pop(label).stop()  # the republish rigs are smaller: free the CPU now
        for r in range(rounds):
            for label in list(dp) if r % 2 == 0 else list(dp)[::-1]:
                lat = dp[label].allocate(1000)  # p99 of 1,000: not the 2nd-worst of 200
                add("alloc_p50", label, statistics.median(lat))
                add("alloc_p99", label, pct(lat, 99))
        for label in list(dp):
            dp.pop(label).stop()
        dra = _start_all(
            {s.label: (lambda s=s, i=i: DraRig(s, work / f"dra1k-{i}", 1024))
             for i, s in enumerate(sides)}, sides, "dra")  # fmt: skip
        for r in range(rounds):
            for label in list(dra) if r % 2 == 0 else list(dra)[::-1]:
                add("dra_republish", label, dra[label].republish() * 1000)
    finally:
        for rig in [*dp.values(), *dra.values()]:
            rig.stop()
        loop.stop()
    return out


# -- the webhook ---------------------------------------------------------------------------------
def webhook_rows(sides: list[Side], rounds: int, work: Path) -> dict[str, dict[str, list[float]]]:
    from bench.webhook_bench import level

    out: dict[str, dict[str, list[float]]] = {}
    servers: dict[str, tuple[subprocess.Popen[str], str, Any]] = {}
    try:
        for i, side in enumerate(sides):
            cert_dir = work / f"wh-{i}"
            cert_dir.mkdir()
            try:
                servers[side.label] = _start_webhook(side, str(cert_dir))
            except (RuntimeError, SystemExit) as e:
                side.broken["webhook"] = str(e)
        for r in range(rounds):
            labels = list(servers) if r % 2 == 0 else list(servers)[::-1]
            for label in labels:
                _, url, ctx = servers[label]
                res = asyncio.run(level(url, ctx, 64, 2000, 15.0))
                out.setdefault("wh_p99", {}).setdefault(label, []).append(res["p99_ms"])
                out.setdefault("wh_rps", {}).setdefault(label, []).append(res["rps"])
        for label, (proc, _, _) in servers.items():
            out.setdefault("wh_rss", {})[label] = [rss_mb(proc.pid)]
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
            proc.wait(10)
    return out


def _start_webhook(side: Side, cert_dir: str) -> tuple[subprocess.Popen[str], str, Any]:
    import base64
    import ssl

    proc = subprocess.Popen(
        [*side.vfioctl(), "webhook", "--self-signed", "--address", "127.0.0.1", "--port", "0",
         "--cert-dir", cert_dir, "--log-level", "warning"],
        env=side.env(VFIOCTL_CONFIG=""), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()  # "# CA: ..."
    ca = base64.b64decode(proc.stdout.readline().strip()).decode()
    line = proc.stderr.readline()
    if not line.startswith("serving "):
        proc.kill()
        raise RuntimeError(f"webhook did not start: {line}{proc.stderr.read()[-300:]}")
    return proc, line.split()[1], ssl.create_default_context(cadata=ca)


# -- DRA Prepare in-process ------------------------------------------------------------------------
def prepare_rows(
    sides: list[Side], rounds: int, big_tree: Callable[[], Path]
) -> dict[str, dict[str, list[float]]]:
    """Each round runs ``bench/dra_prepare_bench.py --json`` once per side, in a fresh
    process whose ``vfio_dp`` (and test helpers) come from that side; its big-host row reads
    the 4,160-function tree built once (``BENCH_BIG_TREE``; it writes only its own state
    there, and removes it)."""
    big = str(big_tree())
    out: dict[str, dict[str, list[float]]] = {}
    script = str(REPO / "bench" / "dra_prepare_bench.py")
    for r in range(rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            if "prepare" in side.broken:
                continue
            for _attempt in range(2):  # one retry: a loaded machine can time a bind out
                res = subprocess.run(
                    [sys.executable, script, "--json"],
                    env=side.env(BENCH_CODE=str(side.tree), BENCH_RUNS="30", BENCH_BIG_TREE=big),
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                if res.returncode == 0:
                    break
            if res.returncode != 0:
                tail = " | ".join(res.stderr.strip().splitlines()[-3:])
                side.broken["prepare"] = tail[:400] or f"exit {res.returncode}"
                continue
            data = json.loads(res.stdout)
            holders = subprocess.run(
                [sys.executable, str(REPO / "bench" / "holders_bench.py"), "--json"],
                env=side.env(BENCH_CODE=str(side.tree)),
                capture_output=True,
                text=True,
                timeout=300,
            )
            if holders.returncode == 0:
                data.update(json.loads(holders.stdout))
            else:  # said in the table (an old ref has no holders module), never silent
                tail = " | ".join(holders.stderr.strip().splitlines()[-3:])
                side.broken["holders"] = tail[:400] or f"exit {holders.returncode}"
            for key, value in data.items():
                out.setdefault(key, {}).setdefault(side.label, []).append(value)
    # Host.bind is each side's own anchor: keep it per side under the anchor keys
    return out


# -- the fleet rows --------------------------------------------------------------------------------
def fleet_rows(sides: list[Side], small: bool) -> dict[str, dict[str, list[float]]]:
    """``bench/fleet.py --json`` once per side (its rows take minutes and repeat inside: one
    run each, not ``rounds``), in a fresh process whose ``vfio_dp`` is that side's;
    ``small``: its ``--small`` sizes (the harness test)."""
    out: dict[str, dict[str, list[float]]] = {}
    script = str(REPO / "bench" / "fleet.py")
    for side in sides:
        res = subprocess.run(
            [sys.executable, script, "--json", *(["--small"] if small else [])],
            env=side.env(BENCH_CODE=str(side.tree)), capture_output=True, text=True,
            timeout=1800,
        )  # fmt: skip
        if res.returncode != 0 or not res.stdout.strip():
            tail = " | ".join(res.stderr.strip().splitlines()[-3:])
            side.broken["fleet"] = tail[:400] or f"exit {res.returncode}"
            continue
        data = json.loads(res.stdout.strip().splitlines()[-1])
        for key, value in data["figures"].items():
            out.setdefault(key, {}).setdefault(side.label, []).append(value)
        if data["broken"]:
            side.broken["fleet"] = "; ".join(f"{k}: {v}" for k, v in data["broken"].items())
    return out


def pool_rows(sides: list[Side], rounds: int) -> dict[str, dict[str, list[float]]]:
    """``bench/pool_switch_bench.py --json`` (one guest boot, ``rounds`` switch rounds in it)
    for the working tree only: the guest rig boots this checkout's code."""
    out: dict[str, dict[str, list[float]]] = {}
    script = str(REPO / "bench" / "pool_switch_bench.py")
    for side in sides:
        if side.label != "tree":
            side.broken["pool"] = "a guest bench: the working tree only"
            continue
        res = subprocess.run(
            [sys.executable, script, "--json"], env={**os.environ, "BENCH_RUNS": str(rounds)},
            cwd=REPO, capture_output=True, text=True, timeout=3600,
        )  # fmt: skip
        if res.returncode != 0 or not res.stdout.strip():
            tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
            side.broken["pool"] = tail[:400] or f"exit {res.returncode}"
            continue
        rounds_data = json.loads(res.stdout.strip().splitlines()[-1])["rounds"]
        for key, name in (("pool_to_vm", "container_to_vm"), ("pool_to_ct", "vm_to_container"),
                          ("pool_bind", "host_bind"), ("pool_unbind", "host_unbind")):  # fmt: skip
            out.setdefault(key, {})[side.label] = list(rounds_data[name])
    return out


# -- everything ------------------------------------------------------------------------------------
def measure(
    sides: list[Side],
    rounds: int,
    skip: set[str] = frozenset(),  # type: ignore[assignment]
    *,
    fleet_small: bool = False,
    guest: bool = False,
) -> dict[str, dict[str, list[float]]]:
    """Every row for every side, ``rounds`` interleaved rounds each (the fleet rows: one run
    each). ``skip``: groups to leave out (``process``, ``daemons``, ``webhook``,
    ``prepare``, ``fleet``, ``pool``); ``fleet_small``: the fleet rows at their small sizes;
    ``guest``: the guest rows too (``pool``: ``make bench`` only)."""
    results: dict[str, dict[str, list[float]]] = {}
    for side in sides:
        compile_side(side)
    work = Path(tempfile.mkdtemp(prefix="vfio-rows-"))

    @functools.cache
    def big_tree() -> Path:
        """bench/host_bench.py's 4,160-function tree, built once (list only reads it)."""
        from bench.host_bench import build

        root = build(work / "big").root
        os.sync()  # its files written back before anything times a disk write
        return root

    try:
        steps: list[tuple[str, Callable[[], dict[str, dict[str, list[float]]]]]] = [
            ("process", lambda: process_rows(sides, rounds, work / "p", big_tree)),
            ("prepare", lambda: prepare_rows(sides, rounds, big_tree)),
            ("webhook", lambda: webhook_rows(sides, rounds, work / "w")),
            ("daemons", lambda: daemon_rows(sides, rounds, work / "d")),
            ("fleet", lambda: fleet_rows(sides, fleet_small)),
        ]
        if guest:
            steps.append(("pool", lambda: pool_rows(sides, rounds)))
        for name, step in steps:
            if name in skip:
                continue
            (work / name[0]).mkdir(exist_ok=True)
            t0 = time.monotonic()
            print(f"  measuring: {name} ...", file=sys.stderr, flush=True)
            for key, per in step().items():
                results.setdefault(key, {}).update(per)
            print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    finally:
        remove_later(work)
    return results


def remove_later(path: Path) -> None:
    """``rm -rf path`` in the background: the trees hold ~100,000 files; nobody waits."""
    subprocess.Popen(["rm", "-rf", str(path)], start_new_session=True)


@contextlib.contextmanager
def ref_side(ref: str) -> Iterator[Side]:
    tmp = Path(tempfile.mkdtemp(prefix="vfio-ref-"))
    try:
        code, commit = unpack_ref(ref, tmp)
        yield Side(commit[:7], code)
    finally:
        remove_later(tmp)
