"""The one atomic file writer: every persisted record (the original-driver records of
:mod:`vfio_dp.host.state`, the daemon's allocation record) is written whole or not at all.

The sequence: a temp file in the same directory (``O_EXCL | O_NOFOLLOW``: never through a
planted link), every byte written, ``fsync``; ``rename`` over the old file; ``fsync`` of the
directory so the rename itself survives a crash. A reader sees the old file or the new one,
never a torn one; a failure removes the temp file and raises the :class:`OSError`.
"""

from __future__ import annotations

import contextlib
import os
import threading


def replace_at(dir_fd: int, name: str, data: bytes) -> None:
    """Replace ``name`` in the open directory ``dir_fd`` with ``data``, atomically."""
    tmp = f".{name}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o644,
        dir_fd=dir_fd,
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.fsync(dir_fd)


def write_atomic(path: str, data: bytes) -> None:
    """:func:`replace_at` for ``path`` (its directory is created when missing)."""
    directory, name = os.path.split(path)
    os.makedirs(directory or ".", exist_ok=True)
    dfd = os.open(directory or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        replace_at(dfd, name, data)
    finally:
        os.close(dfd)
