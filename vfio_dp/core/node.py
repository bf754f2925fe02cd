"""The node core: one process's view of the host's PCI devices, kept current.

What every kubelet front-end (the device-plugin daemon in :mod:`vfio_dp.deviceplugin`, the DRA
plugin in :mod:`vfio_dp.dra`) shares, and nothing kubelet-specific:

- the configuration (``--config``; every error listed, the process does not start on a bad
  one), reloaded when the file behind it changes (a ConfigMap swaps its ``..data`` symlink;
  seen by inotify, polled every 0.25 s where inotify cannot watch;
  :mod:`vfio_dp.core.config_file`): a bad new config is logged and ignored;
- the scan of ``<root>/sys/bus/pci/devices`` and ``<root>/sys/kernel/iommu_groups`` through
  :class:`vfio_dp.host.Host` (never opens ``/dev/vfio/<N>``): in full at start, on config
  changes and every :data:`FULL_SCAN_INTERVAL`, a cheap refresh otherwise; triggered by kernel
  PCI uevents (debounced 50 ms), :meth:`NodeCore.kick` (SIGUSR1) and a front-end's own need
  (:meth:`NodeCore.rescan`). Every ``resync`` seconds the core first takes the cheap look of
  :func:`vfio_dp.host.changes.fingerprint` (two directory listings and three stats, no
  per-device read):
  it scans only when that differs from the look taken with the last scan -- so a driver or
  group link changed or a VFIO node gone without a uevent is seen within one period, and an
  idle daemon costs a few listings per period (with ``numVfs`` selectors or VFs it made, every
  resync reconciles and scans, as below). With ``usage`` (the DRA plugin) an unchanged
  look still re-reads the host's use of the devices (global files, not per device) and tells
  the front-ends (they reconcile what they published);
- one path per resource name on this node: a config under which the device plugin and the DRA
  plugin would both serve one name is refused (at start: the process exits naming the
  selectors; on reload: the previous config is kept);
- the ``bind: true`` policy (:mod:`vfio_dp.core.policy`, pure) for the devices of this
  process's path: bound at start, on hotplug and when a reload makes them ``bind: true``,
  recorded as this front-end's (``CoreOptions.front_end``: ``device-plugin``, ``dra-plugin``).
  Never unbinds anything;
- SR-IOV: the VF count each ``numVfs`` selector asks of the PFs it names, made before every
  scan (:mod:`vfio_dp.core.sriov_pass`); the made VFs are new devices to the ``bind: true``
  pass. Front-ends add who holds a VF (:attr:`NodeCore.vf_holds`);
- health (``/healthz``: the last successful scan is recent) and metrics (``/metrics``);
- host I/O on a 2-thread executor, so threads stay bounded.

Front-ends subscribe with :meth:`NodeCore.subscribe` and are told, after every scan, what the
inventory and the configuration are now (:class:`Snapshot`); each computes what it serves
(a device-plugin listing, ResourceSlices) from it with pure functions.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from vfio_dp.core.config_file import ConfigFile
from vfio_dp.core.mdev_reconcile import MdevPass
from vfio_dp.core.metrics import Metrics, serve_http
from vfio_dp.core.options import CoreOptions
from vfio_dp.core.policy import autobind_groups, newly_bound, vfio_drivers_wanted
from vfio_dp.core.sriov_pass import SriovPass
from vfio_dp.core.uevents import UeventSource
from vfio_dp.errors import BindError, ConfigError, PathConflictError
from vfio_dp.host import Host
from vfio_dp.host.changes import (
    Fingerprint,
    devices_or_groups_changed,
    fingerprint,
    with_usage,
)
from vfio_dp.host.inotify import DirWatcher, config_dirs
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEFAULT_CONFIG, DRA, Config
from vfio_dp.model.device import Inventory
from vfio_dp.model.serving import resource_path_conflicts

log = logging.getLogger("vfio_dp.core")

#: watch loops (config, kubelet sockets: host.inotify.DirWatcher) look on every event, at
#: least every WATCH_SAFETY s, and every WATCH_POLL s while inotify cannot watch
WATCH_POLL = 0.25
WATCH_SAFETY = 5.0
DEBOUNCE = 0.05
#: A full scan (every attribute of every device) at most this often; other rescans re-read
#: only what changes while a device is present (Host.refresh: ~2 syscalls per device), and a
#: resync whose cheap look (host.changes.fingerprint) finds nothing changed reads nothing else.
FULL_SCAN_INTERVAL = 600.0

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the core knows after one scan."""

    inventory: Inventory
    config: Config
    #: what caused the scan: ``start``, ``resync``, ``uevent <action> <bdf>``, ``SIGUSR1``,
    #: ``config`` (a reload was applied), or a front-end's own reason
    trigger: str
    #: the scan generation: bumped whenever the core hands out another inventory or config;
    #: equal generations carry the same ``inventory`` and ``config`` (an idle resync whose
    #: cheap look found nothing changed), so front-ends key their caches by it
    generation: int = 0


