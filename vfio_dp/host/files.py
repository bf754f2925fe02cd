"""Reading the files an operator hands us (the ``--config`` file), bounded and never blocking.

The one reader of the config file: ``vfioctl list --config``, the daemon (at start and on every
ConfigMap swap) and ``vfioctl translate|hostdev --config`` all call :func:`load_config`, so a
file is refused the same way everywhere, with one :class:`~vfio_dp.errors.ConfigError`
naming it:

- not there / unreadable → ``cannot read it: No such file or directory``;
- not a regular file (a FIFO would block the reader, a device would never end) → refused
  without reading (opened with ``O_NONBLOCK``, checked with ``fstat``);
- larger than :data:`~vfio_dp.model.config.MAX_CONFIG_BYTES`, not UTF-8, nested too deep,
  aliases that expand too far → refused by :func:`vfio_dp.model.config.load_config_bytes`
  before any of it is expanded.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import TYPE_CHECKING

from vfio_dp.errors import ConfigError

if TYPE_CHECKING:  # the config's module is imported by the config readers only: the record
    from vfio_dp.model.config import Config  # readers (host.records) share this module

#: What identifies a file at a path: a ConfigMap's ``..data`` swap or a re-created socket
#: changes it even when size and content do not.
FileId = tuple[int, int, int]  # (st_dev, st_ino, st_ctime_ns)


def file_id(path: str, *, follow: bool = True) -> FileId | None:
    """Identity of the file at ``path`` now (None: absent or not stat'able); ``follow=False``
    identifies a symlink or socket itself (``lstat``) rather than what it points at."""
    try:
        st = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


class NotRegularFileError(OSError):
    """The path is a FIFO, socket, device or directory: nothing was read from it."""


def _kind(mode: int) -> str:
    """What a file that is not a regular file is, for a message."""
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return f"mode {stat.filemode(mode)}"


def read_regular(
    path: str, limit: int, *, dir_fd: int | None = None, nofollow: bool = False
) -> bytes:
    """At most ``limit`` + 1 bytes of the regular file ``path`` (one more than allowed, so a
    caller can tell "too big"). Opened non-blocking and checked with ``fstat`` first: a FIFO or
    device raises :class:`NotRegularFileError` instead of hanging (with ``nofollow``, so does
    a symlink at ``path``). Other ``OSError``s pass."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    try:
        fd = os.open(path, flags | (os.O_NOFOLLOW if nofollow else 0), dir_fd=dir_fd)
    except OSError as e:
        if nofollow and e.errno == errno.ELOOP:
            raise NotRegularFileError(f"{path} is a symbolic link") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFileError(f"{path} is not a regular file ({_kind(st.st_mode)})")
        chunks: list[bytes] = []
        left = limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_config_bytes(path: str) -> bytes:
    """The config file's bytes (at most one more than the cap); :class:`ConfigError` naming
    the file when it cannot be read."""
    from vfio_dp.model.config import MAX_CONFIG_BYTES

    try:
        return read_regular(path, MAX_CONFIG_BYTES)
    except NotRegularFileError:
        raise ConfigError(
            path,
            [
                (
                    "(file)",
                    None,
                    "not a regular file (a FIFO, device or directory); give a YAML file",
                )
            ],
        ) from None
    except OSError as e:
        raise ConfigError(path, [("(file)", None, f"cannot read it: {e.strerror or e}")]) from None


def load_config(path: str | None) -> Config:
    """The config at ``path``, or the default (every device on vfio-pci) without one."""
    from vfio_dp.model.config import DEFAULT_CONFIG, load_config_bytes

    if not path:
        return DEFAULT_CONFIG
    return load_config_bytes(read_config_bytes(path), path)
