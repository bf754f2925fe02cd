#!/usr/bin/env python3
"""The regression guard: every row of the performance table for the working tree AND a git
ref, in the same run, interleaved, and each figure's ratio with its noise band.

    python3 bench/against.py [REF] [--rounds 5] [--skip daemons,webhook]

REF defaults to the commit recorded in ``bench/against.ref`` (tags may not travel with a
clone). The ref is unpacked with ``git archive`` into a temp dir and run from there (first on
``PYTHONPATH``, same interpreter and packages); everything that measures -- trees, stand-ins,
clients -- is the working tree's (see ``bench/rows.py``).

For each figure: the working tree's median and the ref's (of >= 5 interleaved rounds), the
ratio of the medians oriented so that > 1 is worse (time: tree / ref; throughput: ref /
tree), and its noise band: the middle of the per-round ratios (round i of the tree over
round i of the ref; with 5 rounds the 2nd to 4th). A ratio above 1.10 is flagged WORSE
(and "worse, within noise" when the band reaches below 1.0). A row the ref cannot run (DRA
on an old ref) is compared with its anchor instead (lspci, Host.bind) and says why. Exit 1
when a figure is flagged WORSE.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.rows import ANCHORS, FIGURES, Figure, Side, floor_note, measure, met, ref_side

DEFAULT_REF_FILE = Path(__file__).resolve().parent / "against.ref"
WORSE = 1.10
GROUP_OF = {
    "list_big": "process", "list_big_1cpu": "process", "list_small": "process",
    "help": "process", "check_big": "process", "dp_idle": "device-plugin",
    "alloc_p50": "device-plugin", "alloc_p99": "device-plugin", "dra_idle": "dra",
    "dra_republish": "dra", "wh_p99": "webhook", "wh_rps": "webhook", "wh_rss": "webhook",
    "prep_p50": "prepare", "prep_p99": "prepare", "prep_on1": "prepare", "prep_on4": "prepare",
    "prep_big": "prepare", "dra_holders": "holders",
    **{f.key: "fleet" for f in FIGURES if f.key.startswith("fleet_")},
}  # fmt: skip


def default_ref() -> str:
    return DEFAULT_REF_FILE.read_text().split()[0]


def band(values: list[float]) -> tuple[float, float]:
    """The middle of ``values``: drop the lowest and highest quarter (at least one each)."""
    s = sorted(values)
    cut = max(1, len(s) // 4) if len(s) >= 3 else 0
    s = s[cut : len(s) - cut] or s
    return s[0], s[-1]


def fmt(v: float | None, unit: str) -> str:
    if v is None:
        return "-"
    if unit in ("s",):
        return f"{v:.3f}"
    if unit in ("req/s",):
        return f"{v:.0f}"
    return f"{v:.2f}"


def anchor_of(fig: Figure, side: str, results: dict[str, dict[str, list[float]]]) -> float | None:
    """The median of the figure's anchor for ``side`` (its own Host.bind) or the shared one."""
    if fig.anchor is None or fig.anchor not in results:
        return None
    per = results[fig.anchor]
    values = per.get(side) or per.get("anchor")
    return statistics.median(values) if values else None


def oriented(a: float, b: float, lower_better: bool) -> float:
    """a against b, > 1 = a is worse."""
    if lower_better:
        return a / b if b else float("inf")
    return b / a if a else float("inf")


