"""The atomic writer: whole content or old content, no temp files left, directory created."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from vfio_dp.host.atomic import remove_durably, write_atomic


def test_write_replace_remove(tmp_path: Path) -> None:
    p = tmp_path / "a" / "b" / "f.json"
    write_atomic(str(p), "one")
    write_atomic(str(p), b"two", mode=0o600)
    assert p.read_text() == "two" and (p.stat().st_mode & 0o777) == 0o600
    assert os.listdir(p.parent) == ["f.json"]
    assert remove_durably(str(p)) is True and remove_durably(str(p)) is False


def test_failed_write_keeps_old_content_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsync failing (EIO from a dying disk) after the temp file was written."""
    p = tmp_path / "f"
    write_atomic(str(p), "old")

    def eio(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", eio)
    with pytest.raises(OSError, match="Input/output"):
        write_atomic(str(p), "new")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["f"]


def test_refuses_to_write_through_a_planted_temp_symlink(tmp_path: Path) -> None:
    """A symlink planted at the temp name is not followed (O_NOFOLLOW)."""
    victim = tmp_path / "victim"
    victim.write_text("keep")
    p = tmp_path / "f"
    import threading

    (tmp_path / f"f.tmp.{os.getpid()}.{threading.get_ident()}").symlink_to(victim)
    with pytest.raises(OSError):
        write_atomic(str(p), "x")
    assert victim.read_text() == "keep"
