"""Keeps this node's ResourceSlices published: the slice writer of the DRA plugin.

Talks to the API server through the ``kubernetes`` client's ``ApiClient`` (pinned in
``pyproject.toml`` to the tested 37.x; its kubeconfig / in-cluster auth and TLS) with plain
JSON (:mod:`.plain`), no typed API: importing ``CoreV1Api`` builds every core model (~0.7 s of
CPU per start, for one GET), ``ResourceV1Api`` ~100 models (~0.15 s, before the first slice
was written). Its calls (what the DRA plugin's RBAC must allow)::

    GET    /api/v1/nodes/<node>                                   (the owner reference's uid)
    GET    /apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName=<node>,spec.driver=<driver>
           (also with watch=true: :mod:`vfio_dp.dra.apiserver.watch`)
    POST   /apis/resource.k8s.io/v1/resourceslices?fieldValidation=Strict
    PUT    /apis/resource.k8s.io/v1/resourceslices/<name>?fieldValidation=Strict  (resourceVersion read)
    DELETE /apis/resource.k8s.io/v1/resourceslices/<name>

Invariants:

- ``pool.generation`` only grows: every reconcile that writes starts from the highest
  generation seen on the server for this node and driver (so after a restart it continues
  from what the previous process published) and adds one (a single-slice update keeps it);
- what we wrote is remembered by ``resourceVersion``, and the :class:`~.watch.SliceWatch`
  keeps the server's names and resourceVersions current: a slice deleted or changed by anyone
  else (kubelet deletes a node's slices at its start and 30 s after the driver goes away)
  wakes the publisher at once, which lists the pool and republishes it at a new generation.
  An idle resync costs no request (checked on the event loop, no hop to the lane) while the
  watch is synced; without it (not started, or failing) each check is a full list, as before;
- at start, slices already on the server that are exactly what we would publish are adopted
  without a write (a restart does not churn the scheduler);
- a device stays in its slice (:func:`~vfio_dp.dra.slices.layout`, seeded from the server at
  start); one slice changed since our last write is one update at the same generation (one
  write is atomic), as upstream's ResourceSlice controller does; more bump it and write all,
  :data:`~.slice_writes.WRITERS` at a time (why that is safe: :mod:`.slice_writes`);
- an answer lacking the counter or binding fields we sent (a feature gate off) is said once
  in the log, and the pool shaped by :func:`~vfio_dp.dra.personalities.fit_api` from then on;
  ``binding_conditions=False`` (``--binding-conditions=false``) leaves the binding fields out;
- calls block, so they run on a lane of their own (:class:`~.client.Lane`, one thread),
  never on the event loop and never on the core's host-I/O threads; each call ends by its
  deadline (10 s, however the server trickles), a whole reconcile by :data:`RECONCILE_DEADLINE`;
  a failure is logged and retried with backoff, the last good slices stay.

The claim path's readers live in :mod:`vfio_dp.dra.apiserver.readers` (re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import kubernetes.client as k8s

from vfio_dp.dra.apiserver.client import Lane, api_client, call_json, client_config_source
from vfio_dp.dra.apiserver.plain import send
from vfio_dp.dra.apiserver.readers import claim_reader, class_reader
from vfio_dp.dra.apiserver.slice_writes import SLICES_PATH, SliceWriter
from vfio_dp.dra.apiserver.watch import SliceWatch
from vfio_dp.dra.personalities import dropped, fit_api
from vfio_dp.dra.slices import Device, Layout, NodeRef, Slice, build_slices, layout, layout_of
from vfio_dp.errors import ApiCallError

if TYPE_CHECKING:
    from vfio_dp.core.metrics import Metrics

log = logging.getLogger("vfio_dp.dra")

__all__ = [
    "PublishError",
    "SlicePublisher",
    "api_client",
    "claim_reader",
    "class_reader",
    "client_config_source",
]

MAX_BACKOFF = 10.0
#: a whole reconcile (list, up to ~35 writes for 4,096 devices) ends by then
RECONCILE_DEADLINE = 60.0

#: the publisher's failures (the one error of the API-server shell)
PublishError = ApiCallError


class SlicePublisher:
    """Publishes the devices it is given (:meth:`want`) as this node's pool, and keeps them."""

    def __init__(
        self,
        client: k8s.ApiClient,
        driver: str,
        node_name: str,
        *,
        watch: bool = True,
        metrics: Metrics | None = None,
        binding_conditions: bool = True,
    ) -> None:
        """``metrics``: where each pool write's time goes (``vfio_dp_dra_publish_seconds``);
        ``binding_conditions``: publish the devices' binding conditions where the API keeps
        them (module docstring)."""
        self.metrics = metrics
        #: does the server keep the counter fields / the binding fields (and do we want the
        #: latter)? Set False when an answer shows them dropped
        self.counters_kept = True
        self.binding_kept = binding_conditions
        #: the slice lane: one thread and a connection pool of its own
        self.lane = Lane(client, "slices", 1, RECONCILE_DEADLINE)
        self.client = self.lane.client
        #: the writes: a connection pool and threads of their own, under the lane's deadline
        self.writer = SliceWriter(client)
        self.driver = driver
        self.node = NodeRef(node_name)
        #: the highest pool generation known (written by us or found on the server)
        self.generation = 0
        self.wanted: list[Device] | None = None
        self.written_devices: list[Device] | None = None
        self.written: dict[str, str] = {}  # slice name -> resourceVersion after our write
        #: slice name -> the spec we wrote (or adopted): what a change is compared with
        self.written_specs: dict[str, Any] = {}
        #: where each device and counter set is published (kept across republishes)
        self.layout: Layout | None = None
        self.writes = 0  # reconciles that wrote (tests, metrics)
        self.checks = 0  # reconciles done, whether they wrote or not (tests)
        self.lists = 0  # full lists of the pool (tests: an idle check lists nothing)
        self.problem: str | None = None  # the last error, None once a reconcile succeeds
        #: callbacks(generation, slices) after each write
        self.on_published: list[Callable[[int, list[Slice]], None]] = []
        #: the server's names and resourceVersions, kept by a watch (started by start())
        self.watch: SliceWatch | None = (
            SliceWatch(client, driver, node_name, self._on_event) if watch else None
        )
        #: each device's JSON as last written, by identity (the front-end hands the same
        #: Device objects again for devices that did not change: a change of one device
        #: encodes one)
        self._encoded: dict[int, tuple[Device, dict[str, Any]]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: set when the first reconcile has ended (the pool written or adopted, or the
        #: attempt failed): what can wait for the first slices waits for it
        self.first_done = asyncio.Event()

    # -- the asyncio side ----------------------------------------------------------------
    def want(self, devices: Sequence[Device]) -> None:
        """Publish ``devices`` (the latest call wins) and check what is on the server."""
        self.wanted = list(devices)
        self._wake.set()

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="publish slices")
        if self.watch is not None:
            self.watch.start()

    async def stop(self) -> None:
        """Stop publishing (the slices stay: kubelet removes them 30 s after we are gone):
        a call under way is cut off, the watch ends."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.lane.close()
        self.writer.close()
        if self.watch is not None:
            await asyncio.to_thread(self.watch.stop)

    def _on_event(self, kind: str, name: str, rv: str) -> None:
        """The watch saw a change (its thread): one not of our own making wakes a check."""
        if kind == "DELETED":
            foreign = name not in self.writer.deleting
        elif kind in ("ADDED", "MODIFIED"):
            foreign = self.writer.ours.get(name) != rv
        else:  # LISTED: the watch (re)synced; what it found is checked
            foreign = True
        loop = self._loop
        if foreign and loop is not None and self.written_devices is not None:
            loop.call_soon_threadsafe(self._wake.set)

    async def _run(self) -> None:
        backoff = 0.2
        while True:
            await self._wake.wait()
            self._wake.clear()
            devices = self.wanted
            if devices is None:
                continue
            if self._checked_here(devices):
                continue
            try:
                await self.lane.run("publishing ResourceSlices", self.reconcile, devices)
            except PublishError as e:
                log.error("ResourceSlices not published: %s; next try in %.1f s", e, backoff)
                self.problem = str(e)
                self.first_done.set()
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                self._wake.set()
                continue
            self.first_done.set()
            if self.problem is not None:
                log.info("ResourceSlices published again")
            self.problem = None
            backoff = 0.2

    def _checked_here(self, devices: list[Device]) -> bool:
        """The idle check on the event loop's thread, no hop to the lane: True when what we
        wrote is what is wanted (as the server keeps it) and the synced watch shows the
        server holds exactly it (:meth:`_unchanged_on_server`); else the lane reconciles."""
        if not (self.counters_kept and self.binding_kept) or self.problem is not None:
            return False  # fit_api reshapes the devices: the lane compares them
        if not self.written or self.written_devices is None or self.node.uid is None:
            return False
        if devices != self.written_devices or not self._unchanged_on_server():
            return False
        self.checks += 1
        return True

    # -- the blocking side (one thread) ----------------------------------------------------
    def _read_node_uid(self) -> None:
        what = f"reading Node {self.node.name}"
        node = self.writer.send(what, "GET", f"/api/v1/nodes/{quote(self.node.name, safe='')}")
        uid = node.get("metadata", {}).get("uid")
        if not uid:
            raise PublishError(f"Node {self.node.name} has no metadata.uid")
        self.node = NodeRef(self.node.name, uid)

    def _list(self) -> dict[str, Slice]:
        """This node's slices of our driver, by name."""
        selector = f"spec.nodeName={self.node.name},spec.driver={self.driver}"
        answer = call_json(
            "listing this node's ResourceSlices", send, self.client, "GET", SLICES_PATH,
            query=[("fieldSelector", selector)],
        )  # fmt: skip
        self.lists += 1
        return {s["metadata"]["name"]: s for s in answer.get("items") or []}

    def _unchanged_on_server(self) -> bool:
        """Does the server hold exactly the slices we wrote (names and resourceVersions)?
        Asked of the watch, no request; False while it is not synced (then the caller lists)."""
        seen = self.watch.snapshot() if self.watch is not None else None
        return seen is not None and seen == self.written

    def list_current(self) -> dict[str, Slice]:
        """This node's slices of our driver on the server, by name (blocking)."""
        return self._list()

    def reconcile(self, devices: list[Device]) -> bool:
        """Make the server hold exactly ``devices`` (as :func:`fit_api` shapes them for what
        the server keeps) for this node; True when it wrote.

        New devices after a write of ours are written straight away over what we wrote
        (one round trip less on the path from a device change to the new slices); if anyone
        else touched the pool meanwhile (409 Conflict, 404), the pool is listed and rewritten.
        An unchanged device list is checked against a fresh list (deleted or changed slices).
        A write that shows a field dropped publishes the pool again without it.
        """
        self.checks += 1
        if self.node.uid is None:
            self._read_node_uid()
        wrote = False
        for _ in range(3):  # each feature is found off at most once
            kept = (self.counters_kept, self.binding_kept)
            wrote = self._reconcile(self._fit(devices)) or wrote
            if kept == (self.counters_kept, self.binding_kept):
                break
        return wrote

    def _fit(self, devices: list[Device]) -> list[Device]:
        return fit_api(devices, counters=self.counters_kept, binding=self.binding_kept)

    def _reconcile(self, devices: list[Device]) -> bool:
        if self.written and self.written_devices is not None and devices != self.written_devices:
            try:
                self._publish(devices, dict(self.written), self.generation, incremental=True)
                return True
            except PublishError as e:
                if e.status not in (409, 404):
                    raise
                log.info("the pool changed under us (%s): listing it again", e)
        elif self.written and devices == self.written_devices and self._unchanged_on_server():
            return False
        current = self._list()
        highest = max(
            [self.generation]
            + [
                int(s.get("spec", {}).get("pool", {}).get("generation") or 0)
                for s in current.values()
            ]
        )
        self.generation = highest
        versions = {n: s["metadata"].get("resourceVersion", "") for n, s in current.items()}
        if devices == self.written_devices and versions == self.written:
            return False
        if self.layout is None:  # a restart: keep each device where the server has it
            self.layout = layout_of(list(current.values()), self.node.name, self.driver)
        if self.written_devices is None and self._adopt(devices, current, highest):
            return False
        self._publish(devices, versions, highest)
        return True

    def _publish(
        self,
        devices: list[Device],
        versions: dict[str, str],
        highest: int,
        *,
        incremental: bool = False,
    ) -> None:
        """Write ``devices`` over the slices named in ``versions`` (name -> resourceVersion
        on the server), deleting the ones no longer needed: at ``highest + 1``, or -- when
        ``incremental`` (the server holds what we wrote at ``highest``) and at most one
        slice's content changed -- only that slice, at ``highest``."""
        started = time.perf_counter()
        before, self._encoded = self._encoded, {}

        def encode(d: Device) -> dict[str, Any]:
            hit = before.get(id(d))
            if hit is None or hit[0] is not d:
                hit = (d, d.to_json())
            self._encoded[id(d)] = hit
            return hit[1]

        placement = layout(devices, self.layout)
        wanted = build_slices(
            devices,
            driver=self.driver,
            node=self.node,
            generation=highest,
            encode=encode,
            placement=placement,
        )
        names = {s["metadata"]["name"] for s in wanted}
        changed = [s for s in wanted if self.written_specs.get(s["metadata"]["name"]) != s["spec"]]
        keep = incremental and names == set(versions) == set(self.written_specs)
        generation = highest if keep and len(changed) <= 1 else highest + 1
        if generation != highest:
            for s in wanted:
                s["spec"]["pool"]["generation"] = generation
            changed = wanted
        self.written_devices = None  # half-written until the end: a failure lists again
        for name in sorted(set(versions) - names):  # a smaller pool: fewer slices
            self.writer.delete(name)
            self.written.pop(name, None)
            self.written_specs.pop(name, None)
        written = {n: rv for n, rv in versions.items() if n in names}

        def answered(s: Slice, rv: str, spec: dict[str, Any]) -> None:
            written[s["metadata"]["name"]] = rv
            self.written_specs[s["metadata"]["name"]] = s["spec"]
            self._notice_dropped(s["spec"], spec)

        self.writer.write_all(changed, versions, answered)
        self.generation = generation
        self.written = written
        self.written_devices = devices
        self.layout = placement
        self.writes += 1
        if self.metrics is not None:
            self.metrics.observe("vfio_dp_dra_publish_seconds", time.perf_counter() - started)
        log.info(
            "published %d device(s) in %d ResourceSlice(s) (%d written), pool %s generation %d",
            len(devices), len(wanted), len(changed), self.node.name, generation,
        )  # fmt: skip
        for cb in self.on_published:
            cb(generation, wanted)

    def _adopt(self, devices: list[Device], current: dict[str, Slice], generation: int) -> bool:
        """At start: are the slices on the server exactly ours at ``generation``? Keep them."""
        if not current:
            return False
        wanted = build_slices(
            devices,
            driver=self.driver,
            node=self.node,
            generation=generation,
            placement=layout(devices, self.layout),
        )
        if set(current) != {s["metadata"]["name"] for s in wanted}:
            return False
        for s in wanted:
            have = current[s["metadata"]["name"]]
            if have.get("spec") != s["spec"] or have["metadata"].get("ownerReferences") != s[
                "metadata"
            ].get("ownerReferences"):
                return False
        self.written = {n: s["metadata"].get("resourceVersion", "") for n, s in current.items()}
        self.written_specs = {n: s["spec"] for n, s in current.items()}
        self.written_devices = devices
        self.layout = layout(devices, self.layout)
        log.info(
            "the %d ResourceSlice(s) on the server are current (generation %d)",
            len(current),
            generation,
        )
        return True

    def _notice_dropped(self, sent: dict[str, Any], got: dict[str, Any]) -> None:
        """Did the server drop the counter or binding fields we sent (a feature gate off)?
        Said once in the log; the next publication leaves them out (:func:`fit_api`)."""
        counters, binding = dropped(sent, got)
        if counters and self.counters_kept:
            self.counters_kept = False
            log.warning(
                "the API server drops ResourceSlice counters (DRAPartitionableDevices is off): "
                "each group is published in its first personality only, and VFs without their "
                "PF's counter"
            )
        if binding and self.binding_kept:
            self.binding_kept = False
            log.warning(
                "the API server drops binding conditions (DRADeviceBindingConditions is off): "
                "a claim's driver switch is done at Prepare"
            )
