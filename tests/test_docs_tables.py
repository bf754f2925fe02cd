"""Every Markdown table of the README and docs/ renders as a table (issue 38.4: a blank line
inside dra.md's "Device plugin or DRA?" table turned its last row into a paragraph): a
block of ``|`` lines starts with a header and a separator row, every row has the header's
number of cells, and no ``|`` row stands alone after a blank line below a table."""

from __future__ import annotations

import re

import pytest

from tests.docs_pages import PAGES, Page

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+$")


def _cells(line: str) -> int:
    """Cells of a row: ``|`` outside code spans and not escaped (``\\|``)."""
    bare = re.sub(r"`[^`]*`", "", line.strip())
    return len(re.findall(r"(?<!\\)\|", bare)) - 1


def _tables(text: str) -> list[tuple[int, list[str]]]:
    lines = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text).splitlines()
    out: list[tuple[int, list[str]]] = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|"):
            j = i
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append((i + 1, lines[i:j]))
            i = j
        else:
            i += 1
    return out


@pytest.mark.parametrize("doc", PAGES, ids=[p.name for p in PAGES])
def test_every_table_is_whole(doc: Page) -> None:
    problems = []
    for line_no, rows in _tables(doc.text):
        if len(rows) < 2 or not _SEPARATOR.match(rows[1].strip()):
            problems.append(f"line {line_no}: no header and separator row: {rows[0][:60]!r}")
            continue
        want = _cells(rows[0])
        for k, row in enumerate(rows[2:], start=line_no + 2):
            if _cells(row) != want:
                problems.append(f"line {k}: {_cells(row)} cells, the header has {want}")
    assert problems == [], f"{doc.name}: " + "; ".join(problems)
