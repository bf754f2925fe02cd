"""DirWatcher (vfio_dp.host.inotify): woken by the kernel on a change, polling where inotify
cannot be had (a directory not there; no inotify instance: the kernel's EMFILE injected with
strace, no test hook) and watching again once it can."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vfio_dp.host.inotify import DirWatcher, config_dirs

STRACE = shutil.which("strace")


async def test_a_change_wakes_the_watcher_long_before_the_safety_look(tmp_path: Path) -> None:
    w = DirWatcher(lambda: [str(tmp_path)], poll=0.05, safety=60)
    try:
        await w.changed()  # sets the watches, returns at once (the first look)
        assert w.notified

        async def soon() -> None:
            await asyncio.sleep(0.05)
            (tmp_path / "kubelet.sock").write_text("")

        start = time.monotonic()
        await asyncio.gather(w.changed(), soon())
        assert time.monotonic() - start < 10  # the safety look is 60 s away
        # a change made while the caller looked wakes the next call at once
        (tmp_path / "kubelet.sock").unlink()
        await asyncio.sleep(0.05)
        start = time.monotonic()
        await w.changed()
        assert time.monotonic() - start < 10
        # nothing changes: the safety look (here 0.3 s), no busy loop in between
        w.safety = 0.3
        start = time.monotonic()
        await w.changed()
        assert 0.25 <= time.monotonic() - start < 10
    finally:
        w.close()


async def test_a_missing_directory_is_polled_until_it_is_there_then_watched(
    tmp_path: Path,
) -> None:
    d = tmp_path / "device-plugins"
    w = DirWatcher(lambda: [str(d)], poll=0.05, safety=60)
    try:
        await w.changed()
        assert not w.notified  # ENOENT: polling
        start = time.monotonic()
        await w.changed()
        assert time.monotonic() - start < 10  # the poll, not the safety look
        d.mkdir()
        await w.changed()  # the next look watches it
        assert w.notified
        d.rmdir()  # its watch ends with it (IN_IGNORED): polling again
        await w.changed()
        await w.changed()
        assert not w.notified
    finally:
        w.close()


def test_config_dirs_follow_a_configmap_symlink(tmp_path: Path) -> None:
    data = tmp_path / "..2026_11_27"
    data.mkdir()
    (data / "config.yaml").write_text("")
    (tmp_path / "..data").symlink_to(data.name)
    (tmp_path / "config.yaml").symlink_to("..data/config.yaml")
    assert config_dirs(str(tmp_path / "config.yaml")) == [str(tmp_path), str(data)]
    assert config_dirs(str(data / "config.yaml")) == [str(data)]
    assert config_dirs(None) == []


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
def test_without_an_inotify_instance_it_polls(tmp_path: Path) -> None:
    """``inotify_init1`` failing with EMFILE (fs.inotify.max_user_instances reached) leaves
    the watcher polling every ``poll`` seconds, and says so once."""
    code = (
        "import asyncio, logging, time\n"
        "logging.basicConfig(level='INFO', format='%(message)s')\n"
        "from vfio_dp.host.inotify import DirWatcher\n"
        "async def main():\n"
        f"    w = DirWatcher(lambda: [{str(tmp_path)!r}], poll=0.05, safety=60, label='test')\n"
        "    await w.changed()\n"
        "    start = time.monotonic()\n"
        "    for _ in range(3):\n"
        "        await w.changed()\n"
        "    print(w.notified, time.monotonic() - start < 10)\n"
        "    w.close()\n"
        "asyncio.run(main())\n"
    )
    proc = subprocess.run(
        [STRACE or "strace", "-f", "-qq", "-o", "/dev/null", "-e", "inject=inotify_init1:error=EMFILE",
         sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(__file__).parents[2]),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True"]
    assert proc.stderr.count("no inotify instance (Too many open files)") == 1, proc.stderr
