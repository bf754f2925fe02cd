"""The webhook's HTTPS listener: TLS with bounded memory per connection and a connection cap.

Why not ``loop.create_server(ssl=ctx)``: asyncio's TLS layer (``asyncio.sslproto.SSLProtocol``)
gives EVERY accepted connection its own 256 KiB receive buffer (``SSLProtocol.max_size``),
allocated and zero-filled at accept, before the handshake. Measured on this project's webhook
(Python 3.11, aiohttp 3.14): 280-310 KB of RSS per open connection, whether bare TCP (no
ClientHello ever sent), idle TLS or slow headers; 600 connections outgrew the Deployment's
192Mi limit. The buffer is only the target of ``recv_into`` and is copied into the
connection's ``ssl.MemoryBIO`` at once (``buffer_updated``), so one buffer per listener serves
every connection of the (single-threaded) event loop. What stays per connection: 26 KB
after a handshake, 50 KB for bare TCP (measured RSS); of that, 7-9 KB is Python heap
(tracemalloc: asyncio's transport and SSLProtocol, aiohttp's handler) and the rest OpenSSL's
SSL object and buffers, larger before the handshake (asyncio starts it at accept).

Bounds applied here (:class:`ListenerLimits` fields; the first two are ``vfioctl webhook``
flags)::

    max_connections     open connections; at the cap a new one evicts one that is not
                        being answered, in this order: one that has sent nothing for
                        ``silent_grace`` seconds (bare TCP); else the least recently active one
                        past its handshake (idle keep-alive, headers not complete); else
                        the oldest handshake older than ``silent_grace``. A real client sends
                        its ClientHello and its request at once and is the last to go. If
                        none qualifies, the NEW connection is closed (load is shed at the
                        door, not from connections already under way).
    handshake_timeout   seconds for the TLS handshake (asyncio's default is 60)
    silent_grace        0.25 s: how long a new connection is protected from eviction

Header and idle keep-alive time are bounded by aiohttp's keep-alive timer (see
:mod:`vm_translate.webhook`): it starts when the handshake completes and again after each
response, and closes a connection whose next request's headers have not all arrived.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from asyncio import sslproto
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

#: Largest plaintext of one TLS record: what one ``SSLObject.read`` hands the HTTP parser.
READ_CHUNK = 16 * 1024
#: The one receive buffer of a listener (one ``recv_into`` per readable socket).
RECV_BUFFER = 256 * 1024
#: Ciphertext a connection may hold undecrypted while its HTTP side does not read
#: (asyncio's default is 256 KiB per connection).
INCOMING_HIGH_WATER = 32 * 1024
#: Measured RSS of one open connection, rounded up: 26 KB idle TLS, 50 KB bare TCP (OpenSSL's
#: handshake state, asyncio's transport and protocol, aiohttp's handler), 104 KB holding an
#: incomplete header block at the webhook's header limits (24 headers of 1 KiB).
CONNECTION_RSS = 128 * 1024


@dataclass(frozen=True, slots=True)
class ListenerLimits:
    max_connections: int = 384
    handshake_timeout: float = 5.0
    silent_grace: float = 0.25


class _TlsConnection(sslproto.SSLProtocol):
    """asyncio's server-side TLS protocol with the listener's shared receive buffer.

    ``busy`` counts requests being answered on it; ``raw`` is the TCP transport.
    """

    max_size = READ_CHUNK  # also what __init__ allocates before we swap in the shared buffer

    def __init__(
        self, listener: Listener, app_protocol: asyncio.BaseProtocol, context: ssl.SSLContext
    ) -> None:
        # No waiter: nobody awaits the handshake (a future failed and never awaited would be
        # logged as "exception was never retrieved"); asyncio accepts None here. The
        # timeout is a float in asyncio, an int in typeshed's stub.
        super().__init__(
            listener.loop,
            app_protocol,
            context,
            None,  # type: ignore[arg-type]
            server_side=True,
            ssl_handshake_timeout=listener.limits.handshake_timeout,  # type: ignore[arg-type]
        )
        # asyncio internals (3.11-3.13): SSLProtocol.get_buffer() hands out _ssl_buffer_view
        # and buffer_updated() copies from it at once. tests/vm_translate checks they are
        # used (and the RSS per connection), so a Python that changes them is noticed.
        self._ssl_buffer = listener.recv_buffer
        self._ssl_buffer_view = listener.recv_view
        self._set_read_buffer_limits(high=INCOMING_HIGH_WATER)  # type: ignore[attr-defined]
        self.listener = listener
        self.app = app_protocol
        self.raw: asyncio.BaseTransport | None = None
        self.busy = 0
        self.heard = False  # any byte received
        self._shaken = False  # handshake done (seen)
        self.accepted_at = listener.loop.time()
        self._evicted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport
        super().connection_made(transport)
        if self._evicted:  # evicted between accept and now (asyncio accepts in bursts)
            self.evict()

    def buffer_updated(self, nbytes: int) -> None:
        self.heard = True
        if self._shaken:
            super().buffer_updated(nbytes)
            return
        super().buffer_updated(nbytes)  # may complete the handshake
        if self.handshake_done:
            self._shaken = True
            self.listener.touch(self)  # its request comes next: keep it longest

    @property
    def handshake_done(self) -> bool:
        return getattr(self.app, "transport", None) is not None  # aiohttp sets it then

    def connection_lost(self, exc: BaseException | None) -> None:
        self.listener.forget(self)
        super().connection_lost(exc)

    def evict(self) -> None:
        self._evicted = True
        if isinstance(self.raw, asyncio.Transport):
            self.raw.abort()


class _Refused(asyncio.Protocol):
    """Closes a connection the listener has no room for."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if isinstance(transport, asyncio.Transport):
            transport.abort()
        else:  # pragma: no cover - a stream server always gives a Transport
            transport.close()


