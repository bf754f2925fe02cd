"""vm_translate.balance in one process: two workers' BalancedServers on one listening socket
with a stand-in listener (counts its connections, plain TCP), so the accept rule is seen
without TLS or forks (tests/vm_translate/test_webhook_workers.py has the real command)."""

from __future__ import annotations

import asyncio
import socket
from typing import cast

from tests.vm_translate.streams import close_streams
from tests.waiting import wait_until_async
from vm_translate.balance import BalancedServer, SharedSocket, shared_counts
from vm_translate.listener import Listener


class _Counted(asyncio.Protocol):
    def __init__(self, owner: _Listener) -> None:
        self.owner = owner

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.open_connections -= 1
        if self.owner.counted is not None:
            self.owner.counted()


class _Listener:
    """What BalancedServer uses of vm_translate.listener.Listener."""

    def __init__(self) -> None:
        self.open_connections = 0
        self.counted: object = None

    def protocol(self) -> asyncio.BaseProtocol:
        self.open_connections += 1
        if callable(self.counted):
            self.counted()
        return _Counted(self)


def _pair() -> tuple[socket.socket, list[SharedSocket], list[_Listener]]:
    sock = socket.create_server(("127.0.0.1", 0))
    sock.setblocking(False)
    counts = shared_counts(2)  # each worker its own descriptor of the socket, as after a fork
    return sock, [SharedSocket(sock.dup(), counts, i) for i in (0, 1)], [_Listener(), _Listener()]


async def test_a_worker_ahead_waits_and_a_closed_one_is_not_waited_for() -> None:
    sock, seats, listeners = _pair()
    loop = asyncio.get_running_loop()
    port = sock.getsockname()[1]
    first = BalancedServer(seats[0], cast(Listener, listeners[0]), loop)
    second = BalancedServer(seats[1], cast(Listener, listeners[1]), loop)
    clients: list[asyncio.StreamWriter] = []
    try:
        for n in range(1, 7):  # each new connection goes to a worker with the fewest
            clients.append((await asyncio.open_connection("127.0.0.1", port))[1])
            await wait_until_async(
                lambda n=n: sum(x.open_connections for x in listeners) == n,
                what=f"{n} connections accepted",
            )
            assert abs(listeners[0].open_connections - listeners[1].open_connections) <= 1
        # the first worker stops accepting (its drain) with fewer connections than its peer:
        # the second must not wait for it to catch up
        await close_streams(clients[:1])  # whichever worker held it now has fewer
        await wait_until_async(
            lambda: sum(x.open_connections for x in listeners) == 5, what="one closed"
        )
        low = 0 if listeners[0].open_connections < listeners[1].open_connections else 1
        closing = first if low == 0 else second
        closing.close()
        before = listeners[1 - low].open_connections
        clients.append((await asyncio.open_connection("127.0.0.1", port))[1])
        await wait_until_async(
            lambda: listeners[1 - low].open_connections == before + 1,
            what="the open worker accepted while its closed peer had fewer",
        )
    finally:
        await close_streams(clients)
        for server in (first, second):  # closing twice is harmless
            server.close()
        await first.wait_closed()
        await second.wait_closed()
        sock.close()
