"""Root-relative access to the host's filesystem: the one door to ``/sys``, ``/dev``, ``/proc``.

A :class:`Root` is built with the root path (``/`` on a node, ``/host`` in a pod, a temp
tree in tests). Every path is built from components that were validated first (a parsed
:class:`~vfio_dp.model.address.PciAddress`, an int group number, a driver name matching
``[A-Za-z0-9_.-]+``), and symlinks are resolved *inside* the root: an absolute link target
is taken relative to the root, and a target that would climb above it raises
:class:`~vfio_dp.errors.PathEscapeError`.
"""

from __future__ import annotations

import os
import posixpath

from vfio_dp.errors import HostError, PathEscapeError, RootNotFoundError

_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-")
_MAX_LINKS = 40


def safe_component(name: str) -> str:
    """Return ``name`` if it is one harmless path component, else raise HostError."""
    if not name or not _SAFE_CHARS.issuperset(name) or name in (".", ".."):
        raise HostError(f"refusing path component {name!r}")
    return name


class Root:
    """A filesystem root; ``root.path('sys', 'bus', 'pci')`` → ``<root>/sys/bus/pci``."""

    __slots__ = ("base", "prefix")

    def __init__(self, base: str | os.PathLike[str]) -> None:
        """Raises :class:`RootNotFoundError` when ``base`` is not a directory (a mistyped
        ``--root`` would otherwise read as a host without devices)."""
        real = os.path.realpath(os.fspath(base))
        if not os.path.isdir(real):
            raise RootNotFoundError(os.fspath(base))
        self.base = real
        self.prefix = "" if real == "/" else real

    def __repr__(self) -> str:
        return f"Root({self.base!r})"

    @property
    def display(self) -> str:
        """The root as shown in messages, always ending in ``/``."""
        return self.prefix + "/"

    def path(self, *parts: str) -> str:
        """Join validated components under the root (no ``..``, no slashes inside a part)."""
        return self.prefix + "/" + "/".join(safe_component(p) for p in parts)

    def resolve(self, path: str) -> str:
        """Resolve every symlink in ``path`` without ever leaving the root.

        ``/sys/bus/pci/devices/0000:01:00.0`` → ``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0``
        (all under the root). Absolute link targets are re-rooted; escapes raise.
        """
        if not path.startswith(self.prefix + "/"):
            raise PathEscapeError(path, self.display)
        rel = path[len(self.prefix) :]
        parts = [p for p in rel.split("/") if p]
        done: list[str] = []
        hops = 0
        while parts:
            part = parts.pop(0)
            if part == ".":
                continue
            if part == "..":
                if not done:
                    raise PathEscapeError(path, self.display)
                done.pop()
                continue
            candidate = self.prefix + "/" + "/".join([*done, part])
            try:
                target = os.readlink(candidate)
            except OSError:
                done.append(part)
                continue
            hops += 1
            if hops > _MAX_LINKS:
                raise HostError(f"too many symlinks resolving {path}")
            if target.startswith("/"):
                done = []
                target = target.lstrip("/")
            parts = [p for p in target.split("/") if p] + parts
        return self.prefix + "/" + "/".join(done)

    def link_name(self, path: str) -> str | None:
        """The last component of a symlink's target (``driver`` → ``e1000e``), None if absent."""
        try:
            return posixpath.basename(os.readlink(path))
        except OSError:
            return None


def read_text(path: str, dir_fd: int | None = None, size: int = 65536) -> str | None:
    """Read a small sysfs/proc file (relative to ``dir_fd`` when given; at most ``size``
    bytes), stripped; None if it does not exist or cannot be read.

    Opened ``O_NONBLOCK``: a FIFO (or a device) planted where an attribute should be never
    hangs the reader -- a FIFO without a writer reads as empty, a device that would block
    fails with ``EAGAIN`` (None); sysfs attributes and ``/proc`` files ignore the flag. Binary
    content decodes with replacement characters, which the callers' checks refuse."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, size).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
