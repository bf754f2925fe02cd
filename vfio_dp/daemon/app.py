"""The daemon's lifecycle: scan, serve, register, watch, reload, stop — one asyncio process.

Reads (under ``--root``): ``<root>/sys/bus/pci/devices/*``, ``<root>/sys/kernel/iommu_groups/*``
(via :class:`vfio_dp.host.Host`; never opens ``/dev/vfio/<N>``), the ``--config`` file.
Writes: ``<root>/var/lib/vfio_dp/allocations.json`` (the allocation record, atomically),
``<root>/var/lib/vfio_dp/original/*`` and ``<root>/run/vfio_dp/*.lock`` (only through
``Host.bind`` when a selector has ``bind: true``), one socket per resource in
``--kubelet-dir`` (a path as the daemon sees it, NOT under ``--root``):
``<kubelet-dir>/vfio_dp-<resource, / as _>.sock``; it dials ``<kubelet-dir>/kubelet.sock``.

Flow:

1. Load the config (every error listed; the daemon does not start on a bad one).
2. Scan sysfs; with ``bind: true`` bind matched devices (and group siblings) that are not on
   vfio-pci yet, at start and when they appear (hotplug) — never unbind anything, ever.
3. Per resource: start a ``grpc.aio`` server on its socket FIRST, then ``Register`` (the
   kubelet dials back inside ``Register``); wait and retry while ``kubelet.sock`` is absent.
   All servers share this one event loop: a ListAndWatch stream costs a coroutine, not a
   thread. Host I/O (scans, binds) runs on a 2-thread executor, so threads stay bounded.
4. Rescan on every kernel PCI uevent (debounced 50 ms), on SIGUSR1, before each
   PreStartContainer, and every ``--resync`` seconds; publish a resource's list only when
   what the kubelet sees (ID, health, NUMA) changed.
5. Every 0.25 s: our socket gone or replaced, or ``kubelet.sock`` re-created → the kubelet
   restarted: serve again and re-register (well within 2 s); the config file's identity
   changed (ConfigMap ``..data`` symlink swap) → reload it: a bad new config is logged and
   ignored; a good one keeps every still-configured resource's server and stream, and
   withdraws dropped resources (empty list, socket removed).
6. SIGTERM/SIGINT: every stream gets an empty list and ends, sockets are removed, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from vfio_dp.daemon import servicer
from vfio_dp.daemon.metrics import Metrics, serve_http
from vfio_dp.daemon.state import AllocationStore
from vfio_dp.daemon.uevents import UeventSource
from vfio_dp.errors import BindError, ConfigError, HostError, PluginError
from vfio_dp.host import Host
from vfio_dp.host.files import load_config, read_config_bytes
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEFAULT_CONFIG, Config, load_config_bytes
from vfio_dp.model.device import Inventory
from vfio_dp.plugin.allocation import (
    ContainerAllocation,
    allocate,
    preferred_allocation,
    verify_prestart,
)
from vfio_dp.plugin.listing import Listing, Unit, changes, compute_listing

log = logging.getLogger("vfio_dp.daemon")

KUBELET_SOCKET = "kubelet.sock"
WATCH_INTERVAL = 0.25
DEBOUNCE = 0.05
#: A full scan (every attribute of every device) at most this often; other rescans re-read
#: only what changes while a device is present (Host.refresh: ~2 syscalls per device).
FULL_SCAN_INTERVAL = 60.0

FileId = tuple[int, int, int]  # (st_dev, st_ino, st_ctime_ns)


@dataclass(frozen=True, slots=True)
class Options:
    root: str = "/"
    kubelet_dir: str = "/var/lib/kubelet/device-plugins"
    config_path: str | None = None
    resync: float = 5.0
    metrics_port: int = 9109  # 0 disables /metrics and /healthz
    metrics_host: str = ""  # all interfaces
    uevents: bool = True


def _file_id(path: str) -> FileId | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _wire(units: tuple[Unit, ...]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """What the kubelet sees of a list: (ID, health, NUMA nodes)."""
    return tuple((str(u.id), u.health, u.numa_nodes) for u in units)


class Endpoint:
    """One resource: its socket, its gRPC server, its device feed, its registration."""

    def __init__(self, resource: str, kubelet_dir: str) -> None:
        self.resource = resource
        self.name = naming.socket_name(resource)
        self.path = os.path.join(kubelet_dir, self.name)
        self.feed = servicer.Feed()
        self.server: Any = None
        self.socket_id: FileId | None = None
        self.kubelet_id: FileId | None = None  # kubelet.sock we registered with
        self.registering: asyncio.Task[None] | None = None


class Daemon:
    def __init__(self, options: Options, host: Host | None = None) -> None:
        self.options = options
        self.host = host or Host(options.root)
        self.kubelet_socket = os.path.join(options.kubelet_dir, KUBELET_SOCKET)
        self.config: Config = DEFAULT_CONFIG
        self.config_id: FileId | None = None
        self.config_text: bytes | None = None
        self.listing: Listing | None = None
        self.endpoints: dict[str, Endpoint] = {}
        self.metrics = Metrics()
        self.store = AllocationStore(self.host.root)
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="vfio_dp-host")
        self.uevents = UeventSource(self._on_uevent)
        self._scan_lock = asyncio.Lock()
        self._dirty = asyncio.Event()
        self._dirty_reason = "resync"
        self._stop = asyncio.Event()
        self._persist = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: asyncio.Server | None = None
        self._last_scan = 0.0
        self._last_full_scan = 0.0
        self._started = False
        self._stopping = False

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Load the config (raises :class:`ConfigError`), scan, serve and start registering."""
        self.config = load_config(self.options.config_path)
        self._remember_config()
        self.store.load()
        loop = asyncio.get_running_loop()
        loop.set_default_executor(self.executor)
        log.info(
            "starting: root %s, kubelet dir %s, config %s, resync %.1fs",
            self.host.root,
            self.options.kubelet_dir,
            self.options.config_path or "(default)",
            self.options.resync,
        )
        if self.options.uevents:
            self.uevents.start(loop)
        if self.options.metrics_port:
            self._http = await serve_http(
                self.options.metrics_host, self.options.metrics_port, self.metrics, self.health
            )
        await self.rescan("start", bind_all=True)
        self._tasks = [
            asyncio.create_task(self._resync_loop(), name="resync"),
            asyncio.create_task(self._watch_loop(), name="watch"),
            asyncio.create_task(self._persist_loop(), name="persist"),
        ]
        self._started = True

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def stop(self) -> None:
        """Empty list to every stream, stop the servers, remove our sockets. Unbinds nothing."""
        if self._stopping:
            return
        self._stopping = True
        log.info("stopping: withdrawing %d resources", len(self.endpoints))
        for t in self._tasks:
            t.cancel()
        for ep in self.endpoints.values():
            if ep.registering:
                ep.registering.cancel()
        await asyncio.gather(
            *(self._close(ep) for ep in self.endpoints.values()), return_exceptions=True
        )
        self.endpoints.clear()
        self._flush_record()
        self.uevents.stop(asyncio.get_running_loop())
        if self._http is not None:
            self._http.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        log.info("stopped")

    async def _close(self, ep: Endpoint) -> None:
        await ep.feed.publish((), closing=True)
        if ep.server is not None:
            await ep.server.stop(1.0)
        if _file_id(ep.path) == ep.socket_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ep.path)

    def health(self) -> str | None:
        """None when serving and the last scan is recent (``/healthz``), else why not."""
        if self._stopping:
            return "stopping"
        if not self._started:
            return "starting"
        age = time.monotonic() - self._last_scan
        limit = 3 * self.options.resync + 30
        if age > limit:
            return f"last successful scan of sysfs was {age:.0f}s ago (limit {limit:.0f}s)"
        return None

    def kick(self, reason: str) -> None:
        """Rescan soon (a uevent, SIGUSR1)."""
        self._dirty_reason = reason
        self._dirty.set()

    def _on_uevent(self, what: str) -> None:
        self.metrics.inc("vfio_dp_uevents_total")
        log.debug("uevent: %s", what)
        self.kick(f"uevent {what}")

    # -- scanning ----------------------------------------------------------------------
    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))

    async def rescan(
        self, trigger: str, *, bind_all: bool = False, bind_only: set[PciAddress] | None = None
    ) -> Listing:
        """Scan ``<root>/sys``, bind new ``bind: true`` devices, recompute, publish changes."""
        async with self._scan_lock:
            inv: Inventory = await self._scan(trigger)
            self.metrics.inc("vfio_dp_scans_total", trigger=trigger.split()[0])
            known = self.listing.inventory.devices if self.listing else {}
            fresh = set(inv.devices) if bind_all else set(inv.devices) - set(known)
            if bind_only:
                fresh |= bind_only
            if fresh and await self._bind(inv, fresh):
                inv = await self._run(self.host.refresh, inv)
            listing = compute_listing(inv, self.config, self.listing)
            await self._apply(listing)
            self._last_scan = time.monotonic()
            return listing

    async def _scan(self, trigger: str) -> Inventory:
        """Full scan at start, on config changes and every FULL_SCAN_INTERVAL; otherwise a
        refresh of the previous inventory (new devices read in full, known ones only for
        driver/override/cdev) — what keeps a uevent → ListAndWatch push well under 1 s on
        thousands of devices, and Allocate latency low while a scan runs."""
        now = time.monotonic()
        full = (
            self.listing is None
            or trigger.startswith(("start", "config"))
            or now - self._last_full_scan >= FULL_SCAN_INTERVAL
        )
        if full:
            inv: Inventory = await self._run(self.host.scan, usage=False)
            self._last_full_scan = now
            return inv
        assert self.listing is not None
        refreshed: Inventory = await self._run(self.host.refresh, self.listing.inventory)
        return refreshed

    async def _bind(self, inv: Inventory, candidates: set[PciAddress]) -> bool:
        """``bind: true``: move matched devices not on vfio-pci (with their group) to vfio-pci."""
        by_group: dict[object, list[PciAddress]] = defaultdict(list)
        for addr in sorted(candidates):
            dev = inv.devices.get(addr)
            if dev is None or dev.is_bridge or dev.on_vfio:
                continue
            sel = self.config.select(dev)
            if sel is None or not sel.bind:
                continue
            by_group[dev.iommu_group if dev.iommu_group is not None else addr].append(addr)
        for addrs in by_group.values():
            names = ", ".join(inv.devices[a].describe() for a in addrs)
            try:
                result = await self._run(self.host.bind, addrs, group=True, probe=False)
            except BindError as e:
                self.metrics.inc("vfio_dp_bind_failures_total")
                log.error("bind: true: did not bind %s: %s", names, e)
                continue
            except HostError as e:
                self.metrics.inc("vfio_dp_bind_failures_total")
                log.error("bind: true: could not bind %s: %s", names, e)
                continue
            self.metrics.inc("vfio_dp_binds_total", float(len(addrs)))
            log.info("bind: true: bound %s to vfio-pci (%s)", names, result)
        return bool(by_group)

    async def _apply(self, listing: Listing) -> None:
        old = self.listing
        for line in changes(old, listing):
            log.info("%s", line)
        for g, names in listing.conflicts.items():
            if old is None or old.conflicts.get(g) != names:
                log.warning("IOMMU group %d is claimed by several resources: %s", g, names)
        self.listing = listing
        self.metrics.clear("vfio_dp_devices")
        for name, units in listing.resources.items():
            healthy = sum(u.healthy for u in units)
            self.metrics.set("vfio_dp_devices", healthy, resource=name, health="Healthy")
            self.metrics.set(
                "vfio_dp_devices", len(units) - healthy, resource=name, health="Unhealthy"
            )
        self.metrics.set("vfio_dp_group_conflicts", len(listing.conflicts))
        if self._stopping:
            return
        wanted = set(self.endpoints) | set(listing.resources) | set(self.config.resource_names)
        for name in sorted(wanted):
            units = listing.units(name)
            ep = self.endpoints.get(name)
            if ep is None:
                ep = await self._open(name)
            if _wire(ep.feed.units) != _wire(units) or ep.feed.version == 0:
                await ep.feed.publish(units)
            else:
                ep.feed.units = units  # same on the wire; keep the latest reasons

    # -- serving and registering -------------------------------------------------------
    async def _open(self, resource: str) -> Endpoint:
        ep = Endpoint(resource, self.options.kubelet_dir)
        self.endpoints[resource] = ep
        await self._serve(ep)
        return ep

    async def _serve(self, ep: Endpoint) -> None:
        """Start ``ep``'s server on its socket, then register in the background."""
        os.makedirs(self.options.kubelet_dir, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(ep.path)  # a stale socket of an earlier run
        ep.server = servicer.make_server(ep.resource, ep.feed, self, ep.path)
        await ep.server.start()
        ep.socket_id = _file_id(ep.path)
        log.info("%s: serving on %s", ep.resource, ep.path)
        ep.registering = asyncio.create_task(self._register(ep), name=f"register {ep.name}")

    async def _register(self, ep: Endpoint) -> None:
        import grpc

        delay, waiting_logged = 0.2, False
        while True:
            kid = _file_id(self.kubelet_socket)
            if kid is None:
                if not waiting_logged:
                    log.info("%s: waiting for %s", ep.resource, self.kubelet_socket)
                    waiting_logged = True
                await asyncio.sleep(0.1)
                continue
            try:
                await servicer.register(self.kubelet_socket, ep.resource, ep.name)
            except grpc.aio.AioRpcError as e:
                log.warning(
                    "%s: Register with %s failed (%s: %s); retrying in %.1fs",
                    ep.resource,
                    self.kubelet_socket,
                    e.code().name,
                    e.details(),
                    delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            ep.kubelet_id = kid
            self.metrics.inc("vfio_dp_kubelet_registrations_total", resource=ep.resource)
            log.info("%s: registered with the kubelet as %s", ep.resource, ep.name)
            return

    async def _reserve(self, ep: Endpoint, why: str) -> None:
        log.warning("%s: %s: serving and registering again", ep.resource, why)
        if ep.registering:
            ep.registering.cancel()
        if ep.server is not None:
            await ep.server.stop(0)
        await self._serve(ep)
        await ep.feed.publish(ep.feed.units)

    async def _withdraw(self, resource: str) -> None:
        ep = self.endpoints.pop(resource)
        if ep.registering:
            ep.registering.cancel()
        log.info("%s: no longer configured: empty list sent, socket %s removed", resource, ep.path)
        await self._close(ep)

    # -- loops -------------------------------------------------------------------------
    async def _resync_loop(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._dirty.wait(), timeout=self.options.resync)
                await asyncio.sleep(DEBOUNCE)  # let a burst of uevents settle
                trigger = self._dirty_reason
            except TimeoutError:
                trigger = "resync"
            self._dirty.clear()
            try:
                await self.rescan(trigger)
            except Exception:  # keep serving the last good listing
                log.exception("scan after %s failed; keeping the previous device lists", trigger)

    def _flush_record(self) -> None:
        try:
            self.store.flush()
        except OSError as e:
            self.store.dirty = True
            log.error("cannot write the allocation record %s: %s", self.store.path, e)

    async def _persist_loop(self) -> None:
        """Write the allocation record behind Allocate (see :mod:`vfio_dp.daemon.state`)."""
        while True:
            await self._persist.wait()
            self._persist.clear()
            await self._run(self._flush_record)
            if self.store.dirty:  # the disk refused: retry soon
                await asyncio.sleep(1.0)
                self._persist.set()

    async def _watch_loop(self) -> None:
        while True:
            await asyncio.sleep(WATCH_INTERVAL)
            try:
                await self._check_kubelet()
                await self._check_config()
            except Exception:
                log.exception("watch loop")

    async def _check_kubelet(self) -> None:
        kid = _file_id(self.kubelet_socket)
        for ep in list(self.endpoints.values()):
            own = _file_id(ep.path)
            if own != ep.socket_id:
                await self._reserve(ep, f"socket {ep.path} was removed (kubelet restart?)")
            elif (
                kid is not None
                and ep.kubelet_id is not None
                and kid != ep.kubelet_id
                and (ep.registering is None or ep.registering.done())
            ):
                await self._reserve(ep, f"{self.kubelet_socket} was re-created (kubelet restart)")

    def _remember_config(self) -> None:
        path = self.options.config_path
        if path is None:
            return
        self.config_id = _file_id(path)
        try:
            self.config_text = read_config_bytes(path)
        except ConfigError:
            self.config_text = None

    async def _check_config(self) -> None:
        """Reload ``--config`` when the file behind it changed (a ConfigMap swaps ``..data``)."""
        path = self.options.config_path
        if path is None:
            return
        now = _file_id(path)
        if now is None or now == self.config_id:
            return
        self.config_id = now
        try:
            text: bytes = await self._run(read_config_bytes, path)
        except ConfigError as e:
            log.warning("%s\nkeeping the current configuration", e)
            return
        if text == self.config_text:
            return
        self.config_text = text
        try:  # in a worker thread: /healthz and the kubelet's calls keep being answered
            new: Config = await self._run(load_config_bytes, text, path)
        except ConfigError as e:
            self.metrics.inc("vfio_dp_config_reloads_total", result="rejected")
            log.error("%s\nkeeping the previous configuration", e)
            return
        await self.apply_config(new)

    async def apply_config(self, new: Config) -> None:
        old, self.config = self.config, new
        self.metrics.inc("vfio_dp_config_reloads_total", result="applied")
        log.info("configuration reloaded from %s", self.options.config_path)
        newly_bind: set[PciAddress] = set()
        if self.listing is not None:
            for addr, dev in self.listing.inventory.devices.items():
                sel, before = new.select(dev), old.select(dev)
                if sel is not None and sel.bind and (before is None or not before.bind):
                    newly_bind.add(addr)
        listing = await self.rescan("config", bind_only=newly_bind)
        keep = set(listing.resources) | set(new.resource_names)
        for name in sorted(set(self.endpoints) - keep):
            await self._withdraw(name)

    # -- the Core protocol used by the servicer ------------------------------------------
    def _current(self) -> Listing:
        if self.listing is None:
            raise PluginError("the daemon has not scanned the devices yet")
        return self.listing

    async def allocate(self, resource: str, ids: Sequence[str]) -> ContainerAllocation:
        try:
            alloc = allocate(self._current(), resource, ids, self.host.device_nodes)
        except PluginError as e:
            self.metrics.inc("vfio_dp_allocation_errors_total", resource=resource, call="Allocate")
            log.warning("Allocate refused: %s", e)
            raise
        self.store.add(alloc.grants)
        self._persist.set()
        self.metrics.inc("vfio_dp_allocations_total", resource=resource)
        log.info(
            "%s: Allocate %s → %s, devices %s",
            resource,
            list(ids),
            alloc.envs.get(naming.kubevirt_env_var(resource)),
            [d.host_path for d in alloc.devices],
        )
        return alloc

    def preferred(
        self, resource: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]:
        return preferred_allocation(self._current(), resource, available, must, size)

    async def prestart(self, resource: str, ids: Sequence[str]) -> None:
        listing = await self.rescan("prestart")  # verify against sysfs as it is now
        try:
            verify_prestart(listing, resource, ids, self.store.record, self.host.device_nodes)
        except PluginError as e:
            self.metrics.inc(
                "vfio_dp_allocation_errors_total", resource=resource, call="PreStartContainer"
            )
            log.error("PreStartContainer refused: %s", e)
            raise
        log.info("%s: PreStartContainer %s verified", resource, list(ids))


async def serve(options: Options) -> int:
    """Run until SIGTERM/SIGINT; 0 on a clean stop. Raises ConfigError on a bad config."""
    daemon = Daemon(options)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop)
    loop.add_signal_handler(signal.SIGUSR1, daemon.kick, "SIGUSR1")
    try:
        await daemon.start()
        await daemon.wait_stopped()
    finally:
        await daemon.stop()
    return 0


def run(options: Options) -> int:
    return asyncio.run(serve(options))
