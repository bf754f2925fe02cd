"""``vfioctl webhook --workers N``: N serving processes behind one listening socket.

One serving process is one core at most (one event loop, one GIL): at 0.35 ms of CPU a
review it answers ~2,850 reviews/s, and 64 connections in a closed loop wait 64 x 0.35 ms
on average whatever the client does. With ``--workers N`` the process started (the
supervisor) binds and listens, then forks N workers that each accept from that one socket
(the kernel hands each connection to one of those accepting: those with the fewest open
connections, :mod:`vm_translate.balance`) and serve exactly as ``--workers 1`` does
(:func:`vm_translate.webhook.run`): TLS, bounds, certificate and ``--config`` reload (each
worker follows the files itself), drain on SIGTERM. The process tree::

    vfioctl webhook --workers 2          supervisor: signals, node list, no HTTP
    ├── worker 1                         serves the socket
    ├── worker 2                         serves the socket
    └── python -m vm_translate.kube_adapter   (--check-nodes) the ONE node-list child

The node list (``--check-nodes``): the supervisor holds the one
:class:`~vm_translate.kube_adapter.ChildNodeLister` and a :class:`NodeCache` of half of
``--node-cache-seconds``; each worker asks it over its socketpair (a line ``list``; the
answer is the child's line: :func:`~vm_translate.kube_adapter.line_of_nodes`) and keeps
the answer the other half, so a list is at most ``--node-cache-seconds`` old and the API
server is asked as often as with one process.

Connections: a worker with more open connections than its least-loaded peer stops
accepting until the others catch up (:mod:`vm_translate.balance`; the kernel does not
balance a shared socket, and kube-apiserver keeps its connections for long).

Bounds: ``--max-connections`` and ``--body-budget-bytes`` are the replica's; each worker
holds its share (N = 2: 192 connections each). Memory: see
:func:`vm_translate.webhook_limits.worst_case_rss_bytes`.

Shutdown: SIGTERM or SIGINT to the supervisor is sent on to every worker (each drains for
``--shutdown-delay`` and stops); the supervisor exits when all have, after stopping the
node-list child. A worker whose supervisor is gone (its socketpair reads EOF) stops. A
worker that exits on its own makes the supervisor stop the others and exit 1: the kubelet
restarts the container (no half-sized replica left behind).

Metrics: ``GET /metrics`` is answered by the worker the connection landed on, with that
worker's counts only (per worker, not summed): sum over scrapes of different
workers does not give the replica's total. Count reviews at the API server
(``apiserver_admission_webhook_*``) for the replica's total.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import signal
import socket
from collections.abc import Callable

from vfio_dp.model.config import Config
from vm_translate.balance import SharedSocket, shared_counts
from vm_translate.config_watch import ConfigWatch
from vm_translate.errors import NodeCheckError
from vm_translate.kube_adapter import ChildNodeLister, line_of_nodes, nodes_of_line
from vm_translate.nodes import NodeCache, NodeResources
from vm_translate.webhook import BACKLOG, NodeFetch, open_listener, run
from vm_translate.webhook_limits import WebhookSettings

log = logging.getLogger(__name__)

#: seconds the supervisor waits for its workers after the drain, then SIGKILL
STOP_GRACE = 30.0
_LINE_LIMIT = 256 * 1024 * 1024  # the node list's answer line (as ChildNodeLister's)


class SupervisorLink:
    """A worker's end of its socketpair with the supervisor: the node fetch (one
    ``list`` line out, one answer line back, in order) and the supervisor's death (EOF:
    ``gone`` is called)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, sock: socket.socket, gone: Callable[[], None]) -> SupervisorLink:
        reader, writer = await asyncio.open_connection(sock=sock, limit=_LINE_LIMIT)
        link = cls(reader, writer)
        link._task = asyncio.get_running_loop().create_task(link._read(gone))
        return link

    async def _read(self, gone: Callable[[], None]) -> None:
        while line := await self._reader.readline():
            fut = self._waiting.popleft()
            if not fut.done():  # its fetch was cancelled meanwhile
                fut.set_result(line)
        while self._waiting:
            fut = self._waiting.popleft()
            if not fut.done():
                fut.set_exception(NodeCheckError("the webhook's supervisor process is gone"))
        log.error("the webhook's supervisor process is gone: this worker stops")
        gone()

    async def __call__(self) -> list[NodeResources]:
        fut: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        self._writer.write(b"list\n")
        return nodes_of_line(await fut)


