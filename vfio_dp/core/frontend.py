"""What every kubelet front-end shares around the node core: its options, start/stop, signals.

A front-end (the device plugin in :mod:`vfio_dp.deviceplugin`, the DRA plugin in
:mod:`vfio_dp.dra`, a third one tomorrow) is a :class:`FrontEnd` over one
:class:`~vfio_dp.core.node.NodeCore`:

- its options derive from :class:`~vfio_dp.core.options.FrontEndOptions` (the core's flags,
  mapped once to the core's options);
- it implements ``start`` and :meth:`FrontEnd.withdraw` (what it takes down at stop); the
  rest is here: :meth:`FrontEnd.request_stop` / :meth:`FrontEnd.wait_stopped`, an idempotent
  :meth:`FrontEnd.stop` (stop scanning, cancel the front-end's loops, withdraw, close the
  core), loops that run a check at an interval or when a directory changes
  (:meth:`FrontEnd.watch`: inotify, polling as the fallback) and log its failures;
- ``/healthz`` fails when one of its kubelet-facing sockets (:meth:`FrontEnd.served_sockets`)
  has not answered for :attr:`FrontEnd.socket_window` seconds
  (:meth:`vfio_dp.core.sockets.SocketServer.unanswered`);
- :func:`serve` runs it as the process does: SIGTERM/SIGINT stop it cleanly (exit 0),
  also while it is still starting (the start is cancelled), SIGUSR1 rescans.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

from vfio_dp.core.node import WATCH_POLL, WATCH_SAFETY, NodeCore
from vfio_dp.core.sockets import SOCKET_WINDOW, SocketServer
from vfio_dp.host.inotify import DirWatcher


class FrontEnd:
    """Start/stop of a front-end over ``core``; a subclass adds ``start`` and :meth:`withdraw`."""

    def __init__(self, core: NodeCore, log: logging.Logger) -> None:
        self.core = core
        self.host = core.host
        self.metrics = core.metrics
        self.log = log
        self._stop_requested = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._watchers: list[DirWatcher] = []
        self._stopping = False
        #: seconds a kubelet-facing socket may stay unanswered before /healthz fails
        self.socket_window = SOCKET_WINDOW
        core.health_checks.append(self._sockets_answer)

    def served_sockets(self) -> Sequence[SocketServer]:
        """The kubelet-facing sockets this front-end serves now (its ``/healthz`` checks)."""
        return ()

    def _sockets_answer(self) -> str | None:
        for server in self.served_sockets():
            why = server.unanswered(self.socket_window)
            if why is not None:
                return why
        return None

    async def start(self) -> None:
        raise NotImplementedError

    async def withdraw(self) -> None:
        """Take down what this front-end serves (sockets, streams); the core is closed after."""
        raise NotImplementedError

    def request_stop(self) -> None:
        self._stop_requested.set()

    async def wait_stopped(self) -> None:
        await self._stop_requested.wait()

    def kick(self, reason: str) -> None:
        """Rescan soon (a uevent, SIGUSR1)."""
        self.core.kick(reason)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` until :meth:`stop` cancels it."""
        self._tasks.append(asyncio.create_task(coro, name=name))

    def watch(
        self,
        directories: Callable[[], Iterable[str]],
        check: Callable[[], Awaitable[bool]],
        name: str,
    ) -> None:
        """Await ``check()`` whenever an entry of one of ``directories()`` comes, goes or is
        renamed (inotify: :class:`vfio_dp.host.inotify.DirWatcher`), at least every
        :data:`WATCH_SAFETY` seconds, and every :data:`WATCH_POLL` seconds while inotify
        cannot watch them or while ``check()`` returns False (something to retry). A
        failure is logged (and retried), never fatal."""
        watcher = DirWatcher(directories, poll=WATCH_POLL, safety=WATCH_SAFETY, label=name)
        self._watchers.append(watcher)
        self.spawn(watcher.run(check, self.log), name)

    def repeat(self, interval: float, check: Callable[[], Awaitable[object]], name: str) -> None:
        """Every ``interval`` seconds await ``check()``; a failure is logged, never fatal."""

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await check()
                except Exception:
                    self.log.exception("%s", name)

        self.spawn(loop(), name)

    async def stop(self) -> None:
        """Stop scanning, cancel the loops, :meth:`withdraw`, close the core. Unbinds nothing;
        a second call does nothing."""
        if self._stopping:
            return
        self._stopping = True
        self.core.begin_stop()
        for t in self._tasks:
            t.cancel()
        for w in self._watchers:
            w.close()
        await self.withdraw()
        await self.core.close()
        self.log.info("stopped")


async def serve(front: FrontEnd) -> int:
    """Run ``front`` until SIGTERM/SIGINT; 0 on a clean stop. SIGUSR1 rescans. A signal
    that comes while ``front.start()`` still runs cancels it (an API call it awaits is cut
    off), then stops as usual."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, front.request_stop)
    loop.add_signal_handler(signal.SIGUSR1, front.kick, "SIGUSR1")
    starting = asyncio.ensure_future(front.start())
    stopped = asyncio.ensure_future(front.wait_stopped())
    try:
        # a stop requested while starting cuts the start off (a call it awaits is cancelled)
        await asyncio.wait((starting, stopped), return_when=asyncio.FIRST_COMPLETED)
        if not starting.done():
            front.log.info("stop requested while starting: the start is cut off")
            starting.cancel()
            await asyncio.wait((starting,))  # serve's own cancel is never swallowed here
        else:
            starting.result()  # a failed start raises
            await stopped
    finally:
        starting.cancel()
        stopped.cancel()
        await front.stop()
    return 0