def report(tree: Side, ref: Side, results: dict[str, dict[str, list[float]]]) -> int:
    worse = 0
    print(f"\nworking tree vs {ref.label}: medians of interleaved rounds; ratio > 1 = the "
          f"working tree is worse; band = middle of the per-round ratios; flag > {WORSE:.2f}")  # fmt: skip
    head = f"{'figure':52} {'unit':6} {'tree':>9} {ref.label:>9} {'ratio':>6} {'band':>11}  verdict"
    print(head)
    print("-" * len(head))
    for fig in FIGURES:
        per = results.get(fig.key, {})
        mine, theirs = per.get(tree.label), per.get(ref.label)
        if not mine:
            why = tree.broken.get(GROUP_OF[fig.key], "not measured (skipped)")
            print(
                f"{fig.what:52} {fig.unit:6} {'-':>9} {'-':>9}  working tree cannot run it: {why}"
            )
            continue
        m = statistics.median(mine)
        if not theirs:
            why = ref.broken.get(GROUP_OF[fig.key], "not measured (skipped)")
            a = anchor_of(fig, tree.label, results)
            vs = ""
            if a is not None:
                vs = f"; vs anchor {fig.anchor}: {m / a:.2f}x"
            ok = met(fig.key, m, {fig.anchor: a} if fig.anchor and a is not None else {})
            goal = "" if ok is None else f"; goal {fig.goal}: {'met' if ok else 'NOT met'}"
            print(f"{fig.what:52} {fig.unit:6} {fmt(m, fig.unit):>9} {'n/a':>9} {'':>6} "
                  f"{'':>11}  ref cannot run it ({why[:80]}){vs}{goal}")  # fmt: skip
            continue
        t = statistics.median(theirs)
        ratio = oriented(m, t, fig.lower_better)
        rounds = [oriented(a, b, fig.lower_better) for a, b in zip(mine, theirs, strict=False)]
        lo, hi = band(rounds)
        if ratio > WORSE:
            verdict = "WORSE" if lo > 1.0 else "worse, within noise"
            worse += verdict == "WORSE"
        elif ratio < 1 / WORSE:
            verdict = "better"
        else:
            verdict = "same"
        a = anchor_of(fig, tree.label, results)
        if a is not None:
            verdict += f" (tree {m / a:.2f}x {fig.anchor})"
        ok = met(fig.key, m, {fig.anchor: a} if fig.anchor and a is not None else {})
        if ok is not None:
            verdict += f"; goal {fig.goal}: {'met' if ok else 'NOT met'}"
        floor = floor_note(fig.key, results, tree.label)
        if floor:
            verdict += f" ({floor})"
        print(f"{fig.what:52} {fig.unit:6} {fmt(m, fig.unit):>9} {fmt(t, fig.unit):>9} "
              f"{ratio:6.2f} {lo:5.2f}–{hi:<5.2f}  {verdict}")  # fmt: skip
    for key, what in ANCHORS.items():
        per = results.get(key, {})
        for side, values in per.items():
            unit = next((f.unit for f in FIGURES if f.anchor == key), "")
            print(f"  anchor {what} [{side}]: {fmt(statistics.median(values), unit)} {unit}")
    for side in (tree, ref):
        for group, why in side.broken.items():
            print(f"  {side.label} cannot run {group}: {why[:200]}")
    return 1 if worse else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ref", nargs="?", help=f"git ref (default: {DEFAULT_REF_FILE.name})")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (>= 5)")
    ap.add_argument(
        "--skip", default="", help="groups to leave out: process,prepare,webhook,daemons,fleet"
    )
    ap.add_argument(
        "--tree",
        default=None,
        help="measure this git ref in place of the working tree (e.g. HEAD while editing)",
    )
    args = ap.parse_args()
    if args.rounds < 5:
        ap.error("--rounds must be at least 5 (a median of fewer says little)")
    ref = args.ref or default_ref()
    skip = {s for s in args.skip.split(",") if s}
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    with contextlib.ExitStack() as stack:
        theirs = stack.enter_context(ref_side(ref))
        tree = Side("tree")
        if args.tree:
            tree = stack.enter_context(ref_side(args.tree))
            tree.label = f"{tree.label}*"  # never equal to the ref's label
        print(f"{started}: working tree vs {ref} ({theirs.label}), {args.rounds} rounds",
              file=sys.stderr)  # fmt: skip
        results = measure([tree, theirs], args.rounds, skip)
        return report(tree, theirs, results)


if __name__ == "__main__":
    sys.exit(main())
