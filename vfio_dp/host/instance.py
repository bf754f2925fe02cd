"""One instance of each node process per node, and which of ours are running now.

Each long-running process of ours holds an exclusive ``flock`` on its own lock file for its
whole life, under the root (the DaemonSet's ``/host`` is the host, so a pod and a shell on
the node see the same file)::

    <root>/run/vfio_dp/instances/device-plugin.lock          vfioctl plugin
    <root>/run/vfio_dp/instances/dra-plugin.<driver>.lock    vfioctl dra-plugin --driver-name <driver>

(a directory of their own: ``run/vfio_dp/<address>.lock`` are the per-device bind locks, which
``unbind --all`` itself takes).

The file holds the holder's pid (for messages only: the lock, not the file, says who runs).
The kernel drops a ``flock`` when its process dies, SIGKILL included, so a crash leaves no
stale lock. A second instance waits a bounded time for the first to exit (logging the first
one's pid), then takes over or fails naming it.

``vfioctl unbind --all`` takes a SHARED lock on every lock file for as long as it runs: it
fails at once when any of ours holds one (a daemon with ``bind: true`` would bind the devices
again), and no process of ours can start until it is done.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from vfio_dp.errors import DriverNameError, InstanceLockError, InstanceRunningError
from vfio_dp.host.root import Root
from vfio_dp.model.naming import check_dra_driver_name

RUN_DIR = ("run", "vfio_dp", "instances")  # apart from the per-device bind locks
DEVICE_PLUGIN = "device-plugin"
SUFFIX = ".lock"


def lock_name(process: str, driver: str | None = None) -> str:
    """``device-plugin`` → ``device-plugin.lock``; the DRA plugin's is per driver name."""
    if process == DEVICE_PLUGIN:
        return DEVICE_PLUGIN + SUFFIX
    if driver is None:
        raise DriverNameError("None", "it is missing")
    return f"dra-plugin.{check_dra_driver_name(driver)}{SUFFIX}"


def _describe(name: str) -> str:
    if name == DEVICE_PLUGIN + SUFFIX:
        return "the device plugin (vfioctl plugin)"
    driver = name[len("dra-plugin.") : -len(SUFFIX)]
    return f"the DRA plugin for {driver} (vfioctl dra-plugin)"


def _open(root: Root, name: str) -> int:
    """The lock file ``<root>/run/vfio_dp/instances/<name>``, created when missing; opened
    ``O_NONBLOCK | O_NOFOLLOW`` and checked with ``fstat``, so a link, FIFO, directory or
    socket at its path (or a file where a directory should be) raises
    :class:`InstanceLockError` naming the path and the fix, never blocks or crashes."""
    path = root.path(*RUN_DIR, name)
    try:
        os.close(root.open_dir(*RUN_DIR, create=True))
        fd = root.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        raise _unusable(root, name, e) from e
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _unusable(root, name, None)
    return fd


def _unusable(root: Root, name: str | None, e: OSError | None) -> InstanceLockError:
    """What stands in the way of the lock file ``name`` (None: of the directory), and how to
    clear it: the first path on the way (``run``, ``run/vfio_dp``, ``instances``, the file)
    that is not what it must be. None of ours holds a lock on such a thing (we lock only
    regular files): removing it is safe."""
    parts = RUN_DIR if name is None else (*RUN_DIR, name)
    for i in range(1, len(parts) + 1):
        p = root.path(*parts[:i])
        want_dir = i <= len(RUN_DIR)
        try:  # a directory may be a link to one (inside the root: Root checks that)
            mode = (os.stat if want_dir else os.lstat)(p).st_mode
        except OSError:
            break
        if stat.S_ISDIR(mode) if want_dir else stat.S_ISREG(mode):
            continue
        kind = next((k for test, k in _KINDS if test(mode)), "not a regular file")
        need = "a directory" if want_dir else "a regular file"
        return InstanceLockError(
            p, f"it is {kind}, not {need}", f"remove it (rm -r {p}) and start again"
        )
    why = (e.strerror or str(e)) if e is not None else "not a regular file"
    return InstanceLockError(
        root.path(*parts), why, "check that directory (it must be writable) and retry"
    )


_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISREG, "a regular file"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


def _pid_in(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@dataclass
class InstanceLock:
    """The exclusive lock of one running process (hold it for the process's whole life)."""

    root: Root
    name: str
    fd: int | None = None

    def acquire(
        self,
        wait: float,
        on_wait: Callable[[int | None], None] = lambda pid: None,
        *,
        poll: float = 0.2,
    ) -> None:
        """Take the lock, waiting up to ``wait`` seconds for a running instance to exit
        (``on_wait(pid)`` once when it has to wait); raises :class:`InstanceRunningError`."""
        fd = _open(self.root, self.name)
        deadline = time.monotonic() + wait
        told = False
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                pid = _pid_in(fd)
                if not told:
                    on_wait(pid)
                    told = True
                if time.monotonic() >= deadline:
                    raise InstanceRunningError(
                        f"{_describe(self.name)} already runs on this node"
                        f"{f' (pid {pid})' if pid else ''}: it holds "
                        f"{self.root.path(*RUN_DIR, self.name)}; waited {wait:g} s for it to "
                        "exit. Run one per node (a DaemonSet with maxSurge 0), or stop the other"
                    )
                time.sleep(poll)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the flock
            self.fd = None


def lock_files(root: Root) -> list[str]:
    """Names of the process lock files present (a process of ours ran here since boot); the
    per-device ``<bdf>.lock`` files of :mod:`.state` share the directory and are not ours to
    hold here (a shared lock on one would block this very process's own bind steps)."""
    try:
        d = root.open_dir(*RUN_DIR)
    except FileNotFoundError:
        return []
    except OSError as e:  # a file where the directory should be: say so, never a traceback
        raise _unusable(root, None, e) from e
    try:
        return sorted(
            n
            for n in os.listdir(d)
            if n == DEVICE_PLUGIN + SUFFIX or (n.startswith("dra-plugin.") and n.endswith(SUFFIX))
        )
    finally:
        os.close(d)


@contextlib.contextmanager
def none_running(root: Root, why: str) -> Iterator[None]:
    """Hold a SHARED lock on every lock file while the body runs; raise
    :class:`InstanceRunningError` naming each process of ours that runs now."""
    held: list[int] = []
    running: list[str] = []
    try:
        for name in lock_files(root):
            fd = _open(root, name)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as e:
                if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                    os.close(fd)
                    raise
                pid = _pid_in(fd)
                running.append(f"{_describe(name)}{f' (pid {pid})' if pid else ''}")
                os.close(fd)
                continue
            held.append(fd)
        if running:
            raise InstanceRunningError(
                f"{why}: {', '.join(running)} runs on this node and would take the devices "
                "again; stop it first (docs/install.md, Uninstall: delete the DaemonSets, "
                "then run the uninstall workload)"
            )
        yield
    finally:
        for fd in held:
            os.close(fd)
