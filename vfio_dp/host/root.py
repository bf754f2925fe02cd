"""Root-relative access to the host's filesystem: the one door to ``/sys``, ``/dev``, ``/proc``.

A :class:`Root` is built with the root path (``/`` on a node, ``/host`` in a pod, a temp
tree in tests). Every path is built from components that were validated first (a parsed
:class:`~vfio_dp.model.address.PciAddress`, an int group number, a driver name matching
``[A-Za-z0-9_.-]+``).

Every file vfio_dp WRITES under the root (sysfs attributes, its records, journal and locks)
is opened with :meth:`Root.open` / :meth:`Root.open_dir`, which resolve the path *inside*
the root, never following a symlink out of it:

- relative links are followed as long as they stay below the root (``bus/pci/devices/<bdf>
  -> ../../../devices/pci0000:00/...`` on every real node);
- a link that climbs above the root with ``..``, and an ABSOLUTE link anywhere below the
  root, are refused with :class:`~vfio_dp.errors.PathEscapeError` naming the path and the
  link. (Refused, not re-rooted: the kernel's sysfs has only relative links, so an absolute
  one under ``<root>/sys`` or in the state directories is a planted or foreign tree.)

Mechanism: ``openat2(2)`` with ``RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`` relative to a
directory fd of the root (one system call; Linux >= 5.6), else -- ``ENOSYS``, or ``EPERM``
from a seccomp filter -- a walk one component at a time with directory fds, ``readlinkat``
and ``O_NOFOLLOW``, with the same semantics. With the root ``/`` nothing can leave the root
and paths are opened as they are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import threading
from typing import Any

from vfio_dp.errors import HostError, PathEscapeError, RootNotFoundError

_SAFE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.:+-")
_MAX_LINKS = 40

#: openat2(2) is system call 437 on every architecture (it postdates the unified numbering).
_SYS_OPENAT2 = 437
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_BENEATH = 0x08
#: None: not tried yet; False: this kernel (or a seccomp filter) refuses it -- walk instead.
_openat2_ok: bool | None = None
_openat2_fn: Any = None
_openat2_lock = threading.Lock()
#: tries of one openat2 that keeps answering EAGAIN (a racing rename) before walking instead
_EAGAIN_RETRIES = 8


def _openat2(dirfd: int, rel: str, flags: int, mode: int) -> int | None:
    """``openat2(dirfd, rel, {flags, mode, RESOLVE_BENEATH|RESOLVE_NO_MAGICLINKS})``; None
    when the system call is not available here. Raises OSError (``EXDEV`` = would leave)."""
    global _openat2_ok, _openat2_fn
    if _openat2_ok is False:
        return None
    if _openat2_fn is None:
        with _openat2_lock:
            if _openat2_fn is None:
                _openat2_fn = _make_openat2()
    fd: int
    err: int
    for _ in range(_EAGAIN_RETRIES):
        fd, err = _openat2_fn(dirfd, rel, flags, mode)
        if err != errno.EAGAIN or fd >= 0:
            break
    else:
        # RESOLVE_BENEATH answers EAGAIN when a rename or mount elsewhere on the system raced
        # a ".." in the path (sysfs device links are "../../../devices/..."); the kernel asks
        # the caller to retry. Still racing: the walk below has the same rules.
        return None
    if fd >= 0:
        _openat2_ok = True
        return fd
    if err in (errno.ENOSYS, errno.EPERM) and not _openat2_ok:
        _openat2_ok = False  # no openat2 here (old kernel, seccomp): walk from now on
        return None
    raise OSError(err, os.strerror(err), rel)


def _make_openat2() -> Any:
    """The ``openat2`` caller: ``call(dirfd, path, flags, mode) -> (fd, errno)``. Built once
    (ctypes is imported only for a root other than "/": a pod's /host, a test tree), with the
    argument types declared and one ``open_how`` per (flags, mode) kept: a big host's scan
    opens thousands of device directories with the same flags."""
    import ctypes

    class OpenHow(ctypes.Structure):
        _fields_ = [
            ("flags", ctypes.c_uint64),
            ("mode", ctypes.c_uint64),
            ("resolve", ctypes.c_uint64),
        ]

    libc = ctypes.CDLL(None, use_errno=True)
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    syscall.argtypes = [
        ctypes.c_long,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_void_p,
        ctypes.c_size_t,
    ]
    size = ctypes.sizeof(OpenHow)
    hows: dict[tuple[int, int], tuple[Any, int]] = {}
    get_errno = ctypes.get_errno

    def call(dfd: int, path: str, fl: int, md: int) -> tuple[int, int]:
        how = hows.get((fl, md))
        if how is None:
            creates = fl & os.O_CREAT or fl & os.O_TMPFILE == os.O_TMPFILE
            st = OpenHow(
                fl | os.O_CLOEXEC,
                md if creates else 0,  # a mode without O_CREAT is EINVAL
                _RESOLVE_BENEATH | _RESOLVE_NO_MAGICLINKS,
            )
            how = hows[(fl, md)] = (st, ctypes.addressof(st))
        fd = syscall(_SYS_OPENAT2, dfd, os.fsencode(path), how[1], size)
        return fd, (get_errno() if fd < 0 else 0)

    return call


def openat2_available() -> bool | None:
    """Whether :meth:`Root.open` used ``openat2`` (None until a non-``/`` root opened a path)."""
    return _openat2_ok


def safe_component(name: str) -> str:
    """Return ``name`` if it is one harmless path component, else raise HostError."""
    if not name or not _SAFE_CHARS.issuperset(name) or name in (".", ".."):
        raise HostError(f"refusing path component {name!r}")
    return name


class Root:
    """A filesystem root; ``root.path('sys', 'bus', 'pci')`` → ``<root>/sys/bus/pci``."""

    __slots__ = ("_fd", "base", "prefix", "walk_only")

    def __init__(self, base: str | os.PathLike[str], *, walk_only: bool = False) -> None:
        """Raises :class:`RootNotFoundError` when ``base`` is not a directory (a mistyped
        ``--root`` would otherwise read as a host without devices). ``walk_only``: never use
        openat2 (tests prove the fallback has the same rules)."""
        real = os.path.realpath(os.fspath(base))
        if not os.path.isdir(real):
            raise RootNotFoundError(os.fspath(base))
        self.base = real
        self.prefix = "" if real == "/" else real
        self.walk_only = walk_only
        self._fd: int | None = None

    def __repr__(self) -> str:
        return f"Root({self.base!r})"

    @property
    def display(self) -> str:
        """The root as shown in messages, always ending in ``/``."""
        return self.prefix + "/"

    def path(self, *parts: str) -> str:
        """Join validated components under the root (no ``..``, no slashes inside a part)."""
        return self.prefix + "/" + "/".join(safe_component(p) for p in parts)

    def resolve(self, path: str, links: dict[str, str | None] | None = None) -> str:
        """Resolve every symlink in ``path`` without ever leaving the root.

        ``/sys/bus/pci/devices/0000:01:00.0`` → ``/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0``
        (all under the root). Absolute link targets are re-rooted; escapes raise.
        ``links``: what each path's ``readlink`` answered (None: not a link), kept by a
        caller resolving many paths in one pass (thousands of devices share ``sys``,
        ``sys/bus/pci/devices`` and their bridges' directories): each is read once.
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
            if links is not None and candidate in links:
                link = links[candidate]
            else:
                try:
                    link = os.readlink(candidate)
                except OSError:
                    link = None
                if links is not None:
                    links[candidate] = link
            if link is None:
                done.append(part)
                continue
            target = link
            hops += 1
            if hops > _MAX_LINKS:
                raise HostError(f"too many symlinks resolving {path}")
            if target.startswith("/"):
                done = []
                target = target.lstrip("/")
            parts = [p for p in target.split("/") if p] + parts
        return self.prefix + "/" + "/".join(done)

    # -- opening inside the root ---------------------------------------------------------
    def _root_fd(self) -> int:
        if self._fd is None:
            fd = os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if self._fd is None:
                self._fd = fd
            else:  # another thread was first
                os.close(fd)
        return self._fd

    def __del__(self) -> None:
        fd = getattr(self, "_fd", None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def _relative(self, path: str) -> str:
        if not path.startswith(self.prefix + "/"):
            raise PathEscapeError(path, self.display)
        return path[len(self.prefix) + 1 :]

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        """``os.open(path, flags, mode)`` for a path under the root (as :meth:`path` builds
        it), resolved inside the root (see the module docstring). Raises
        :class:`PathEscapeError` for a path that would leave the root, OSError otherwise."""
        if not self.prefix:  # the root is "/": nothing can leave it
            return os.open(path, flags | os.O_CLOEXEC, mode)
        rel = self._relative(path)
        if not rel:
            return os.open(self.base, flags | os.O_CLOEXEC, mode)
        return self.open_relative(rel, flags, mode, path)

    def open_relative(self, rel: str, flags: int, mode: int = 0o600, shown: str = "") -> int:
        """:meth:`open` of ``<root>/<rel>`` (``rel`` built from validated components, no
        leading slash; ``shown``: the path named in errors), for callers that open many
        paths under one directory. Never called with the root ``/`` (nothing to confine)."""
        if not self.walk_only:
            try:
                fd = _openat2(self._root_fd(), rel, flags, mode)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    e.filename = shown or f"{self.prefix}/{rel}"
                    raise
                fd = None  # leaves the root: the walk names the link that does it
            if fd is not None:
                return fd
        return self._walk(rel, flags, mode, shown or f"{self.prefix}/{rel}")

    def _walk(self, rel: str, flags: int, mode: int, shown: str) -> int:
        """Resolve ``rel`` one component at a time with directory fds (the fallback)."""
        stack = [os.dup(self._root_fd())]
        names: list[str] = []
        parts = [p for p in rel.split("/") if p]
        hops = 0
        via: str | None = None  # the last link followed (named when the walk leaves)
        try:
            while parts:
                part = parts.pop(0)
                if part == ".":
                    continue
                if part == "..":
                    if len(stack) == 1:
                        raise PathEscapeError(shown, self.display, via)
                    os.close(stack.pop())
                    names.pop()
                    continue
                here = "/".join([*names, part])
                try:
                    target: str | None = os.readlink(part, dir_fd=stack[-1])
                except OSError as e:
                    if e.errno == errno.ENOENT and (parts or not flags & os.O_CREAT):
                        raise FileNotFoundError(
                            errno.ENOENT, os.strerror(errno.ENOENT), shown
                        ) from None
                    if e.errno not in (errno.EINVAL, errno.ENOENT):
                        e.filename = shown
                        raise
                    target = None  # not a symlink (or a file about to be created)
                if target is not None:
                    hops += 1
                    if hops > _MAX_LINKS:
                        raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), shown)
                    if target.startswith("/"):
                        raise PathEscapeError(shown, self.display, f"{here} -> {target}")
                    via = f"{here} -> {target}"
                    parts = [p for p in target.split("/") if p] + parts
                    # `..` in a target is relative to the link's directory: the walk's own
                    # stack; climbing above the root is caught above.
                    continue
                if not parts:
                    return os.open(
                        part, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=stack[-1]
                    )
                stack.append(
                    os.open(
                        part,
                        os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                        dir_fd=stack[-1],
                    )
                )
                names.append(part)
            return (
                os.dup(stack[-1])
                if flags & os.O_DIRECTORY
                else os.open(".", flags | os.O_CLOEXEC, mode, dir_fd=stack[-1])
            )
        finally:
            for fd in stack:
                os.close(fd)

    def open_dir(self, *parts: str, create: bool = False) -> int:
        """A directory fd (``O_RDONLY``, usable for ``fsync`` and ``*at`` calls) of
        ``<root>/<parts>``, resolved inside the root; with ``create``, missing directories
        are made (mode 0755), each one inside the root too."""
        path = self.path(*parts)
        try:
            return self.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            if not create or not parts:
                raise
        parent = self.open_dir(*parts[:-1], create=True)
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(parts[-1], 0o755, dir_fd=parent)
        finally:
            os.close(parent)
        return self.open(path, os.O_RDONLY | os.O_DIRECTORY)

    def check_inside(self, path: str) -> None:
        """Raise :class:`PathEscapeError` if ``path`` resolves outside the root (a path that
        does not exist is fine: nothing can be written through it)."""
        if not self.prefix:
            return
        with contextlib.suppress(FileNotFoundError):
            os.close(self.open(path, os.O_PATH))

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
