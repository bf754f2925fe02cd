"""The one atomic writer and the one durable remove (vfio_dp.host.atomic) on a real temp
directory; strace (a real tracer, no test hook) shows the order of the system calls."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vfio_dp.host.atomic import remove_durably, remove_tree_durably, write_atomic


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


# -- the one durable remove ----------------------------------------------------------------
def test_remove_durably_removes_what_is_there_and_reports_it(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("")
    (tmp_path / "keep").write_text("")
    assert remove_durably(str(tmp_path), "a", "b") == ["a"]
    assert os.listdir(tmp_path) == ["keep"]
    assert remove_durably(str(tmp_path / "missing"), "a") == []


def test_remove_durably_unlinks_a_link_never_its_target(tmp_path: Path) -> None:
    (tmp_path / "target").write_text("keep")
    os.symlink(tmp_path / "target", tmp_path / "link")
    assert remove_durably(str(tmp_path), "link") == ["link"]
    assert (tmp_path / "target").read_text() == "keep"


def test_remove_tree_durably_takes_a_tree_and_never_follows_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    top = tmp_path / "claims" / "uid-1"
    (top / "nic").mkdir(parents=True)
    (top / "nic" / "m.json").write_text("{}")
    os.symlink(outside, top / "escape")
    os.symlink(outside, top / "nic" / "escape-dir")
    assert remove_tree_durably(str(top)) is True
    assert os.listdir(tmp_path / "claims") == []
    assert (outside / "precious").read_text() == "keep"
    assert remove_tree_durably(str(top)) is False
    os.symlink(outside, top)  # a link where the tree was: the link goes, not the target
    assert remove_tree_durably(str(top)) is True
    assert (outside / "precious").read_text() == "keep"


STRACE = shutil.which("strace")


def _traced(tmp_path: Path, code: str, *strace_args: str) -> tuple[int, list[str], str]:
    """Run ``code`` (with the repo importable) under strace; (exit code, trace lines, stderr)."""
    log = tmp_path / "trace"
    proc = subprocess.run(
        [STRACE or "strace", "-f", "-qq", "-o", str(log), *strace_args, sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).parents[2]),
    )
    return proc.returncode, log.read_text().splitlines(), proc.stderr


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
def test_remove_fsyncs_the_directory_after_the_unlink(tmp_path: Path) -> None:
    """The order that makes a removal survive a crash: unlink, then fsync of the directory."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "rec.json").write_text("")
    code = f"from vfio_dp.host.atomic import remove_durably; remove_durably({str(d)!r}, 'rec.json')"
    rc, lines, err = _traced(tmp_path, code, "-e", "trace=unlink,unlinkat,fsync")
    assert rc == 0, err
    calls = [ln.split("(")[0].split()[-1] for ln in lines if "rec.json" in ln or "fsync(" in ln]
    assert calls[-2:] == ["unlinkat", "fsync"], lines
    assert not (d / "rec.json").exists()


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
def test_a_failed_directory_fsync_is_raised_and_a_retry_syncs_again(tmp_path: Path) -> None:
    """fsync fails (EIO injected): the caller hears of it; the retry finds the name gone and
    still syncs the directory, so the earlier unlink becomes durable."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "rec.json").write_text("")
    code = f"from vfio_dp.host.atomic import remove_durably; remove_durably({str(d)!r}, 'rec.json')"
    rc, _, err = _traced(tmp_path, code, "-e", "trace=fsync", "-e", "inject=fsync:error=EIO")
    assert rc != 0 and "Input/output error" in err
    rc, lines, err = _traced(tmp_path, code, "-e", "trace=unlinkat,fsync")
    assert rc == 0, err
    gone = [i for i, ln in enumerate(lines) if "rec.json" in ln and "ENOENT" in ln]
    assert gone and any("fsync(" in ln for ln in lines[gone[-1] :]), lines


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
@pytest.mark.parametrize("durable", [True, False])
def test_the_write_order_durable_or_not(tmp_path: Path, durable: bool) -> None:
    """Durable: temp file written, fsync, rename, fsync of the directory. ``durable=False``
    (a DRA claim's CDI spec and metadata: rebuilt by every Prepare) is the same atomic
    replace without either fsync -- never seen torn, and no disk flush."""
    target = tmp_path / "d" / "rec.json"
    code = (
        "from vfio_dp.host.atomic import write_atomic; "
        f"write_atomic({str(target)!r}, b'{{}}', durable={durable})"
    )
    rc, lines, err = _traced(tmp_path, code, "-e", "trace=openat,write,renameat,fsync")
    assert rc == 0, err
    start = next(i for i, ln in enumerate(lines) if ".rec.json." in ln and "openat" in ln)
    calls = [ln.split("(")[0].split()[-1] for ln in lines[start:]]
    calls = [c for c in calls if c in ("write", "fsync", "renameat")][:4]
    if durable:
        assert calls == ["write", "fsync", "renameat", "fsync"], lines[start:]
    else:
        assert calls == ["write", "renameat"], lines[start:]
    assert target.read_bytes() == b"{}" and os.listdir(target.parent) == ["rec.json"]
