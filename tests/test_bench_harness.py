"""The benchmark harness runs: ``make bench`` measures every row of the performance table,
and ``bench/against.py`` unpacks a ref and reports. No figure is judged here (targets live
in the benchmarks, issue 25); this keeps the instrument from rotting, so the regression guard
still works the day someone needs it (a row whose command or tree changed fails here, not
in the middle of someone's measurement)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench.rows import ANCHORS, FIGURES, FLEET_NOT_MEASURED

REPO = Path(__file__).resolve().parents[1]
#: minutes of benchmark runs: in `make test` and CI, not in `make check`
pytestmark = pytest.mark.bench


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=900
    )


#: one round of every row: building the 4,160-function tree (10-60 s here), the daemons'
#: idle windows, the webhook's load and the Prepare runs take one to three minutes (more
#: on a loaded machine: the fleet rows run in a test of their own)
@pytest.mark.timeout(600)
def test_make_bench_measures_every_row() -> None:
    """One round of every row (cold, so the figures mean nothing): each row has a value, each
    anchor is printed, nothing "could not run". Exit 1 is a goal not met, which is fine here."""
    # the fleet rows: below; the guest rows (pool): a QEMU boot, never in the unit run
    r = _run("bench/goals.py", "--rounds", "1", "--skip", "fleet,pool")
    assert r.returncode in (0, 1), (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    lines = r.stdout.splitlines()
    for fig in (f for f in FIGURES if not f.key.startswith("fleet_")):
        row = [line for line in lines if line.startswith(fig.what)]
        assert len(row) == 1, (fig.what, r.stdout[-3000:])
        assert "not measured" not in row[0], (row[0], r.stdout[-3000:], r.stderr[-3000:])
        value = row[0][len(fig.what) :].split()[0]
        assert float(value) >= 0, row[0]
    for what in ANCHORS.values():
        assert f"anchor: {what}:" in r.stdout, (what, r.stdout[-3000:])
    assert "could not run" not in r.stdout, r.stdout[-3000:]


def test_make_bench_lists_the_guest_rows_and_against_never_does() -> None:
    """The real-kernel pool rows (``bench/pool_switch_bench.py``, group ``pool``) are rows of
    ``make bench``, said "not measured" when skipped; bench/against.py, which measures a ref
    whose tree has no guest rig of its own, never lists them."""
    from bench.rows import GUEST_FIGURES

    r = _run("bench/goals.py", "--rounds", "1", "--skip",
             "process,prepare,webhook,daemons,fleet,pool")  # fmt: skip
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for fig in GUEST_FIGURES:
        (row,) = [line for line in r.stdout.splitlines() if line.startswith(fig.what)]
        assert "not measured" in row, row
    assert not {f.key for f in GUEST_FIGURES} & {f.key for f in FIGURES}


def test_against_unpacks_a_ref_and_reports() -> None:
    """``bench/against.py HEAD`` with every group skipped: the ref is resolved, unpacked and
    byte-compiled, and the report names every row and why it was not measured."""
    r = _run("bench/against.py", "HEAD", "--skip", "process,prepare,daemons,webhook,fleet")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    for fig in FIGURES:
        assert fig.what in r.stdout, fig.what
    assert "not measured (skipped)" in r.stdout


@pytest.mark.timeout(600)
def test_fleet_runs_every_row_at_its_small_size() -> None:
    """``make bench``'s fleet rows (issue 39: ``bench/fleet.py`` through ``bench/goals.py``)
    measured once at their small sizes, in minutes at most (the figures mean nothing at that
    size); the rows it does not measure say why."""
    host_cdi = Path("/var/run/cdi")  # the machine's own CDI specs: a bench writes its own dirs
    before = set(host_cdi.glob("*.json")) if host_cdi.is_dir() else set()
    r = _run("bench/goals.py", "--rounds", "1", "--skip", "process,prepare,webhook,daemons,pool",
             "--fleet-small")  # fmt: skip
    after = set(host_cdi.glob("*.json")) if host_cdi.is_dir() else set()
    assert not after - before, (
        f"the fleet rows wrote CDI specs on the host: {sorted(after - before)[:3]}"
    )
    assert r.returncode in (0, 1), (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    for fig in FIGURES:
        if not fig.key.startswith("fleet_"):
            continue
        row = [line for line in r.stdout.splitlines() if line.startswith(fig.what)]
        assert len(row) == 1, (fig.what, r.stdout[-3000:])
        assert "not measured" not in row[0], (row[0], r.stdout[-3000:], r.stderr[-3000:])
        value = float(row[0][len(fig.what) :].split()[0])
        # a growth may be below zero (a process's RSS shrinks when a scan's objects are
        # freed); every other figure is a time, a rate, a count or a size
        assert math.isfinite(value) and (value >= 0 or fig.key.endswith("_growth")), row[0]
    for what in FLEET_NOT_MEASURED:
        assert f"{what}" in r.stdout and "not measured: " in r.stdout, what
    assert "could not run" not in r.stdout, r.stdout[-3000:]


@pytest.mark.timeout(300)
def test_reliability_fleet_loses_nothing_with_a_few_claims() -> None:
    """``bench/reliability_fleet.py`` (issue 39: nothing lost when the DRA daemon is killed
    mid-call) at a small size: every row answered correctly, no function without a driver."""
    r = _run("bench/reliability_fleet.py", "--claims", "40")
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    rows = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 3 and all("'answered_correctly': True" in row for row in rows), rows
