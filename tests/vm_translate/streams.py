"""Closing a test's client connections while its event loop still runs.

``StreamWriter.close()`` does not close the socket: on a TLS stream it starts asyncio's TLS
shutdown (``close_notify``, then the peer's answer), on plain TCP it schedules the close for the
loop's next turn. A test that ends right after ``close()`` closes its event loop first, and the
socket is left to the garbage collector, whose ``ResourceWarning`` ("unclosed transport
<_SelectorSocketTransport fd=21>"; an error under pyproject's ``filterwarnings = error``) then
fails whichever test the worker runs next — far from the test that leaked it::

    await close_streams(writers)        # StreamWriters and plain sockets, in any mix

Each writer is closed and its close awaited (``wait_closed``) for up to ``timeout`` seconds in
all; one whose peer never answers the TLS shutdown is aborted (the socket closed at once, as a
client that gives up does), and the loop turns once more so every socket is closed on return.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Iterable


async def close_streams(
    conns: Iterable[asyncio.StreamWriter | socket.socket], timeout: float = 5
) -> None:
    writers: list[asyncio.StreamWriter] = []
    for conn in conns:
        conn.close()
        if isinstance(conn, asyncio.StreamWriter):
            writers.append(conn)
    if not writers:
        return
    closing = {asyncio.ensure_future(_closed(w)): w for w in writers}
    _, late = await asyncio.wait(closing, timeout=timeout)
    for task in late:
        closing[task].transport.abort()
        task.cancel()
    if late:
        await asyncio.wait(late)
    await asyncio.sleep(0)  # the aborted transports' connection_lost: their sockets close


async def _closed(writer: asyncio.StreamWriter) -> None:
    # the peer may have reset the connection or skipped close_notify: closed all the same
    with contextlib.suppress(OSError, ssl.SSLError):
        await writer.wait_closed()
