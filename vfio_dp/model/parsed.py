"""Reading a field of parsed JSON (an API object as ``json.loads`` returns it) that may be
absent at any level::

    dig({"metadata": {"name": "vm-1"}}, "metadata", "name")   → "vm-1"
    dig({"metadata": None}, "metadata", "name")               → None
"""

from __future__ import annotations

from typing import Any


def dig(obj: object, *keys: str) -> Any:
    """``obj[k1][k2]…``, or None where a level is missing or not an object."""
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj
