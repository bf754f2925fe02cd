"""Rewrite the field tables of docs/configuration.md from the fields' one declaration.

    python scripts/config_docs.py          # rewrite the tables in place
    python scripts/config_docs.py --check  # exit 1 when the docs differ (what the test checks)

Each table sits between ``<!-- fields: NAME -->`` and ``<!-- end fields: NAME -->``, NAME being
``Config`` or ``Selector`` (:mod:`vfio_dp.model.config_fields` says how to add a field).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from vfio_dp.model.config import Config, Selector
from vfio_dp.model.config_fields import markdown_table, yaml_fields
from vfio_dp.model.mdev_config import MdevEntry

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
TABLES = {"Config": Config, "Selector": Selector, "MdevEntry": MdevEntry}


def rendered(text: str) -> str:
    """``text`` with each marked table replaced by the one the declaration gives."""
    for name, cls in TABLES.items():
        block = re.compile(
            rf"(<!-- fields: {name} -->\n).*?(<!-- end fields: {name} -->)", re.DOTALL
        )
        if not block.search(text):
            raise SystemExit(f"{DOC}: no <!-- fields: {name} --> ... <!-- end fields: {name} -->")
        table = markdown_table(yaml_fields(cls))
        text = block.sub(lambda m, t=table: m.group(1) + t + m.group(2), text)
    return text


def main(argv: list[str]) -> int:
    text = DOC.read_text(encoding="utf-8")
    new = rendered(text)
    if "--check" in argv:
        return 0 if new == text else 1
    if new != text:
        DOC.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
