#!/usr/bin/env python3
"""Reliability under load: the device-plugin daemon (issue 11, "Load held", daemon half).

``vfioctl plugin`` runs as a real subprocess over a temp sysfs tree of 4,096 PCI functions on
vfio-pci (each in its own IOMMU group) spread over 64 vendor:device IDs, so 64 resources and
64 sockets. The kubelet stand-in (tests/deviceplugin/kubelet_standin.py: real gRPC on real unix
sockets, dials back inside Register, holds every ListAndWatch stream open) then

1. waits for all 64 resources to be registered and listed Healthy;
2. makes 10,000 Allocate calls from 16 concurrent clients -- one in ten malformed (no IDs:
   must be INVALID_ARGUMENT; an ID never listed: NOT_FOUND) -- and checks every answer (the
   env var names exactly the ID, the device specs are ``/dev/vfio/vfio`` and the device's own
   ``/dev/vfio/<group>``);
3. restarts 20 times in a row (stop, wipe every socket in the dir but the checkpoint, serve a
   fresh ``kubelet.sock``, as a starting kubelet does), each time waiting until all 64 are
   registered again with their streams open and every device Healthy;
4. makes 640 more Allocate calls after the restarts.

The daemon's RSS peak (``VmHWM``) is compared with the DaemonSet's memory limit
(deploy/base/daemonset.yaml); its open fds and threads are sampled after each restart: the
last must not exceed the first (no growth per restart).

    python3 bench/reliability_daemon.py [--quick]

``rows(quick)`` returns the rows for ``bench/reliability.py`` (keys: area, case, fault_or_load,
answered_correctly, devices_without_driver, rss_peak_mb, note). ``--quick``: 64 resources over
1,024 devices, 2,000 calls, 3 restarts.

During the Allocate load the ConfigMap is also swapped to four hostile files (billion laughs,
2,000-deep nesting, not UTF-8, 3,000 anchored bad selectors) while ``/healthz`` is probed every
0.1 s: each must be rejected (``vfio_dp_config_reloads_total{result="rejected"}``), the old
config kept, and every probe answered 200.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.common import vfioctl_command  # noqa: E402
from bench.plugin_bench import build_tree  # noqa: E402
from tests.deviceplugin.kubelet_standin import KubeletStandin  # noqa: E402

AREA = "daemon"
RESOURCES = 64
MALFORMED_EVERY = 10  # one call in ten is malformed (alternately: no IDs, an unknown ID)


# NamedTuples and a plain class, not dataclasses: bench/reliability.py loads this file by path
# without registering it in sys.modules, which dataclasses need.
class Load(NamedTuple):
    devices: int
    allocs: int
    clients: int
    restarts: int
    after: int  # Allocate calls after the restarts


FULL = Load(devices=4096, allocs=10_000, clients=16, restarts=20, after=640)
QUICK = Load(devices=1024, allocs=2_000, clients=16, restarts=3, after=640)


def _daemon_container() -> dict[str, object]:
    import yaml

    doc = yaml.safe_load((REPO / "deploy/base/daemonset.yaml").read_text())
    return dict(doc["spec"]["template"]["spec"]["containers"][0])


def probe_timeout_s() -> float:
    """``livenessProbe.timeoutSeconds`` of the daemon container (Kubernetes' default is 1)."""
    probe = _daemon_container().get("livenessProbe") or {}
    assert isinstance(probe, dict)
    return float(probe.get("timeoutSeconds", 1))


def memory_limit_mib() -> float:
    """``resources.limits.memory`` of the daemon container in deploy/base/daemonset.yaml."""
    container: Any = _daemon_container()
    text = str(container["resources"]["limits"]["memory"])
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text) / (1024 * 1024)


class Sample(NamedTuple):
    rss_mib: float
    hwm_mib: float
    threads: int
    fds: int


def sample(pid: int) -> Sample:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return Sample(
        rss_mib=int(fields["VmRSS"].split()[0]) / 1024,
        hwm_mib=int(fields["VmHWM"].split()[0]) / 1024,
        threads=int(fields["Threads"]),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
    )


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))] if s else float("nan")


class CallStats:
    def __init__(self) -> None:
        self.made = 0
        self.right = 0
        self.wrong: list[str] = []
        self.latencies: list[float] = []


