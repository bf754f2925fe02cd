"""Whole-file records under the root: the one place that reads, replaces, removes and lists
the JSON files the node keeps, for every store of them (bind records and journals
:mod:`vfio_dp.host.state`, SR-IOV records :mod:`vfio_dp.host.sriov_store`, mdev records
:mod:`vfio_dp.host.mdev_store`, persistent binds
:mod:`vfio_dp.host.persist`, the DRA checkpoint :mod:`vfio_dp.dra.claimpath.checkpoint`,
the device plugin's allocations :mod:`vfio_dp.deviceplugin.allocation_store`); each store is
the one module that reads and writes its kind (``tests/host/test_one_writer.py``)::

    <root>/var/lib/vfio_dp/original/0000:3b:00.0.json     read(("var", "lib", "vfio_dp", "original"), "0000:3b:00.0.json")
    <root>/var/lib/vfio_dp/sriov/0000:af:00.0.json        write(("var", "lib", "vfio_dp", "sriov"), "0000:af:00.0.json", b"{...}")

Every directory is opened beneath the root (:meth:`vfio_dp.host.root.Root.open_dir`: no
``..``, no symlink out of it), every file relative to that directory with ``O_NOFOLLOW``; a
write replaces the file atomically and durably (:func:`vfio_dp.host.atomic.replace_at`). A
failed write raises :class:`~vfio_dp.errors.StateWriteError` naming the file and the fix
(:func:`write_failure`), before anything else of the operation was changed. A record is read
the same way for every store (:meth:`RecordFiles.load`, :meth:`RecordFiles.load_all`): inside
the root, never blocking, capped in size, parsed as JSON by the store's own parser; one that
cannot be read or parsed raises (or is reported as) a
:class:`~vfio_dp.errors.CorruptRecordError` naming the file and the store's fix, and is kept.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
from collections.abc import Callable, Sequence
from typing import TypeVar

from vfio_dp.errors import CorruptRecordError, PathEscapeError, StateWriteError
from vfio_dp.host.atomic import remove_at, replace_at, replace_many_at
from vfio_dp.host.files import NotRegularFileError, read_regular
from vfio_dp.host.root import Root

#: a record is a few hundred bytes; a journal of 4,096 devices < 1 MB
MAX_RECORD = 1 << 20

#: ``<root>/var/lib/vfio_dp``: the node's own durable files, every store's directory below it
STATE_DIR = ("var", "lib", "vfio_dp")

T = TypeVar("T")
K = TypeVar("K")


def write_failure(path: str, e: OSError) -> str:
    """``cannot write <path>: <why>; <fix> and retry`` for a failed write of a state file."""
    why = e.strerror or str(e)
    fix = {
        errno.ENOSPC: "free space on that file system",
        errno.EDQUOT: "raise the disk quota",
        errno.EROFS: "mount it read-write (the DaemonSet needs it writable)",
        errno.EACCES: "run as root",
        errno.EPERM: "run as root",
    }.get(e.errno or 0, "check the directory")
    return f"cannot write {path}: {why}; {fix} and retry"


class RecordFiles:
    """The record files beneath ``root`` (see the module docstring)."""

    def __init__(self, root: Root, limit: int = MAX_RECORD) -> None:
        self.root = root
        self.limit = limit

    def read(self, parts: tuple[str, ...], name: str) -> bytes | None:
        """``<root>/<parts>/<name>``, at most ``limit + 1`` bytes (so a caller sees a file too
        large); None if it or its directory is absent. Never blocks and never follows a link:
        opened ``O_NONBLOCK | O_NOFOLLOW`` and checked with ``fstat``
        (:func:`vfio_dp.host.files.read_regular`), so a FIFO, a directory, a socket or a
        symlink where the record should be raises :class:`NotRegularFileError` (an
        :class:`OSError`) instead of hanging; every other failure raises its
        :class:`OSError` (or :class:`PathEscapeError`). The store turns either into
        :class:`~vfio_dp.errors.CorruptRecordError` with its own fix (:meth:`unreadable`)."""
        try:
            dfd = self.root.open_dir(*parts)
        except FileNotFoundError:
            return None
        try:
            return read_regular(name, self.limit, dir_fd=dfd, nofollow=True)
        except FileNotFoundError:
            return None
        finally:
            os.close(dfd)

    def unreadable(
        self, parts: tuple[str, ...], name: str, e: BaseException, fix: str
    ) -> CorruptRecordError:
        """``unreadable record <root>/<parts>/<name>: <why>; it is kept as it is; <fix>``."""
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        if isinstance(e, NotRegularFileError):  # its text names the bare name: say the kind
            why = str(e).removeprefix(name).strip() or "not a regular file"
        return CorruptRecordError(self.root.path(*parts, name), why or type(e).__name__, fix)

    def load(
        self, parts: tuple[str, ...], name: str, fix: str, parse: Callable[[object], T]
    ) -> T | None:
        """The record ``<root>/<parts>/<name>`` through the store's ``parse`` (it gets the
        decoded JSON and raises ``ValueError``/``TypeError``/``KeyError`` for what is not
        its record); None when the file is absent. A file that cannot be read (:meth:`read`:
        a FIFO, a directory, a link), is larger than ``limit``, is not JSON or does not
        parse raises :class:`CorruptRecordError` naming it, why, and ``fix``."""
        try:
            raw = self.read(parts, name)
        except OSError as e:  # a FIFO, a directory, a link: never opened blocking
            raise self.unreadable(parts, name, e, fix) from e
        if raw is None:
            return None
        try:
            if len(raw) > self.limit:
                raise ValueError(f"larger than {self.limit} bytes")
            return parse(json.loads(raw))
        except (ValueError, TypeError, KeyError) as e:
            why = f"missing field {e}" if isinstance(e, KeyError) else str(e) or type(e).__name__
            raise CorruptRecordError(self.root.path(*parts, name), why, fix) from e

    def keys(self, parts: tuple[str, ...], key: Callable[[str], K]) -> list[K]:
        """The record files ``<root>/<parts>/<stem>.json``, each ``stem`` through ``key``
        (a PCI address, a UUID), sorted by name; hidden files (a write's temp file) and
        names ``key`` refuses with ``ValueError`` are not records and are left out."""
        return [k for k, _name in self._named(parts, key)]

    def _named(self, parts: tuple[str, ...], key: Callable[[str], K]) -> list[tuple[K, str]]:
        out = []
        for n in self.names(parts):
            if n.endswith(".json") and not n.startswith("."):
                with contextlib.suppress(ValueError):
                    out.append((key(n[:-5]), n))
        return out

    def load_all(
        self,
        parts: tuple[str, ...],
        key: Callable[[str], K],
        parse: Callable[[object], T],
        fix: Callable[[K], str],
    ) -> tuple[list[T], list[str]]:
        """Every record in ``<root>/<parts>`` (:meth:`keys`) that :meth:`load` reads, and the
        message of each that it cannot (kept as it is, with its fix ``fix(key)``); one
        removed meanwhile is neither."""
        out: list[T] = []
        problems: list[str] = []
        for k, name in self._named(parts, key):
            try:
                rec = self.load(parts, name, fix(k), parse)
            except CorruptRecordError as e:
                problems.append(str(e))
                continue
            if rec is not None:
                out.append(rec)
        return out, problems

    def write(self, parts: tuple[str, ...], name: str, data: bytes) -> None:
        """Replace ``<root>/<parts>/<name>`` atomically, creating the directories. Raises
        :class:`StateWriteError` naming the file and the fix."""
        dfd = -1
        try:
            dfd = self.root.open_dir(*parts, create=True)
            replace_at(dfd, name, data)
        except OSError as e:  # a directory that leaves the root raises PathEscapeError
            raise StateWriteError(write_failure(self.root.path(*parts, name), e)) from e
        finally:
            if dfd >= 0:
                os.close(dfd)

    def write_many(self, parts: tuple[str, ...], items: Sequence[tuple[str, bytes]]) -> None:
        """:meth:`write` of each ``(name, data)`` in ``<root>/<parts>``, made durable together
        (:func:`vfio_dp.host.atomic.replace_many_at`: their ``fsync`` calls at once, the
        directory synced once). Raises :class:`StateWriteError` naming the directory and the
        fix; files already replaced are whole, the others untouched."""
        if not items:
            return
        dfd = -1
        try:
            dfd = self.root.open_dir(*parts, create=True)
            replace_many_at(dfd, items)
        except OSError as e:
            raise StateWriteError(write_failure(self.root.path(*parts), e)) from e
        finally:
            if dfd >= 0:
                os.close(dfd)

    def remove(self, parts: tuple[str, ...], name: str) -> None:
        """Remove ``<root>/<parts>/<name>`` (durably); absent is fine. Raises
        :class:`StateWriteError` when it cannot be removed."""
        try:
            dfd = self.root.open_dir(*parts)
        except FileNotFoundError:
            return
        try:
            remove_at(dfd, (name,))
        except OSError as e:
            raise StateWriteError(write_failure(self.root.path(*parts, name), e)) from e
        finally:
            os.close(dfd)

    def set_aside(self, parts: tuple[str, ...], name: str, aside: str) -> str:
        """Rename ``<root>/<parts>/<name>`` (whatever it is: a FIFO, a directory, a link is
        renamed, never opened) to ``aside`` in the same directory, so a fresh record can be
        written; returns the new path. Raises :class:`OSError` when it cannot."""
        dfd = self.root.open_dir(*parts)
        try:
            os.rename(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return self.root.path(*parts, aside)

    def names(self, parts: tuple[str, ...]) -> list[str]:
        """The names in ``<root>/<parts>``, sorted (none when it is absent or unusable)."""
        try:
            dfd = self.root.open_dir(*parts)
        except (OSError, PathEscapeError):
            return []
        try:
            return sorted(os.listdir(dfd))
        finally:
            os.close(dfd)
