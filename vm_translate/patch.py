"""JSONPatch (RFC 6902) values, JSON Pointer (RFC 6901) escaping, and a small applier.

Resource names contain ``/`` (``devices.kubevirt.io/10de_1eb8``), so a key in a pointer is
escaped — ``~`` → ``~0`` first, then ``/`` → ``~1``::

    pointer("spec", "containers", 0, "resources", "limits", "devices.kubevirt.io/10de_1eb8")
    == "/spec/containers/0/resources/limits/devices.kubevirt.io~110de_1eb8"

:func:`apply_patch` implements ``add``, ``replace``, ``remove`` and ``test`` so the translator
derives its mutated object FROM its patch: the two can never disagree.
"""

from __future__ import annotations

import copy
from typing import Any, Literal, NotRequired, TypedDict

from vm_translate.errors import PatchError


class JsonPatchOp(TypedDict):
    """One RFC 6902 operation, e.g. ``{"op": "add", "path": "/a~1b", "value": "1"}``."""

    op: Literal["add", "replace", "remove", "test"]
    path: str
    value: NotRequired[Any]


def escape(token: str | int) -> str:
    if not isinstance(token, str):
        return str(token)
    if "~" not in token and "/" not in token:  # the usual key: nothing to escape
        return token
    return token.replace("~", "~0").replace("/", "~1")


def unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def pointer(*tokens: str | int) -> str:
    return "".join(["/" + escape(t) for t in tokens])


def split_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"pointer {path!r} must start with '/'")
    return [unescape(t) for t in path[1:].split("/")]


def apply_patch(doc: Any, ops: list[JsonPatchOp]) -> Any:
    """A deep copy of ``doc`` with ``ops`` applied in order; raise :class:`PatchError`."""
    result = copy.deepcopy(doc)
    for op in ops:
        tokens = split_pointer(op["path"])
        if not tokens:
            if op["op"] in ("add", "replace"):
                result = copy.deepcopy(op["value"])
                continue
            raise PatchError(f"cannot {op['op']} the whole document")
        parent = result
        for t in tokens[:-1]:
            parent = _child(parent, t, op["path"])
        last = tokens[-1]
        kind = op["op"]
        if isinstance(parent, dict):
            if kind in ("replace", "remove", "test") and last not in parent:
                raise PatchError(f"{kind} {op['path']}: no member {last!r}")
            if kind in ("add", "replace"):
                parent[last] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[last]
            elif parent[last] != op["value"]:
                raise PatchError(f"test {op['path']}: {parent[last]!r} != {op['value']!r}")
        elif isinstance(parent, list):
            if kind == "add" and last == "-":
                parent.append(copy.deepcopy(op["value"]))
                continue
            idx = _index(last, len(parent) + (1 if kind == "add" else 0), op["path"])
            if kind == "add":
                parent.insert(idx, copy.deepcopy(op["value"]))
            elif kind == "replace":
                parent[idx] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del parent[idx]
            elif parent[idx] != op["value"]:
                raise PatchError(f"test {op['path']}: {parent[idx]!r} != {op['value']!r}")
        else:
            raise PatchError(f"{kind} {op['path']}: parent is not an object or array")
    return result


def _child(node: Any, token: str, path: str) -> Any:
    if isinstance(node, dict):
        if token not in node:
            raise PatchError(f"{path}: no member {token!r}")
        return node[token]
    if isinstance(node, list):
        return node[_index(token, len(node), path)]
    raise PatchError(f"{path}: cannot descend into {type(node).__name__}")


def _index(token: str, size: int, path: str) -> int:
    if not token.isdigit() or (token.startswith("0") and token != "0"):
        raise PatchError(f"{path}: {token!r} is not an array index")
    idx = int(token)
    if idx >= size:
        raise PatchError(f"{path}: index {idx} out of range")
    return idx
