"""Whole-or-nothing files: the node side's atomic writer.

``write_atomic(path, data)``: a temp file in the same directory, ``fsync``, ``rename`` over
``path``, ``fsync`` of the directory -- a crash or power loss leaves the old content or the
new one, never a mix. Used for the DRA checkpoint, CDI specs and device-metadata files.
(``StateStore.put`` in :mod:`.state` follows the same sequence for bind records; branch
``house`` unifies the writers.)
"""

from __future__ import annotations

import contextlib
import os
import threading


def write_atomic(path: str, data: str | bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content, never
    a mix: a temp file in the same directory, fsync, rename over ``path``, fsync of the
    directory. Creates the directory when missing. The one atomic writer of the node side
    (bind records, DRA checkpoint, CDI specs, device-metadata files)."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, mode)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def remove_durably(path: str) -> bool:
    """Unlink ``path`` and fsync its directory; False when it was not there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True