class Listener:
    """The protocol factory of the webhook's server socket; tracks every open connection.

    ``loop.create_server(listener.protocol, host, port)`` — with NO ``ssl=`` argument: each
    connection's TLS is the :class:`_TlsConnection` this factory returns.
    """

    def __init__(
        self,
        app_factory: Callable[[], asyncio.BaseProtocol],
        context: ssl.SSLContext,
        limits: ListenerLimits,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.app_factory = app_factory
        self.context = context
        self.limits = limits
        self.loop = loop
        self.recv_buffer = bytearray(RECV_BUFFER)
        self.recv_view = memoryview(self.recv_buffer)
        #: open connections, least recently active first
        self._open: OrderedDict[_TlsConnection, None] = OrderedDict()
        self._by_app: dict[asyncio.BaseProtocol, _TlsConnection] = {}
        self.evicted = 0
        self.refused = 0
        #: evictions by what the connection was doing: silent, idle, handshaking, young
        self.evicted_by: dict[str, int] = {}
        #: called when a connection is added or gone (vm_translate.balance publishes the count)
        self.counted: Callable[[], None] | None = None

    @property
    def open_connections(self) -> int:
        return len(self._open)

    def protocol(self) -> asyncio.BaseProtocol:
        """A new connection's protocol (called by asyncio at each accept)."""
        if len(self._open) >= self.limits.max_connections and not self._evict_one():
            self.refused += 1
            if self.refused == 1 or self.refused % 1000 == 0:
                log.warning(
                    "refused a connection: all %d allowed connections are answering requests "
                    "or just opened (refused %d so far; raise --max-connections if this is "
                    "real load)",
                    self.limits.max_connections,
                    self.refused,
                )
            return _Refused()
        app = self.app_factory()
        conn = _TlsConnection(self, app, self.context)
        self._open[conn] = None
        self._by_app[app] = conn
        if self.counted is not None:
            self.counted()
        return conn

    def _victim(self) -> tuple[_TlsConnection, str] | None:
        """The connection to close for a new one, or None (then the new one is refused).

        Connections younger than ``silent_grace`` that are not idle yet are never chosen: a
        young one may have its ClientHello waiting unread (asyncio accepts several at once
        before it reads any), and when connections arrive faster than handshakes are done,
        shedding the NEW ones keeps those already under way (a real client among them)
        going."""
        idle: _TlsConnection | None = None
        handshaking: _TlsConnection | None = None
        grace = self.loop.time() - self.limits.silent_grace
        for conn in self._open:  # least recently active first
            if conn.busy:
                continue
            if conn.handshake_done:
                idle = idle or conn
            elif conn.accepted_at <= grace:
                if not conn.heard:
                    return conn, "silent"
                handshaking = handshaking or conn
        if idle is not None:
            return idle, "idle"
        if handshaking is not None:
            return handshaking, "handshaking"
        return None

    def _evict_one(self) -> bool:
        victim = self._victim()
        if victim is None:
            return False
        conn, why = victim
        self.evicted_by[why] = self.evicted_by.get(why, 0) + 1
        self.forget(conn)  # now, not at connection_lost: the count must drop at once
        conn.evict()
        self.evicted += 1
        if self.evicted == 1 or self.evicted % 1000 == 0:
            log.warning(
                "connection cap %d reached: closed an idle connection (%d so far; raise "
                "--max-connections if this is real load)",
                self.limits.max_connections,
                self.evicted,
            )
        return True

    def forget(self, conn: _TlsConnection) -> None:
        self._open.pop(conn, None)
        self._by_app.pop(conn.app, None)
        if self.counted is not None:
            self.counted()

    def touch(self, conn: _TlsConnection) -> None:
        """``conn`` made progress: it becomes the last candidate for eviction."""
        if conn in self._open:
            self._open.move_to_end(conn)

    def hold(self, app_protocol: asyncio.BaseProtocol | None) -> _TlsConnection | None:
        """A request on this connection is being answered: it is not evicted until
        :meth:`release` (call it in a ``finally``). None: not a connection of ours."""
        conn = self._by_app.get(app_protocol) if app_protocol is not None else None
        if conn is not None:
            conn.busy += 1
        return conn

    def release(self, conn: _TlsConnection) -> None:
        """The request :meth:`hold` counted is answered."""
        conn.busy -= 1
        self.touch(conn)

    def close_all(self) -> None:
        for conn in list(self._open):
            self.forget(conn)
            conn.evict()


def event_loop() -> asyncio.AbstractEventLoop:
    """A serving process's event loop: uvloop's (its event loop and socket transports are
    C: ~10-15 % less CPU a review than asyncio's under row 4's closed loop (docs/performance.md);
    the TLS stays :class:`_TlsConnection`, asyncio's Python ``SSLProtocol``); asyncio's own,
    with a warning, where uvloop is not installed (a platform without its wheel)."""
    try:
        import uvloop
    except ImportError:
        log.warning(
            "uvloop is not installed (pip install 'uvloop>=0.19', a dependency of vfio_dp): "
            "serving on asyncio's event loop, ~10-15 % more CPU a review"
        )
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def listening_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # IPv4 too
        sock.bind(addr)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
