"""The DRA plugin's lifecycle: node core + ResourceSlice publisher + kubelet gRPC shell.

What ``vfioctl dra-plugin`` runs, one asyncio process:

1. The node core (:class:`vfio_dp.core.node.NodeCore`, path ``dra``, host usage on) loads the
   config and scans; ``bind: true`` selectors of ``path: dra`` are bound at start and on
   hotplug; ``bind: onPrepare`` groups stay on their host drivers.
2. After every scan (start, uevent, SIGUSR1, resync, config reload) this front-end computes
   the devices to publish (:func:`vfio_dp.dra.slices.published_devices`, pure) and hands them
   to the :class:`~vfio_dp.dra.apiserver.publisher.SlicePublisher`, which writes them when they changed
   and rewrites them when someone deleted or changed ours (within one resync).
3. The kubelet shell (:class:`vfio_dp.dra.kubeletapi.server.KubeletFrontEnd`) serves
   ``<plugins>/<driver>/dra.sock``, then ``<registry>/<driver>-reg.sock``; every 0.25 s it
   re-creates a socket removed from under it.
4. NodePrepareResources / NodeUnprepareResources go to the
   :class:`~vfio_dp.dra.claimpath.prepare.ClaimPreparer` (claims read through the publisher's
   :func:`~vfio_dp.dra.apiserver.publisher.claim_reader`): ``bind: onPrepare`` groups are bound when a
   claim is prepared and given back when it is unprepared; CDI specs go to ``--cdi-dir`` and
   device metadata under ``<plugins>/<driver>/``. At start and every resync it reconciles:
   claims gone from the API server are unprepared, groups still held open are kept.
5. SIGTERM/SIGINT: both sockets removed, exit 0. The slices stay: kubelet deletes them 30 s
   after no instance of the driver is connected, and a restarted plugin continues the pool's
   generation.

Paths: ``--kubelet-registry-dir``, ``--kubelet-plugins-dir`` and ``--cdi-dir`` are paths as
this process sees them, never joined with ``--root`` (which is only for sysfs and the state
records).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from vfio_dp.core.frontend import FrontEnd, serve
from vfio_dp.core.health import HEALTHY, HealthModel, assess
from vfio_dp.core.node import NodeCore, Snapshot
from vfio_dp.dra.apiserver.claim_status import ClaimStatusWriter, DeviceStatus, StatusError
from vfio_dp.dra.apiserver.publisher import (
    PublishError,
    SlicePublisher,
    api_executor,
    claim_reader,
    class_reader,
)
from vfio_dp.dra.claimpath.checkpoint import PREPARED, ClaimRecord
from vfio_dp.dra.claimpath.claims import ClaimRef, ClaimResult
from vfio_dp.dra.claimpath.holds import checkpoint_holds
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.dra.kubeletapi.health_stream import HealthStream
from vfio_dp.dra.kubeletapi.server import KubeletFrontEnd
from vfio_dp.dra.observers import health
from vfio_dp.dra.options import DraOptions
from vfio_dp.dra.slices import Device, device_for
from vfio_dp.errors import UsageError
from vfio_dp.host import Host
from vfio_dp.host.holders import scan_holders
from vfio_dp.host.topology import pcie_roots
from vfio_dp.host.vfio import group_nodes_present
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vfio_dp.model.device import Inventory, PciDevice
from vfio_dp.model.serving import DraUnit, dra_units, withdraw_held

log = logging.getLogger("vfio_dp.dra")

WATCH_INTERVAL = 0.25
#: a held group's new health is confirmed by a second scan this soon (debounce, < 1 s)
CONFIRM_DELAY = 0.2


def health_timeout(resync: float) -> int:
    """``health_check_timeout_seconds``: we report after every scan, at least every
    ``resync`` seconds; three missed reports (as ``/healthz``) make kubelet say Unknown."""
    return max(1, math.ceil(3 * resync))


class DraPlugin(FrontEnd):
    """The DRA front-end over its own :class:`NodeCore`."""

    def __init__(self, options: DraOptions, client: Any, host: Host | None = None) -> None:
        if not options.node_name:
            raise UsageError(
                "the DRA plugin needs its node's name: --node-name, or NODE_NAME from the "
                "pod's spec.nodeName (fieldRef)"
            )
        self.options = options
        self.health = HealthModel()
        self.health_stream = HealthStream(options.node_name, health_timeout(options.resync))
        self.kubelet = KubeletFrontEnd(
            options.driver_name,
            options.registry_dir,
            options.plugins_dir,
            self,
            health=self.health_stream,
        )
        super().__init__(NodeCore(options.core(), host), log)
        self.core.subscribe(self)
        # a VF a prepared claim holds is never destroyed by an SR-IOV count change
        self.core.vf_holds.append(lambda: checkpoint_holds(self.core.host.fs, options.driver_name))
        self.publisher = SlicePublisher(client, options.driver_name, options.node_name)
        self.publisher.on_published.append(self._published)
        self.devices: list[Device] = []
        self._roots: dict[PciAddress, str] = {}
        self._last: dict[str, Device] = {}  # every device as last built (held, gone ones)
        #: an idle resync hands the same inventory and config again (the core reads nothing
        #: when its cheap look finds no change): their units and devices are reused, not
        #: recomputed (4,096 devices: ~8 % of a CPU at --resync 5 before)
        self._units_of: tuple[Inventory, Config, list[DraUnit]] | None = None
        self._built: dict[str, tuple[DraUnit, PciDevice, Device]] = {}
        #: what the last scan's verdicts came from (an equal next one changes nothing)
        self._idle_key: tuple[Any, ...] | None = None
        # the group nodes _withdraw_held looks for, per (inventory, units, our groups)
        self._held_nodes: (
            tuple[Inventory, list[DraUnit], frozenset[int | None], dict[str, int]] | None
        ) = None
        self._effects: dict[str, str] = {}
        self._confirm: asyncio.TimerHandle | None = None
        #: this node's device taints on the server at start, by device name
        self._on_server: dict[str, list[dict[str, str]]] = {}
        self.api_pool = api_executor()  # the claim path's API calls (never the host threads)
        self.claims = ClaimPreparer(
            host=self.core.host,
            driver=options.driver_name,
            node=options.node_name,
            cdi_dir=options.cdi_dir,
            plugins_dir=options.plugins_dir,
            read_claim=claim_reader(client, self.api_pool),
            read_class=class_reader(client, self.api_pool),
            config=lambda: self.core.config,
            published=self._published_devices,
            metrics=self.metrics,
        )
        self.status_writer = ClaimStatusWriter(client, options.driver_name)
        self._status_tasks: set[asyncio.Task[None]] = set()

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        log.info(
            "DRA plugin %s on node %s: registry %s, plugins %s",
            self.options.driver_name,
            self.options.node_name,
            self.options.registry_dir,
            self.options.plugins_dir,
        )
        self.publisher.start()
        # the first scan must know the prepared claims: a held group is never withdrawn
        # (blocking reads on the core's executor, which core.start makes the default anyway)
        asyncio.get_running_loop().set_default_executor(self.core.executor)
        await self.claims._ensure_loaded()
        self._on_server = await self._published_on_server()
        await self.core.start()
        await self._reconcile_once()  # before kubelet can call: what a crash left is settled
        await self.kubelet.start()
        self.repeat(WATCH_INTERVAL, self.kubelet.check, "kubelet socket watch")
        self.repeat(self.options.resync, self._reconcile_once, "reconcile claims")

    async def withdraw(self) -> None:
        """At stop: no health confirmation pending, kubelet's health streams ended, both
        sockets removed, claim-status writes under way finished, publishing stopped (the
        slices stay)."""
        if self._confirm is not None:
            self._confirm.cancel()
        self.health_stream.close()  # kubelet's streams end before the server goes
        await self.kubelet.stop()
        if self._status_tasks:  # status writes under way finish (each has its own timeouts)
            await asyncio.wait(set(self._status_tasks), timeout=15)
        self.api_pool.shutdown(wait=False, cancel_futures=True)
        await self.publisher.stop()

    async def _reconcile_once(self) -> None:
        try:
            report = await self.claims.reconcile()
        except Exception:
            log.exception("reconciling prepared claims")
            return
        for line in report.unprepared:
            log.info("claim unprepared by reconcile: %s", line)

    def _published_devices(self) -> Mapping[str, Device]:
        """The devices last written to the API server (before the first write: the ones being
        published), by name."""
        written = self.publisher.written_devices
        return {d.name: d for d in (written if written is not None else self.devices)}

    # -- the core's observer -------------------------------------------------------------
    async def inventory_changed(self, snapshot: Snapshot) -> None:
        inv, config = snapshot.inventory, snapshot.config
        units = await self._withdraw_held(inv, self._dra_units(inv, config))
        holds = health.claim_holds(self.claims.checkpoint.all().values())
        key, last = (inv, config, units, holds), self._idle_key
        if (
            last is not None
            and all(a is b for a, b in zip(key[:3], last[:3], strict=True))
            and holds == last[3]
            and not self.health.waiting
        ):
            # an idle resync: the same inventory, config, units and claims give the same
            # verdicts and devices -- and the same devnodes: the core hands the same inventory
            # only while its cheap look (vfio_dp.host.changes.fingerprint, which lists
            # /dev/vfio) is unchanged. Only the time of the last check moves.
            self.health.scanned = time.time()
            self.metrics.set("vfio_dp_dra_health_streams", self.health_stream.streams)
            self.publisher.want(self.devices)
            self._publish_health(self.devices)
            return
        shown = [
            u for u in units if u.primary in inv.devices and (u.published or u.name in holds.held)
        ]
        # a device's PCIe root does not change while it is present: read new ones only
        new = [u.primary for u in shown if u.primary not in self._roots]
        if new:
            self._roots.update(await self.core.run(pcie_roots, self.core.host.fs, new))
        for gone in set(self._roots) - set(inv.devices):
            del self._roots[gone]
        missing = await self.core.run(self._missing_nodes, inv, units, holds)
        verdicts = assess(units, inv, holds.held, missing)
        busy = await self.core.run(self._busy, verdicts, holds)
        update = self.health.update(
            verdicts, held=set(holds.held), in_flight=holds.in_flight | busy, now=time.time()
        )
        built = self._devices(shown, inv)
        self._last = {n: d for n, d in {**self._last, **built}.items() if n in verdicts}
        self._effects = {
            **{n: e for n, e in self._effects.items() if n in verdicts},
            **{u.name: u.taint_effect for u in units},
        }
        devices = health.pool_devices(
            self.health.states,
            built,
            self._last,
            self._effects,
            self.options.driver_name,
            previous={d.name: d.taints for d in self.devices} or self._on_server,
        )
        self._on_server = {}
        self._log_changes(snapshot, units, devices, update.changed)
        same = not update.changed and devices == self.devices  # an idle resync
        self.devices = devices
        if not same:  # the per-device gauges change only with the devices or their health
            self.metrics.set("vfio_dp_dra_devices", len(devices))
            self.metrics.clear("vfio_dp_dra_device_health")
            self.metrics.clear("vfio_dp_dra_device_tainted")
            for d in devices:
                h = self.health.states[d.name]
                self.metrics.set("vfio_dp_dra_device_health", 1, device=h.device, health=h.health)
                self.metrics.set(
                    "vfio_dp_dra_device_tainted", float(bool(d.taints)), device=h.device
                )
        self.metrics.set("vfio_dp_dra_health_streams", self.health_stream.streams)
        self.publisher.want(devices)
        self._publish_health(devices)
        for h in update.changed:
            if h.held:
                self._status_changed(h.device)
        if update.pending and self._confirm is None and not self._stopping:
            self._confirm = asyncio.get_running_loop().call_later(CONFIRM_DELAY, self._confirm_scan)
        self._idle_key = key  # all of it done: the same key next time is an idle resync

    def _publish_health(self, devices: Sequence[Device]) -> None:
        """The health stream's next list (built only when a kubelet stream wants it)."""
        states, names, checked = self.health.states, [d.name for d in devices], self.health.checked
        self.health_stream.publish(lambda: health.reports(states, names, checked))

    def _dra_units(self, inv: Inventory, config: Config) -> list[DraUnit]:
        """:func:`dra_units` of ``inv`` under ``config``, reused while both are the same
        objects (an idle resync)."""
        cached = self._units_of
        if cached is not None and cached[0] is inv and cached[1] is config:
            return cached[2]
        units = dra_units(inv, config)
        self._units_of = (inv, config, units)
        return units

    def _devices(self, shown: Sequence[DraUnit], inv: Inventory) -> dict[str, Device]:
        """The slice device of each unit in ``shown``, by name: the one built before when
        the unit and its primary function's record are equal (a device depends on nothing
        else but its PCIe root, which does not change while it is present), else built anew
        -- a change of one function rebuilds one device, an idle resync none."""
        cache = self._built
        fresh: dict[str, tuple[DraUnit, PciDevice, Device]] = {}
        for u in shown:
            dev = inv.devices[u.primary]
            hit = cache.get(u.name)
            if (
                hit is None
                or not (hit[0] is u or hit[0] == u)
                or not (hit[1] is dev or hit[1] == dev)
            ):
                hit = (u, dev, device_for(u, inv, self._roots))
            fresh[u.name] = hit
        self._built = fresh
        return {n: d for n, (_, _, d) in fresh.items()}

    async def _published_on_server(self) -> dict[str, list[dict[str, str]]]:
        """The taints of this node's devices on the server now, by name (a restart keeps
        their ``timeAdded``, so the slices are adopted unchanged); {} when unreadable."""
        try:
            current = await asyncio.to_thread(self.publisher.list_current)
        except PublishError as e:
            log.info("could not read the published slices at start (%s); publishing anew", e)
            return {}
        return {
            d["name"]: list(d.get("taints") or [])
            for s in current.values()
            for d in s.get("spec", {}).get("devices") or []
            if isinstance(d, dict) and "name" in d
        }

    def _confirm_scan(self) -> None:
        self._confirm = None
        self.core.kick("health confirm")

    def _missing_nodes(
        self, inv: Inventory, units: list[DraUnit], holds: health.ClaimHolds
    ) -> set[int]:
        """Groups that should have ``/dev/vfio/<N>`` but have none. Blocking (one listing)."""
        groups = health.nodes_to_check(inv, units, holds)
        present = group_nodes_present(self.core.host.fs, groups)
        return {g for g, ok in present.items() if not ok}

    def _busy(self, verdicts: Mapping[str, Any], holds: health.ClaimHolds) -> set[str]:
        """Held devices whose verdict changed while a bind/unbind holds their locks (ours,
        or an operator's ``vfioctl``): never a fault. Blocking (lock probes)."""
        out: set[str] = set()
        for name, h in holds.held.items():
            cur, v = self.health.states.get(name), verdicts.get(name)
            if cur is None or v is None or (cur.health, cur.faults) == (v.health, v.faults):
                continue
            if self.core.host.state.busy(list(h.addresses)):
                out.add(name)
        return out

    def _log_changes(
        self, snapshot: Snapshot, units: list[DraUnit], devices: list[Device], changed: Any
    ) -> None:
        before = {d.name for d in self.devices}
        after = {d.name for d in devices}
        for name in sorted(after - before):
            log.info("DRA device %s to be published (%s)", name, snapshot.trigger)
        for name in sorted(before - after):
            log.info("DRA device %s to be withdrawn (%s)", name, snapshot.trigger)
        for h in changed:
            if h.held:
                log.warning("DRA device %s (prepared) now %s: %s", h.device, h.health, h.message)
                self.metrics.inc("vfio_dp_dra_health_changes_total", health=h.health)
        for u in units:
            if not u.published and snapshot.trigger in ("start", "config"):
                log.info("IOMMU group %d not published: %s", u.group, "; ".join(u.reasons))

    async def _withdraw_held(self, inv: Inventory, units: list[DraUnit]) -> list[DraUnit]:
        """Withdraw published groups whose ``/dev/vfio/<N>`` a process holds open while no
        claim of ours is prepared on them (:func:`vfio_dp.model.serving.withdraw_held`)."""
        ours = frozenset(
            d.iommu_group for r in self.claims.checkpoint.all().values() for d in r.devices
        )
        cached = self._held_nodes
        if cached is not None and cached[0] is inv and cached[1] is units and cached[2] == ours:
            nodes = cached[3]  # an idle resync: the same groups to look for
        else:
            nodes = {
                f"/dev/vfio/{inv.groups[u.group].node}": u.group
                for u in units
                if u.published and u.group not in ours and u.group in inv.groups
            }
            self._held_nodes = (inv, units, ours, nodes)
        if not nodes:
            return units
        scan = await self.core.run(scan_holders, self.core.host.fs, nodes)
        # by_node holds only the nodes someone holds (few, usually none)
        held = {nodes[n]: scan.describe(n) for n in scan.by_node}
        if scan.unreadable:
            log.warning("%s", scan.describe(next(iter(nodes))))
        return withdraw_held(units, held)

    def _published(self, generation: int, slices: list[dict[str, Any]]) -> None:
        self.metrics.inc("vfio_dp_dra_publishes_total")
        self.metrics.set("vfio_dp_dra_pool_generation", generation)

    # -- the claims' device status (KEP-4817) --------------------------------------------
    def _statuses(self, rec: ClaimRecord) -> list[DeviceStatus]:
        """Our entries for one prepared claim, from the health model. Blocking (reads the
        bind records: who bound the group)."""
        out: list[DeviceStatus] = []
        holders = self.core.host.record_holders()
        for d in rec.devices:
            if d.admin_access or d.iommu_group is None or not d.addresses:
                continue
            h = self.health.states.get(d.device)
            bound = holders.get(PciAddress.parse(d.addresses[0]))
            out.append(
                DeviceStatus(
                    pool=d.pool,
                    device=d.device,
                    health=h.health if h else HEALTHY,
                    message=h.message if h else "prepared: viable and on vfio-pci",
                    since=health.rfc3339(h.since if h else time.time()),
                    addresses=d.addresses,
                    iommu_group=d.iommu_group,
                    devnodes=("/dev/vfio/vfio", f"/dev/vfio/{d.iommu_group}"),
                    bound_by=bound or "none (it was on vfio-pci already)",
                )
            )
        return out

    async def _write_status(
        self, namespace: str, name: str, uid: str, rec: ClaimRecord | None
    ) -> None:
        """Write (``rec``) or remove (None) our entries of a claim's status; never raises."""

        def job() -> None:
            ours = self._statuses(rec) if rec is not None else []
            self.status_writer.write(namespace, name, uid, ours)

        try:  # on the API threads: a hanging API server never takes the host-I/O threads
            await asyncio.get_running_loop().run_in_executor(self.api_pool, job)
        except (StatusError, OSError, ValueError) as e:
            self.metrics.inc("vfio_dp_dra_claim_status_errors_total")
            log.error("claim %s/%s: device status not written: %s", namespace, name, e)

    def _status_changed(self, device: str) -> None:
        """A held device changed health: rewrite the status of every claim holding it."""
        for rec in self.claims.checkpoint.all().values():
            if rec.state == PREPARED and any(d.device == device for d in rec.devices):
                task = asyncio.create_task(
                    self._write_status(rec.namespace, rec.name, rec.uid, rec)
                )
                self._status_tasks.add(task)
                task.add_done_callback(self._status_tasks.discard)

    # -- the kubelet shell's handler -----------------------------------------------------
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, ClaimResult]:
        results = await self.claims.prepare(claims)
        for c in claims:
            r = results.get(c.uid)
            rec = self.claims.checkpoint.get(c.uid)
            if r is not None and not r.error and rec is not None and rec.state == PREPARED:
                await self._write_status(c.namespace, c.name, c.uid, rec)
        return results

    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        errors = await self.claims.unprepare(claims)
        for c in claims:
            if errors.get(c.uid) == "":
                await self._write_status(c.namespace, c.name, c.uid, None)
        return errors


def run(options: DraOptions, client: Any) -> int:
    """Run until SIGTERM/SIGINT (:func:`vfio_dp.core.frontend.serve`); 0 on a clean stop."""
    return asyncio.run(serve(DraPlugin(options, client)))
