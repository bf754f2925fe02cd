"""The device-plugin front-end's lifecycle: serve, register, watch the kubelet, stop.

Composes the node core (:class:`vfio_dp.core.node.NodeCore`: config and reload, scans,
uevents, resync, ``bind: true``, health, metrics) with the kubelet's device-plugin API.

Reads (under ``--root``, through the core): ``<root>/sys/bus/pci/devices/*``,
``<root>/sys/kernel/iommu_groups/*``, the ``--config`` file. Writes:
``<root>/var/lib/vfio_dp/allocations.json`` (the allocation record, atomically),
``<root>/var/lib/vfio_dp/original/*`` and ``<root>/run/vfio_dp/*.lock`` (only through
``Host.bind`` when a ``path: devicePlugin`` selector has ``bind: true``), one socket per
resource in ``--kubelet-dir`` (a path as the daemon sees it, NOT under ``--root``):
``<kubelet-dir>/vfio_dp-<resource, / as _>.sock``; it dials ``<kubelet-dir>/kubelet.sock``.
With ``--cdi-dir`` (also not under ``--root``): one CDI spec per advertised unit or mdev instance,
``<cdi-dir>/deviceplugin.vfio-dp.io_pci-0000-65-00-0.json`` (:mod:`vfio_dp.deviceplugin.cdi`), and
Allocate answers ``cdi_devices`` besides the unchanged envs and device specs.

Flow:

1. The core loads the config and scans; this front-end lists only the devices of
   ``path: devicePlugin`` selectors (all of vfio-pci without a config).
2. Per resource (:mod:`vfio_dp.deviceplugin.kubelet`): start a ``grpc.aio`` server on its socket FIRST
   (:class:`vfio_dp.core.sockets.SocketServer`, the serving helper both front-ends share:
   a stale socket is replaced atomically, anything else at the path is refused with the
   fix), then ``Register`` (the kubelet dials back inside ``Register``); wait and retry
   while ``kubelet.sock`` is absent.
   All servers share this one event loop: a ListAndWatch stream costs a coroutine, not a
   thread.
3. After every scan of the core (uevent, SIGUSR1, resync, config reload) and before each
   PreStartContainer: publish a resource's list only when what the kubelet sees (ID,
   health, NUMA) changed. A config reload keeps every still-configured resource's server and
   stream, and withdraws dropped resources (empty list, socket removed).
4. On every change in ``--kubelet-dir`` (inotify; every 0.25 s where it cannot watch): our
   socket gone or replaced, or ``kubelet.sock`` re-created → the kubelet restarted: serve
   again and re-register (well within 2 s; :meth:`vfio_dp.deviceplugin.kubelet.Endpoints.check`).
5. SIGTERM/SIGINT (:func:`vfio_dp.core.frontend.serve`): every stream gets an empty list and
   ends, sockets are removed, exit 0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from vfio_dp.core.frontend import FrontEnd, serve
from vfio_dp.core.mdev_reconcile import wanted
from vfio_dp.core.node import NodeCore, Snapshot
from vfio_dp.core.sockets import SocketServer, make_socket_dir
from vfio_dp.deviceplugin import podresources, servicer
from vfio_dp.deviceplugin.allocation import (
    ContainerAllocation,
    allocate,
    cdi_device_name,
    cdi_specs,
    preferred_allocation,
    verify_prestart,
)
from vfio_dp.deviceplugin.allocation_store import AllocationStore
from vfio_dp.deviceplugin.cdi import SpecDir
from vfio_dp.deviceplugin.kubelet import Endpoints
from vfio_dp.deviceplugin.listing import Listing, changes, compute_listing
from vfio_dp.deviceplugin.mdevs import (
    MdevUnits,
    allocate_mdev,
    mdev_cdi_specs,
    mdev_changes,
    mdev_units,
    preferred_mdev,
    verify_mdev_prestart,
    with_gone_parents,
)
from vfio_dp.deviceplugin.options import Options
from vfio_dp.errors import DevicePluginError, SocketPathError
from vfio_dp.host import Host
from vfio_dp.model import cdi
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEVICE_PLUGIN, Config

log = logging.getLogger("vfio_dp.deviceplugin")


def _wire(units: servicer.Units) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """What the kubelet sees of a list: (ID, health, NUMA nodes)."""
    return tuple((str(u.id), u.health, u.numa_nodes) for u in units)


class Daemon(FrontEnd):
    """The device-plugin front-end over a :class:`NodeCore` (its own, or one given)."""

    def __init__(
        self, options: Options, host: Host | None = None, core: NodeCore | None = None
    ) -> None:
        super().__init__(core or NodeCore(options.core(), host), log)
        self.options = options
        self.core.subscribe(self)
        self.core.vf_holds.append(self._pod_holds)  # SR-IOV: never destroy a pod's VF
        #: the sockets at the kubelet, one per resource (vfio_dp.deviceplugin.kubelet)
        self.kubelet = Endpoints(options.kubelet_dir, self, self.metrics)
        self.kubelet_socket = self.kubelet.kubelet_socket
        self._kubelet_dir = self.kubelet.dir
        self.endpoints = self.kubelet.by_resource
        self.listing: Listing | None = None
        self.mdev: MdevUnits = {}  # resource -> its mdev instances (vfio_dp.deviceplugin.mdevs)
        self.store = AllocationStore(self.host.fs)
        self.cdi = SpecDir(options.cdi_dir) if options.cdi_dir else None
        self._persist = asyncio.Event()

    @property
    def config(self) -> Config:
        return self.core.config

    def served_sockets(self) -> list[SocketServer]:
        return [ep.socket for ep in self.endpoints.values()]

    # -- lifecycle ---------------------------------------------------------------------
    def _pod_holds(self) -> dict[PciAddress | str, list[str]]:
        """Which PCI functions running pods were allocated (any plugin naming devices by
        PCI address), from the kubelet's PodResources API; a device held stands for its
        whole IOMMU group."""
        inv = self.core.inventory
        out: dict[PciAddress | str, list[str]] = {}
        for key, who in podresources.holds(self.options.pod_resources_socket).items():
            group = inv.group_of(key) if inv is not None and isinstance(key, PciAddress) else None
            for a in group.devices if group is not None else (key,):
                out.setdefault(a, []).extend(who)
        return out

    async def start(self) -> None:
        """Load the config (raises :class:`ConfigError`), scan, serve and start registering.

        Raises :class:`SocketPathError` when ``--kubelet-dir`` or a socket path in it is
        unusable (checked before anything is bound)."""
        make_socket_dir(self.options.kubelet_dir, "--kubelet-dir")
        self.store.load()
        log.info("device-plugin front-end: kubelet dir %s", self.options.kubelet_dir)
        await self.core.start()
        self.watch(lambda: [self.options.kubelet_dir], self._check_kubelet, "watch kubelet")
        self.spawn(self._persist_loop(), "persist")

    async def withdraw(self) -> None:
        """At stop: empty list to every stream, stop the servers, remove our sockets, write
        the allocation record."""
        log.info("stopping: withdrawing %d resources", len(self.endpoints))
        await self.kubelet.close_all()
        self._flush_record()

    # -- the core's observer -----------------------------------------------------------
    async def inventory_changed(self, snapshot: Snapshot) -> None:
        """Recompute every resource's list from the core's new view and publish changes."""
        holders = await self.core.run(self.host.record_holders)  # a DRA pool's hold: refused
        listing = compute_listing(snapshot.inventory, snapshot.config, self.listing, None, holders)
        if any(e.path == DEVICE_PLUGIN for e in snapshot.config.mdev) or self.mdev:
            mdev = await self.core.run(self._read_mdev, snapshot.config)
            for line in mdev_changes(self.mdev, mdev):
                log.info("%s", line)
            for name in sorted(set(mdev) & set(listing.resources)):
                log.error("%s: both an mdev: entry and a selector name it; served as mdevs only: "
                          "give one of them another resourceName", name)  # fmt: skip
            self.mdev = mdev
        if snapshot.trigger == "config" and not self._stopping:
            keep = set(listing.resources) | set(snapshot.config.resource_names) | set(self.mdev)
            for name in sorted(set(self.endpoints) - keep):
                await self.kubelet.withdraw(name)
        await self._apply(listing)

    def _read_mdev(self, config: Config) -> MdevUnits:
        """The mdev instances this front-end serves (two directory listings without mdevs)."""
        mdevs = self.core.mdev.mdevs
        inv = mdevs.read()
        wants, _ = wanted(self.host, config, inv, DEVICE_PLUGIN)
        records, _ = mdevs.store.records()
        served = with_gone_parents([(w.parent, w.entry) for w in wants], config.mdev, inv)
        return mdev_units(inv, served, records, mdevs.by, config.resource_domain)

    async def rescan(self, trigger: str) -> Listing:
        """Have the core scan now; the listing this front-end computed from it."""
        await self.core.rescan(trigger)
        return self._current()

    async def apply_config(self, new: Config) -> None:
        await self.core.apply_config(new)

    async def _apply(self, listing: Listing) -> None:
        old = self.listing
        for line in changes(old, listing):
            log.info("%s", line)
        for g, names in listing.conflicts.items():
            if old is None or old.conflicts.get(g) != names:
                log.warning("IOMMU group %d is claimed by several resources: %s", g, names)
        self.listing = listing
        self.metrics.clear("vfio_dp_devices")
        served: dict[str, servicer.Units] = {**listing.resources, **self.mdev}
        for name, listed in served.items():
            healthy = sum(u.healthy for u in listed)
            self.metrics.set("vfio_dp_devices", healthy, resource=name, health="Healthy")
            self.metrics.set(
                "vfio_dp_devices", len(listed) - healthy, resource=name, health="Unhealthy"
            )
        self.metrics.set("vfio_dp_group_conflicts", len(listing.conflicts))
        if self._stopping:
            return
        if self.cdi is not None:
            await self.core.run(self._sync_cdi, listing)
        wanted_names = set(self.endpoints) | set(served) | set(self.config.resource_names)
        for name in sorted(wanted_names):
            units = served.get(name, ())
            ep = self.endpoints.get(name)
            if ep is None:
                try:
                    ep = await self.kubelet.open(name)
                except SocketPathError as e:
                    if not self.core.started:
                        raise  # at start: exit with the message
                    log.error("%s: not served: %s", name, e)
                    continue
            if _wire(ep.feed.units) != _wire(units) or ep.feed.version == 0:
                await ep.feed.publish(units)
            else:
                ep.feed.units = units  # same on the wire; keep the latest reasons

    # -- CDI -----------------------------------------------------------------------------
    def _sync_cdi(self, listing: Listing) -> None:
        """One spec per advertised unit; specs of units gone are removed (logged, not fatal:
        Allocate writes the specs it hands out again and fails if it cannot)."""
        assert self.cdi is not None
        try:
            specs = cdi_specs(listing, self.host.device_nodes, self.cdi.vendor)
            self.cdi.sync({**specs, **mdev_cdi_specs(self.mdev, self.cdi.vendor)})
        except OSError as e:
            log.error("cannot update the CDI specs in %s: %s", self.cdi.directory, e)

    def _ensure_cdi(self, listing: Listing, resource: str, ids: Sequence[str]) -> None:
        """Before Allocate answers ``cdi_devices``: the specs they name are on disk and
        current, else :class:`DevicePluginError` (the runtime would fail later and less clearly)."""
        assert self.cdi is not None
        vendor = self.cdi.vendor
        if resource in self.mdev:  # an mdev resource: its instances' specs
            specs = mdev_cdi_specs({resource: self.mdev[resource]}, vendor, ids)
        else:
            wanted = {
                cdi.spec_file_name(vendor, cdi_device_name(u))
                for i in ids
                if (u := listing.unit(resource, i)) is not None
            }
            specs = cdi_specs(listing, self.host.device_nodes, vendor)
            specs = {k: v for k, v in specs.items() if k in wanted}
        try:
            self.cdi.write(specs)
        except OSError as e:
            raise DevicePluginError(
                f"{resource}: cannot write the CDI spec for {list(ids)} in "
                f"{self.cdi.directory}: {e.strerror or e}; check --cdi-dir (the host's "
                "/var/run/cdi mounted read-write)"
            ) from e

    # -- loops -------------------------------------------------------------------------
    def _flush_record(self) -> None:
        try:
            self.store.flush()
        except OSError as e:
            self.store.dirty = True
            log.error("cannot write the allocation record %s: %s", self.store.path, e)

    async def _persist_loop(self) -> None:
        """Write the allocation record behind Allocate (see :mod:`vfio_dp.deviceplugin.allocation_store`)."""
        while True:
            await self._persist.wait()
            self._persist.clear()
            await self.core.run(self._flush_record)
            if self.store.dirty:  # the disk refused: retry soon
                await asyncio.sleep(1.0)
                self._persist.set()

    async def _check_kubelet(self) -> bool:
        """On every change in the kubelet dir (:meth:`FrontEnd.watch`): our sockets served
        and registered again after a kubelet restart (:meth:`Endpoints.check`)."""
        return await self.kubelet.check()

    # -- the Core protocol used by the servicer ------------------------------------------
    def _current(self) -> Listing:
        if self.listing is None:
            raise DevicePluginError("the daemon has not scanned the devices yet")
        return self.listing

    async def allocate(self, resource: str, ids: Sequence[str]) -> ContainerAllocation:
        listing = self._current()
        try:
            vendor = self.cdi.vendor if self.cdi is not None else None
            if resource in self.mdev:
                alloc = allocate_mdev(self.mdev[resource], resource, ids, vendor)
            else:
                alloc = allocate(listing, resource, ids, self.host.device_nodes, vendor)
            if self.cdi is not None:
                await self.core.run(self._ensure_cdi, listing, resource, ids)
        except DevicePluginError as e:
            self.metrics.inc("vfio_dp_allocation_errors_total", resource=resource, call="Allocate")
            log.warning(
                "Allocate refused: %s", e, extra={"resource": resource, "device": ",".join(ids)}
            )
            raise
        self.store.add(alloc.grants)
        self._persist.set()
        self.metrics.inc("vfio_dp_allocations_total", resource=resource)
        log.info(
            "%s: Allocate %s → %s, devices %s",
            resource,
            list(ids),
            alloc.envs,
            [d.host_path for d in alloc.devices],
            extra={"resource": resource, "device": ",".join(ids)},
        )
        return alloc

    def preferred(
        self, resource: str, available: Sequence[str], must: Sequence[str], size: int
    ) -> list[str]:
        if resource in self.mdev:
            return preferred_mdev(self.mdev[resource], available, must, size)
        return preferred_allocation(self._current(), resource, available, must, size)

    async def prestart(self, resource: str, ids: Sequence[str]) -> None:
        listing = await self.rescan("prestart")  # verify against sysfs as it is now
        try:
            if resource in self.mdev:
                verify_mdev_prestart(self.mdev[resource], resource, ids, self.store.record)
            else:
                verify_prestart(listing, resource, ids, self.store.record, self.host.device_nodes)
        except DevicePluginError as e:
            self.metrics.inc(
                "vfio_dp_allocation_errors_total", resource=resource, call="PreStartContainer"
            )
            log.error("PreStartContainer refused: %s", e)
            raise
        log.info("%s: PreStartContainer %s verified", resource, list(ids))


def run(options: Options) -> int:
    """Run until SIGTERM/SIGINT (:func:`vfio_dp.core.frontend.serve`); 0 on a clean stop.
    Raises ConfigError on a bad config."""
    return asyncio.run(serve(Daemon(options)))
