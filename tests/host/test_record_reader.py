"""One reader for the record files of every host store (issue 33: the reader was written
three times): :meth:`vfio_dp.host.records.RecordFiles.load` reads ``<root>/<dir>/<name>.json``
inside the root, never blocking, caps its size, decodes the JSON and hands it to the store's
own parser; whatever goes wrong is a :class:`CorruptRecordError` naming the file, why, and the
store's fix. The bind records and journals (:mod:`vfio_dp.host.state`), the SR-IOV ones
(:mod:`vfio_dp.host.sriov_store`) and the mdev ones (:mod:`vfio_dp.host.mdev_store`) all go
through it, so they answer the same bad file the same way.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from vfio_dp.errors import CorruptRecordError
from vfio_dp.host.mdev_store import MdevStore
from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root
from vfio_dp.host.sriov_store import SriovStore
from vfio_dp.host.state import StateStore
from vfio_dp.model.address import PciAddress

REPO = Path(__file__).resolve().parents[2]
PF = PciAddress.parse("0000:af:00.0")
UUID = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
MDEV = {"uuid": UUID, "parent": "mtty", "type_id": "mtty-2", "by": "operator"}
SRIOV = {"address": str(PF), "before": 0, "autoprobe_before": 1, "count": 2, "by": "operator"}
ORIGINAL = {
    "address": "0000:3b:00.0",
    "driver": "e1000e",
    "driver_override": None,
    "vendor": "8086",
    "device": "10d3",
    "bound_by": "operator",
}


def write(root: Path, parts: tuple[str, ...], name: str, data: bytes) -> Path:
    path = root.joinpath(*parts, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def parse_point(data: object) -> tuple[int, int]:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    return int(data["x"]), int(data["y"])


def test_load_reads_parses_and_says_absent(tmp_path: Path) -> None:
    files = RecordFiles(Root(tmp_path), 100)
    parts = (*STATE_DIR, "points")
    assert files.load(parts, "a.json", "fix it", parse_point) is None  # no directory yet
    write(tmp_path, parts, "a.json", b'{"x": 1, "y": 2}')
    assert files.load(parts, "a.json", "fix it", parse_point) == (1, 2)
    assert files.load(parts, "b.json", "fix it", parse_point) is None


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"{" + b" " * 200 + b"}", "larger than 100 bytes"),
        (b"not json", "Expecting value"),
        (b"[1, 2]", "not a JSON object"),
        (b'{"x": 1}', "missing field 'y'"),  # a bare KeyError's text is only the key
    ],
)
def test_load_names_the_file_why_and_the_fix(tmp_path: Path, data: bytes, why: str) -> None:
    files = RecordFiles(Root(tmp_path), 100)
    parts = (*STATE_DIR, "points")
    path = write(tmp_path, parts, "a.json", data)
    with pytest.raises(CorruptRecordError) as e:
        files.load(parts, "a.json", "remove it by hand", parse_point)
    assert str(path) in str(e.value) and why in str(e.value)
    assert "remove it by hand" in str(e.value)
    assert path.read_bytes() == data  # kept as it was


def test_load_never_opens_a_fifo(tmp_path: Path) -> None:
    files = RecordFiles(Root(tmp_path), 100)
    parts = (*STATE_DIR, "points")
    (tmp_path / "var/lib/vfio_dp/points").mkdir(parents=True)
    os.mkfifo(tmp_path / "var/lib/vfio_dp/points/a.json")  # opened blocking, this would hang
    with pytest.raises(CorruptRecordError, match=r"not a regular file|FIFO|fifo"):
        files.load(parts, "a.json", "remove it", parse_point)


def test_load_all_keys_records_and_problems(tmp_path: Path) -> None:
    files = RecordFiles(Root(tmp_path), 100)
    parts = (*STATE_DIR, "points")
    write(tmp_path, parts, "1.json", b'{"x": 1, "y": 1}')
    write(tmp_path, parts, "2.json", b"{broken")
    write(tmp_path, parts, ".3.json.tmp", b"{}")  # a write's temp file: not a record
    write(tmp_path, parts, "four.json", b"{}")  # not a key: not a record
    write(tmp_path, parts, "notes.txt", b"")
    assert files.keys(parts, int) == [1, 2]
    records, problems = files.load_all(parts, int, parse_point, lambda k: f"remove {k}.json")
    assert records == [(1, 1)]
    assert len(problems) == 1 and "2.json" in problems[0] and "remove 2.json" in problems[0]


#: (the file under the root, its good content, the store's cap, read it back)
STORES: dict[str, tuple[tuple[str, ...], dict[str, object], int, Callable[[Root], object]]] = {
    "bind record": (
        (*STATE_DIR, "original", "0000:3b:00.0.json"),
        ORIGINAL,
        1 << 20,
        lambda r: StateStore(r).get(PciAddress.parse("0000:3b:00.0")),
    ),
    "SR-IOV record": (
        (*STATE_DIR, "sriov", f"{PF}.json"),
        SRIOV,
        1 << 16,
        lambda r: SriovStore(r).get(PF),
    ),
    "SR-IOV journal": (
        (*STATE_DIR, "sriov", "ops", f"{PF}.json"),
        {
            "pf": str(PF),
            "owner": "operator",
            "pid": 1,
            "started": 1.0,
            "from_count": 0,
            "from_autoprobe": 1,
            "previous": None,
        },
        1 << 16,
        lambda r: SriovStore(r).op(PF),
    ),
    "mdev record": (
        (*STATE_DIR, "mdev", f"{UUID}.json"),
        MDEV,
        1 << 16,
        lambda r: MdevStore(r).get(UUID),
    ),
    "mdev journal": (
        (*STATE_DIR, "mdev", "ops", f"{UUID}.json"),
        {
            "action": "create",
            "uuid": UUID,
            "parent": "mtty",
            "type_id": "mtty-2",
            "owner": "operator",
            "pid": 1,
            "started": 1.0,
            "previous": None,
            "record": MDEV,
        },
        1 << 16,
        lambda r: MdevStore(r).op(UUID),
    ),
}


@pytest.mark.parametrize("kind", list(STORES))
def test_every_store_reads_its_record_and_refuses_one_over_its_cap(
    tmp_path: Path, kind: str
) -> None:
    """The same file answered the same way by every store: a good one is read; one over the
    store's cap -- even valid JSON padded with spaces -- is refused, named, with the cap, and
    kept (the SR-IOV journal was cut at the cap and parsed, the others said "too large" or
    "larger than 1 MB")."""
    parts, good, cap, read = STORES[kind]
    path = write(tmp_path, parts[:-1], parts[-1], json.dumps(good).encode())
    assert read(Root(tmp_path)) is not None
    big = json.dumps(good).encode() + b" " * cap
    path.write_bytes(big)
    with pytest.raises(CorruptRecordError) as e:
        read(Root(tmp_path))
    assert str(path) in str(e.value) and f"larger than {cap} bytes" in str(e.value)
    assert path.read_bytes() == big


def test_the_stores_decode_no_json_of_their_own() -> None:
    """The three stores read through :meth:`RecordFiles.load` / ``load_all``: none calls
    ``json.loads`` or ``RecordFiles.read`` itself (a second copy of the reader)."""
    wrong = []
    for mod in ("state", "sriov_store", "mdev_store"):
        path = REPO / "vfio_dp" / "host" / f"{mod}.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and (
                    node.func.attr == "loads"
                    or (node.func.attr == "read" and ast.unparse(node.func.value) == "self.files")
                )
            ):
                wrong.append(f"vfio_dp/host/{mod}.py:{node.lineno} {ast.unparse(node.func)}")
    assert wrong == [], "read records with RecordFiles.load:\n" + "\n".join(wrong)
