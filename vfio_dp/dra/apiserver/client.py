"""The ``kubernetes`` client as the DRA plugin uses it: its config, and calls that end by a deadline.

Three things live here, for every API call of the DRA plugin (:mod:`.publisher`,
:mod:`.watch`, :mod:`.readers`, :mod:`.claim_status`) and ``vfioctl webhook-certs``:

- **the client config**, in kubectl's order (:func:`client_config_source`, :func:`api_client`);
- **an overall deadline per call** (:func:`deadline`). urllib3's read timeout restarts with
  every byte received, so a server that trickles one byte every 2 s holds a call with a 10 s
  read timeout for ever. Every connection our clients open is registered with the deadline
  of the call that uses it (:func:`with_deadlines` puts connection classes of ours into the
  client's urllib3 pool manager); when the deadline passes, one watchdog thread shuts the
  socket down (``shutdown(SHUT_RDWR)``: the blocked ``recv`` returns at once) and the call
  fails with :class:`~vfio_dp.errors.ApiCallError` ``expired``. Nothing needs ``os._exit``
  to get out of a blocked call;
- **lanes** (:class:`Lane`): a bounded set of threads, and a client (its own connection pool)
  of their own, for one kind of call -- claim reads (Prepare's path), DeviceClass reads, the
  publisher's slice writes; claim-status writes have a pool of their own and the status
  feed's threads -- so a slow peer that fills one (eight trickling status writes or class
  reads) never delays another (a later Prepare's claim read). A deadline counts from the
  call's queueing; a call that fans out to threads of its own carries it (:func:`run_under`).

Errors: the status comes from ``ApiException.status``, never from text; what the server said
(its ``Status.message``, else the body) is shown at most :data:`SHOWN_BODY` characters (a
5 MB error body is one bounded log line, :func:`vfio_dp.errors.clip`).
"""

from __future__ import annotations

import asyncio
import copy
import heapq
import itertools
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any, ClassVar, TypeVar

import kubernetes.client as k8s
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from vfio_dp.dra.apiserver.plain import send
from vfio_dp.errors import ApiCallError, clip

T = TypeVar("T")

#: every API call's overall deadline (seconds), queueing on its lane included
TIMEOUT = 10.0
#: at most this much of what a server answered goes into an error (and so a log line)
SHOWN_BODY = 4096


# -- the client config -----------------------------------------------------------------------
def client_config_source(
    kubeconfig: str | None, env: Mapping[str, str], home: str
) -> tuple[str, str | None]:
    """Where the client config comes from, in kubectl's order: ``--kubeconfig``, then
    ``$KUBECONFIG``, then ``~/.kube/config`` if it exists, then the pod's service account
    (``/var/run/secrets/kubernetes.io/serviceaccount``). → ``(kind, path)`` with kind one of
    ``flag``, ``env``, ``home``, ``in-cluster``."""
    if kubeconfig:
        return "flag", kubeconfig
    if env.get("KUBECONFIG"):
        return "env", env["KUBECONFIG"]
    default = os.path.join(home, ".kube", "config")
    if os.path.isfile(default):
        return "home", default
    return "in-cluster", None


def api_client(kubeconfig: str | None) -> k8s.ApiClient:
    """A ``kubernetes.client.ApiClient`` from :func:`client_config_source`'s choice, its
    calls ending at their deadlines (:func:`with_deadlines`).

    Raises ``ValueError`` naming the source tried when its config cannot be loaded."""
    import kubernetes.config

    config: Any = kubernetes.config  # its loaders are untyped
    kind, path = client_config_source(kubeconfig, os.environ, os.path.expanduser("~"))
    cfg = k8s.Configuration()
    try:
        if path is not None:
            # $KUBECONFIG may list several files (':'-separated), merged as kubectl does
            config.load_kube_config(config_file=path, client_configuration=cfg)
        else:
            config.load_incluster_config(client_configuration=cfg)
    except Exception as e:  # the loaders raise their own types
        where = {
            "flag": f"--kubeconfig {path}",
            "env": f"KUBECONFIG={path}",
            "home": path,
            "in-cluster": "the pod's service account (no --kubeconfig, KUBECONFIG or "
            "~/.kube/config found)",
        }[kind]
        raise ValueError(f"cannot load the Kubernetes client config from {where}: {e}") from e
    # No silent retries inside urllib3 (three "Retrying (Retry(total=2 ...))" warnings per call
    # while the API server is down): each caller has its deadline, back-off and log line.
    cfg.retries = 0
    return with_deadlines(k8s.ApiClient(cfg))


