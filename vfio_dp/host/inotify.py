"""Being told when a directory changes (Linux inotify), with polling as the fallback.

The node processes watch a few directories for entries that come, go or are renamed: the
kubelet's device-plugin directory (``kubelet.sock`` re-created, our sockets wiped), the DRA
plugin's ``<plugins>/<driver>/`` and ``<registry>/`` (its two sockets), the directories of
``--config`` (a ConfigMap swaps its ``..data`` symlink; an edit closes the file). The
webhook watches its config's and certificate's directories the same way. Instead of looking
four times a second, a :class:`DirWatcher` sleeps until the kernel reports an event in one
of them (``IN_CREATE``, ``IN_DELETE``, ``IN_MOVED_FROM``/``TO``, ``IN_CLOSE_WRITE``,
``IN_ATTRIB``, and the directory's own deletion or move), read through the ``inotify_simple``
library (a thin, maintained ``ctypes`` wrapper: no compiler, no dependencies) from the
asyncio loop (``loop.add_reader``).

Polling stays the fallback, every ``poll`` seconds, while inotify cannot be had: no
inotify instance (``EMFILE``: ``fs.inotify.max_user_instances``), no watch
(``ENOSPC``: ``fs.inotify.max_user_watches``), or a directory that is not there (yet, or
any more: its watch ends with it). Each fallback look tries to watch again. With every watch
in place the caller still looks every ``safety`` seconds, in case a change escaped the
kernel's report (an event queue overflow says so and is treated as a change).

What a change is, is the caller's business: :meth:`DirWatcher.changed` only says when to
look again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Iterable

from inotify_simple import INotify, flags  # type: ignore[import-untyped]

log = logging.getLogger("vfio_dp.host")

#: a directory's entries came, went or were renamed, a file in it was written or its
#: attributes changed; the directory itself went away
MASK = (
    flags.CREATE
    | flags.DELETE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.CLOSE_WRITE
    | flags.ATTRIB
    | flags.DELETE_SELF
    | flags.MOVE_SELF
)
#: the kernel dropped the watch (its directory is gone) or dropped events (queue overflow)
_REARM = flags.IGNORED | flags.DELETE_SELF | flags.MOVE_SELF | flags.Q_OVERFLOW


class DirWatcher:
    """Waits for a change in any of ``directories()`` (evaluated at every (re)arming: a
    config path's resolved directory moves with each ConfigMap update)."""

    def __init__(
        self,
        directories: Callable[[], Iterable[str]],
        *,
        poll: float,
        safety: float,
        label: str = "",
    ) -> None:
        self.directories = directories
        self.poll = poll
        self.safety = safety
        self.label = label
        self._inotify: INotify | None = None
        self._watched: dict[int, str] = {}  # wd -> directory
        self._missing: str | None = None  # why a directory is not watched (fallback)
        self._ready: asyncio.Event | None = None
        self._rearm = False  # a watch ended or events were lost: watch again
        self._loop: asyncio.AbstractEventLoop | None = None
        self._said = ""

    @property
    def notified(self) -> bool:
        """True while every directory is watched by inotify (False: polling)."""
        return self._inotify is not None and self._missing is None

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ready = asyncio.Event()
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as e:
            self._say(f"no inotify instance ({e.strerror or e}): looking every {self.poll:g}s")
            return
        self._loop.add_reader(self._inotify.fileno(), self._on_readable)
        self._arm()

    def _arm(self) -> None:
        """Watch every directory (again); a failure leaves this watcher polling."""
        assert self._inotify is not None
        self._missing = None
        for d in dict.fromkeys(self.directories()):
            try:
                self._watched[self._inotify.add_watch(d, MASK)] = d
            except OSError as e:
                self._missing = f"{d}: {e.strerror or e}"
        if self._missing is not None:
            self._say(f"cannot watch {self._missing}: looking every {self.poll:g}s")
        else:
            self._said = ""

    def _say(self, what: str) -> None:
        if what != self._said:
            log.info("%s%s", f"{self.label}: " if self.label else "", what)
            self._said = what

    def _on_readable(self) -> None:
        """Read every pending event at once (the descriptor stays readable until then, and
        the loop would call us again and again); wake :meth:`changed`."""
        assert self._inotify is not None and self._ready is not None
        try:
            events = self._inotify.read(timeout=0)
        except (BlockingIOError, OSError):
            events = []
        for e in events:
            if e.mask & _REARM:
                self._rearm = True
                if e.mask & flags.IGNORED:
                    self._watched.pop(e.wd, None)
        self._ready.set()

    async def changed(self, *, soon: bool = False) -> None:
        """Return when it is time to look again: after an event, or ``poll`` seconds when
        polling or when ``soon`` (the caller's last look left something to retry), or
        ``safety`` seconds at most."""
        if self._loop is None:
            self._start()
            return  # a change before the watches were set is seen by this first look
        if self._inotify is None:
            await asyncio.sleep(self.poll)
            return
        assert self._ready is not None
        if self._missing is None and not self._rearm:
            try:
                async with asyncio.timeout(self.poll if soon else self.safety):
                    await self._ready.wait()
            except TimeoutError:
                pass
        else:
            await asyncio.sleep(self.poll)
        self._ready.clear()  # what arrives from now on wakes the next call
        if self._rearm or self._missing is not None:
            self._rearm = False
            self._arm()

    async def run(self, check: Callable[[], Awaitable[bool | None]], log: logging.Logger) -> None:
        """Await ``check()`` now and whenever :meth:`changed` says, until cancelled; a
        ``check()`` returning False (something to retry) or raising (logged to ``log``) is
        looked at again ``poll`` seconds later. Closes the watcher at the end."""
        settled = True
        try:
            while True:
                await self.changed(soon=not settled)
                try:
                    settled = await check() is not False
                except Exception:
                    log.exception("%s", self.label)
                    settled = False
        finally:
            self.close()

    def close(self) -> None:
        if self._inotify is not None:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None


def config_dirs(path: str | None) -> list[str]:
    """The directories whose changes may change the file ``path`` resolves to: its own
    directory (a ConfigMap's ``..data`` swap, a replacement) and the one it resolves into
    (an edit in place)."""
    if path is None:
        return []
    here = os.path.dirname(os.path.abspath(path))
    there = os.path.dirname(os.path.realpath(path))
    return [here] if there == here else [here, there]
