"""A kubelet call of many claims (issue 39 row 2): ONE durable checkpoint write per
NodePrepareResources / NodeUnprepareResources, on disk before the answer -- a process killed
right after the answer finds every claim -- and every claim of the call failed when that
write fails (temp sysfs tree: lone functions already on vfio-pci)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath import edits
from vfio_dp.dra.claimpath.checkpoint import Checkpoint
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.host import records as records_mod
from vfio_dp.host.root import Root
from vfio_dp.model.config import load_config_text

DRIVER = "vfio.example.com"
NODE = "node-a"
CONFIG = 'selectors:\n  - {vendor: "8086", device: "1533", path: dra}\n'
N = 40
REPO = Path(__file__).resolve().parents[2]


def build(base: Path, n: int = N) -> SysfsTree:
    t = SysfsTree(base)
    for i in range(n):
        t.add(Dev(f"0000:{i + 1:02x}:00.0", "8086", "1533", "020000", driver="vfio-pci",
                  group=100 + i, native_driver="igb"))  # fmt: skip
    p = t.root / "proc/sys/kernel/random"
    p.mkdir(parents=True)
    (p / "boot_id").write_text("boot-1\n")
    return t


def claims(n: int = N) -> tuple[dict[tuple[str, str], dict[str, Any]], list[ClaimRef]]:
    objects, refs = {}, []
    for i in range(n):
        uid = f"uid-{i:03d}"
        objects[("default", f"c{i}")] = {
            "metadata": {"name": f"c{i}", "namespace": "default", "uid": uid},
            "status": {"allocation": {"devices": {"results": [
                {"request": "nic", "driver": DRIVER, "pool": NODE,
                 "device": f"pci-0000-{i + 1:02x}-00-0"}]}}},
        }  # fmt: skip
        refs.append(ClaimRef("default", uid, f"c{i}"))
    return objects, refs


def preparer(
    root: Path, work: Path, objects: dict[tuple[str, str], dict[str, Any]]
) -> ClaimPreparer:
    config = load_config_text(CONFIG, "test")

    async def read(ns: str, name: str) -> dict[str, Any] | None:
        return objects.get((ns, name))

    return ClaimPreparer(
        host=Host(root), driver=DRIVER, node=NODE, cdi_dir=str(work / "cdi"),
        plugins_dir=str(work / "plugins"), read_claim=read, config=lambda: config,
    )  # fmt: skip


def on_disk(root: Path) -> dict[str, str]:
    cp = Checkpoint(Root(root), DRIVER)
    return {uid: rec.state for uid, rec in cp.load().items()}


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return build(tmp_path / "root")


def _count_writes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every record-file write (the checkpoint's one writer), by file name."""
    names: list[str] = []
    real = records_mod.replace_at

    def counting(dfd: int, name: str, data: bytes) -> None:
        names.append(name)
        real(dfd, name, data)

    monkeypatch.setattr(records_mod, "replace_at", counting)
    return names


def test_one_call_is_one_checkpoint_write(
    tree: SysfsTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 claims in one Prepare: one write of the checkpoint, holding all 40 when the call
    answers; the same 40 again (a kubelet restart): no write at all; one Unprepare of them:
    one write, and the directories their files were removed from synced once each, before
    it (not once per claim)."""
    objects, refs = claims()
    p = preparer(tree.root, tmp_path, objects)
    writes = _count_writes(monkeypatch)
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    assert len(writes) == 1, writes
    assert on_disk(tree.root) == {r.uid: "prepared" for r in refs}
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    assert len(writes) == 1, writes  # nothing changed: nothing written
    events: list[str] = []
    real_sync = edits.sync_dir
    real_write = records_mod.replace_at

    def sync(where: str) -> None:
        events.append(f"sync {os.path.basename(where)}")
        real_sync(where)

    def write(dfd: int, name: str, data: bytes) -> None:
        events.append("checkpoint")
        real_write(dfd, name, data)

    monkeypatch.setattr(edits, "sync_dir", sync)
    monkeypatch.setattr(records_mod, "replace_at", write)
    errors = asyncio.run(p.unprepare(refs))
    assert set(errors.values()) == {""}, errors
    assert events == ["sync cdi", "sync dra-device-metadata", "checkpoint"], events
    assert on_disk(tree.root) == {}
    assert os.listdir(tmp_path / "cdi") == []


def test_a_failed_write_fails_every_claim_of_the_call_and_leaves_no_files(
    tree: SysfsTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects, refs = claims(8)
    p = preparer(tree.root, tmp_path, objects)

    def enospc(*a: object, **k: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(records_mod, "replace_at", enospc)
    out = asyncio.run(p.prepare(refs))
    assert all("No space left on device" in r.error for r in out.values()), out
    assert p.checkpoint.all() == {}
    assert os.listdir(tmp_path / "cdi") == []  # no container may get a spec of these
    monkeypatch.undo()
    out = asyncio.run(p.prepare(refs))  # kubelet's retry
    assert all(r.error == "" for r in out.values()), out
    assert on_disk(tree.root) == {r.uid: "prepared" for r in refs}


def test_unprepare_whose_directory_sync_fails_forgets_no_claim(
    tree: SysfsTree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files' removal must be on disk before the checkpoint forgets the claims (else a
    crash brings back files of a claim nobody remembers): a failed sync fails every claim
    of the call, and they stay checkpointed for kubelet's retry."""
    objects, refs = claims(6)
    p = preparer(tree.root, tmp_path, objects)
    asyncio.run(p.prepare(refs))

    def eio(where: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(edits, "sync_dir", eio)
    errors = asyncio.run(p.unprepare(refs))
    assert all("Input/output error" in e for e in errors.values()), errors
    assert sorted(p.checkpoint.all()) == sorted(r.uid for r in refs)
    assert on_disk(tree.root) == {r.uid: "prepared" for r in refs}
    monkeypatch.undo()
    assert set(asyncio.run(p.unprepare(refs)).values()) == {""}
    assert on_disk(tree.root) == {}


CHILD = """
import asyncio, json, os, sys
from pathlib import Path
sys.path.insert(0, {repo!r})
from tests.dra.test_prepare_batch import claims, preparer
objects, refs = claims()
p = preparer(Path({root!r}), Path({work!r}), objects)

async def main() -> None:
    out = await (p.{call}(refs))
    print(json.dumps(sorted(out)), flush=True)
    os._exit(0)  # killed right after the answer: no loop shutdown, no executor drained

asyncio.run(main())
"""


def _answer_then_die(call: str, root: Path, work: Path) -> list[str]:
    code = CHILD.format(repo=str(REPO), root=str(root), work=str(work), call=call)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    answered: list[str] = json.loads(r.stdout)
    return answered


def test_a_process_killed_right_after_the_answer_finds_every_claim(
    tree: SysfsTree, tmp_path: Path
) -> None:
    answered = _answer_then_die("prepare", tree.root, tmp_path)
    assert len(answered) == N
    assert on_disk(tree.root) == dict.fromkeys(answered, "prepared")
    answered = _answer_then_die("unprepare", tree.root, tmp_path)
    assert len(answered) == N
    assert on_disk(tree.root) == {}
    assert os.listdir(tmp_path / "cdi") == []
