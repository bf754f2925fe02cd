"""The one atomic file writer and the one durable remove: every persisted record (the
original-driver records and journal of :mod:`vfio_dp.host.state`, the device plugin's
allocation record, CDI specs, DRA device metadata) is written whole or not at all, and what
is removed stays removed after a crash.

Write: a temp file in the same directory (``O_EXCL | O_NOFOLLOW``: never through a planted
link), every byte written, ``fsync``; ``rename`` over the old file; ``fsync`` of the
directory so the rename itself survives a crash. A reader sees the old file or the new one,
never a torn one; a failure removes the temp file and raises the :class:`OSError`.

``durable=False`` keeps all of that but the two ``fsync`` calls: for files that are rebuilt
whole before anyone can need them after a crash, and so must only never be seen torn. A DRA
claim's CDI spec and device-metadata files are such files: kubelet calls
NodePrepareResources again after a kubelet restart or a node reboot (the prepared flag is
not persisted, ``shared/reference/dra.md``), every Prepare writes them anew, and the pod
that reads them is started only after that Prepare answered. Two ``fsync`` calls are
~0.5 ms on a node's disk, a quarter of a Prepare. State the plugin decides from (bind
records, journals, the DRA checkpoint, allocation records) is always written durably.

Many at once (:func:`replace_many_at`: a pass binding 1,024 VFs writes 1,024 bind records):
each file as above, but their ``fsync`` calls are made together from a few threads (the
file system's journal commits them in a handful of transactions instead of one each) and the
directory is synced once, after every rename. Each file is still whole or absent; all of
them are durable when it returns.

Remove: ``unlink`` (never following a link), then ``fsync`` of the directory. A name already
gone is no error, yet the directory is still synced: a retry after a failed ``fsync`` makes
the earlier unlink durable. ``durable=False`` leaves the ``fsync`` to the caller, who syncs
the directory once for many removes (:func:`sync_dir`: a DRA Unprepare of 1,000 claims
syncs its two directories once, before the checkpoint forgets the claims).
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Iterable, Sequence

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _temp_of(name: str) -> str:
    """The temp file ``name`` is written to before its rename (this process and thread's)."""
    return f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"


def _write_temp(dir_fd: int, tmp: str, data: bytes) -> int:
    """Create ``tmp`` in ``dir_fd`` (never an existing file, never through a link), write all
    of ``data``; the open descriptor is the caller's to sync, close and rename. A failed
    write closes and removes ``tmp``; a failed create leaves whatever has that name alone."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    return fd


def replace_at(dir_fd: int, name: str, data: bytes, *, durable: bool = True) -> None:
    """Replace ``name`` in the open directory ``dir_fd`` with ``data``, atomically (and
    durably unless ``durable=False``: see the module docstring)."""
    tmp = _temp_of(name)
    fd = _write_temp(dir_fd, tmp, data)
    try:
        try:
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    if durable:
        os.fsync(dir_fd)


#: files written, then synced together, per round of :func:`replace_many_at` (bounds open fds)
MANY_CHUNK = 64
#: threads that ``fsync`` one round's files together
SYNC_THREADS = 16


def replace_many_at(dir_fd: int, items: Sequence[tuple[str, bytes]]) -> None:
    """:func:`replace_at` of each ``(name, data)`` in the open directory ``dir_fd``, made
    durable together: per round of :data:`MANY_CHUNK` files, every temp file written, all
    ``fsync``'ed at once from :data:`SYNC_THREADS` threads, then renamed; one ``fsync`` of
    the directory at the end. A failure removes the temp files not yet renamed and raises
    (files already renamed are whole: the caller decides what to undo)."""
    if len(items) == 1:
        replace_at(dir_fd, *items[0])
        return
    from concurrent.futures import ThreadPoolExecutor  # on use: `vfioctl list` never writes

    with ThreadPoolExecutor(max_workers=SYNC_THREADS, thread_name_prefix="fsync") as pool:
        for start in range(0, len(items), MANY_CHUNK):
            chunk = items[start : start + MANY_CHUNK]
            temps: list[tuple[str, str]] = []  # (temp name, final name), not yet renamed
            fds: list[int] = []  # still open
            try:
                for name, data in chunk:
                    tmp = _temp_of(name)
                    fds.append(_write_temp(dir_fd, tmp, data))
                    temps.append((tmp, name))
                list(pool.map(os.fsync, fds))
                while fds:
                    os.close(fds.pop())
                while temps:
                    tmp, name = temps[0]
                    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    temps.pop(0)
            except BaseException:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                for tmp, _ in temps:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dir_fd)
                raise
    if items:
        os.fsync(dir_fd)


def write_atomic(path: str, data: bytes, *, durable: bool = True) -> None:
    """:func:`replace_at` for ``path`` (its directory is created when missing: only then,
    a Prepare of 1,000 claims writes 2,000 files into directories that mostly exist)."""
    directory, name = os.path.split(path)
    try:
        dfd = os.open(directory or ".", _DIR_FLAGS)
    except FileNotFoundError:
        os.makedirs(directory or ".", exist_ok=True)
        dfd = os.open(directory or ".", _DIR_FLAGS)
    try:
        replace_at(dfd, name, data, durable=durable)
    finally:
        os.close(dfd)


def remove_at(dir_fd: int, names: Iterable[str], *, durable: bool = True) -> list[str]:
    """Unlink ``names`` in the open directory ``dir_fd``, then ``fsync`` it once (when any
    name was given, and ``durable``). Returns the names that were there."""
    asked = False
    removed = []
    for name in names:
        asked = True
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            continue
        removed.append(name)
    if asked and durable:
        os.fsync(dir_fd)
    return removed


def sync_dir(directory: str) -> None:
    """``fsync`` of ``directory`` (absent: nothing to sync): removes made with
    ``durable=False`` in it survive a crash from now on."""
    try:
        dfd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def remove_durably(directory: str, *names: str, durable: bool = True) -> list[str]:
    """:func:`remove_at` in ``directory``: the names that were there (none when the directory
    itself is missing)."""
    try:
        dfd = os.open(directory or ".", _DIR_FLAGS)
    except FileNotFoundError:
        return []
    try:
        return remove_at(dfd, names, durable=durable)
    finally:
        os.close(dfd)


def remove_tree_durably(path: str, *, durable: bool = True) -> bool:
    """Remove ``path`` — a file, a symlink (never what it points at) or a directory with
    everything below it (walked without following links) — then ``fsync`` its parent
    (unless ``durable=False``: the caller's :func:`sync_dir`). False when nothing was there."""
    directory, name = os.path.split(path)
    try:
        dfd = os.open(directory or ".", _DIR_FLAGS)
    except FileNotFoundError:
        return False
    try:
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            if durable:
                os.fsync(dfd)
            return False
        if stat.S_ISDIR(st.st_mode):
            _empty_dir(path)
            os.rmdir(name, dir_fd=dfd)
        else:
            os.unlink(name, dir_fd=dfd)
        if durable:
            os.fsync(dfd)
        return True
    finally:
        os.close(dfd)


def _empty_dir(top: str) -> None:
    """Delete what is below ``top``, deepest first; a link is removed, never followed."""
    for dirpath, dirnames, filenames in os.walk(top, topdown=False, followlinks=False):
        for name in filenames:
            os.unlink(os.path.join(dirpath, name))
        for name in dirnames:
            p = os.path.join(dirpath, name)
            if os.path.islink(p):
                os.unlink(p)
            else:
                os.rmdir(p)
