"""DirWatch: one stat of a directory stands for checking its entries, only when trustworthy."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from vfio_dp.core import sockets
from vfio_dp.core.sockets import DirWatch


def test_a_change_to_the_entries_is_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sockets, "SETTLE_SECONDS", 0.05)
    (tmp_path / "kubelet.sock").touch()
    w = DirWatch(str(tmp_path))
    assert not w.unchanged()  # nothing recorded yet: check in full
    time.sleep(0.1)
    w.settled(w.look())
    assert w.unchanged()
    (tmp_path / "a.sock").touch()  # added
    assert not w.unchanged()
    w.settled(w.look())  # the change is too recent to trust its timestamp
    assert not w.unchanged()
    time.sleep(0.1)
    w.settled(w.look())
    assert w.unchanged()
    os.rename(tmp_path / "a.sock", tmp_path / "b.sock")  # renamed
    assert not w.unchanged()
    time.sleep(0.1)
    w.settled(w.look())
    os.unlink(tmp_path / "b.sock")  # removed
    assert not w.unchanged()


def test_a_fresh_change_is_never_trusted(tmp_path: Path) -> None:
    # the default settle time: a directory changed just now is checked in full every time
    (tmp_path / "x").touch()
    w = DirWatch(str(tmp_path))
    w.settled(w.look())
    assert not w.unchanged()


def test_a_missing_directory_and_forget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sockets, "SETTLE_SECONDS", 0.0)
    w = DirWatch(str(tmp_path / "absent"))
    w.settled(w.look())
    assert not w.unchanged()
    w = DirWatch(str(tmp_path))
    w.settled(w.look())
    assert w.unchanged()
    w.forget()
    assert not w.unchanged()