class Observer(Protocol):
    """A front-end: told after every scan; raising keeps the others informed (logged)."""

    async def inventory_changed(self, snapshot: Snapshot) -> None: ...


class NodeCore:
    def __init__(self, options: CoreOptions, host: Host | None = None) -> None:
        self.options = options
        self.host = host or Host(options.root, runner=options.front_end)
        self.config: Config = DEFAULT_CONFIG
        self.config_file = ConfigFile(options.config_path, options.node_name)
        self.inventory: Inventory | None = None
        #: :attr:`Snapshot.generation` of the last snapshot, and the config it carried
        self.generation = 0
        self._told_config: Config | None = None
        self.metrics = Metrics()
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vfio_dp-host")
        self.uevents = UeventSource(self.on_uevent)
        self.observers: list[Observer] = []
        #: extra health checks of the front-ends: each returns None or why it is unhealthy
        self.health_checks: list[Callable[[], str | None]] = []
        self.sriov_pass = SriovPass(self.host, by=options.front_end, path=options.path)
        #: front-ends' holds on VFs (a prepared claim, a pod's allocation): address -> who
        self.vf_holds = self.sriov_pass.vf_holds
        #: the config's mdev: section (vfio_dp.core.mdev_reconcile), before every scan
        self.mdev = MdevPass(self.host, options.front_end, options.path)
        self._scan_lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._dirty_reason = "resync"
        self._tasks: list[asyncio.Task[None]] = []
        self._http: asyncio.Server | None = None
        self._watcher: DirWatcher | None = None  # the config's directories
        self._last_scan = 0.0
        self._last_full_scan = 0.0
        #: the cheap look taken just before the scan that made ``inventory`` (None: take
        #: no shortcut at the next resync)
        self._fingerprint: Fingerprint | None = None
        self.started = False
        self.stopping = False

    def subscribe(self, observer: Observer) -> None:
        self.observers.append(observer)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Load the config (raises :class:`ConfigError`), scan (binding ``bind: true``
        devices), tell the observers, and start the resync and watch loops."""
        self.config = self.config_file.load()
        if self.config.node_limited and self.options.node_name is None:
            log.warning(
                "the config limits selectors to nodes (nodes:) but this process does not know "
                "its node name: those selectors are skipped; set --node-name (NODE_NAME)"
            )
        loop = asyncio.get_running_loop()
        loop.set_default_executor(self.executor)
        log.info(
            "starting: root %s, config %s, resync %.1fs, serving path %s",
            self.host.root,
            self.options.config_path or "(default)",
            self.options.resync,
            self.options.path,
        )
        if self.options.uevents:
            self.uevents.start(loop)
        if self.options.metrics_port:
            self._http = await serve_http(
                self.options.metrics_host, self.options.metrics_port, self.metrics, self.health
            )
        # undo binds a kill interrupted (ours, and an older version's "daemon" ones)
        await self.run(self.host.recover, runner=self.options.front_end)
        await self.rescan("start", bind_all=True)
        self._tasks = [asyncio.create_task(self._resync_loop(), name="resync")]
        if (path := self.options.config_path) is not None:  # reloaded when its dirs change
            self._watcher = DirWatcher(
                lambda: config_dirs(path), poll=WATCH_POLL, safety=WATCH_SAFETY, label="--config"
            )
            self._tasks.append(asyncio.create_task(self._watcher.run(self.check_config, log)))
        self.started = True

    def begin_stop(self) -> None:
        """Stop scanning and watching (front-ends then withdraw, then call :meth:`close`)."""
        self.stopping = True
        for t in self._tasks:
            t.cancel()

    async def close(self) -> None:
        self.begin_stop()
        self.uevents.stop(asyncio.get_running_loop())
        if self._watcher is not None:
            self._watcher.close()
        if self._http is not None:
            self._http.close()
        self.executor.shutdown(wait=False, cancel_futures=True)

    def health(self) -> str | None:
        """None when serving and the last scan is recent (``/healthz``), else why not."""
        if self.stopping:
            return "stopping"
        if not self.started:
            return "starting"
        age = time.monotonic() - self._last_scan
        limit = 3 * self.options.resync + 30
        if age > limit:
            return f"last successful scan of sysfs was {age:.0f}s ago (limit {limit:.0f}s)"
        for check in self.health_checks:
            why = check()
            if why is not None:
                return why
        return None

    def kick(self, reason: str) -> None:
        """Rescan soon (a uevent, SIGUSR1, a front-end noticing something)."""
        self._dirty_reason = reason
        self._dirty.set()

    def on_uevent(self, what: str) -> None:
        self.metrics.inc("vfio_dp_uevents_total")
        log.debug("uevent: %s", what)
        self.kick(f"uevent {what}")

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` on the host-I/O executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    # -- scanning ----------------------------------------------------------------------
    async def rescan(
        self,
        trigger: str,
        *,
        bind_all: bool = False,
        bind_only: set[PciAddress] | None = None,
        full: bool = False,
    ) -> Snapshot:
        """Scan ``<root>/sys`` (``full``: every attribute of every device), bind new
        ``bind: true`` devices, tell the observers."""
        async with self._scan_lock:
            made: list[PciAddress] = []
            if self.mdev.needed(self.config):
                await self.mdev.reconcile(self.config, self.run, self.vf_holds)
            if self.sriov_pass.needed(self.config):
                made = await self.sriov_pass.reconcile(self.config, self.run)
            inv = await self._scan(trigger, full)
            self.metrics.inc("vfio_dp_scans_total", trigger=trigger.split()[0])
            if trigger == "start":  # before binding anything
                self._refuse_path_conflicts(inv, self.config)
            known = self.inventory.devices if self.inventory else {}
            fresh = set(inv.devices) if bind_all else set(inv.devices) - set(known)
            if bind_only:
                fresh |= bind_only
            fresh |= set(made)  # a VF made again at an address seen before is new too
            if fresh and await self._bind(inv, fresh):
                self._fingerprint = None  # our own bind changed links: scan at the next resync
                inv = await self._rescan_after_bind(inv)
            return await self._tell(inv, trigger)

    async def _tell(self, inv: Inventory, trigger: str) -> Snapshot:
        """Take ``inv`` as the current view and tell the observers (under the scan lock)."""
        if inv is not self.inventory or self.config is not self._told_config:
            self.generation += 1  # the one place a new scan result is told apart
        self.inventory, self._told_config = inv, self.config
        snapshot = Snapshot(inv, self.config, trigger, self.generation)
        for obs in list(self.observers):
            try:
                await obs.inventory_changed(snapshot)
            except Exception:
                if not self.started:
                    raise  # at start: the process does not come up half-served
                log.exception("%s failed to take the new inventory", type(obs).__name__)
        self._last_scan = time.monotonic()
        return snapshot

    async def resync(self) -> None:
        """The periodic resync: the cheap look first; a rescan only when it differs from the
        look taken with the last scan, or when the full scan is due (see the module
        docstring)."""
        if (
            self.inventory is None
            or self._fingerprint is None
            or time.monotonic() - self._last_full_scan >= FULL_SCAN_INTERVAL
            or self.sriov_pass.needed(self.config)  # SR-IOV: reconciled at every resync
            or self.mdev.needed(self.config)  # mdev: reconciled at every resync too
        ):
            await self.rescan("resync")
            return
        async with self._scan_lock:  # the look and (usage) the host's use: ONE executor job
            known, inv = self._fingerprint, self.inventory
            look, used = await self.run(self._look_then_usage, known, inv)
            if look == known:
                self.metrics.inc("vfio_dp_resync_checks_total", result="unchanged")
                if used is None:
                    self._last_scan = time.monotonic()  # checked: the view is current
                    return
                await self._tell(used, "resync")
                return
        self.metrics.inc("vfio_dp_resync_checks_total", result="changed")
        # a device came, went or was re-made, or a group came or went (a device's group
        # may differ): read every device in full
        await self.rescan("resync", full=devices_or_groups_changed(look, known))

    def _look_then_usage(
        self, known: Fingerprint | None, inv: Inventory | None
    ) -> tuple[Fingerprint, Inventory | None]:
        """The cheap look and, when it equals ``known`` and the core reads the host's use,
        ``inv`` with that use read again (:func:`with_usage`; None otherwise): an idle resync
        hops to the executor once."""
        look = fingerprint(self.host.fs)
        if look != known or not self.options.usage or inv is None:
            return look, None
        return look, with_usage(self.host.fs, inv)

    def _refuse_path_conflicts(self, inv: Inventory, config: Config) -> None:
        """Raise :class:`PathConflictError` when a resource name would be served by both
        paths on this node (:func:`vfio_dp.model.serving.resource_path_conflicts`)."""
        conflicts = resource_path_conflicts(inv, config)
        if conflicts:
            process = "the DRA plugin" if self.options.path == DRA else "the device-plugin daemon"
            raise PathConflictError(process, self.options.node_name, conflicts)

    async def _rescan_after_bind(self, inv: Inventory) -> Inventory:
        if self.options.usage:
            return await self.run(self.host.scan, usage=True)
        return await self.run(self.host.refresh, inv)

    async def _scan(self, trigger: str, full: bool = False) -> Inventory:
        """Full scan at start, on config changes and every FULL_SCAN_INTERVAL; otherwise a
        refresh of the previous inventory (new devices read in full, known ones only for
        driver/override/cdev; with ``usage``, the host's use read again from its global files,
        :func:`vfio_dp.host.changes.with_usage`) — what keeps a uevent → front-end update
        well under 1 s on thousands of devices, and Allocate latency low while a scan runs."""
        now = time.monotonic()
        full = (
            full
            or self.inventory is None
            or trigger.startswith(("start", "config"))
            or now - self._last_full_scan >= FULL_SCAN_INTERVAL
        )
        previous = self.inventory
        if full or previous is None:
            look, inv = await self.run(
                self._look_and, lambda: self.host.scan(usage=self.options.usage)
            )
            self._last_full_scan = now
        else:
            look, inv = await self.run(self._look_and, lambda: self._refresh(previous))
        self._fingerprint = look
        return inv

    def _refresh(self, previous: Inventory) -> Inventory:
        inv = self.host.refresh(previous)
        return with_usage(self.host.fs, inv) if self.options.usage else inv

    def _look_and(self, scan: Callable[[], Inventory]) -> tuple[Fingerprint, Inventory]:
        """The cheap look, then the scan (in this order: a change during the scan differs
        from the look, so the next resync scans again)."""
        look = fingerprint(self.host.fs)
        return look, scan()

    async def _bind(self, inv: Inventory, candidates: set[PciAddress]) -> bool:
        """``bind: true``: move matched devices not on vfio-pci (with their group) to vfio-pci,
        every group of the pass at once (:meth:`Host.bind_groups`: one journal, the records
        durable together), each group bound or refused on its own."""
        plan = autobind_groups(inv, self.config, candidates, self.options.path)
        if not plan:
            return False
        wanted = vfio_drivers_wanted(inv, self.config, [a for addrs in plan for a in addrs])
        # their groups read once by the pass, with the host's use (scan_groups)
        out = await self.run(
            functools.partial(self.host.bind_groups, vfio_driver=wanted, mdev=self.config.mdev),
            plan,
            bound_by=self.options.front_end,
        )
        for i, addrs in enumerate(plan):
            names = ", ".join(inv.devices[a].describe() for a in addrs)
            e = out.errors.get(i)
            if e is not None:
                self.metrics.inc("vfio_dp_bind_failures_total")
                how = "did not bind" if isinstance(e, BindError) else "could not bind"
                log.error("bind: true: %s %s: %s", how, names, e)
                continue
            result = out.results[i]
            self.metrics.inc("vfio_dp_binds_total", float(len(addrs)))
            drivers = ", ".join(f"{a}: {c.driver} ({c.why})" for a, c in result.drivers.items())
            log.info("bind: true: bound %s (%s)", names, drivers)
        return True

    # -- loops -------------------------------------------------------------------------
    async def _resync_loop(self) -> None:
        while True:
            try:  # asyncio.timeout: 3.11's wait_for may lose a stop's cancel to a kick
                async with asyncio.timeout(self.options.resync):
                    await self._dirty.wait()
                await asyncio.sleep(DEBOUNCE)  # let a burst of uevents settle
                trigger = self._dirty_reason
            except TimeoutError:
                trigger = "resync"
            self._dirty.clear()
            try:
                if trigger == "resync":
                    await self.resync()
                else:
                    await self.rescan(trigger)
            except Exception:  # keep serving the last good view
                log.exception("scan after %s failed; keeping the previous device lists", trigger)

    # -- configuration -----------------------------------------------------------------
    async def check_config(self) -> None:
        """Reload ``--config`` when the file behind it changed (a ConfigMap swaps ``..data``)."""
        try:
            new = await self.config_file.changed(self.run)
            if new is None:
                return
            if self.inventory is not None:
                self._refuse_path_conflicts(self.inventory, new)
        except (ConfigError, PathConflictError) as e:
            self.metrics.inc("vfio_dp_config_reloads_total", result="rejected")
            log.error("%s\nkeeping the previous configuration", e)
            return
        await self.apply_config(new)

    async def apply_config(self, new: Config) -> Snapshot:
        """Take ``new``: bind what it newly makes ``bind: true``, rescan in full, tell the
        observers (trigger ``config``)."""
        old, self.config = self.config, new
        self.metrics.inc("vfio_dp_config_reloads_total", result="applied")
        log.info("configuration reloaded from %s", self.options.config_path)
        fresh: set[PciAddress] = set()
        if self.inventory is not None:
            fresh = newly_bound(self.inventory, old, new, self.options.path)
        return await self.rescan("config", bind_only=fresh)
