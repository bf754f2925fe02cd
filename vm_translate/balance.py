"""Connections balanced over ``vfioctl webhook --workers N``: a worker with more open
connections than its least-loaded peer stops accepting until the others catch up.

Why: N workers accepting from one listening socket (:mod:`vm_translate.workers`) get the
connections the kernel hands them, which it does not balance: the worker whose event loop
wakes first takes a burst (asyncio accepts up to 16 at a wake-up). Measured under row 4's
closed loop (``wrk -c 64``): 37/27, 48/16. kube-apiserver keeps its keep-alive connections
to a webhook for long, so the split a replica gets at its start stays: the worker with the
most connections queues the most, and the replica's p99 is that worker's.

How: the supervisor maps one shared page before forking (:func:`shared_counts`: one signed
64-bit count per worker; each worker writes only its own, every worker reads all). A worker
counts its open connections (:class:`vm_translate.listener.Listener`'s) plus those it has
accepted and not yet handed to the listener, and accepts one connection at a time while its
count is the lowest (ties: every tied worker accepts; the kernel gives the connection to
one). A worker above the lowest takes its socket out of its event loop and looks again every
:data:`RECHECK` seconds, or at once when one of its own connections closes. The worker with
the lowest count always accepts, so a connection never waits for a paused one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import socket
from dataclasses import dataclass

from vm_translate.listener import Listener

log = logging.getLogger(__name__)

#: seconds between a paused worker's looks at its peers' counts
RECHECK = 0.01
_SLOT = 8  # bytes of one worker's count (a signed 64-bit integer)
#: the count of a worker that stopped accepting (its drain, its stop)
CLOSED = 2**62


def shared_counts(workers: int) -> memoryview:
    """One count per worker in an anonymous shared mapping: made before ``os.fork``, so
    every worker maps the same page."""
    return memoryview(mmap.mmap(-1, _SLOT * workers)).cast("q")


@dataclass(frozen=True, slots=True)
class SharedSocket:
    """Worker ``index``'s place on the listening ``sock`` it shares with its peers, whose
    open-connection counts are ``counts``."""

    sock: socket.socket
    counts: memoryview
    index: int

    def may_accept(self) -> bool:
        return self.counts[self.index] <= min(self.counts)


class BalancedServer:
    """Accepts from a :class:`SharedSocket` while this worker has the fewest connections;
    the connections go to ``listener`` as ``loop.create_server(listener.protocol)``'s would
    (``sockets``, ``close`` and ``wait_closed`` as :class:`asyncio.Server`'s); the listener
    tells it when a connection is made or gone (``Listener.counted``)."""

    def __init__(
        self, seat: SharedSocket, listener: Listener, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.seat = seat
        self.sockets = [seat.sock]
        self._listener = listener
        self._loop = loop
        self._accepted = 0  # accepted, protocol not made yet
        self._reading = False
        self._recheck: asyncio.TimerHandle | None = None
        self._handing: set[asyncio.Task[None]] = set()
        self._closed = False
        listener.counted = self.publish
        self.publish()
        self._resume()

    def publish(self) -> None:
        """Write this worker's count; a paused worker whose count is now the lowest
        accepts again. Called by the listener at each connection made or gone."""
        if self._closed:  # its peers must not wait for it: it accepts no more
            return
        self.seat.counts[self.seat.index] = self._listener.open_connections + self._accepted
        if not self._reading and self.seat.may_accept():
            self._resume()

    def _resume(self) -> None:
        if self._recheck is not None:
            self._recheck.cancel()
            self._recheck = None
        if self._closed:
            return
        if not self.seat.may_accept():
            self._recheck = self._loop.call_later(RECHECK, self._resume)
            return
        if not self._reading:
            self._loop.add_reader(self.seat.sock.fileno(), self._readable)
            self._reading = True

    def _pause(self) -> None:
        if self._reading:
            self._loop.remove_reader(self.seat.sock.fileno())
            self._reading = False
        self._recheck = self._loop.call_later(RECHECK, self._resume)

    def _readable(self) -> None:
        while self.seat.may_accept():
            try:
                conn, _ = self.seat.sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return  # a peer took it, or it went away in the backlog
            except OSError as e:  # EMFILE and the like: as asyncio, wait a second
                log.error("accepting a connection failed: %s; retrying in 1 s", e)
                self._pause()
                if self._recheck is not None:
                    self._recheck.cancel()
                self._recheck = self._loop.call_later(1.0, self._resume)
                return
            conn.setblocking(False)
            self._accepted += 1
            self.publish()
            task = self._loop.create_task(self._hand(conn))
            self._handing.add(task)
            task.add_done_callback(self._handing.discard)
        self._pause()

    async def _hand(self, conn: socket.socket) -> None:
        made = False

        def protocol() -> asyncio.BaseProtocol:
            nonlocal made
            made = True
            self._accepted -= 1
            return self._listener.protocol()  # which publishes the new count

        try:
            await self._loop.connect_accepted_socket(protocol, conn)
        except OSError as e:  # reset before its transport was made
            log.debug("an accepted connection failed at once: %s", e)
            conn.close()
        finally:
            if not made:
                self._accepted -= 1
                self.publish()

    def close(self) -> None:
        """Stop accepting (this worker's socket closed; its connections stay). Its count
        becomes the highest possible, so a peer never waits for it to catch up."""
        self._closed = True
        self.seat.counts[self.seat.index] = CLOSED
        if self._recheck is not None:
            self._recheck.cancel()
        if self._reading:
            self._loop.remove_reader(self.seat.sock.fileno())
            self._reading = False
        self.seat.sock.close()

    async def wait_closed(self) -> None:
        for task in list(self._handing):
            with contextlib.suppress(asyncio.CancelledError):
                await task
