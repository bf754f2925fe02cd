"""What a Prepare of many claims does per claim (issue 39 row 2; the timing goal lives in
``bench/fleet.py``'s row 2, these count the work): no directory made again for a claim
whose directories exist, the CDI spec encoded by the C JSON encoder (one line), the
driver name validated once, not at each of a claim's eight uses -- and the checkpoint
still ONE durable write (file and directory ``fsync``) per call, on disk before the
answer (temp sysfs tree: lone functions already on vfio-pci)."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.dra.test_prepare_batch import build, claims, on_disk, preparer
from vfio_dp.host import atomic
from vfio_dp.model import naming

N = 20


def _count(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[object]:
    """Every call of ``module.name`` (still made), by its first argument."""
    calls: list[object] = []
    real = getattr(module, name)

    def counting(*a: object, **k: object) -> object:
        calls.append(a[0] if a else None)
        return real(*a, **k)

    monkeypatch.setattr(module, name, counting)
    return calls


def test_a_repeat_prepare_makes_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first Prepare makes the claims' metadata directories (two levels each) and the
    CDI directory once; the same claims again (a kubelet restart) find them all: no
    ``mkdir`` at all (was two tried per claim: ``os.makedirs`` of the CDI directory and of
    the metadata directory before every file)."""
    tree = build(tmp_path / "root", N)
    objects, refs = claims(N)
    p = preparer(tree.root, tmp_path, objects)
    mkdirs = _count(monkeypatch, os, "mkdir")
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    assert len(mkdirs) <= 2 * N + 8, mkdirs  # each claim's own directories, the tops once
    mkdirs.clear()
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    assert mkdirs == []


def test_the_cdi_spec_is_one_line_of_json(tmp_path: Path) -> None:
    """``json.dumps(..., indent=2)`` runs Python's pure-Python encoder (dozens of calls
    per claim): the spec is written by the C encoder, one line, and still reads back as
    the same spec."""
    tree = build(tmp_path / "root", 2)
    objects, refs = claims(2)
    p = preparer(tree.root, tmp_path, objects)
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    for spec in sorted((tmp_path / "cdi").iterdir()):
        text = spec.read_text()
        assert text.count("\n") == 1 and text.endswith("\n"), text[:200]
        data = json.loads(text)
        assert data["kind"] == "vfio.example.com/vfio" and data["devices"], data


def test_the_driver_name_is_judged_once_not_per_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver name is checked at every use (spec path, CDI kind, device IDs...):
    eight times a claim; the answer for one name is remembered, so a call of N claims
    judges it at most once."""
    tree = build(tmp_path / "root", N)
    objects, refs = claims(N)
    p = preparer(tree.root, tmp_path, objects)
    naming.dra_driver_name_problem.cache_clear()
    judged = _count(monkeypatch, naming, "dns_subdomain_problem")
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    assert judged.count("vfio.example.com") <= 1, len(judged)
    with pytest.raises(Exception, match="not a lowercase DNS subdomain"):
        naming.check_dra_driver_name("Not.Valid")  # a bad name is still refused
    with pytest.raises(Exception, match="not a lowercase DNS subdomain"):
        naming.check_dra_driver_name("Not.Valid")  # ... each time


def test_still_one_durable_checkpoint_write_per_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The files of the claims are not synced (rebuilt by every Prepare); the checkpoint
    is: ONE ``fsync`` of its file and one of its directory for the call, and every claim
    on disk when the call answers."""
    tree = build(tmp_path / "root", N)
    objects, refs = claims(N)
    p = preparer(tree.root, tmp_path, objects)
    syncs = _count(monkeypatch, atomic.os, "fsync")
    out = asyncio.run(p.prepare(refs))
    assert all(r.error == "" for r in out.values()), out
    assert len(syncs) == 2, syncs
    assert on_disk(tree.root) == {r.uid: "prepared" for r in refs}


def test_one_worker_at_a_time_reads_and_writes_a_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call's claims settle on several worker threads, but their reads, checks and files
    are made one claim at a time (the others wait on a lock, not on the GIL: a thread
    switch per claim, not one per sysfs read), while a claim blocked in its bind (or a
    container's wait for its device nodes) holds none of it: the others are prepared
    meanwhile."""
    import threading
    import time

    from vfio_dp.dra.claimpath.steps import DeviceSteps

    tree = build(tmp_path / "root", N)
    objects, refs = claims(N)
    p = preparer(tree.root, tmp_path, objects)
    inside, most = [0], [0]
    guard = threading.Lock()
    real_resolve, real_take = DeviceSteps.resolve, DeviceSteps.take
    blocked, release = threading.Event(), threading.Event()

    def resolve(self: DeviceSteps, *a: object, **k: object) -> object:
        with guard:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        try:
            time.sleep(0.002)  # long enough for another worker to come in, were it let
            return real_resolve(self, *a, **k)  # type: ignore[arg-type]
        finally:
            with guard:
                inside[0] -= 1

    def take(self: DeviceSteps, who: str, uid: str, *a: object, **k: object) -> object:
        if uid == refs[0].uid:  # the first claim's "bind" hangs until the others are done
            blocked.set()
            assert release.wait(30), "the other claims were not prepared meanwhile"
        return real_take(self, who, uid, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(DeviceSteps, "resolve", resolve)
    monkeypatch.setattr(DeviceSteps, "take", take)

    async def call() -> dict[str, str]:
        task = asyncio.ensure_future(p.prepare(refs))
        while len(list((tmp_path / "cdi").glob("*.json"))) < N - 1:  # all but the hung one
            await asyncio.sleep(0.01)
            assert not task.done(), task.result()
        release.set()
        return {u: r.error for u, r in (await task).items()}

    errors = asyncio.run(asyncio.wait_for(call(), 60))
    assert set(errors.values()) == {""}, errors
    assert blocked.is_set()
    assert most[0] == 1, most
