"""One writer per record kind, as a fact (issue 33, item 5): read off the code's syntax trees.

- The low-level atomic writers of :mod:`vfio_dp.host.atomic` that state files go through
  (``replace_at``, ``remove_at``) are used by :mod:`vfio_dp.host.records` alone; the
  path-based ones are for the files a claim or a resource leaves outside the state
  directory (CDI specs, device metadata), each used only by its module.
- Record files are read only through :meth:`vfio_dp.host.records.RecordFiles.read`.
- :class:`vfio_dp.host.records.RecordFiles` is made only by the one store of each record kind
  (``docs/architecture.md``, "What is written where").
- Bind records and journals are written only by :class:`vfio_dp.host.ledger.Ledger`: no
  other module calls a :class:`~vfio_dp.host.state.StateStore` writer (``put``, ``remove``,
  ``begin``, ``save``, ``step``, ``finish``).
- The DRA checkpoint is parsed in one place (:mod:`vfio_dp.dra.claimpath.checkpoint`).

A second writer makes one of these tests fail, naming the module and the line.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: who may use each writer of vfio_dp.host.atomic
ATOMIC_USERS = {
    "replace_at": {"vfio_dp.host.records"},
    "remove_at": {"vfio_dp.host.records"},
    "write_atomic": {
        "vfio_dp.deviceplugin.cdi",
        "vfio_dp.dra.claimpath.cdi",
        "vfio_dp.dra.claimpath.metadata",
    },
    "remove_durably": {"vfio_dp.deviceplugin.cdi", "vfio_dp.dra.claimpath.cdi"},
    "remove_tree_durably": {"vfio_dp.dra.claimpath.metadata"},
}

#: the one store of each kind of record under <root>/var/lib/vfio_dp
STORES = {
    "vfio_dp.host.state": "bind records original/<bdf>.json and journals ops/<id>.json",
    "vfio_dp.host.sriov_store": "SR-IOV records sriov/<pf>.json and journals sriov/ops/<pf>.json",
    "vfio_dp.host.mdev_store": "mdev records mdev/<uuid>.json and journals mdev/ops/<uuid>.json",
    "vfio_dp.host.persist": "persistent binds persist.json (and its udev rule)",
    "vfio_dp.dra.claimpath.checkpoint": "the DRA checkpoint dra-<driver>.checkpoint.json",
    "vfio_dp.deviceplugin.allocation_store": "the device plugin's allocations.json",
    "vfio_dp.host.devnodes": "device nodes on the native driver devnodes/<bdf>.json",
    "vfio_dp.dra.observers.api_fields": "what the API server keeps dra-<driver>.api.json",
}

STATE_WRITERS = {"put", "remove", "begin", "save", "step", "finish"}


def modules() -> Iterator[tuple[str, ast.Module]]:
    """(dotted name, syntax tree) of every module of the node side and the CLI."""
    for top in ("vfio_dp", "cli", "vm_translate"):
        for path in sorted((REPO / top).rglob("*.py")):
            if "_pb" in path.parts:
                continue
            rel = path.relative_to(REPO).with_suffix("")
            name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            yield name, ast.parse(path.read_text(), str(path))


def names_used(tree: ast.Module, wanted: set[str]) -> Iterator[tuple[str, int]]:
    """Each ``wanted`` name imported (``from m import x``) or reached as an attribute
    (``atomic.x``), with its line."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in wanted:
                    yield alias.name, node.lineno
        elif isinstance(node, ast.Attribute) and node.attr in wanted:
            yield node.attr, node.lineno


def test_the_atomic_writers_are_used_only_by_their_owners() -> None:
    wrong = [
        f"{mod}:{line} uses vfio_dp.host.atomic.{name} (only {sorted(ATOMIC_USERS[name])} may)"
        for mod, tree in modules()
        if mod != "vfio_dp.host.atomic"
        for name, line in names_used(tree, set(ATOMIC_USERS))
        if mod not in ATOMIC_USERS[name]
    ]
    assert wrong == [], "\n".join(wrong)


def test_record_files_are_read_only_through_record_files() -> None:
    """The non-blocking reader of state files: ``RecordFiles.read`` wraps it; every other
    module reads its records through that (a FIFO, a directory or a link is never opened
    blocking nor followed)."""
    wrong = [
        f"{mod}:{line} reads with vfio_dp.host.files.read_regular past RecordFiles.read"
        for mod, tree in modules()
        if mod not in ("vfio_dp.host.files", "vfio_dp.host.records")
        for _, line in names_used(tree, {"read_regular"})
    ]
    assert wrong == [], "\n".join(wrong)


def test_each_record_kind_has_one_store() -> None:
    wrong = [
        f"{mod}:{line} makes a RecordFiles: records are written by their store ({STORES})"
        for mod, tree in modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name | ast.Attribute)
        and (node.func.id if isinstance(node.func, ast.Name) else node.func.attr) == "RecordFiles"
        and mod not in STORES
        for line in [node.lineno]
    ]
    assert wrong == [], "\n".join(wrong)


def test_bind_records_and_journals_are_written_only_by_the_ledger() -> None:
    """``<x>.state.put(...)``, ``state.remove(...)``: a StateStore writer called past the
    Ledger (``host.state`` is the store; ``host.ledger`` the one writer)."""

    def receiver_is_state(node: ast.expr) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "state") or (
            isinstance(node, ast.Name) and node.id == "state"
        )

    wrong = [
        f"{mod}:{node.lineno} calls StateStore.{node.func.attr} past the Ledger"
        for mod, tree in modules()
        if mod not in ("vfio_dp.host.ledger", "vfio_dp.host.state")
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in STATE_WRITERS
        and receiver_is_state(node.func.value)
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_checkpoint_is_parsed_in_one_place() -> None:
    """Its readers (the holds of SR-IOV changes, ``vfioctl list``) go through the
    checkpoint module's reader: none of them parses JSON of its own."""
    readers = {"vfio_dp.dra.claimpath.holds"}
    wrong = [
        f"{mod}:{node.lineno} parses JSON itself; read the checkpoint with "
        "vfio_dp.dra.claimpath.checkpoint.read_only"
        for mod, tree in modules()
        if mod in readers
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        and "json" in {a.name for a in node.names} | {getattr(node, "module", None)}
    ]
    assert wrong == [], "\n".join(wrong)