async def allocate_load(
    kubelet: KubeletStandin,
    targets: list[tuple[str, str, int]],
    calls: int,
    clients: int,
) -> CallStats:
    """``calls`` Allocates from ``clients`` concurrent clients; every answer checked."""
    import grpc

    from vfio_dp.model import naming

    stats = CallStats()
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(calls):
        queue.put_nowait(i)

    async def client() -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            resource, dev_id, group = targets[(i * 7919) % len(targets)]
            malformed = i % MALFORMED_EVERY == MALFORMED_EVERY - 1
            ids = (
                ([] if (i // MALFORMED_EVERY) % 2 else ["0000:ff:1f.7"]) if malformed else [dev_id]
            )
            t0 = time.perf_counter()
            try:
                resp = await kubelet.allocate(resource, ids)
                code, got = None, resp
            except grpc.aio.AioRpcError as e:
                code, got = e.code(), e.details()
            stats.latencies.append(time.perf_counter() - t0)
            stats.made += 1
            if malformed:
                want = grpc.StatusCode.INVALID_ARGUMENT if not ids else grpc.StatusCode.NOT_FOUND
                ok = code == want
            else:
                ok = (
                    code is None
                    and got.envs.get(naming.kubevirt_env_var(resource)) == dev_id
                    and [d.host_path for d in got.devices]
                    == ["/dev/vfio/vfio", f"/dev/vfio/{group}"]
                )
            if ok:
                stats.right += 1
            elif len(stats.wrong) < 5:
                stats.wrong.append(f"{resource} {ids[:1]}: {code} {str(got)[:200]}")

    await asyncio.gather(*(client() for _ in range(clients)))
    return stats


GOOD_CONFIG = "selectors:\n- drivers: [vfio-pci]\n"  # what the default selects, as a file
HOSTILE_CONFIGS: list[bytes] = [
    (
        'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        + "".join(
            f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n"
            for p, c in zip("abcdefgh", "bcdefghi", strict=True)
        )
    ).encode(),
    b"selectors: " + b"[" * 2000 + b"]" * 2000,
    b"selectors:\n- resourceName: ger\xe4t\n",
    b"x: &x {vendor: zz, device: yy}\nselectors: [" + b",".join([b"*x"] * 3000) + b"]\n",
]


def swap_configmap(directory: Path, version: str, data: bytes) -> Path:
    """A ConfigMap volume as the kubelet updates it: ``config.yaml -> ..data/config.yaml``,
    ``..data -> ..<version>``, swapped by renaming a new symlink over ``..data``."""
    target = directory / f"..{version}"
    target.mkdir(parents=True)
    (target / "config.yaml").write_bytes(data)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, directory / "..data")
    link = directory / "config.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/config.yaml")
    return link


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def http_get(port: int, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    return await asyncio.to_thread(get)


async def metric(port: int, name: str) -> float:
    _, body = await http_get(port, "/metrics")
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def hostile_swaps(directory: Path, port: int) -> tuple[int, int, float]:
    """Swap the ConfigMap to each hostile file in turn, probing ``/healthz`` every 0.1 s for
    1.5 s after each (inotify tells the daemon of each swap at once); (probes, failed, slowest)."""
    probes = bad = 0
    slowest = 0.0
    for i, data in enumerate(HOSTILE_CONFIGS):
        swap_configmap(directory, f"hostile{i}", data)
        for _ in range(15):
            t0 = time.perf_counter()
            status, body = await http_get(port, "/healthz")
            slowest = max(slowest, time.perf_counter() - t0)
            probes += 1
            bad += (status, body.strip()) != (200, "ok")
            await asyncio.sleep(0.1)
    return probes, bad, slowest


def all_listed(names: list[str], per: int) -> object:
    def check(k: KubeletStandin) -> bool:
        for name in names:
            view = k.plugins.get(name)
            if view is None or not view.stream_open or len(view.devices) != per:
                return False
            if any(h != "Healthy" for h in view.devices.values()):
                return False
        return True

    return check


async def run(load: Load) -> tuple[list[dict[str, object]], list[str]]:
    """The load; returns (rows, detail lines)."""
    work = Path(tempfile.mkdtemp(prefix="vfio-reliab-"))
    kdir = tempfile.mkdtemp(prefix="krd", dir="/tmp")  # short: unix socket paths <= 107
    detail: list[str] = []
    rows: list[dict[str, object]] = []
    limit = memory_limit_mib()
    t0 = time.monotonic()
    tree, names = build_tree(work / "root", load.devices, RESOURCES)
    per = load.devices // RESOURCES
    detail.append(f"built a {load.devices}-device tree in {time.monotonic() - t0:.1f} s")
    targets = []
    for address, dev in tree.devs.items():
        assert dev.group is not None
        targets.append((f"devices.kubevirt.io/{dev.vendor}_{dev.device}", address, dev.group))
    config = swap_configmap(work / "cm", "v1", GOOD_CONFIG.encode())
    port = free_port()
    kubelet = KubeletStandin(kdir)
    await kubelet.start()
    log = open(work / "daemon.log", "w")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [
            *vfioctl_command(),
            "plugin",
            "--root",
            str(tree.root),
            "--kubelet-dir",
            kdir,
            "--config",
            str(config),
            "--metrics-port",
            str(port),
            "--metrics-host",
            "127.0.0.1",
        ],  # --resync 5 and log level info: as the DaemonSet runs it
        stdout=log,
        stderr=log,
    )
    devices_col = "n/a"  # this load binds nothing (devices are on vfio-pci already)
    try:
        t0 = time.monotonic()
        try:
            await kubelet.wait_for("all resources listed", all_listed(names, per), timeout=120)
            started = True
        except AssertionError as e:
            started = False
            detail.append(str(e)[:300])
        ready = time.monotonic() - t0
        s = at_start = sample(proc.pid)
        rows.append(
            {
                "area": AREA,
                "case": f"start: {RESOURCES} resources, {load.devices} devices",
                "fault_or_load": "register all, ListAndWatch held open by the kubelet stand-in",
                "answered_correctly": started,
                "devices_without_driver": devices_col,
                "rss_peak_mb": round(s.hwm_mib, 1),
                "note": f"all listed Healthy in {ready:.1f} s; RSS {s.rss_mib:.0f} MiB",
            }
        )
        if not started:
            return rows, detail

        t0 = time.monotonic()
        swaps = asyncio.create_task(hostile_swaps(work / "cm", port))
        stats = await allocate_load(kubelet, targets, load.allocs, load.clients)
        took = time.monotonic() - t0
        probes, bad_probes, slowest = await swaps
        rejected = await metric(port, 'vfio_dp_config_reloads_total{result="rejected"}')
        rows.append(
            {
                "area": AREA,
                "case": "hostile ConfigMap swaps during the Allocate load",
                "fault_or_load": "billion laughs (342 B), 2,000-deep nesting, not UTF-8, "
                "3,000 anchored bad selectors",
                "answered_correctly": bad_probes == 0
                and rejected == len(HOSTILE_CONFIGS)
                and slowest < probe_timeout_s(),
                "devices_without_driver": devices_col,
                "rss_peak_mb": round(sample(proc.pid).hwm_mib, 1),
                "note": f"{rejected:.0f}/{len(HOSTILE_CONFIGS)} rejected, old config kept; "
                f"/healthz {probes - bad_probes}/{probes} answered 200, slowest {slowest * 1e3:.0f} ms "
                f"(the probes' timeout: {probe_timeout_s():.0f} s)",
            }
        )
        s = sample(proc.pid)
        p50, p99 = pct(stats.latencies, 50) * 1e3, pct(stats.latencies, 99) * 1e3
        detail.append(
            f"Allocate: {stats.made} calls in {took:.1f} s ({stats.made / took:.0f}/s), "
            f"p50 {p50:.1f} ms, p99 {p99:.1f} ms; wrong: {stats.wrong}"
        )
        rows.append(
            {
                "area": AREA,
                "case": f"{load.allocs:,} Allocate from {load.clients} concurrent clients",
                "fault_or_load": f"1 in {MALFORMED_EVERY} malformed (no IDs / unknown ID)",
                "answered_correctly": stats.right == load.allocs,
                "devices_without_driver": devices_col,
                "rss_peak_mb": round(s.hwm_mib, 1),
                "note": f"{stats.right}/{stats.made} right; p50 {p50:.1f} ms, p99 {p99:.1f} ms; "
                f"{stats.made / took:.0f} calls/s; fds {at_start.fds} -> {s.fds}, threads "
                f"{at_start.threads} -> {s.threads}",
            }
        )

        per_restart: list[Sample] = []
        recover: list[float] = []
        recovered = 0
        for n in range(load.restarts):
            await kubelet.restart()
            t0 = time.monotonic()
            try:
                await kubelet.wait_for(
                    f"all resources back after restart {n + 1}", all_listed(names, per), timeout=60
                )
                recovered += 1
                recover.append(time.monotonic() - t0)
            except AssertionError as e:
                detail.append(str(e)[:300])
                break
            await asyncio.sleep(0.5)  # let the old servers' teardown finish before sampling
            per_restart.append(sample(proc.pid))
        s = sample(proc.pid)
        detail.append(
            "after each restart: fds "
            + " ".join(str(x.fds) for x in per_restart)
            + "; threads "
            + " ".join(str(x.threads) for x in per_restart)
            + "; RSS MiB "
            + " ".join(f"{x.rss_mib:.0f}" for x in per_restart)
        )
        rows.append(
            {
                "area": AREA,
                "case": f"{load.restarts} kubelet restarts in a row",
                "fault_or_load": "every socket wiped, kubelet.sock re-created",
                "answered_correctly": recovered == load.restarts,
                "devices_without_driver": devices_col,
                "rss_peak_mb": round(s.hwm_mib, 1),
                "note": (
                    f"{recovered}/{load.restarts} recovered (all {RESOURCES} re-registered, "
                    f"streams open, all Healthy); recovery median "
                    f"{statistics.median(recover) if recover else float('nan'):.2f} s, "
                    f"max {max(recover) if recover else float('nan'):.2f} s"
                ),
            }
        )

        stats = await allocate_load(kubelet, targets, load.after, load.clients)
        detail.append(
            f"Allocate after the restarts: {stats.right}/{stats.made} right {stats.wrong}"
        )
        s = sample(proc.pid)
        first, last = (per_restart[0], per_restart[-1]) if per_restart else (s, s)
        no_growth = last.fds <= first.fds and last.threads <= first.threads
        rows.append(
            {
                "area": AREA,
                "case": "after the restarts: calls, fds, threads, memory",
                "fault_or_load": f"{load.after} more Allocate; fds/threads after each restart",
                "answered_correctly": stats.right == load.after
                and no_growth
                and s.hwm_mib <= limit,
                "devices_without_driver": devices_col,
                "rss_peak_mb": round(s.hwm_mib, 1),
                "note": (
                    f"{stats.right}/{stats.made} right; fds {first.fds} -> {last.fds}, threads "
                    f"{first.threads} -> {last.threads} (restart 1 -> {len(per_restart)}); "
                    f"RSS peak {s.hwm_mib:.0f} MiB vs the DaemonSet limit {limit:.0f} MiB"
                ),
            }
        )
        return rows, detail
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        errors = [
            line
            for line in (work / "daemon.log").read_text(errors="replace").splitlines()
            if "Traceback" in line or (" ERROR " in line and "invalid configuration" not in line)
        ]
        detail.append(
            f"daemon exit {proc.returncode}; Traceback or unexpected ERROR lines in its log "
            f"(the rejected configs excepted): {len(errors)}"
        )
        detail.extend(errors[:5])
        await kubelet.stop()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(kdir, ignore_errors=True)


def rows(quick: bool = False) -> list[dict[str, object]]:
    """The rows for bench/reliability.py (see the module docstring)."""
    out, detail = asyncio.run(run(QUICK if quick else FULL))
    for line in detail:
        print(line, file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,024 devices, 2,000 calls, 3 restarts")
    args = ap.parse_args()
    table = rows(quick=args.quick)
    cols = ["case", "fault_or_load", "answered_correctly", "rss_peak_mb", "note"]
    print()
    print(" | ".join(cols))
    print(" | ".join("---" for _ in cols))
    for row in table:
        print(" | ".join(str(row[c]) for c in cols))
    return 0 if all(r["answered_correctly"] is True for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
