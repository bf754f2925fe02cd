"""The mutating admission webhook: an aiohttp HTTPS shell around :mod:`vm_translate.review`.

Routes (HTTPS only)::

    POST /mutate    AdmissionReview admission.k8s.io/v1 → AdmissionReview (200)
                    not an AdmissionReview (not JSON, nested too deep, wrong shape)
                        → 400 {"error": "<reason>"}
                    body over max_body_bytes → 413; body not received in read_timeout → 408
                    large bodies beyond body_budget_bytes being received at once → 503
    GET  /healthz   200 "ok"
    GET  /metrics   Prometheus text: reviews answered by result (allowed, patched, denied),
                    requests refused by HTTP status (400, 408, 413, 500, 503), the time
                    each POST /mutate took (vm_translate.webhook_metrics)

Bounds (each a :class:`WebhookSettings` field and a ``vfioctl webhook`` flag): open
connections and TLS handshake time (:mod:`vm_translate.listener`); headers and idle
keep-alive (``idle_timeout``: aiohttp's keep-alive timer, started at the handshake and after
each response, closes a connection whose next request's headers are not complete by then);
request body size and time; bytes of large bodies (over 32 KiB) received at once; JSON
nesting depth (:mod:`vm_translate.review`). The settings and what they cost in memory at
worst are :mod:`vm_translate.webhook_limits`.

The certificate is re-read when its files change (see :mod:`vm_translate.tls`) and
``--config`` when its file identity changes (:mod:`vm_translate.config_watch`), both as soon
as inotify reports a change in their directories and every ``reload_interval`` seconds. With ``check_nodes``, requested resources are checked against
node allocatable (cached; the Kubernetes client calls run in a child process:
:class:`vm_translate.kube_adapter.ChildNodeLister`); if the API server
cannot be asked, the request is allowed with a warning rather than blocking every VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from vfio_dp.core.metrics import CONTENT_TYPE
from vfio_dp.model.config import Config
from vm_translate.balance import BalancedServer, SharedSocket
from vm_translate.config_watch import ConfigWatch, follow
from vm_translate.errors import NodeCheckError, PortError, ReviewError
from vm_translate.http_log import HttpLog
from vm_translate.kube_adapter import ChildNodeLister
from vm_translate.listener import Listener, ListenerLimits, event_loop, listening_socket
from vm_translate.nodes import NodeCache, NodeResources
from vm_translate.review import decide, parse_review
from vm_translate.tls import ReloadingContext
from vm_translate.webhook_limits import (
    MAX_FIELD_SIZE,
    MAX_HEADERS,
    READ_BUFSIZE,
    SMALL_BODY,
    WebhookSettings,
)
from vm_translate.webhook_metrics import WebhookMetrics, review_result

log = logging.getLogger(__name__)

#: Connections the kernel queues before they are accepted.
BACKLOG = 1024
#: Connections asyncio accepts in one go (its ``backlog`` argument). At the connection cap each
#: accept evicts one connection; accepting hundreds at once would evict connections whose
#: ClientHello is waiting unread. Small batches let the loop read between them.
ACCEPT_BATCH = 16

NodeFetch = Callable[[], Awaitable[list[NodeResources]]]


class _BodyBudget:
    """Bytes of large request bodies being received at once (declared Content-Length)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, n: int) -> bool:
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


@dataclass(slots=True)
class _State:
    configs: ConfigWatch
    settings: WebhookSettings
    nodes: NodeCache | None
    budget: _BodyBudget
    listener: Listener | None = field(default=None)
    metrics: WebhookMetrics = field(default_factory=lambda: WebhookMetrics())
    #: SIGTERM arrived: /healthz says 503 so the Service stops sending, reviews still answered
    draining: bool = False


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


