"""The one atomic writer (vfio_dp.host.atomic) on a real temp directory."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from vfio_dp.host.atomic import write_atomic


def test_writes_creates_the_directory_and_replaces_whole(tmp_path: Path) -> None:
    target = tmp_path / "var/lib/vfio_dp/rec.json"
    write_atomic(str(target), b'{"a": 1}')
    assert target.read_bytes() == b'{"a": 1}'
    write_atomic(str(target), b"{}")
    assert target.read_bytes() == b"{}"
    assert os.listdir(target.parent) == ["rec.json"]  # no temp file left behind


def test_a_failed_replace_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    (tmp_path / "busy").mkdir()  # a directory where the file should go: rename fails
    (tmp_path / "busy" / "x").write_text("")
    with pytest.raises(OSError):
        write_atomic(str(tmp_path / "busy"), b"new")
    assert sorted(os.listdir(tmp_path)) == ["busy"]
    assert os.listdir(tmp_path / "busy") == ["x"]


def test_never_writes_through_a_planted_temp_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    tmp = f".rec.json.{os.getpid()}.{threading.get_ident()}.tmp"
    os.symlink(victim, tmp_path / tmp)
    with pytest.raises(FileExistsError):
        write_atomic(str(tmp_path / "rec.json"), b"data")
    assert victim.read_text() == "keep" and not (tmp_path / "rec.json").exists()
