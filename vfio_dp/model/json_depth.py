"""How deep parsed JSON nests: the one bound on nesting for every JSON we are handed.

The webhook's AdmissionReview bodies (:mod:`vm_translate.review`) and the DRA device-metadata
files ``vfioctl hostdev --dra-metadata-dir`` reads (:mod:`vfio_dp.model.dra_metadata`) are
refused with a clear error past their limit; ``json`` itself raises ``RecursionError`` on
input nested a few thousand levels deep, which both callers turn into that same error::

    [[[[...]]]]   →  "nested more than 200 levels deep"
"""

from __future__ import annotations

from collections.abc import Iterable


def nesting_depth(value: object, limit: int) -> int:
    """Levels of arrays/objects in parsed JSON (a scalar is 0), counted without recursion;
    stops counting past ``limit`` (returns ``limit + 1``)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            children: Iterable[object] = v.values()
        elif isinstance(v, list):
            children = v
        else:
            continue
        d += 1
        if d > limit:
            return limit + 1
        deepest = max(deepest, d)
        stack.extend((c, d) for c in children if isinstance(c, (dict, list)))
    return deepest