async def _receive(request: web.BaseRequest, state: _State) -> bytes | web.Response:
    """The body, or the error response saying why not (413, 408, 503)."""
    settings = state.settings
    declared = request.content_length
    if declared is not None and declared > settings.max_body_bytes:
        return _error(
            413,
            f"body of {declared} bytes is over the limit of {settings.max_body_bytes} "
            "(--max-body-bytes)",
        )
    reserve = settings.max_body_bytes if declared is None else declared
    if request.content.is_eof():  # all here already (a review comes with its headers)
        return await request.read()  # returns at once: no timer, no budget
    if reserve <= SMALL_BODY:
        reserve = 0
    elif not state.budget.take(reserve):
        return _error(
            503,
            f"too many large request bodies being received at once ({state.budget.used} of "
            f"{state.budget.total} bytes, --body-budget-bytes); retry",
        )
    try:
        async with asyncio.timeout(settings.read_timeout):
            return await request.read()  # raises HTTPRequestEntityTooLarge (413) past the bound
    except TimeoutError:
        return _error(408, f"request body not received within {settings.read_timeout:g}s")
    finally:
        state.budget.give(reserve)


async def _nodes_or_error(cache: NodeCache) -> list[NodeResources] | NodeCheckError:
    """Never raises NodeCheckError: a shielded fetch nobody awaits any more must not leave
    an exception unretrieved."""
    try:
        return await cache.get()
    except NodeCheckError as e:
        return e


async def mutate(request: web.BaseRequest, state: _State) -> web.Response:
    start = time.perf_counter()
    listener = state.listener
    conn = listener.hold(request.protocol) if listener else None
    try:
        response = await _mutate(request, state)
    finally:
        if conn is not None:
            conn.listener.release(conn)
        state.metrics.took(time.perf_counter() - start)
    if response.status != 200:
        state.metrics.refused(response.status)
    return response


async def _mutate(request: web.BaseRequest, state: _State) -> web.Response:
    body = await _receive(request, state)
    if isinstance(body, web.Response):
        return body
    nodes: list[NodeResources] | None = None
    warnings: list[str] = []
    cache = state.nodes
    got: list[NodeResources] | NodeCheckError | None = None
    if cache is not None and (got := cache.peek()) is None:
        wait = state.settings.node_wait  # before parsing: no parsed review held meanwhile
        try:
            async with asyncio.timeout(wait):  # the fetch goes on for later reviews
                got = await asyncio.shield(_nodes_or_error(cache))
        except TimeoutError:
            got = NodeCheckError(f"the node list did not arrive within {wait:g}s")
    if isinstance(got, NodeCheckError):
        log.warning("%s", got)
        warnings.append(f"vfio_dp: device availability not checked: {got}")
    else:
        nodes = got
    try:
        review_request = parse_review(body)
    except ReviewError as e:
        return _error(400, str(e))
    del body
    try:
        answer = decide(review_request, state.configs.config, nodes, warnings)
        text = json.dumps(answer)
        state.metrics.reviewed(review_result(answer))
    except Exception as e:  # a bug, never the caller's fault: name the review, keep serving
        log.exception("internal error answering review uid %r", review_request["uid"][:100])
        return _error(500, f"internal error: {type(e).__name__}; see the webhook's log")
    return web.Response(body=text.encode(), content_type="application/json")


def _get(request: web.BaseRequest, state: _State) -> web.Response:
    if request.path == "/metrics":
        return web.Response(
            body=state.metrics.render().encode(), headers={"Content-Type": CONTENT_TYPE}
        )
    if state.draining:
        return web.Response(status=503, text="draining: shutting down")
    return web.Response(text="ok")


_ROUTES = {"/mutate": ("POST",), "/healthz": ("GET", "HEAD"), "/metrics": ("GET", "HEAD")}


