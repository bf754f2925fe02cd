#!/usr/bin/env python3
"""Reliability table, area "dra": the DRA plugin's claim path against hostile peers and files.

Each row drives the real claim handler (:class:`vfio_dp.dra.claimpath.prepare.ClaimPreparer`, the code
behind NodePrepareResources / NodeUnprepareResources) in-process on a temp sysfs tree with the
simulated kernel (``tests/kernel_sim.py``), as ``bench/dra_batch_bench.py`` does:

- **hostile API server**: the real ``kubernetes`` client and the plugin's claim reader
  (:func:`vfio_dp.dra.apiserver.publisher.claim_reader`, deadline 2 s here, 10 s in the plugin) against
  a TCP server that accepts and never answers; ten claims prepared at once while a
  never-prepared claim is unprepared: the unprepare must answer at once, each prepare must
  fail alone naming the deadline, nothing bound.
- **hostile state files**: a FIFO at the checkpoint path (must not hang: moved aside, the
  claim prepared), and a ``var/lib/vfio_dp`` that links out of the root (the claim refused,
  nothing written in the outside directory).
- **garbage claims next to a good one**: wrongly typed fields, 20,000 results, a claim of
  another driver, then the same UID under another name -- each its own error, the good claim
  prepared, no metadata directory written for the refused ones.
- **1,000-claim batch**: one NodePrepareResources of 1,000 claims on vfio-pci, then one
  NodeUnprepareResources (kubelet gives up on a call after about 45 s; the goal is a few
  seconds).

"Files outside the root" is checked for each row against a sibling directory the hostile
links point at (must stay empty). ``rows(quick)`` is what ``bench/reliability.py`` calls
(``--quick``: 200 claims in the batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.config import load_config_text

AREA = "dra"
DRIVER = "vfio.example.com"
NODE = "node-a"
CONFIG = 'selectors:\n  - vendor: "8086"\n    device: "1533"\n    path: dra\n'


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _name(i: int) -> str:
    bus, slot = divmod(i, 32)
    return f"0000:{bus + 1:02x}:{slot:02x}.0"


def _tree(base: Path, n: int) -> SysfsTree:
    t = SysfsTree(base / "root")
    t.add(Dev("0000:00:00.0", "8086", "29c0", "060000", group=0))
    for i in range(n):
        t.add(Dev(_name(i), "8086", "1533", "020000", driver="vfio-pci", group=100 + i,
                  native_driver="igb"))  # fmt: skip
    p = t.root / "proc/sys/kernel/random"
    p.mkdir(parents=True)
    (p / "boot_id").write_text("bench\n")
    return t


def _claim(i: int, uid: str | None = None, name: str | None = None) -> dict[str, Any]:
    dev = "pci-" + _name(i).replace(":", "-").replace(".", "-")
    name = name or f"c{i}"
    return {
        "metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{i:05d}"},
        "status": {"allocation": {"devices": {"results": [
            {"request": "nic", "driver": DRIVER, "pool": NODE, "device": dev}]}}},
    }  # fmt: skip


def _preparer(base: Path, tree: SysfsTree, read: Callable[..., Any]) -> ClaimPreparer:
    config = load_config_text(CONFIG, "bench")
    return ClaimPreparer(
        host=Host(tree.root, kernel=SimulatedKernel(tree)), driver=DRIVER, node=NODE,
        cdi_dir=f"{base}/cdi", plugins_dir=f"{base}/plugins", read_claim=read,
        config=lambda: config,
    )  # fmt: skip


def _in_memory(objects: dict[tuple[str, str], dict[str, Any]]) -> Callable[..., Any]:
    async def read(ns: str, name: str) -> dict[str, Any] | None:
        return objects.get((ns, name))

    return read


def _driverless(tree: SysfsTree) -> int:
    """The NICs under test without a driver (the host bridge of the tree has none, by design)."""
    devs = tree.root / "sys/bus/pci/devices"
    return sum(
        1 for d in devs.iterdir() if d.name != "0000:00:00.0" and not (d / "driver").exists()
    )


def _outside(base: Path) -> int:
    out = base / "outside"
    return sum(1 for _ in out.rglob("*")) if out.exists() else 0


def _row(case: str, fault: str, ok: bool, tree: SysfsTree, note: str) -> dict[str, object]:
    return {
        "area": AREA,
        "case": case,
        "fault_or_load": fault,
        "answered_correctly": "yes" if ok else "NO",
        "devices_without_driver": _driverless(tree),
        "rss_peak_mb": round(_rss_mb()),
        "note": note,
    }


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A TCP server that accepts every connection and never answers; yields its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(srv.accept()[0])

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield srv.getsockname()[1]
    finally:
        stop.set()
        t.join()
        for s in held:
            s.close()
        srv.close()


def hostile_api_server() -> dict[str, object]:
    import kubernetes.client as k8s

    from vfio_dp.dra.apiserver.publisher import claim_reader

    with tempfile.TemporaryDirectory(prefix="rel-dra") as d, _silent_server() as port:
        base = Path(d)
        tree = _tree(base, 10)
        cfg = k8s.Configuration()
        cfg.host = f"http://127.0.0.1:{port}"
        read = claim_reader(k8s.ApiClient(cfg), timeout=2.0)
        prep = _preparer(base, tree, read)
        refs = [ClaimRef("default", f"uid-{i:05d}", f"c{i}") for i in range(10)]

        async def scenario() -> tuple[dict[str, Any], float, dict[str, str], float]:
            t0 = time.perf_counter()
            prepare = asyncio.ensure_future(prep.prepare(refs))
            un = await prep.unprepare([ClaimRef("default", "never", "never-prepared")])
            t_un = time.perf_counter() - t0
            out = dict(await prepare)
            return out, time.perf_counter() - t0, dict(un), t_un

        out, t_prep, un, t_un = asyncio.run(scenario())
        errors = [r.error for r in out.values()]
        ok = (
            un == {"never": ""}
            and t_un < 1.0
            and all(e and "did not answer within 2 s" in e for e in errors)
            and t_prep < 5.0
        )
        return _row(
            "10 Prepares + 1 Unprepare while claim GETs hang",
            "API server accepts, never answers",
            ok,
            tree,
            f"unprepare answered in {t_un * 1000:.0f} ms; each prepare failed alone naming the "
            f"deadline after {t_prep:.1f} s (deadline 2 s here, 10 s in the plugin)",
        )


def hostile_state_files() -> list[dict[str, object]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="rel-dra") as d:
        base = Path(d)
        tree = _tree(base, 1)
        state = tree.root / "var/lib/vfio_dp"
        state.mkdir(parents=True)
        os.mkfifo(state / f"dra-{DRIVER}.checkpoint.json")
        prep = _preparer(base, tree, _in_memory({("default", "c0"): _claim(0)}))
        t0 = time.perf_counter()
        out = asyncio.run(
            asyncio.wait_for(prep.prepare([ClaimRef("default", "uid-00000", "c0")]), 30)
        )
        secs = time.perf_counter() - t0
        aside = [p.name for p in state.iterdir() if ".corrupt-" in p.name]
        ok = not out["uid-00000"].error and len(aside) == 1 and secs < 5
        rows.append(_row(
            "a FIFO at the checkpoint path", "state file is a FIFO", ok, tree,
            f"start did not block ({secs:.2f} s); FIFO moved aside as {aside[0] if aside else '-'}; "
            "claim prepared",
        ))  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="rel-dra") as d:
        base = Path(d)
        tree = _tree(base, 1)
        (base / "outside").mkdir()
        (tree.root / "var/lib").mkdir(parents=True)
        (tree.root / "var/lib/vfio_dp").symlink_to(base / "outside")
        prep = _preparer(base, tree, _in_memory({("default", "c0"): _claim(0)}))
        err = ""
        try:
            out = asyncio.run(prep.prepare([ClaimRef("default", "uid-00000", "c0")]))
            err = out["uid-00000"].error
        except Exception as e:  # refused at load: also a correct answer, if it names the path
            err = str(e)
        written = _outside(base)
        ok = bool(err) and written == 0
        rows.append(_row(
            "state directory links out of --root", "var/lib/vfio_dp -> outside", ok, tree,
            f"files written outside the root: {written}; error: {err[:120]}",
        ))  # fmt: skip
    return rows


def garbage_next_to_good() -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rel-dra") as d:
        base = Path(d)
        tree = _tree(base, 4)
        good = _claim(0)
        bad_results = _claim(1)
        bad_results["status"]["allocation"]["devices"]["results"] = 5
        bad_config = _claim(2)
        bad_config["status"]["allocation"]["devices"]["config"] = 7
        huge = _claim(3)
        one = huge["status"]["allocation"]["devices"]["results"][0]
        huge["status"]["allocation"]["devices"]["results"] = [dict(one) for _ in range(20_000)]
        other = _claim(3, uid="uid-other")
        other["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.example.com"
        objects = {("default", o["metadata"]["name"]): o for o in
                   (good, bad_results, bad_config, huge)}  # fmt: skip
        objects[("default", "c-other")] = {
            **other,
            "metadata": {**other["metadata"], "name": "c-other"},
        }
        refs = [
            ClaimRef("default", "uid-00000", "c0"),
            ClaimRef("default", "uid-00001", "c1"),
            ClaimRef("default", "uid-00002", "c2"),
            ClaimRef("default", "uid-00003", "c3"),
            ClaimRef("default", "uid-other", "c-other"),
        ]
        prep = _preparer(base, tree, _in_memory(objects))
        t0 = time.perf_counter()
        out = asyncio.run(prep.prepare(refs))
        secs = time.perf_counter() - t0
        # the same UID again under another name: refused naming both
        again = asyncio.run(prep.prepare([ClaimRef("default", "uid-00000", "c-renamed")]))
        errors = {u: r.error for u, r in out.items()}
        meta = base / "plugins" / DRIVER
        written = sorted(p.name for p in meta.rglob("*") if p.is_dir()) if meta.exists() else []
        refused = [u for u, e in errors.items() if e]
        ok = (
            not errors["uid-00000"]
            and set(refused) == {"uid-00001", "uid-00002", "uid-00003", "uid-other"}
            and "c-renamed" in again["uid-00000"].error
            and not any("uid-00003" in w for w in written)
        )
        return _row(
            "garbage claims next to a good one, in one call",
            "results: 5, config: 7, 20,000 results, same UID renamed, another driver's claim",
            ok,
            tree,
            f"good claim prepared; {len(refused)} refused each alone (another driver's claim: "
            f"'no device of driver'); renamed UID refused naming both; nothing written for the "
            f"20,000-result claim; {secs * 1000:.0f} ms",
        )


def batch(n: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rel-dra") as d:
        base = Path(d)
        tree = _tree(base, n)
        objects = {("default", f"c{i}"): _claim(i) for i in range(n)}
        prep = _preparer(base, tree, _in_memory(objects))
        refs = [ClaimRef("default", f"uid-{i:05d}", f"c{i}") for i in range(n)]
        t0 = time.perf_counter()
        out = asyncio.run(prep.prepare(refs))
        t1 = time.perf_counter()
        un = asyncio.run(prep.unprepare(refs))
        t2 = time.perf_counter()
        errs = sum(1 for r in out.values() if r.error) + sum(1 for e in un.values() if e)
        ok = errs == 0 and t1 - t0 < 10 and t2 - t1 < 10
        return _row(
            f"one call of {n:,} claims, then their unprepare",
            f"{n:,} claims, groups on vfio-pci",
            ok,
            tree,
            f"prepare {t1 - t0:.1f} s, unprepare {t2 - t1:.1f} s, {errs} errors "
            "(kubelet gives up after ~45 s; goal: a few seconds)",
        )


def rows(quick: bool = False) -> list[dict[str, object]]:
    return [
        hostile_api_server(),
        *hostile_state_files(),
        garbage_next_to_good(),
        batch(200 if quick else 1000),
    ]


if __name__ == "__main__":
    for r in rows("--quick" in sys.argv):
        print(r)
