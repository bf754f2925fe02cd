"""The one way a kubelet front-end serves gRPC on a unix socket (both front-ends use it).

Where the sockets go (paths as this process sees them, never joined with ``--root``)::

    <kubelet-dir>/vfio_dp-<resource, / as _>.sock      device plugin, one per resource
    <plugins-dir>/<driver>/dra.sock                    DRA service
    <registry-dir>/<driver>-reg.sock                   DRA registration

The rules, written once:

- what may stand where our socket goes (:func:`make_room`): nothing, or a socket (an earlier
  run's, or someone else's: replaced atomically). A directory, a regular file, a symlink or a
  special file is refused with :class:`~vfio_dp.errors.SocketPathError` naming the path and
  the fix, and left as it is; so is a path too long for ``sun_path`` (107 bytes) and a
  directory that cannot be created;
- a server binds a hidden name beside the path (``.<pid>.<n>.sock``; kubelet's watchers ignore
  dot files) and renames it into place once it serves: gRPC unlinks the name it bound when
  it stops, and that name is then one nobody else uses, never a socket someone put at our
  path meanwhile;
- every server has the same limits (:data:`SERVER_OPTIONS`, :data:`MAX_CONCURRENT_RPCS`):
  a front-end's messages fit many times over, a hostile client's do not;
- :meth:`SocketServer.changed` notices a socket removed or replaced from under us (kubelet
  restart, cleanup); :meth:`SocketServer.restore` serves it again, logging a path it cannot
  use once per distinct problem; :meth:`SocketServer.close` removes only a socket still ours;
- :meth:`SocketServer.unanswered` is the ``/healthz`` check: a socket that stays gone,
  replaced or refusing connections for longer than :data:`SOCKET_WINDOW` makes the probe fail
  (the liveness probe then restarts the pod, which serves the sockets afresh);
- :class:`DirWatch` lets a watcher that checks many sockets of one directory (64 resources:
  65 ``lstat``) skip the checks while the directory itself shows no change: one ``stat``.
  The watch wakes on inotify events (:class:`vfio_dp.host.inotify.DirWatcher`); this matters
  where it falls back to looking four times a second, and at its look every 5 s.

No gRPC import here (the core stays free of it, see the import contracts): a front-end hands
in ``grpc.aio.server`` as the factory and a function that adds its servicers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import stat
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from vfio_dp.errors import SocketPathError
from vfio_dp.host.files import FileId, file_id

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes with the terminating NUL
MAX_MESSAGE = 1 << 20  # a pod's claims, a resource's device list: fit many times over
MAX_CONCURRENT_RPCS = 64
#: ``grpc.aio.server(options=...)`` of every server we run
SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.so_reuseport", 0),
)

_hidden_serial = itertools.count(1)

#: How long a kubelet-facing socket may stay unanswered before ``/healthz`` says so. A kubelet
#: restart wipes the device-plugin sockets and the plugin watcher's view; we serve them again
#: within one watch event, but the kubelet's own restart (systemd restart, its start-up, its
#: plugin manager dialling every socket again) takes 10-30 s on a busy node, and the directory
#: may be re-made meanwhile (our restore fails until it is back). 60 s is beyond a slow
#: kubelet restart, so a kubelet restart never restarts our pod; a socket still unanswered
#: after it is ours to fix, and the liveness probe (3 x 10 s) restarts the pod within 90 s.
SOCKET_WINDOW = 60.0


class Server(Protocol):
    """What we use of a ``grpc.aio.Server``."""

    def add_insecure_port(self, address: str) -> int: ...

    async def start(self) -> None: ...

    async def stop(self, grace: float | None) -> Any: ...


class ServerFactory(Protocol):
    """``grpc.aio.server`` as far as we call it."""

    def __call__(
        self, *, options: Sequence[tuple[str, Any]], maximum_concurrent_rpcs: int
    ) -> Any: ...


#: A directory whose last change is older than this when it is recorded can be trusted to
#: show any later change with another timestamp (the kernel stamps changes with a coarse
#: clock: two changes in one tick may carry the same time).
SETTLE_SECONDS = 1.0

_DirState = tuple[int, int, int, int]


class DirWatch:
    """Has anything been added to, removed from or renamed in a directory since the last
    check that found everything in order? Any of these changes the directory's
    ``mtime``/``ctime`` (POSIX), so an unchanged ``(st_dev, st_ino, st_mtime_ns,
    st_ctime_ns)`` means: the entries are the ones checked then.

    A recorded state counts only when its newest timestamp was older than
    :data:`SETTLE_SECONDS` when it was taken (a change in the same clock tick as the one
    before could otherwise keep the old timestamp: git's "racy" files). Use::

        before = watch.look()            # before checking the entries
        ...check every entry...
        watch.settled(before)            # only when the check found nothing to do
        ...
        if watch.unchanged(): skip       # one stat instead of the checks
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: _DirState | None = None

    def look(self) -> _DirState | None:
        """The directory's state now (None: not there)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)

    def unchanged(self) -> bool:
        """True when the directory is as it was at the last :meth:`settled` look."""
        return self._seen is not None and self.look() == self._seen

    def settled(self, before: _DirState | None) -> None:
        """Record ``before`` (taken before the check that found everything in order) when its
        changes are old enough to trust; else forget (the next call checks in full)."""
        newest = max(before[2], before[3]) if before is not None else None
        ok = newest is not None and time.time_ns() - newest > SETTLE_SECONDS * 1e9
        self._seen = before if ok else None

    def forget(self) -> None:
        """The next call checks in full (something was acted on)."""
        self._seen = None


def _socket_id(path: str) -> FileId | None:
    """The file at ``path`` itself (never what a link there points at)."""
    return file_id(path, follow=False)


def make_socket_dir(directory: str, flag: str) -> None:
    """Create ``directory`` (where our sockets go) when missing, else
    :class:`SocketPathError`; ``flag`` names the option that chose it, for the fix."""
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise SocketPathError(
            directory,
            f"is not a directory and cannot be made one ({e.strerror or e})",
            f"make {directory} a writable directory or choose another {flag}",
        ) from e


def _refuse_links(base: str, directory: str) -> None:
    """Every directory below ``base`` down to ``directory`` is ours (``<plugins>/<driver>``):
    a symlink there would put our socket wherever it points -- refused."""
    rel = os.path.relpath(directory, base)
    if rel == "." or rel.startswith(".."):
        return
    here = base
    for part in rel.split(os.sep):
        here = os.path.join(here, part)
        if os.path.islink(here):
            raise SocketPathError(
                here,
                f"is a symlink (to {os.readlink(here)}): our socket would be created wherever "
                "it points",
                "remove the link; the plugin makes this directory itself",
            )


def make_room(path: str, flag: str, base: str | None = None) -> None:
    """Check that ``path`` can take a new socket of ours; create its directory.

    Nothing there, or a socket (stale, or someone else's: the rename of
    :meth:`SocketServer.serve` replaces it atomically), is fine. Anything else, and a path
    too long for ``sun_path``, is a :class:`SocketPathError` naming the path and the fix;
    nothing is ever deleted here. ``flag`` names the option that chose the directory;
    ``base``, when given, is that directory: the ones between it and the socket are ours and
    must not be symlinks (checked before and after they are made).
    """
    size = len(os.fsencode(path))
    if size > MAX_SOCKET_PATH:
        raise SocketPathError(
            path,
            f"is {size} bytes long, unix sockets allow {MAX_SOCKET_PATH}",
            f"choose a shorter {flag} or name",
        )
    directory = os.path.dirname(path) or "."
    if base is not None:
        _refuse_links(base, directory)
    make_socket_dir(directory, flag)
    if base is not None:
        _refuse_links(base, directory)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SocketPathError(
            path, f"cannot be inspected: {e.strerror or e}", "check the permissions"
        ) from e
    if stat.S_ISSOCK(st.st_mode):
        return
    kind = (
        "a directory"
        if stat.S_ISDIR(st.st_mode)
        else "a symlink"
        if stat.S_ISLNK(st.st_mode)
        else "a regular file"
        if stat.S_ISREG(st.st_mode)
        else "a special file"
    )
    raise SocketPathError(path, f"is {kind}", f"remove it (rm -r {path}) or choose another {flag}")


class SocketServer:
    """One unix socket of ours and the gRPC server on it.

    ``new_server`` builds an unstarted server (``grpc.aio.server``); ``add_services`` adds
    the front-end's servicers to it; ``label`` prefixes this socket's log lines.
    """

    def __init__(
        self,
        path: str,
        flag: str,
        new_server: ServerFactory,
        add_services: Callable[[Any], None],
        *,
        log: logging.Logger,
        label: str,
        base: str | None = None,
    ) -> None:
        """``base``: the operator's directory the socket's own directories are made in
        (:func:`make_room`)."""
        self.path = path
        self.flag = flag
        self.base = base
        self.new_server = new_server
        self.add_services = add_services
        self.log = log
        self.label = label
        self.server: Server | None = None
        self.file_id: FileId | None = None
        self.problem = ""  # why the last restore failed (logged once per distinct problem)
        #: since when (monotonic) the socket has not answered; None while it does
        self.down_since: float | None = None

    async def serve(self) -> None:
        """Serve ``path``: bind a hidden name beside it, start, rename it into place.
        :class:`SocketPathError` (nothing left behind) when the path cannot take it."""
        make_room(self.path, self.flag, self.base)
        hidden = os.path.join(
            os.path.dirname(self.path), f".{os.getpid()}.{next(_hidden_serial)}.sock"
        )
        if len(os.fsencode(hidden)) > MAX_SOCKET_PATH:
            raise SocketPathError(
                self.path,
                f"is in a directory too long for a unix socket ({MAX_SOCKET_PATH} bytes)",
                f"choose a shorter {self.flag}",
            )
        with contextlib.suppress(FileNotFoundError):
            os.unlink(hidden)  # our own leftover (pid reused after a crash)
        server: Server = self.new_server(
            options=SERVER_OPTIONS, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS
        )
        self.add_services(server)
        try:
            port = server.add_insecure_port("unix:" + hidden)
        except RuntimeError as e:
            port, why = 0, f"cannot be bound: {e}"
        else:
            why = "cannot be bound (gRPC refused it)"
        if port == 0:
            await server.stop(None)
            raise SocketPathError(self.path, why, "check the directory's permissions")
        await server.start()
        try:
            os.rename(hidden, self.path)
        except OSError as e:
            await server.stop(None)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(hidden)
            raise SocketPathError(
                self.path,
                f"cannot be put in place: {e.strerror or e}",
                f"remove it (rm -r {self.path}) or choose another {self.flag}",
            ) from e
        self.server = server
        self.file_id = _socket_id(self.path)
        self.down_since = None
        self.log.info("%s: serving %s", self.label, self.path)

    async def close(self, grace: float = 0.5) -> None:
        """Stop the server (``grace`` seconds for running calls); remove the socket only if
        it is still ours."""
        server, self.server = self.server, None
        if server is not None:
            await server.stop(grace)
        if self.file_id is not None and _socket_id(self.path) == self.file_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self.file_id = None

    def changed(self) -> str | None:
        """None while our server serves our socket at ``path``; else what happened to it
        (``"is gone"``, ``"was replaced"``)."""
        now = _socket_id(self.path)
        if self.server is not None and now == self.file_id:
            return None
        return "is gone" if now is None else "was replaced"

    async def restore(self, why: str) -> bool:
        """Serve again (``why`` says what happened, for the log). False when the path cannot
        take the socket yet: logged once per distinct problem, tried again at the next call."""
        try:
            await self.close(0)
            await self.serve()
        except SocketPathError as e:
            if str(e) != self.problem:
                self.log.error("%s: %s: %s", self.label, why, e)
                self.problem = str(e)
            if self.down_since is None:
                self.down_since = time.monotonic()
            return False
        self.problem = ""
        self.log.warning("%s: %s: serving it again", self.label, why)
        return True

    def answers(self) -> str | None:
        """None when our server serves our socket at ``path`` and a client can connect to
        it now (a non-blocking ``connect``, closed at once); else why not."""
        if self.server is None:
            return "is not served"
        what = self.changed()
        if what is not None:
            return what
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK)
        try:
            probe.connect(self.path)
        except BlockingIOError:
            return None  # the listen backlog is full: it listens, the kubelet will get in
        except OSError as e:
            return f"refuses connections ({e.strerror or e})"
        finally:
            probe.close()
        return None

    def unanswered(self, window: float = SOCKET_WINDOW) -> str | None:
        """The ``/healthz`` check: None unless the socket has not answered (:meth:`answers`)
        for more than ``window`` seconds (counted from the first check or failed
        :meth:`restore` that saw it so); then why, with the fix."""
        why = self.answers()
        now = time.monotonic()
        if why is None:
            self.down_since = None
            return None
        if self.down_since is None:
            self.down_since = now
        age = now - self.down_since
        if age <= window:
            return None
        return (
            f"{self.label}: {self.path} {why} for {age:.0f}s (limit {window:g}s): the "
            "kubelet cannot reach this plugin"
            + (f"; the last attempt to serve it again: {self.problem}" if self.problem else "")
        )
