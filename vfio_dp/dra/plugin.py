"""The DRA plugin's lifecycle: node core + ResourceSlice publisher + kubelet gRPC shell.

What ``vfioctl dra-plugin`` runs, one asyncio process:

1. The node core (:class:`vfio_dp.core.node.NodeCore`, path ``dra``, host usage on) loads the
   config and scans; ``bind: true`` selectors of ``path: dra`` are bound at start and on
   hotplug; ``bind: onPrepare`` groups stay on their host drivers.
2. After every scan (start, uevent, SIGUSR1, resync, config reload) the slice feed
   (:class:`vfio_dp.dra.observers.slice_feed.SliceFeed`) says what the pool is now; this
   module hands it to the :class:`~vfio_dp.dra.apiserver.publisher.SlicePublisher` (which
   writes it when it changed and rewrites it when someone deleted or changed ours, within
   one resync), to the health stream (sent when it changed, else at its refresh), to the
   metrics, and tells the claim-status feed
   (:class:`vfio_dp.dra.observers.claim_status.StatusFeed`) which prepared claims' devices
   changed health.
3. The kubelet shell (:class:`vfio_dp.dra.kubeletapi.server.KubeletFrontEnd`) serves
   ``<plugins>/<driver>/dra.sock``, then ``<registry>/<driver>-reg.sock``; it re-creates a
   socket removed from under it as soon as inotify reports it (every 0.25 s without).
4. NodePrepareResources / NodeUnprepareResources go to the
   :class:`~vfio_dp.dra.claimpath.prepare.ClaimPreparer` (claims read through the publisher's
   :func:`~vfio_dp.dra.apiserver.publisher.claim_reader`): ``bind: onPrepare`` groups are bound when a
   claim is prepared and given back when it is unprepared; CDI specs go to ``--cdi-dir`` and
   device metadata under ``<plugins>/<driver>/``. At start and every resync it reconciles:
   claims gone from the API server are unprepared, groups still held open are kept. A claim
   prepared or unprepared is handed to the claim-status feed, which writes its
   ``status.devices`` in the background: the kubelet's answer never waits for it.
5. SIGTERM/SIGINT: both sockets removed, claim-status writes given a few seconds, exit 0. The slices stay: kubelet deletes them 30 s
   after no instance of the driver is connected, and a restarted plugin continues the pool's
   generation.

Paths: ``--kubelet-registry-dir``, ``--kubelet-plugins-dir`` and ``--cdi-dir`` are paths as
this process sees them, never joined with ``--root`` (which is only for sysfs and the state
records).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from vfio_dp.core.frontend import FrontEnd, serve
from vfio_dp.core.health import HealthModel
from vfio_dp.core.node import DEBOUNCE, NodeCore, Snapshot
from vfio_dp.core.sockets import SocketServer
from vfio_dp.dra.apiserver.claim_status import ClaimStatusWriter
from vfio_dp.dra.apiserver.claim_watch import BindingWrites, ClaimWatch
from vfio_dp.dra.apiserver.client import TIMEOUT, Lane, Lanes
from vfio_dp.dra.apiserver.publisher import PublishError, SlicePublisher
from vfio_dp.dra.apiserver.readers import claim_reader, class_reader
from vfio_dp.dra.claimpath.ahead import SwitchAhead
from vfio_dp.dra.claimpath.claims import ClaimRef, ClaimResult
from vfio_dp.dra.claimpath.holds import checkpoint_holds
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.dra.kubeletapi.health_stream import HealthStream, timeout_for
from vfio_dp.dra.kubeletapi.server import KubeletFrontEnd
from vfio_dp.dra.observers import health
from vfio_dp.dra.observers.api_fields import ApiFields, ApiFieldsStore
from vfio_dp.dra.observers.claim_status import StatusFeed
from vfio_dp.dra.observers.slice_feed import PoolUpdate, SliceFeed
from vfio_dp.dra.options import DraOptions
from vfio_dp.dra.slices import Device
from vfio_dp.errors import UsageError, VfioError
from vfio_dp.host import Host
from vfio_dp.model.naming import dra_entry

log = logging.getLogger("vfio_dp.dra")

#: a held group's new health is confirmed by a second scan this soon (debounce, < 1 s)
CONFIRM_DELAY = 0.2
#: claim-status writes wait this long at most for the slices of a health change
STATUS_HOLD = 2.0


def confirm_delay(seen: float, now: float) -> float:
    """Seconds from ``now`` to the kick of the confirming scan of a held device's new health:
    CONFIRM_DELAY after the scan that saw it ended (``seen``), not after the slice feed
    digested it (0.1-0.4 s at 1,024 changed devices on a busy node), less the core's own
    :data:`~vfio_dp.core.node.DEBOUNCE` between a kick and its scan: the two looks at the
    device stay at least CONFIRM_DELAY apart, and no more, so a flap shorter than that still
    never taints."""
    return max(0.0, CONFIRM_DELAY - DEBOUNCE - (now - seen))


class DraPlugin(FrontEnd):
    """The DRA front-end over its own :class:`NodeCore`: wiring and lifecycle only; each
    job is its room's (docs/architecture.md, "The DRA plugin's rooms")."""

    def __init__(self, options: DraOptions, client: Any, host: Host | None = None) -> None:
        if not options.node_name:
            raise UsageError(
                "the DRA plugin needs its node's name: --node-name, or NODE_NAME from the "
                "pod's spec.nodeName (fieldRef)"
            )
        self.options = options
        self.health_stream = HealthStream(options.node_name, timeout_for(options.resync))
        self.kubelet = KubeletFrontEnd(
            options.driver_name,
            options.registry_dir,
            options.plugins_dir,
            self,
            health=self.health_stream,
        )
        super().__init__(NodeCore(options.core(), host), log)
        self.kubelet.metrics = self.metrics
        self.core.subscribe(self)
        # a VF a prepared claim holds is never destroyed by an SR-IOV count change
        self.core.vf_holds.append(lambda: checkpoint_holds(self.core.host.fs, options.driver_name))
        self.publisher = SlicePublisher(
            client,
            options.driver_name,
            options.node_name,
            metrics=self.metrics,
            binding_conditions=options.binding_conditions,
        )
        self.publisher.on_published.append(self._published)
        #: what the server keeps of our fields, for vfioctl list (written when it changes)
        self.api_fields = ApiFieldsStore(self.core.host.fs, options.driver_name)
        self._fields_written: ApiFields | None = None
        #: the claim path's API calls, each kind on threads and a connection pool of its own
        #: (never the host threads): claim reads, DeviceClass reads; the status writes'
        #: connection pool (their threads are the status feed's own)
        self.api = Lanes(client)
        self.claims = ClaimPreparer(
            host=self.core.host,
            driver=options.driver_name,
            node=options.node_name,
            cdi_dir=options.cdi_dir,
            plugins_dir=options.plugins_dir,
            read_claim=claim_reader(client, self.api.claims),
            read_class=class_reader(client, self.api.classes),
            config=lambda: self.core.config,
            published=self._published_devices,
            metrics=self.metrics,
        )
        checkpoint = self.claims.checkpoint
        self.feed = SliceFeed(self.core, options.driver_name, checkpoint.all)
        self.status_writer = ClaimStatusWriter(self.api.status_client, options.driver_name)
        self.status = StatusFeed(
            self.status_writer.write,
            record=checkpoint.get,
            records=checkpoint.all,
            states=lambda: self.feed.health.states,
            holders=self.core.host.record_holders,
            failed=lambda: self.metrics.inc("vfio_dp_dra_claim_status_errors_total"),
        )
        self._confirm: asyncio.TimerHandle | None = None
        self._gauges: dict[str, tuple[str, float]] = {}  # device -> (health, tainted) exported
        self._uncounted: PoolUpdate | None = None  # its gauges wait for the first slices
        #: the switch ahead of the pod (binding conditions): the claims allocated from our
        #: pool, watched; their conditions written on a lane of their own
        self.ahead = SwitchAhead(self.claims)
        self.claim_watch: ClaimWatch | None = None
        self.binding_lane: Lane | None = None
        self.binding: BindingWrites | None = None  # the conditions written, retried
        if options.binding_conditions:
            self.claim_watch = ClaimWatch(
                client, options.driver_name, options.node_name, self._claim_seen
            )
            self.binding_lane = Lane(client, "binding", 1)
            self.binding = BindingWrites(self.binding_lane, self.status_writer.write_binding)
        self._ahead_tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reconciled = 0.0  # when the last reconcile began (monotonic)

    @property
    def health(self) -> HealthModel:
        """The devices' health (the slice feed's model)."""
        return self.feed.health

    @property
    def devices(self) -> list[Device]:
        """The pool as the last scan built it."""
        return self.feed.devices

    def served_sockets(self) -> tuple[SocketServer, ...]:
        return self.kubelet.sockets

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        log.info(
            "DRA plugin %s on node %s: registry %s, plugins %s",
            self.options.driver_name,
            self.options.node_name,
            self.options.registry_dir,
            self.options.plugins_dir,
        )
        self._loop = asyncio.get_running_loop()
        self.publisher.start()
        # the first scan must know the prepared claims: a held group is never withdrawn
        # (blocking reads on the core's executor, which core.start makes the default anyway)
        asyncio.get_running_loop().set_default_executor(self.core.executor)
        await self.claims.loaded()
        self.feed.on_server = await self._published_on_server()
        await self.core.start()
        await self._reconcile_once()  # before kubelet can call: what a crash left is settled
        if self.claim_watch is not None:  # after reconcile: a switch ahead starts settled
            self.claim_watch.start()
        await self.kubelet.start()
        self.watch(self.kubelet.directories, self.kubelet.check, "kubelet socket watch")
        self._reconciled = time.monotonic()
        self.repeat(self.options.resync, self._reconcile_share, "reconcile claims")
        if not gc.isenabled():  # off for start-up (``vfioctl dra-plugin``): what start-up made
            gc.freeze()  # lives as long as the process (no garbage: a collection here found
            gc.enable()  # none at 4,096 devices); no collection walks it again

    async def withdraw(self) -> None:
        """At stop: no health confirmation pending, kubelet's health streams ended, both
        sockets removed, claim-status writes given a few seconds (then left), publishing
        stopped (the slices stay)."""
        if self._confirm is not None:
            self._confirm.cancel()
        if self.claim_watch is not None:
            await asyncio.to_thread(self.claim_watch.stop)
        for task in list(self._ahead_tasks):
            task.cancel()
        if self.binding is not None:
            self.binding.close()
        if self.binding_lane is not None:
            self.binding_lane.close()
        self.health_stream.close()  # kubelet's streams end before the server goes
        await self.kubelet.stop()
        await self.status.close()
        self.api.close()  # calls still under way are cut off
        await self.publisher.stop()

    async def _reconcile_share(self) -> None:
        """A resync's reconcile: every claim's local state, and a share of the claims read
        from the API server -- as many as keep each read once per ``claim_check`` seconds
        (1,000 claims, every 5 s: 17 reads, not 1,000)."""
        now = time.monotonic()
        since, self._reconciled = now - self._reconciled, now
        check = self.options.claim_check
        count = len(self.claims.checkpoint.all())
        await self._reconcile_once(None if check <= 0 else math.ceil(count * since / check))

    async def _reconcile_once(self, budget: int | None = None) -> None:
        try:
            report = await self.claims.reconcile(budget)
        except Exception:
            log.exception("reconciling prepared claims")
            return
        for line in report.unprepared:
            log.info("claim unprepared by reconcile: %s", line)

    def _published_devices(self) -> Mapping[str, Device]:
        """The devices last written to the API server (before the first write: the ones being
        published), by name."""
        written = self.publisher.written_devices
        return {d.name: d for d in (written if written is not None else self.feed.devices)}

    async def _published_on_server(self) -> dict[str, list[dict[str, str]]]:
        """The taints of this node's devices on the server now, by name (a restart keeps
        their ``timeAdded``, so the slices are adopted unchanged); {} when unreadable."""
        try:  # on the slice lane, never the core's host-I/O threads: a stop cuts it off
            current = await self.publisher.lane.run(
                "listing this node's ResourceSlices at start",
                self.publisher.list_current,
                timeout=TIMEOUT,
            )
        except PublishError as e:
            log.info("could not read the published slices at start (%s); publishing anew", e)
            return {}
        return {
            d["name"]: list(d.get("taints") or [])
            for s in current.values()
            for d in s.get("spec", {}).get("devices") or []
            if isinstance(d, dict) and "name" in d
        }

    # -- the claim watch: switch ahead, write the binding conditions ------------------------
    def _claim_seen(self, uid: str, claim: dict[str, Any] | None) -> None:
        """The claim watch's thread: a claim of our pool, as it is now (None: gone)."""
        loop = self._loop
        if loop is not None and not self._stopping:
            loop.call_soon_threadsafe(self._start_ahead, uid, claim)

    def _start_ahead(self, uid: str, claim: dict[str, Any] | None) -> None:
        task = asyncio.create_task(self._ahead(uid, claim), name=f"switch ahead {uid}")
        self._ahead_tasks.add(task)
        task.add_done_callback(self._ahead_tasks.discard)

    async def _ahead(self, uid: str, claim: dict[str, Any] | None) -> None:
        try:
            if claim is None:
                if self.binding is not None:
                    self.binding.drop(uid)  # a write still retried is given up
                await self.ahead.gone(uid)
                return
            outcome = await self.ahead.allocated(claim)
            if outcome is None or self.binding is None:
                return
            meta = claim.get("metadata") or {}
            ns, name = str(meta.get("namespace")), str(meta.get("name"))
            self.binding.write(uid, ns, name, outcome.conditions(self.options.driver_name))
        except Exception:
            log.exception("claim %s: the switch ahead of its pod", uid)

    # -- the core's observer: the slice feed's answer, carried to its peers ----------------
    async def inventory_changed(self, snapshot: Snapshot) -> None:
        seen = time.monotonic()  # the scan has just ended
        update = await self.feed.update(snapshot)
        self.publisher.want(update.devices)
        self._publish_health(update.devices, changed=not update.same)
        if not update.same:  # the per-device gauges change only with the devices or health
            self._count_soon(update)
        self.metrics.set("vfio_dp_dra_health_streams", self.health_stream.streams)
        held = [h for h in update.changed if h.held]
        for h in held:
            self.metrics.inc("vfio_dp_dra_health_changes_total", health=h.health)
        if held:  # the taints are written first (the scheduler's), then the claims' status
            self.status.hold(STATUS_HOLD)
        self.status.devices_changed({h.device for h in held})
        if update.pending and self._confirm is None and not self._stopping:
            wait = confirm_delay(seen, time.monotonic())
            self._confirm = asyncio.get_running_loop().call_later(wait, self._confirm_scan)

    def _count_soon(self, update: PoolUpdate) -> None:
        """:meth:`_count` now, or -- before the publisher's first reconcile has ended -- once
        it has: the first pool's gauges are a series per device (8,192 made at 4,096 devices,
        ~0.13 s of CPU) that the first slices, on the way to the API server, need not wait for
        (nor share the GIL with). The latest update waiting is the one counted."""
        if self.publisher.first_done.is_set():
            self._uncounted = None
            self._count(update)
            return
        if self._uncounted is None:
            self.spawn(self._count_after_first(), "the first pool's per-device gauges")
        self._uncounted = update

    async def _count_after_first(self) -> None:
        await self.publisher.first_done.wait()
        update, self._uncounted = self._uncounted, None
        if update is not None:
            self._count(update)

    def _count(self, update: PoolUpdate) -> None:
        """The per-device gauges: only the series of devices whose health or taint changed
        are touched (1,024 devices re-made per change cost ~0.1 s of CPU before the slices)."""
        self.metrics.set("vfio_dp_dra_devices", len(update.devices))
        now: dict[str, tuple[str, float]] = {}
        for d in update.devices:
            h = self.feed.health.states.get(dra_entry(d.name)[0])  # a container entry: its group's
            if h is not None:  # else an mdev entry: published only while usable
                now[d.name] = (h.health, float(bool(d.taints)))
        before, self._gauges = self._gauges, now
        for name, was in before.items():
            if now.get(name, ("", 0.0))[0] != was[0]:
                self.metrics.remove("vfio_dp_dra_device_health", device=name, health=was[0])
            if name not in now:
                self.metrics.remove("vfio_dp_dra_device_tainted", device=name)
        for name, (health_, tainted) in now.items():
            if before.get(name) != (health_, tainted):
                self.metrics.set("vfio_dp_dra_device_health", 1, device=name, health=health_)
                self.metrics.set("vfio_dp_dra_device_tainted", tainted, device=name)

    def _publish_health(self, devices: Sequence[Device], *, changed: bool) -> None:
        """The health stream's next list (built only when a kubelet stream wants it; sent at
        once only when ``changed``, else at the stream's refresh)."""
        model = self.feed.health
        states, checked = model.states, model.checked
        self.health_stream.publish(
            lambda: health.reports(states, [d.name for d in devices], checked), changed=changed
        )

    def _confirm_scan(self) -> None:
        self._confirm = None
        self.core.kick("health confirm")

    def _published(self, generation: int, slices: list[dict[str, Any]]) -> None:
        """After each pool write (the publisher's thread)."""
        self.metrics.inc("vfio_dp_dra_publishes_total")
        self.metrics.set("vfio_dp_dra_pool_generation", generation)
        fields = ApiFields(self.publisher.counters_kept, self.publisher.binding_kept)
        if fields != self._fields_written:  # the slice lane's thread: one small file
            try:
                self.api_fields.put(fields)
                self._fields_written = fields
            except VfioError as e:
                log.warning("what the API server keeps is not recorded for vfioctl list: %s", e)
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: the process stops
                self._loop.call_soon_threadsafe(self.status.release)

    # -- the kubelet shell's handler -----------------------------------------------------
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, ClaimResult]:
        results = await self.claims.prepare(claims)
        for c in claims:
            r = results.get(c.uid)
            if r is not None and not r.error:  # written in the background, never waited for
                self.status.claim_changed(c.namespace, c.name, c.uid)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        errors = await self.claims.unprepare(claims)
        for c in claims:
            if errors.get(c.uid) == "":
                self.status.claim_changed(c.namespace, c.name, c.uid)
        return errors


def run(options: DraOptions, client: Any) -> int:
    """Run until SIGTERM/SIGINT (:func:`vfio_dp.core.frontend.serve`); 0 on a clean stop."""
    return asyncio.run(serve(DraPlugin(options, client)))