def _server(state: _State, **handler_args: Any) -> web.Server:
    """aiohttp's low-level server (``web.Server``: no application, router or middleware
    chain per request) answering the three routes; other paths 404, other methods 405."""
    settings = state.settings

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        path, method = request.path, request.method
        allowed = _ROUTES.get(path)
        if allowed is None:
            return web.Response(status=404, text="404: Not Found")
        if method not in allowed:
            return web.Response(
                status=405, text="405: Method Not Allowed", headers={"Allow": ",".join(allowed)}
            )
        if method == "POST":
            return await mutate(request, state)
        return _get(request, state)

    def request_of(
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:  # the body's bound: over it, request.read() raises 413
        return web.BaseRequest(
            message, payload, protocol, writer, task, protocol._loop,
            client_max_size=settings.max_body_bytes,
        )  # fmt: skip

    return web.Server(handle, request_factory=request_of, **handler_args)


def open_listener(settings: WebhookSettings) -> socket.socket:
    """The bound socket of ``settings.host``:``settings.port`` (not listening yet), or
    PortError naming the flag."""
    try:
        return listening_socket(settings.host, settings.port)
    except OSError as e:  # one line naming the flag, not a traceback
        raise PortError(
            f"--port {settings.port}: cannot listen on {settings.host or '0.0.0.0'}:"
            f"{settings.port}: {os.strerror(e.errno) if e.errno else e}; another process may hold it "
            f"(ss -ltnp 'sport = :{settings.port}'): pick another --port or stop it"
        ) from e


class Webhook:
    """A started webhook: ``await Webhook.start(...)``, then ``.port``, then ``await .stop()``."""

    def __init__(
        self,
        runner: web.ServerRunner,
        state: _State,
        server: asyncio.Server | BalancedServer,
        tls: ReloadingContext,
        configs: ConfigWatch,
        listener: Listener,
        reloader: asyncio.Task[None],
        lister: ChildNodeLister | None = None,
    ) -> None:
        self._runner = runner
        self._state = state
        self._server = server
        self.tls = tls
        self.configs = configs
        self.listener = listener
        self._reloader = reloader
        self.lister = lister  #: the child process listing nodes (``--check-nodes``)
        self._warm: asyncio.Task[object] | None = None

    @property
    def port(self) -> int:
        return int(self._server.sockets[0].getsockname()[1])

    @classmethod
    async def start(
        cls,
        config: Config | ConfigWatch,
        settings: WebhookSettings,
        node_fetch: NodeFetch | None = None,
        sock: socket.socket | SharedSocket | None = None,
    ) -> Webhook:
        """Serve ``config`` (fixed) or a :class:`ConfigWatch` (followed every reload_interval).
        ``sock``: a bound socket, or a worker's place on the socket it shares with the other
        workers (:mod:`vm_translate.balance`), instead of one of its own; ``node_fetch``:
        where the node list comes from instead of a child of its own."""
        lister = None
        if settings.check_nodes and node_fetch is None:
            node_fetch = lister = ChildNodeLister()
        tls = ReloadingContext(settings.cert_file, settings.key_file)
        fetch = node_fetch if settings.check_nodes else None
        cache = NodeCache(fetch, settings.node_cache_seconds) if fetch else None
        configs = config if isinstance(config, ConfigWatch) else ConfigWatch.fixed(config)
        state = _State(configs, settings, cache, _BodyBudget(settings.body_budget_bytes))
        http = _server(
            state,
            keepalive_timeout=settings.idle_timeout,
            access_log=None,
            logger=HttpLog(log),
            read_bufsize=READ_BUFSIZE,
            auto_decompress=False,  # the API server sends plain JSON; no gzip bombs
            # a header block is held whole until complete: aiohttp's defaults (128 headers of
            # 8 KiB) let one slow client hold 2 MB; the API server sends ~10 short headers
            max_headers=MAX_HEADERS,
            max_field_size=MAX_FIELD_SIZE,
            max_line_size=MAX_FIELD_SIZE,
        )
        runner = web.ServerRunner(http, handle_signals=False)
        await runner.setup()
        assert runner.server is not None
        loop = asyncio.get_running_loop()
        # Our own TLS per connection (vm_translate.listener), not create_server(ssl=...):
        # asyncio's would cost 256 KiB per connection before the handshake.
        listener = Listener(
            runner.server,
            tls.context,
            ListenerLimits(
                settings.max_connections, settings.handshake_timeout, settings.silent_grace
            ),
            loop,
        )
        state.listener = listener
        server: asyncio.Server | BalancedServer
        if isinstance(sock, SharedSocket):  # a worker: accepts while it has the fewest
            server = BalancedServer(sock, listener, loop)
        else:
            try:
                sock = sock or open_listener(settings)
            except PortError:
                await runner.cleanup()
                raise
            server = await loop.create_server(listener.protocol, sock=sock, backlog=ACCEPT_BATCH)
            sock.listen(BACKLOG)  # asyncio accepts up to `backlog` per wakeup: keep that small
        reloader = asyncio.create_task(follow(tls, state.configs, settings.reload_interval))
        log.info(
            "webhook serving https://%s:%d/mutate (at most %d connections)",
            settings.host,
            settings.port,
            settings.max_connections,
        )
        hook = cls(runner, state, server, tls, state.configs, listener, reloader, lister)
        if state.nodes is not None:  # the first list (the child's start) before any review
            hook._warm = asyncio.create_task(_nodes_or_error(state.nodes))
        gc.collect()  # what start-up left behind, then everything it keeps is never scanned
        gc.freeze()  # again by the collector (each full collection walked ~the whole heap)
        return hook

    def drain(self) -> None:
        """Fail /healthz from now on; keep answering reviews until :meth:`stop`."""
        self._state.draining = True

    @property
    def draining(self) -> bool:
        """:meth:`drain` was called."""
        return self._state.draining

    async def stop(self) -> None:
        for task in (self._reloader, self._warm):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._server.close()
        if self.listener.evicted or self.listener.refused:
            log.info(
                "connections evicted at the cap: %d %s; refused: %d",
                self.listener.evicted,
                self.listener.evicted_by,
                self.listener.refused,
            )
        await self._runner.cleanup()  # lets requests being answered finish
        self.listener.close_all()  # what is left: handshakes, idle keep-alive
        await self._server.wait_closed()
        if self.lister is not None:
            await self.lister.close()
        gc.unfreeze()


async def serve(
    config: Config | ConfigWatch,
    settings: WebhookSettings,
    ready: Callable[[int], None] | None = None,
    started: Callable[[Webhook], None] | None = None,
    node_fetch: NodeFetch | None = None,
    sock: socket.socket | SharedSocket | None = None,
) -> None:
    """Run until cancelled (SIGTERM/SIGINT under :func:`run`)."""
    hook = await Webhook.start(config, settings, node_fetch, sock)
    if started is not None:
        started(hook)
    if ready is not None:
        ready(hook.port)
    try:
        await asyncio.Event().wait()
    finally:
        await hook.stop()


def run(
    config: Config | ConfigWatch,
    settings: WebhookSettings,
    ready: Callable[[int], None] | None = None,
    worker: Callable[[Callable[[], None]], Awaitable[tuple[SharedSocket, NodeFetch | None]]]
    | None = None,
) -> None:
    """Blocking entry point for ``vfioctl webhook``; returns on SIGTERM / Ctrl-C.
    ``worker``: this process is one of :mod:`vm_translate.workers`' serving processes; called
    in its loop with the function that stops it (its supervisor is gone), it gives its place
    on the shared listening socket and the node fetch."""
    import signal

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        hooks: list[Webhook] = []
        def stop() -> None:
            task.cancel()

        sock, fetch = await worker(stop) if worker else (None, None)

        def terminate() -> None:
            if settings.shutdown_delay <= 0 or not hooks or loop.is_closed():
                task.cancel()
            elif not hooks[0].draining:  # a second SIGTERM changes nothing
                hooks[0].drain()
                log.info("SIGTERM: draining for %g s, then stopping", settings.shutdown_delay)
                loop.call_later(settings.shutdown_delay, task.cancel)

        loop.add_signal_handler(signal.SIGTERM, terminate)
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(config, settings, ready, hooks.append, fetch, sock)

    with asyncio.Runner(loop_factory=event_loop) as runner:  # uvloop's where installed
        runner.run(main())
