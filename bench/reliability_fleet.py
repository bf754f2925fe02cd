#!/usr/bin/env python3
"""Reliability table, area "fleet": nothing lost at issue 39's sizes when the DRA daemon dies.

The real ``vfioctl dra-plugin`` daemon (``bench/rows.py``'s :class:`DraRig`: its own temp
sysfs tree of N functions on vfio-pci, each in its own IOMMU group, against the API-server
stand-in, its CDI specs in the rig's work dir) and the kubelet DRA stand-in
(``tests/dra/kubelet_dra_standin.py``: real gRPC on real unix sockets), with N claims, one
device each, in the stand-in. The rows, each ending with what must hold:

1. **killed mid-Prepare**: ONE NodePrepareResources of the N claims; the daemon is killed
   (``SIGKILL``) once a quarter of the claims' CDI specs are on disk, so the call dies half
   done; the daemon is started again on the same node state and the kubelet calls again, as
   it does after a failed call, until it is answered. Must hold: every claim answered without
   an error, each with the CDI device ID of its own device; the checkpoint
   (``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json``) holds exactly the N claims,
   all prepared; one CDI spec a claim.
2. **every prepared device goes bad and comes back**: all N functions leave vfio-pci at once
   (an outside actor's rebind) and come back; the health stream says Unhealthy for all, then
   Healthy for all. Must hold: the checkpoint still holds the N claims (a device's health
   never unprepares a claim: kubelet does).
3. **killed mid-Unprepare**: ONE NodeUnprepareResources of the N claims; the daemon is killed
   once a quarter of their CDI specs are gone, started again, and the kubelet calls again.
   Must hold: every claim answered without an error; the checkpoint empty; no CDI spec left;
   every function still on its driver (vfio-pci: the groups were on it before the claims).

``devices_without_driver`` counts the N functions with no ``driver`` link at the end.

    python3 bench/reliability_fleet.py [--quick | --claims N]   (N = 1,000; --quick: 200)

``tests/test_bench_harness.py`` runs it with a few claims, so the rows cannot rot unseen.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.rows import DraRig, LoopThread, Side, rss_mb, vm_claim  # noqa: E402
from tests.waiting import wait_until  # noqa: E402

AREA = "fleet"
FULL, QUICK = 1000, 200
#: how long the kubelet stand-in keeps calling again after a failed call (kubelet retries a
#: pod's Prepare with a backoff for as long as the pod exists)
RETRY_FOR = 180.0


class _Node:
    """The rig, its kubelet stand-in and the claims; the daemon can be killed and restarted."""

    def __init__(self, base: Path, n: int) -> None:
        from bench.dra_bench import DRIVER
        from bench.dra_health_bench import name_of
        from tests.dra.apiserver_standin import CLAIMS
        from tests.dra.kubelet_dra_standin import KubeletDraStandin

        self.driver, self.n, self.base = DRIVER, n, base
        self.rig = DraRig(Side("working tree"), base, n)
        self.cdi = base / "cdi"
        self.loop = LoopThread()
        self.kubelet = KubeletDraStandin(
            f"{self.rig.kdir}/registry", DraRig.NODE, api_client=self.rig.api.client()
        )
        self.loop.run(self.kubelet.start())
        self.wanted: dict[str, str] = {}  # claim uid -> its device's name
        self.claims: list[tuple[str, str, str]] = []  # (namespace, uid, name)
        for i, a in enumerate(self.rig.addrs[:n]):
            body = vm_claim(i, name_of(a), DRIVER, DraRig.NODE)
            uid = self.rig.api.seed(CLAIMS, body)["metadata"]["uid"]
            self.claims.append(("vms", uid, f"vm-{i}"))
            self.wanted[uid] = name_of(a)
        self.rig.wait_ready()
        self._registered()

    def _registered(self) -> None:
        k = self.kubelet
        self.loop.run(k.wait_for("registration", lambda s: self.driver in s.plugins, 120), 150)

    def specs(self) -> int:
        try:
            return sum(1 for name in os.listdir(self.cdi) if name.endswith(".json"))
        except FileNotFoundError:
            return 0

    def kill_when(self, check: Callable[[], bool], call: Any) -> tuple[bool, str]:
        """Start ``call`` on the stand-in's loop, SIGKILL the daemon once ``check()``; →
        (whether the kill came before the call's answer, what the call ended with)."""
        future = asyncio.run_coroutine_threadsafe(call, self.loop.loop)
        wait_until(
            lambda: check() or future.done(), what="the call under way", timeout=120, interval=0.005
        )
        early = not future.done()
        self.rig.proc.kill()
        self.rig.proc.wait(30)
        try:
            future.result(60)
            ended = "answered"
        except Exception as e:  # the call dies with the daemon: what kubelet sees
            ended = type(e).__name__
        return early, ended

    def restart(self) -> None:
        """The daemon again, as the DaemonSet's pod restarts it: same flags, same node."""
        self.rig.proc = subprocess.Popen(
            self.rig.proc.args, env=self.rig.side.env(), stdout=self.rig.log, stderr=self.rig.log
        )

    def again(self, call: Callable[[], Any]) -> Any:
        """``call()`` on the stand-in's loop until it is answered (kubelet's retries)."""
        deadline = time.monotonic() + RETRY_FOR
        while True:
            try:
                return self.loop.run(call(), 120)
            except Exception as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no answer in {RETRY_FOR:.0f} s: {e}") from e
                time.sleep(0.5)

    def checkpoint(self) -> dict[str, str]:
        """uid -> state of every claim in the daemon's checkpoint (the project's own reader)."""
        from vfio_dp.dra.claimpath.checkpoint import peek
        from vfio_dp.host import Host

        records, error = peek(Host(self.rig.tree.root), self.driver)
        if error:
            raise RuntimeError(f"checkpoint unreadable: {error}")
        return {r.uid: r.state for r in records}

    def without_driver(self) -> int:
        devices = self.rig.tree.root / "sys/bus/pci/devices"
        return sum(1 for a in self.rig.addrs[: self.n] if not (devices / a / "driver").exists())

    def health(self, want: str) -> int:
        seen = self.kubelet.health.get(self.driver, {})
        names = set(self.wanted.values())
        return sum(1 for (_, dev), s in seen.items() if dev in names and s.health == want)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.run(self.kubelet.stop(), 30)
        self.rig.stop()
        self.loop.stop()


def _row(case: str, fault: str, ok: bool, node: _Node, note: str) -> dict[str, object]:
    alive = node.rig.proc.poll() is None
    return {
        "area": AREA,
        "case": case,
        "fault_or_load": fault,
        "answered_correctly": ok,
        "devices_without_driver": node.without_driver(),
        "rss_peak_mb": round(rss_mb(node.rig.proc.pid), 1) if alive else "n/a",
        "note": note,
    }


def run(n: int) -> list[dict[str, object]]:
    base = Path(tempfile.mkdtemp(prefix="vfio-fleet-reliab-"))
    rows: list[dict[str, object]] = []
    node = _Node(base, n)
    k, claims = node.kubelet, node.claims
    try:
        # 1. killed mid-Prepare
        early, ended = node.kill_when(
            lambda: node.specs() >= n // 4, k.prepare(node.driver, claims, timeout=120)
        )
        at_kill = node.specs()
        node.restart()
        t = time.monotonic()
        answers = node.again(lambda: k.prepare(node.driver, claims, timeout=120))
        took = time.monotonic() - t
        errors = [a.error for a in answers.values() if a.error]
        wrong = [
            uid
            for uid, a in answers.items()
            if not any(node.wanted[uid] in i for d in a.devices for i in d.cdi_device_ids)
        ]
        cp = node.checkpoint()
        prepared = sum(1 for s in cp.values() if s == "prepared")
        ok = early and not errors and not wrong and set(cp) == set(node.wanted)
        ok = ok and prepared == n and node.specs() == n
        rows.append(_row(
            f"DRA daemon SIGKILLed mid-Prepare of {n} claims, restarted, kubelet calls again",
            f"kill after {at_kill} of {n} CDI specs written (call: {ended})",
            ok, node,
            f"kill before the answer: {early}; the call again answered in {took:.1f} s; "
            f"errors {len(errors)}{': ' + errors[0] if errors else ''}; wrong device {len(wrong)}; "
            f"checkpoint {len(cp)} claims, {prepared} prepared; CDI specs {node.specs()}",
        ))  # fmt: skip

        # 2. every prepared device goes bad and comes back
        for a in node.rig.addrs[:n]:
            node.rig.tree.set_driver(a, None)
        os.kill(node.rig.proc.pid, signal.SIGUSR1)
        wait_until(lambda: node.health("Unhealthy") == n, what=f"{n} Unhealthy", timeout=120)
        for a in node.rig.addrs[:n]:
            node.rig.tree.set_driver(a, "vfio-pci")
        os.kill(node.rig.proc.pid, signal.SIGUSR1)
        wait_until(lambda: node.health("Healthy") == n, what=f"{n} Healthy again", timeout=120)
        cp = node.checkpoint()
        kept = sum(1 for uid, s in cp.items() if uid in node.wanted and s == "prepared")
        rows.append(_row(
            f"all {n} prepared devices leave vfio-pci at once, then come back",
            "outside rebind of every prepared function",
            kept == n and len(cp) == n, node,
            f"health stream: {n} Unhealthy, then {n} Healthy; checkpoint {len(cp)} claims, "
            f"{kept} still prepared",
        ))  # fmt: skip

        # 3. killed mid-Unprepare
        early, ended = node.kill_when(
            lambda: node.specs() <= n - n // 4, k.unprepare(node.driver, claims, timeout=120)
        )
        at_kill = node.specs()
        node.restart()
        t = time.monotonic()
        errors2 = node.again(lambda: k.unprepare(node.driver, claims, timeout=120))
        took = time.monotonic() - t
        failed = [e for e in errors2.values() if e]
        cp = node.checkpoint()
        ok = early and not failed and not cp and node.specs() == 0
        rows.append(_row(
            f"DRA daemon SIGKILLed mid-Unprepare of {n} claims, restarted, kubelet calls again",
            f"kill with {at_kill} of {n} CDI specs left (call: {ended})",
            ok, node,
            f"kill before the answer: {early}; the call again answered in {took:.1f} s; "
            f"errors {len(failed)}{': ' + failed[0] if failed else ''}; checkpoint {len(cp)} "
            f"claims; CDI specs left {node.specs()}",
        ))  # fmt: skip
    finally:
        node.stop()
        shutil.rmtree(base, ignore_errors=True)
    return rows


def rows(quick: bool = False) -> list[dict[str, object]]:
    """The rows for bench/reliability.py (see the module docstring)."""
    return run(QUICK if quick else FULL)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK} claims, not {FULL}")
    ap.add_argument("--claims", type=int, default=0, help="this many claims (the tests: a few)")
    args = ap.parse_args()
    bad = 0
    for row in run(args.claims) if args.claims else rows(args.quick):
        print(row)
        bad += row["answered_correctly"] is not True or row["devices_without_driver"] != 0
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
