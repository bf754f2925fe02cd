"""The documentation pages as the README tests read them: ``README.md`` and ``docs/*.md``.

A :class:`Page` gives its fenced blocks by language, its code (inline spans and fenced lines,
comments cut), its relative links and its headings' anchors as GitHub computes them (lowercase;
everything but letters, digits, ``_``, ``-`` and spaces dropped; spaces to ``-``; a repeated
anchor gets ``-1``, ``-2``, ...). Headings inside fenced blocks are not headings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: an inline code span; it may wrap onto the next line, never across a blank line
_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\s*\n))+)`")


@dataclass(frozen=True)
class Page:
    path: Path
    text: str = field(repr=False)

    @property
    def name(self) -> str:
        return self.path.relative_to(REPO).as_posix()

    def blocks(self, lang: str) -> list[str]:
        return [body for lng, body in _FENCE.findall(self.text) if lng == lang]

    def prose(self) -> str:
        """The text with its fenced blocks cut out."""
        return _FENCE.sub("", self.text)

    def code(self) -> list[str]:
        """Inline code spans and lines of fenced blocks (`` # `` comments cut)."""
        spans = [" ".join(s.split()) for s in re.findall(_SPAN, self.prose())]
        lines = [ln.split(" # ")[0] for _, b in _FENCE.findall(self.text) for ln in b.splitlines()]
        return spans + lines


@cache
def page(path: Path) -> Page:
    return Page(path.resolve(), path.read_text())


README = page(REPO / "README.md")
DOCS = [page(p) for p in sorted((REPO / "docs").glob("*.md"))]
PAGES = [README, *DOCS]


def links(doc: Page) -> list[str]:
    """Targets of the Markdown links ``[text](target)`` outside code."""
    prose = _SPAN.sub("", doc.prose())
    return re.findall(r"\]\(([^)\s]+)\)", prose)


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(doc: Page) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for m in re.finditer(r"(?m)^#{1,6} (.+?)\s*#*$", doc.prose()):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out