# -- the deadline ------------------------------------------------------------------------------
class Deadline:
    """One call's overall deadline (``at``, monotonic): when it passes, every socket the call
    registered is shut down. A finished call's deadline shuts nothing."""

    __slots__ = ("_lock", "_outer", "_socks", "at", "done", "expired", "seconds", "what")

    def __init__(self, seconds: float, what: str, outer: Deadline | None = None) -> None:
        self.seconds, self.what, self.done, self._outer = seconds, what, False, outer
        self.at = time.monotonic() + seconds
        if outer is not None:
            self.at = min(self.at, outer.at)
        self.expired: bool = outer is not None and outer.expired  # nothing starts under it
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()

    def passed(self) -> bool:
        """Has this deadline, or an enclosing one, expired?"""
        return self.expired or (self._outer is not None and self._outer.passed())

    def left(self) -> float:
        return self.at - time.monotonic()

    def attach(self, sock: socket.socket | None) -> None:
        """Shut ``sock`` down when this deadline (or an enclosing one) passes."""
        if sock is None:
            return
        with self._lock:
            late = self.expired
            if not late:
                self._socks.append(sock)
        if late:
            _shutdown(sock)
        if self._outer is not None:
            self._outer.attach(sock)

    def expire(self) -> None:
        with self._lock:
            if self.done or self.expired:
                return
            self.expired = True
            socks, self._socks = self._socks, []
        for s in socks:
            _shutdown(s)

    def finish(self) -> None:
        with self._lock:
            self.done = True
            self._socks = []


def _shutdown(sock: socket.socket) -> None:
    # socket.socket's own shutdown, also for an SSLSocket (whose override drops its SSL
    # object under a reader blocked in it): the blocked recv returns at once
    with suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watchdog:
    """One daemon thread that expires deadlines when they pass; it does not wake for one
    finished before its time (a burst of calls -- the first publication's slice writes --
    would otherwise wake it once per call, a minute later)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, d: Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (d.at, next(self._seq), d))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="vfio_dp-api-deadlines", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    while self._heap and self._heap[0][2].done:  # finished: no wake-up for it
                        heapq.heappop(self._heap)
                    wait = self._heap[0][0] - time.monotonic() if self._heap else None
                    self._cond.wait(wait)
                _, _, d = heapq.heappop(self._heap)
            d.expire()


_WATCHDOG = _Watchdog()
_local = threading.local()


def current() -> Deadline | None:
    """The deadline of the call this thread is making, if any."""
    d: Deadline | None = getattr(_local, "deadline", None)
    return d


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[Deadline]:
    """Every request this thread makes inside ends within ``seconds`` from now (or the
    enclosing deadline, if sooner): its sockets are shut down then."""
    outer = current()
    d = Deadline(seconds, what, outer)
    _local.deadline = d
    _WATCHDOG.add(d)
    try:
        yield d
    finally:
        d.finish()
        _local.deadline = outer


def _attach(sock: socket.socket | None) -> None:
    d = current()
    if d is not None:
        d.attach(sock)


class _DeadlineHTTPConnection(HTTPConnection):
    """Registers each socket it uses with the current call's :class:`Deadline`."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _attach(sock)  # the TCP socket: a TLS handshake that trickles is cut off too
        return sock

    def connect(self) -> None:
        super().connect()
        _attach(self.sock)  # after TLS: the wrapping socket

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self.sock)  # a pooled connection, reused
        super().request(*args, **kwargs)

    def getresponse(self) -> Any:  # the urllib3 response
        _attach(self.sock)
        return super().getresponse()