def _worker(
    config: ConfigWatch, settings: WebhookSettings, sock: SharedSocket, link: socket.socket
) -> None:
    """A forked worker: serves ``sock`` until SIGTERM/SIGINT or its supervisor's end."""

    async def attach(stop: Callable[[], None]) -> tuple[SharedSocket, NodeFetch | None]:
        to_parent = await SupervisorLink.open(link, stop)
        return sock, to_parent if settings.check_nodes else None

    own = dataclasses.replace(
        settings,
        node_cache_seconds=settings.node_cache_seconds / 2,
        max_connections=settings.share(settings.max_connections),
        body_budget_bytes=settings.share(settings.body_budget_bytes),
    )
    run(config, own, worker=attach)


async def _answer_lists(link: socket.socket, cache: NodeCache | None) -> None:
    """The supervisor's side of one worker's socketpair: a node list line per ``list``."""
    reader, writer = await asyncio.open_connection(sock=link, limit=1024)
    try:
        while await reader.readline():
            got: list[NodeResources] | NodeCheckError
            if cache is None:
                got = NodeCheckError("the node check is off (--check-nodes)")
            else:
                try:
                    got = await cache.get()
                except NodeCheckError as e:
                    got = e
            writer.write(line_of_nodes(got))
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # the worker is gone; its exit is seen by supervise()
    finally:
        writer.close()


async def _supervise(pids: list[int], links: list[socket.socket], settings: WebhookSettings) -> int:
    """Forward SIGTERM/SIGINT, answer the workers' node lists, wait for every worker."""
    loop = asyncio.get_running_loop()
    lister = ChildNodeLister() if settings.check_nodes else None
    cache = NodeCache(lister, settings.node_cache_seconds / 2) if lister else None
    stopping = False
    ended: dict[int, asyncio.Future[int]] = {}
    for pid in pids:
        fd = os.pidfd_open(pid)
        fut = ended[pid] = loop.create_future()

        def reap(pid: int = pid, fd: int = fd, fut: asyncio.Future[int] = fut) -> None:
            loop.remove_reader(fd)
            os.close(fd)
            _, status = os.waitpid(pid, 0)
            fut.set_result(os.waitstatus_to_exitcode(status))

        loop.add_reader(fd, reap)

    def send(sig: int) -> None:
        nonlocal stopping
        stopping = True
        for pid, fut in ended.items():
            if not fut.done():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)

    loop.add_signal_handler(signal.SIGTERM, send, signal.SIGTERM)
    loop.add_signal_handler(signal.SIGINT, send, signal.SIGINT)
    answering = [loop.create_task(_answer_lists(link, cache)) for link in links]
    code = 0
    try:
        done, _ = await asyncio.wait(ended.values(), return_when=asyncio.FIRST_COMPLETED)
        if not stopping:
            first = next(pid for pid, fut in ended.items() if fut in done)
            log.error(
                "webhook worker %d exited (%s) unasked: stopping the others; the container "
                "restarts (its liveness and restartPolicy)",
                first,
                ended[first].result(),
            )
            code = 1
            send(signal.SIGTERM)
        try:
            async with asyncio.timeout(settings.shutdown_delay + STOP_GRACE):
                await asyncio.gather(*ended.values())
        except TimeoutError:
            log.error("webhook workers still running %gs after SIGTERM: killed", STOP_GRACE)
            send(signal.SIGKILL)
            await asyncio.gather(*ended.values())
    finally:
        for task in answering:
            task.cancel()
        await asyncio.gather(*answering, return_exceptions=True)
        if lister is not None:
            await lister.close()
    return code


def run_workers(
    config: Config | ConfigWatch,
    settings: WebhookSettings,
    ready: Callable[[int], None] | None = None,
) -> int:
    """Blocking entry point of ``vfioctl webhook --workers N`` (``settings.workers`` > 1):
    bind, fork the workers, supervise them; the exit code (0 after SIGTERM, 1 when a
    worker died). Each worker holds its share of ``--max-connections`` and
    ``--body-budget-bytes`` (the replica's bounds, and its memory, stay what they say)."""
    workers = settings.workers
    configs = config if isinstance(config, ConfigWatch) else ConfigWatch.fixed(config)
    sock = open_listener(settings)  # PortError before any worker exists
    sock.listen(BACKLOG)
    pids: list[int] = []
    links: list[socket.socket] = []
    counts = shared_counts(workers)  # each worker's open connections (vm_translate.balance)
    for index in range(workers):
        ours, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:  # the worker: no event loop, thread or signal handler was made before
            code = 0
            try:
                ours.close()
                for other in links:
                    other.close()
                _worker(configs, settings, SharedSocket(sock, counts, index), theirs)
            except BaseException:
                log.exception("webhook worker %d failed", os.getpid())
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        theirs.close()
        pids.append(pid)
        links.append(ours)
    log.info("webhook: %d workers %s on one socket", workers, pids)
    if ready is not None:  # connections queue in the backlog until a worker accepts
        ready(int(sock.getsockname()[1]))
    sock.close()  # the workers hold it
    return asyncio.run(_supervise(pids, links, settings))
