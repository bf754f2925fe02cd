"""This node's ResourceSlices as the API server holds them, kept current by a watch (and
the list-then-watch loop :class:`ListWatch` the claim watch, :mod:`.claim_watch`, shares).

::

    GET /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>
    GET ...same...&watch=true&resourceVersion=<rv>&allowWatchBookmarks=true&timeoutSeconds=<s>

The list-then-watch loop of a Kubernetes informer, on one thread of its own: list (the
names, their ``resourceVersion``, the list's ``resourceVersion``), then watch from there with
``kubernetes.watch.Watch``; a watch that ends (``timeoutSeconds``, a dropped connection) is
started again from the last resourceVersion seen (a BOOKMARK moves it too; so is one cut
off before any answer, at once, up to three in a row: kept-alive connections the server had
closed); a ``410 Gone`` (the server forgot that resourceVersion: an ERROR event, or the HTTP
status) lists again. Other failures are retried with backoff; meanwhile
:attr:`SliceWatch.synced` is False and the publisher lists for itself, as it would without a
watch.

Why not ``kubernetes.informer.SharedInformer``: it turns every event into a typed model
(``V1ResourceSlice``: ~0.17 ms per device here, ~180 ms of CPU per 1,024-device republish,
just to learn a name and a resourceVersion), its calls carry no deadline we could cut
(its first list has no timeout at all) and its ``stop`` joins its thread without a bound.
Why not ``kubernetes.aio``: the plugin's API calls are blocking calls on lanes of their own
(:mod:`.client`); one asyncio client for one of them would be a second way to do the same.

Events stay JSON: the watch is given a list function that declares no model
(:func:`.plain.lister`, no typed API at all), so ``Watch`` hands the event's object over as
the server sent it (its ``deserialize=False`` would lose
the ERROR event's ``raw_object`` it reads for the 410).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import kubernetes.client as k8s
import kubernetes.watch

from vfio_dp.dra.apiserver.client import (
    TIMEOUT,
    Deadline,
    api_error,
    call_json,
    deadline,
    own_client,
)
from vfio_dp.dra.apiserver.plain import lister
from vfio_dp.dra.apiserver.slice_writes import SLICES_PATH
from vfio_dp.errors import ApiCallError

log = logging.getLogger("vfio_dp.dra")

#: how long one watch request lasts (the server ends it; the next starts where it stopped)
WATCH_SECONDS = 300
MAX_BACKOFF = 10.0
#: watches cut off before any answer started again at once, in a row (each stale kept-alive
#: connection of the pool costs one), before the next is a failure like any other
MAX_UNANSWERED = 3

#: ``(event type, slice name, resourceVersion)`` -- called on the watch's thread
OnEvent = Callable[[str, str, str], None]


class ListWatch:
    """The list-then-watch loop (module doc) over one list method (:func:`.plain.lister`,
    called as a typed ``list_*`` method is); subclasses say what a list and an event mean
    (:meth:`listed`, :meth:`changed`)."""

    #: what is watched, for logs and errors ("this node's ResourceSlices")
    what = ""

    def __init__(
        self,
        list_method: Callable[..., Any],
        field_selector: str | None,
        seconds: int,
        thread_name: str,
    ) -> None:
        self.list_method = list_method
        self.selector = field_selector
        self.seconds = seconds
        self.thread_name = thread_name
        self.synced = False
        self.resource_version: str | None = None  # where the next watch starts; None: list
        self.lists = 0  # (tests, logs) lists made, the first included
        self.expired = 0  # 410 Gone answers that made it list again
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._deadline: Deadline | None = None
        self._thread: threading.Thread | None = None

    def listed(self, items: list[dict[str, Any]]) -> None:
        """A list's items (under no lock; called on the watch's thread)."""

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        """An ADDED / MODIFIED / DELETED event's object (the watch's thread)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the watch now (its socket is shut down) and wait for the thread."""
        self._stop.set()
        d = self._deadline
        if d is not None:
            d.expire()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = 0.2
        unanswered = 0  # watches in a row cut off before any answer, started again at once
        while not self._stop.is_set():
            try:
                # one deadline over the list and the watch: stop() cuts either off
                with deadline(self.seconds + 2 * TIMEOUT, f"the watch of {self.what}") as d:
                    self._deadline = d
                    if self._stop.is_set():
                        return
                    if self.resource_version is None:
                        self.relist()
                    self.watch_once()
                backoff, unanswered = 0.2, 0
            except ApiCallError as e:
                if self._stop.is_set():
                    return
                if e.status is None and not e.expired and unanswered < MAX_UNANSWERED and (
                    self.resource_version
                ):
                    # no answer at all (kept-alive connections the server had closed, a
                    # restart): at once, from where it was; 410 if that is too old
                    log.debug("watching %s: %s; starting again from %s", self.what, e,
                              self.resource_version)  # fmt: skip
                    unanswered += 1
                    continue
                if e.status == 410:
                    log.info("the watch of %s: resourceVersion expired (%s): listing again",
                             self.what, e)  # fmt: skip
                    self.expired += 1
                    self.resource_version = None
                    continue
                log.warning("watching %s: %s; again in %.1f s", self.what, e, backoff)
                with self._lock:
                    self.synced = False
                self.resource_version = None  # events may have been missed: list again
                self._stop.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _selector(self) -> dict[str, Any]:
        return {"field_selector": self.selector} if self.selector else {}

    def relist(self) -> None:
        """List: what :meth:`listed` makes of it, and where the next watch starts."""
        answer = call_json(
            f"listing {self.what} (for the watch)", self.list_method, **self._selector()
        )
        self.listed(list(answer.get("items") or []))
        self.lists += 1
        self.resource_version = (answer.get("metadata") or {}).get("resourceVersion") or "0"

    def watch_once(self) -> None:
        """One watch request, from :attr:`resource_version` until the server ends it."""
        what = f"watching {self.what}"
        w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]

        def list_them(**kwargs: Any) -> Any:  # no model declared: events stay JSON
            return self.list_method(**kwargs)

        with deadline(self.seconds + TIMEOUT, what) as d:
            try:
                for event in w.stream(
                    list_them,
                    **self._selector(),
                    resource_version=self.resource_version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=self.seconds,
                    _request_timeout=(TIMEOUT, self.seconds + TIMEOUT),
                ):
                    self._event(event)
                    if self._stop.is_set():
                        w.stop()
            except Exception as e:  # the client, urllib3 and the socket raise many types
                if self._stop.is_set():
                    return
                raise api_error(what, e, d) from e

    def _event(self, event: dict[str, Any]) -> None:
        kind = event.get("type", "")
        obj = event.get("raw_object") or event.get("object") or {}
        meta = obj.get("metadata") or {} if isinstance(obj, dict) else {}
        rv = meta.get("resourceVersion", "")
        if rv:
            self.resource_version = rv
        if kind not in ("ADDED", "MODIFIED", "DELETED") or not meta.get("name"):
            return  # a BOOKMARK: only the resourceVersion moves
        self.changed(kind, obj)


class SliceWatch(ListWatch):
    """Names and resourceVersions of this node's slices of our driver (see module doc)."""

    what = "this node's ResourceSlices"

    def __init__(
        self,
        client: k8s.ApiClient,
        driver: str,
        node: str,
        on_event: OnEvent | None = None,
        seconds: int = WATCH_SECONDS,
    ) -> None:
        super().__init__(
            lister(own_client(client), SLICES_PATH),
            f"spec.nodeName={node},spec.driver={driver}",
            seconds,
            "vfio_dp-slice-watch",
        )
        self.on_event = on_event
        #: slice name -> resourceVersion, as last seen on the server (valid while synced)
        self.versions: dict[str, str] = {}

    def snapshot(self) -> dict[str, str] | None:
        """The slices' versions now, None while not synced."""
        with self._lock:
            return dict(self.versions) if self.synced else None

    def relist(self) -> None:
        super().relist()
        if self.on_event is not None:
            self.on_event("LISTED", "", self.resource_version or "0")

    def listed(self, items: list[dict[str, Any]]) -> None:
        versions = {s["metadata"]["name"]: s["metadata"].get("resourceVersion", "") for s in items}
        with self._lock:
            self.versions = versions
            self.synced = True

    def changed(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        name, rv = meta["name"], meta.get("resourceVersion", "")
        with self._lock:
            if kind == "DELETED":
                self.versions.pop(name, None)
            else:
                self.versions[name] = rv
        if self.on_event is not None:
            self.on_event(kind, name, rv)