class _DeadlineHTTPSConnection(_DeadlineHTTPConnection, HTTPSConnection):
    pass


class _HTTPPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _HTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


def with_deadlines(client: k8s.ApiClient) -> k8s.ApiClient:
    """``client``, its urllib3 pool manager making connections that end at the calling
    thread's :func:`deadline` (idempotent; a SOCKS proxy's manager is left as it is)."""
    pm = client.rest_client.pool_manager
    if hasattr(pm, "pool_classes_by_scheme"):
        pm.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
    return client


def own_client(client: k8s.ApiClient, connections: int = 0) -> k8s.ApiClient:
    """A client of the same config as ``client`` with a connection pool of its own keeping
    ``connections`` open for reuse (urllib3 closes those past the config's
    ``connection_pool_maxsize``, 5 per CPU by default), and no retries inside urllib3 (each
    caller has its deadline and its own back-off)."""
    cfg = copy.deepcopy(client.configuration)
    cfg.retries = 0
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 1, connections)
    return with_deadlines(k8s.ApiClient(cfg))


# -- one call ------------------------------------------------------------------------------------
def api_error(what: str, e: BaseException, d: Deadline | None = None) -> ApiCallError:
    """``what`` failed with ``e``: the error to raise, saying the server's status and message
    (at most :data:`SHOWN_BODY` characters of it), or that the deadline passed."""
    if d is not None and (d.passed() or d.left() <= 0):  # urllib3's own timeout may beat
        d.expire()  # the watchdog by a hair: still this deadline
        return ApiCallError(
            f"{what}: the API server did not answer within {d.seconds:g} s (check the API "
            "server and the network; the call is retried)",
            expired=True,
        )
    if isinstance(e, k8s.ApiException) and e.status:
        body: Any = e.body if e.body is not None else e.data
        message = server_message(body)
        reason = e.reason or ""
        detail = f"HTTP {e.status}" + (f" {reason}" if reason else "")
        return ApiCallError(
            f"{what}: {detail}" + (f": {message}" if message else ""), status=e.status
        )
    return ApiCallError(f"{what}: {clip(str(e) or type(e).__name__, SHOWN_BODY)}")


def server_message(body: Any) -> str:
    """What an error answer says: its ``Status.message``, else the body as text; at most
    :data:`SHOWN_BODY` characters either way."""
    if body is None or body == b"" or body == "":
        return ""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes | bytearray) else str(body)
    try:
        answer = json.loads(text)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("message"), str):
        text = answer["message"]
    return clip(text, SHOWN_BODY)


def request_timeout(d: Deadline) -> tuple[float, float]:
    """urllib3's (connect, read) timeouts for a call under ``d``: a backstop a little past
    the deadline (the watchdog ends the call at the deadline itself)."""
    left = max(0.001, min(TIMEOUT, d.left())) + 0.5
    return left, left


def call_json(
    what: str, fn: Callable[..., Any], *args: Any, timeout: float = TIMEOUT, **kwargs: Any
) -> dict[str, Any]:
    """``fn(*args, **kwargs)`` -- a ``kubernetes`` API method, or :func:`.plain.send` --
    within ``timeout`` seconds overall; the answer's JSON object. Raises
    :class:`ApiCallError` (``status`` set when the server refused)."""
    with deadline(timeout, what) as d:
        try:
            if d.passed() or d.left() <= 0:  # e.g. the lane was closed: no new request
                d.expire()
                raise TimeoutError(what)
            if fn is send:  # a plain request (:mod:`.plain`)
                data = send(*args, request_timeout=request_timeout(d), **kwargs)
            else:  # a typed method: it raises ApiException itself
                raw = fn(
                    *args, _preload_content=False, _request_timeout=request_timeout(d), **kwargs
                )
                data = raw.data
            if d.passed():  # cut off after the last byte: still past the deadline
                raise TimeoutError(what)
        except Exception as e:  # the client, urllib3 and the socket raise many types
            raise api_error(what, e, d) from e
    try:
        answer = json.loads(data or b"{}")
    except ValueError as e:
        raise ApiCallError(f"{what}: the API server's answer is not JSON: {e}") from e
    if not isinstance(answer, dict):
        raise ApiCallError(f"{what}: the API server's answer is not a JSON object")
    return answer


