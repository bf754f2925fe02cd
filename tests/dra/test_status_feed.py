"""The claim-status feed (vfio_dp.dra.observers.claim_status): writes in the background,
coalesced per claim, decided when each write starts, bounded at stop. The writer is a
blocking function on real threads (as the API shell's is); it records what it was asked."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence

import pytest

from vfio_dp.dra.claimpath.checkpoint import PREPARED, PREPARING, ClaimRecord, DeviceRecord
from vfio_dp.dra.observers.claim_status import DeviceStatus, StatusFeed
from vfio_dp.model.address import PciAddress

GUARD = 30.0  # liveness only


def record(uid: str, state: str = PREPARED) -> ClaimRecord:
    dev = DeviceRecord(("gpu",), "node-a", "pci-0000-3b-00-0", 45,
                       ("0000:3b:00.0", "0000:3b:00.1"), ("10de:1eb8", "10de:10f8"))  # fmt: skip
    return ClaimRecord("vms", f"claim-{uid}", uid, state, devices=(dev,))


class Writer:
    """Records each write; the first ``hold`` writes block until :attr:`go` is set."""

    def __init__(self, hold: int = 0) -> None:
        self.calls: list[tuple[str, list[DeviceStatus]]] = []
        self.go = threading.Event()
        self.hold = hold
        self.lock = threading.Lock()

    def __call__(self, ns: str, name: str, uid: str, ours: Sequence[DeviceStatus]) -> bool:
        with self.lock:
            self.calls.append((uid, list(ours)))
            n = len(self.calls)
        if n <= self.hold:
            self.go.wait(GUARD)
        return True


def feed_of(writer: Writer, claims: dict[str, ClaimRecord]) -> StatusFeed:
    return StatusFeed(
        writer, record=claims.get, records=lambda: claims, states=lambda: {},
        holders=lambda: {PciAddress.parse("0000:3b:00.0"): "claim:a"},
    )  # fmt: skip


async def until(check: object) -> None:
    end = time.monotonic() + GUARD
    while not check():  # type: ignore[operator]
        assert time.monotonic() < end, "timed out"
        await asyncio.sleep(0.01)


async def test_changes_while_a_write_runs_make_one_more_write_as_the_checkpoint_says_then() -> None:
    claims = {"a": record("a")}
    writer = Writer(hold=1)
    feed = feed_of(writer, claims)
    feed.claim_changed("vms", "claim-a", "a")
    await until(lambda: len(writer.calls) == 1)
    for _ in range(10):  # while the first write hangs
        feed.claim_changed("vms", "claim-a", "a")
    del claims["a"]  # unprepared meanwhile: the next write removes our entries
    writer.go.set()
    await until(lambda: feed.busy == 0)
    assert [(uid, len(ours)) for uid, ours in writer.calls] == [("a", 1), ("a", 0)]
    (first,) = writer.calls[0][1]
    assert first.bound_by == "claim:a" and first.devnodes == ("/dev/vfio/vfio", "/dev/vfio/45")
    assert (feed.written, feed.errors) == (2, 0)
    await feed.close()


async def test_a_claim_being_prepared_is_not_written_until_its_end_asks_again() -> None:
    claims = {"b": record("b", PREPARING)}
    writer = Writer()
    feed = feed_of(writer, claims)
    feed.claim_changed("vms", "claim-b", "b")
    await until(lambda: feed.busy == 0)
    assert writer.calls == []
    claims["b"] = record("b")
    feed.device_changed("pci-0000-3b-00-0")  # a held device's health changed
    await until(lambda: feed.busy == 0)
    assert [uid for uid, _ in writer.calls] == ["b"]
    await feed.close()


async def test_many_devices_changing_at_once_look_at_the_claims_once() -> None:
    """1,024 held devices going bad in one scan: one pass over the checkpoint's claims (it
    was one pass per device, on the event loop ahead of the health stream), and each claim
    holding one of them written, the others not."""
    claims: dict[str, ClaimRecord] = {}
    for i in range(4):
        dev = DeviceRecord(("nic",), "node-a", f"pci-0000-0{i}-00-0", i, (f"0000:0{i}:00.0",),
                           ("8086:1533",))  # fmt: skip
        claims[f"u{i}"] = ClaimRecord("vms", f"claim-u{i}", f"u{i}", PREPARED, devices=(dev,))
    passes = 0

    def records() -> dict[str, ClaimRecord]:
        nonlocal passes
        passes += 1
        return claims

    writer = Writer()
    feed = StatusFeed(
        writer, record=claims.get, records=records, states=lambda: {}, holders=lambda: {}
    )
    feed.devices_changed({"pci-0000-00-00-0", "pci-0000-02-00-0", "pci-0000-09-00-0"})
    await until(lambda: feed.busy == 0)
    assert passes == 1
    assert sorted(uid for uid, _ in writer.calls) == ["u0", "u2"]
    await feed.close()


async def test_close_leaves_a_stuck_write_after_its_grace_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    claims = {c: record(c) for c in "abcdef"}
    writer = Writer(hold=100)  # every write hangs (an API server that trickles)
    feed = feed_of(writer, claims)
    for c in "abcdef":
        feed.claim_changed("vms", f"claim-{c}", c)
    await until(lambda: len(writer.calls) == 4)  # four at once, two queued
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="vfio_dp.dra"):
        await feed.close(grace=0.5)
    assert time.monotonic() - start < 5  # the grace, not the writes
    assert "6 claim status write(s) not done within" in caplog.text
    feed.claim_changed("vms", "claim-a", "a")  # closed: taken no more
    assert feed.busy == 0
    writer.go.set()


async def test_a_hold_keeps_writes_queued_until_released_or_run_out() -> None:
    """Issue 39 row 1: when held devices change health the plugin holds the status writes
    until the tainted slices are written (1,024 status GETs and PUTs raced the 16 slice
    writes); the claims asked for meanwhile are written at the release, coalesced; a hold
    nobody releases runs out by itself."""
    claims = {u: record(u) for u in ("a", "b")}
    writer = Writer()
    feed = feed_of(writer, claims)
    feed.hold(GUARD)
    feed.device_changed("pci-0000-3b-00-0")
    feed.device_changed("pci-0000-3b-00-0")
    await asyncio.sleep(0.2)
    assert writer.calls == [] and feed.busy == 2  # queued, not started
    feed.release()
    await until(lambda: feed.busy == 0)
    assert sorted(uid for uid, _ in writer.calls) == ["a", "b"]  # once each
    feed.hold(0.1)  # never released: runs out
    feed.claim_changed("vms", "claim-a", "a")
    await until(lambda: len(writer.calls) == 3)
    await feed.close()
