"""The mutating admission webhook: an aiohttp HTTPS shell around :mod:`vm_translate.review`.

Routes (HTTPS only)::

    POST /mutate    AdmissionReview admission.k8s.io/v1 → AdmissionReview (200)
                    not an AdmissionReview → 400 {"error": "<reason>"}
                    body over max_body_bytes → 413; body not received in read_timeout → 408
    GET  /healthz   200 "ok"

Bounds: request body size (``client_max_size``), time to receive a body, TLS handshake time,
idle keep-alive time. The certificate is re-read when its files change (see
:mod:`vm_translate.tls`). With ``check_nodes``, requested resources are checked against node
allocatable (cached; the Kubernetes client call runs in a thread); if the API server cannot
be asked, the request is allowed with a warning rather than blocking every VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from vfio_dp.model.config import Config
from vm_translate.errors import NodeCheckError, ReviewError
from vm_translate.nodes import NodeCache, NodeResources
from vm_translate.review import decide, parse_review
from vm_translate.tls import ReloadingContext

log = logging.getLogger(__name__)

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    cert_file: str
    key_file: str
    host: str = "0.0.0.0"
    port: int = 8443
    max_body_bytes: int = MIB
    read_timeout: float = 10.0
    handshake_timeout: float = 10.0
    keepalive_timeout: float = 75.0
    reload_interval: float = 10.0
    check_nodes: bool = False
    node_cache_seconds: float = 30.0


NodeFetch = Callable[[], Awaitable[list[NodeResources]]]


@dataclass(frozen=True, slots=True)
class _State:
    config: Config
    settings: WebhookSettings
    nodes: NodeCache | None


_STATE: web.AppKey[_State] = web.AppKey("vfio_dp_webhook", _State)


def _error(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


async def mutate(request: web.Request) -> web.Response:
    state = request.app[_STATE]
    settings = state.settings
    try:
        async with asyncio.timeout(settings.read_timeout):
            body = await request.read()  # raises HTTPRequestEntityTooLarge (413) past the bound
    except TimeoutError:
        return _error(408, f"request body not received within {settings.read_timeout:g}s")
    try:
        review_request = parse_review(body)
    except ReviewError as e:
        return _error(400, str(e))
    nodes: list[NodeResources] | None = None
    warnings: list[str] = []
    cache = state.nodes
    if cache is not None:
        try:
            nodes = await cache.get()
        except NodeCheckError as e:
            log.warning("%s", e)
            warnings.append(f"vfio_dp: device availability not checked: {e}")
    answer = decide(review_request, state.config, nodes, warnings)
    return web.Response(body=json.dumps(answer).encode(), content_type="application/json")


async def healthz(_request: web.Request) -> web.Response:
    return web.Response(text="ok")


def make_app(
    config: Config, settings: WebhookSettings, node_fetch: NodeFetch | None = None
) -> web.Application:
    """The aiohttp application (no socket yet). ``node_fetch`` enables the capacity check."""
    app = web.Application(client_max_size=settings.max_body_bytes)
    cache = NodeCache(node_fetch, settings.node_cache_seconds) if node_fetch else None
    app[_STATE] = _State(config, settings, cache)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    return app


async def _threaded_list_nodes() -> list[NodeResources]:
    from vm_translate import kube_adapter  # imports the kubernetes client on first use

    return await asyncio.to_thread(kube_adapter.list_nodes)


class Webhook:
    """A started webhook: ``await Webhook.start(...)``, then ``.port``, then ``await .stop()``."""

    def __init__(
        self,
        runner: web.AppRunner,
        server: asyncio.Server,
        tls: ReloadingContext,
        reloader: asyncio.Task[None],
    ) -> None:
        self._runner = runner
        self._server = server
        self.tls = tls
        self._reloader = reloader

    @property
    def port(self) -> int:
        return int(self._server.sockets[0].getsockname()[1])

    @classmethod
    async def start(
        cls, config: Config, settings: WebhookSettings, node_fetch: NodeFetch | None = None
    ) -> Webhook:
        if settings.check_nodes and node_fetch is None:
            node_fetch = _threaded_list_nodes
        tls = ReloadingContext(settings.cert_file, settings.key_file)
        app = make_app(config, settings, node_fetch if settings.check_nodes else None)
        runner = web.AppRunner(app, keepalive_timeout=settings.keepalive_timeout, access_log=None)
        await runner.setup()
        assert runner.server is not None
        # Our own listener instead of web.TCPSite: TCPSite cannot bound the TLS handshake.
        server = await asyncio.get_running_loop().create_server(
            runner.server,
            settings.host,
            settings.port,
            ssl=tls.context,
            ssl_handshake_timeout=settings.handshake_timeout,
            backlog=512,
            reuse_address=True,
        )
        reloader = asyncio.create_task(_reload_loop(tls, settings.reload_interval))
        log.info("webhook serving https://%s:%d/mutate", settings.host, settings.port)
        return cls(runner, server, tls, reloader)

    async def stop(self) -> None:
        self._reloader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reloader
        self._server.close()
        await self._server.wait_closed()
        await self._runner.cleanup()


async def _reload_loop(tls: ReloadingContext, interval: float) -> None:
    while True:
        await asyncio.sleep(interval)
        tls.reload_if_changed()


async def serve(
    config: Config, settings: WebhookSettings, ready: Callable[[int], None] | None = None
) -> None:
    """Run until cancelled (SIGTERM/SIGINT under :func:`run`)."""
    hook = await Webhook.start(config, settings)
    if ready is not None:
        ready(hook.port)
    try:
        await asyncio.Event().wait()
    finally:
        await hook.stop()


def run(
    config: Config, settings: WebhookSettings, ready: Callable[[int], None] | None = None
) -> None:
    """Blocking entry point for ``vfioctl webhook``; returns on SIGTERM / Ctrl-C."""
    import signal

    async def main() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await serve(config, settings, ready)

    asyncio.run(main())
