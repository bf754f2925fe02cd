"""How deep parsed JSON nests: the one bound on nesting for every JSON we are handed.

The webhook's AdmissionReview bodies (:mod:`vm_translate.review`) and the DRA device-metadata
files ``vfioctl hostdev --dra-metadata-dir`` reads (:mod:`vfio_dp.model.dra_metadata`) are
refused with a clear error past their limit; ``json`` itself raises ``RecursionError`` on
input nested a few thousand levels deep, which both callers turn into that same error::

    [[[[...]]]]   →  "nested more than 200 levels deep"
"""

from __future__ import annotations


def nesting_depth(value: object, limit: int) -> int:
    """Levels of arrays/objects in parsed JSON (a scalar is 0), counted without recursion;
    stops counting past ``limit`` (returns ``limit + 1``). Only containers are visited: a
    scalar member costs one type check (this runs on every admission review)."""
    if not isinstance(value, (dict, list)):
        return 0
    deepest = 0
    stack: list[tuple[dict[object, object] | list[object], int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        v, d = pop()
        if d > deepest:
            if d > limit:
                return limit + 1
            deepest = d
        for c in v.values() if isinstance(v, dict) else v:
            if isinstance(c, (dict, list)):
                push((c, d + 1))
    return deepest