def run_under(d: Deadline | None, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in this thread under ``d`` (a lane's call, or one that fans out to other
    threads: :func:`current` there): every request it makes ends by then."""
    _local.deadline = d
    try:
        return fn(*args)
    except ApiCallError:
        raise
    except Exception as e:  # fn's own errors pass, unless the deadline cut it short
        if d is not None and d.passed():
            raise api_error(d.what, e, d) from e
        raise
    finally:
        _local.deadline = None


# -- lanes ---------------------------------------------------------------------------------------
class Lane:
    """Threads and a client of their own for one kind of API call (see module doc).

    ``await lane.run(what, fn, *args)`` runs the blocking ``fn`` on one of ``workers`` threads
    under a :func:`deadline` of ``timeout`` seconds counted from now (queueing included):
    every request ``fn`` makes ends by then, and the caller gets :class:`ApiCallError`
    ``expired`` at the deadline even if ``fn`` is still in something else."""

    def __init__(
        self, client: k8s.ApiClient, name: str, workers: int, timeout: float = TIMEOUT
    ) -> None:
        self.name = name
        self.client = own_client(client, workers)
        self.timeout = timeout
        self.workers = workers
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix=f"vfio_dp-api-{name}")
        self._live: set[Deadline] = set()
        self._closed = False

    def _in_thread(self, d: Deadline, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
        if d.expired or self._closed:
            raise ApiCallError(f"{d.what}: not started before the deadline", expired=True)
        return run_under(d, fn, *args)

    async def run(
        self, what: str, fn: Callable[..., T], *args: Any, timeout: float | None = None
    ) -> T:
        if self._closed:
            raise ApiCallError(f"{what}: the plugin is stopping")
        seconds = self.timeout if timeout is None else timeout
        d = Deadline(seconds, what)
        _WATCHDOG.add(d)
        self._live.add(d)
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self._executor, self._in_thread, d, fn, args)
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of
                # a call that ended just as its caller was cancelled, and the cancellation
                # is lost (the publisher's loop then outlived a stop that awaited it)
                async with asyncio.timeout(max(0.0, d.left())):
                    return await fut
            except TimeoutError:
                d.expire()  # a thread still in the call: its sockets shut now
                raise api_error(what, TimeoutError(what), d) from None
            except asyncio.CancelledError:
                d.expire()  # the caller gave up (a stop): the call is cut off too
                raise
        finally:
            d.finish()
            self._live.discard(d)

    def close(self) -> None:
        """Stop: calls under way are cut off now (their sockets shut), queued ones never
        start; the threads end at once."""
        self._closed = True
        for d in list(self._live):
            d.expire()
        self._executor.shutdown(wait=False, cancel_futures=True)


class Lanes:
    """The DRA plugin's claim-path lanes: ``claims`` (Prepare's claim reads) and ``classes``
    (DeviceClass reads), with :data:`WORKERS` threads each; and ``status_client``, the
    claim-status writes' pool (their threads: the status feed's, bounded by its workers,
    :class:`vfio_dp.dra.observers.claim_status.StatusFeed`); slices: the publisher's lane."""

    WORKERS: ClassVar[dict[str, int]] = {"claims": 8, "classes": 4}

    def __init__(self, client: k8s.ApiClient, timeout: float = TIMEOUT) -> None:
        self.claims = Lane(client, "claims", self.WORKERS["claims"], timeout)
        self.classes = Lane(client, "classes", self.WORKERS["classes"], timeout)
        self.status_client = own_client(client)

    def close(self) -> None:
        for lane in (self.claims, self.classes):
            lane.close()
