"""The API calls' deadline watchdog (:mod:`vfio_dp.dra.apiserver.client`): a deadline
finished before its time costs its thread no wake-up (issue 39 row 6: the first
publication's ~35 slice writes woke it once each, a minute later, in the idle window)."""

from __future__ import annotations

import threading
import time

from vfio_dp.dra.apiserver import client


def _switches(tid: int) -> int:
    """Context switches of thread ``tid`` of this process so far (each wake-up is one)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return int(fields["voluntary_ctxt_switches"]) + int(fields["nonvoluntary_ctxt_switches"])


def test_the_watchdog_sleeps_through_deadlines_finished_before_their_time() -> None:
    with client.deadline(60, "a call that starts the watchdog"):
        pass
    (thread,) = [t for t in threading.enumerate() if t.name == "vfio_dp-api-deadlines"]
    assert thread.native_id is not None
    for i in range(40):  # forty calls, each done long before its deadline
        with client.deadline(0.3 + i * 0.01, "a quick call"):
            pass
    time.sleep(0.1)  # the adds' own wake-ups are over
    before = _switches(thread.native_id)
    time.sleep(0.9)  # every one of the forty deadlines passes now
    assert _switches(thread.native_id) - before <= 5


def test_an_unfinished_deadline_still_expires_after_finished_ones() -> None:
    for _ in range(10):
        with client.deadline(0.05, "a quick call"):
            pass
    with client.deadline(0.2, "a call that hangs") as d:
        t0 = time.monotonic()
        while not d.expired and time.monotonic() - t0 < 10:
            time.sleep(0.01)
        assert d.expired
