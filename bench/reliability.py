"""The reliability report: every hostile input tried, fault injected and load held, in one table.

Runs each ``bench/reliability_<area>.py`` present beside this file (webhook, daemon, bind, ...),
each of which exposes ``rows(quick: bool) -> list[dict]`` with the keys of :data:`COLUMNS`, and
prints one table (Markdown, so the README can carry it as printed). A script that fails is a row
that says so (and makes the exit status 1), never a silently shorter table.

    python3 bench/reliability.py [--quick] [--only webhook,daemon] [--json]

Exit status: 0 when every row answered correctly and left no device without a driver.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import sys
import time
import traceback
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
COLUMNS = (
    "area",
    "case",
    "fault_or_load",
    "answered_correctly",
    "devices_without_driver",
    "rss_peak_mb",
    "note",
)
HEADERS = (
    "area",
    "case",
    "fault / load",
    "answered correctly",
    "devices left without a driver",
    "RSS peak (MB)",
    "note",
)


def _load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # dataclasses look their module up here
    sys.path.insert(0, str(HERE.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(HERE.parent))
    return module


def _rows_of(path: Path, quick: bool) -> list[dict[str, object]]:
    module = _load(path)
    rows = module.rows
    if "quick" in inspect.signature(rows).parameters:
        return list(rows(quick=quick))
    return list(rows())


def _cell(value: object) -> str:
    if value is True:
        return "yes"
    if value is False:
        return "**NO**"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def failed(row: dict[str, object]) -> bool:
    """A row fails when it was not answered correctly or left a device without a driver."""
    if row.get("answered_correctly") is False:
        return True
    stranded = row.get("devices_without_driver")
    return isinstance(stranded, int) and stranded != 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller loads (minutes, not tens)")
    ap.add_argument("--only", default="", help="comma-separated areas, e.g. webhook,daemon")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    only = {a for a in args.only.split(",") if a}
    scripts = sorted(HERE.glob("reliability_*.py"))
    if only:
        scripts = [s for s in scripts if s.stem.removeprefix("reliability_") in only]
    all_rows: list[dict[str, object]] = []
    for script in scripts:
        area = script.stem.removeprefix("reliability_")
        t0 = time.monotonic()
        try:
            rows = _rows_of(script, args.quick)
        except Exception as e:  # a broken area is a failed row, not a shorter table
            traceback.print_exc()
            rows = [
                {
                    "area": area,
                    "case": f"{script.name} did not run",
                    "fault_or_load": "-",
                    "answered_correctly": False,
                    "devices_without_driver": "n/a",
                    "rss_peak_mb": "n/a",
                    "note": f"{type(e).__name__}: {e}"[:200],
                }
            ]
        print(
            f"# {script.name}: {len(rows)} rows in {time.monotonic() - t0:.1f} s", file=sys.stderr
        )
        all_rows.extend(rows)
    if args.json:
        print(json.dumps(all_rows, indent=2, default=str))
    else:
        print("| " + " | ".join(HEADERS) + " |")
        print("|" + "---|" * len(HEADERS))
        for row in all_rows:
            print("| " + " | ".join(_cell(row.get(c, "")) for c in COLUMNS) + " |")
    bad = [r for r in all_rows if failed(r)]
    print(
        f"{len(all_rows)} rows, {len(bad)} failed"
        + (": " + "; ".join(f"{r.get('area')}/{r.get('case')}" for r in bad) if bad else ""),
        file=sys.stderr,
    )
    return 1 if bad or not all_rows else 0


if __name__ == "__main__":
    sys.exit(main())
