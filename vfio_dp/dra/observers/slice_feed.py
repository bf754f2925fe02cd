"""The slice feed: from one scan of the node core to the devices of this node's pool.

After every scan the DRA plugin hands the core's :class:`~vfio_dp.core.node.Snapshot` to
:meth:`SliceFeed.update`, which answers with a :class:`PoolUpdate`: the devices to publish
(:func:`vfio_dp.dra.observers.health.pool_devices`: design.md's table, taints included), the
health changes of this scan and whether a change waits for a confirming scan. The plugin
carries it to its peers (the publisher, the health stream, the claim-status feed, metrics);
the feed itself writes nothing.

It reads the host for what the snapshot does not carry, on the core's host-I/O executor:

- ``<root>/sys/bus/pci/devices/<bdf>`` links (:func:`vfio_dp.host.topology.pcie_roots`), once
  per device while it is present;
- ``<root>/dev/vfio/<N>`` of the groups that must have one
  (:func:`vfio_dp.host.vfio.group_nodes_present`);
- ``<root>/proc/*/fd`` for published groups someone holds open outside any claim of ours
  (:func:`vfio_dp.host.holders.scan_holders`: withdrawn);
- the per-device locks of ``<root>/run/vfio_dp`` when a held device's verdict changes (a bind
  or unbind under way is never a fault).

Caches are keyed by the core's scan generation (:attr:`vfio_dp.core.node.Snapshot.generation`:
equal generations carry the same inventory and config), never by object identity: an idle
resync (the same generation, the same prepared claims, the same groups held open) rebuilds
nothing and only moves the time of the last check.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.core.health import DeviceHealth, HealthModel, assess
from vfio_dp.core.node import NodeCore, Snapshot
from vfio_dp.dra.claimpath import mdev, resolve
from vfio_dp.dra.claimpath.checkpoint import ClaimRecord
from vfio_dp.dra.observers import health
from vfio_dp.dra.personalities import Offer, with_personalities
from vfio_dp.dra.slices import Device, device_for
from vfio_dp.host.devnodes import native_nodes
from vfio_dp.host.holders import scan_holders
from vfio_dp.host.topology import pcie_roots
from vfio_dp.host.vfio import group_nodes_present
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory, PciDevice
from vfio_dp.model.devnodes import group_container_problem
from vfio_dp.model.personality import Personality
from vfio_dp.model.serving import DraUnit, dra_units, withdraw_held

log = logging.getLogger("vfio_dp.dra")


@dataclass(frozen=True, slots=True)
class PoolUpdate:
    """What one scan means for the pool."""

    devices: list[Device]  # the pool, by name
    changed: tuple[DeviceHealth, ...]  # devices whose health changed with this scan
    pending: bool  # a held device's new state waits for a confirming scan
    same: bool  # the devices and their health are what they were (an idle resync)


class SliceFeed:
    """The pool of one DRA driver on this node, kept from the core's scans (module doc)."""

    def __init__(
        self, core: NodeCore, driver: str, records: Callable[[], Mapping[str, ClaimRecord]]
    ) -> None:
        """``records``: the checkpoint's claims now (prepared ones are never withdrawn)."""
        self.core = core
        self.driver = driver
        self.records = records
        self.health = HealthModel()
        self.devices: list[Device] = []
        #: this node's device taints on the server at start, by device name (a restart keeps
        #: their ``timeAdded``); emptied by the first update
        self.on_server: dict[str, list[dict[str, str]]] = {}
        self._roots: dict[PciAddress, str] = {}
        self._last: dict[str, Device] = {}  # every device as last built (held, gone ones)
        self._effects: dict[str, str] = {}
        #: the units of one generation (4,096 devices: ~8 % of a CPU at --resync 5 when
        #: recomputed at every idle resync)
        self._units: tuple[int, list[DraUnit]] | None = None
        self._built: dict[str, tuple[DraUnit, PciDevice, Device]] = {}
        #: the group nodes to look for, per (generation, the groups our claims hold)
        self._held_nodes: tuple[int, frozenset[int | None], dict[str, int]] | None = None
        #: the checkpoint's records at the last update and the holds made of them
        self._holds: tuple[tuple[Any, ...], health.ClaimHolds] | None = None
        #: what the last update's verdicts came from (an equal next one changes nothing)
        self._idle_key: tuple[Any, ...] | None = None
        #: how each published group is offered (device name -> Offer) after a scan; None:
        #: from its selectors' ``personalities`` and its device nodes (:meth:`_offers_of`)
        self.offers: Callable[[Snapshot], Mapping[str, Offer]] | None = None
        self._offers: Mapping[str, Offer] = {}
        #: each mdev type's cost in its parent's counter (vfio_dp.dra.mdev_slices.type_cost)
        self.mdev_costs: dict[tuple[str, str], int] = {}

    async def update(self, snapshot: Snapshot) -> PoolUpdate:
        """The pool after ``snapshot`` (see the module docstring)."""
        inv = snapshot.inventory
        by_uid = self.records()  # one copy of the checkpoint's records for this update
        records = tuple(by_uid.values())
        withheld, units = await self._withdraw_held(snapshot, records)
        # the same records (the checkpoint keeps each unchanged record's object): the same
        # holds object, so the idle check below compares it by identity, not 1,000 entries
        if self._holds is None or self._holds[0] != records:
            self._holds = (records, health.claim_holds(records))
        holds = self._holds[1]
        offers = await self._offers_of(snapshot, units)
        mdevs = await self.core.run(
            mdev.pool, self.core.host, snapshot.config, by_uid, self.mdev_costs
        )
        key = (snapshot.generation, withheld, holds, tuple(m.device for m in mdevs))
        if key == self._idle_key and offers == self._offers and not self.health.waiting:
            # an idle resync: the same scan, claims and held groups give the same verdicts
            # and devices -- and the same devnodes: the core keeps its generation only while
            # its cheap look (vfio_dp.host.changes.fingerprint, which lists /dev/vfio) is
            # unchanged. Only the time of the last check moves.
            self.health.scanned = time.time()
            return PoolUpdate(self.devices, (), False, True)
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
        for name in update.pending:  # a held device's news waits for its confirming scan:
            if name in self._last:  # published as it was until then (1,024 VFs unbound at
                built[name] = self._last[name]  # once were every slice written twice)
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
            self.driver,
            previous={d.name: d.taints for d in self.devices} or self.on_server,
            kept={d.name: d for d in self.devices},
        )
        if offers:  # a group offered to containers too: two entries
            devices = with_personalities(devices, offers, self.driver)
        if mdevs:  # mediated devices (vfio_dp.dra.mdev_slices), by name with the rest
            devices = sorted([*devices, *(m.device for m in mdevs)], key=lambda d: d.name)
        self._offers = offers
        self.on_server = {}
        self._log_changes(snapshot, units, devices, update.changed)
        same = not update.changed and devices == self.devices
        self.devices = devices
        self._idle_key = key  # all of it done: the same key next time is an idle resync
        return PoolUpdate(devices, tuple(update.changed), bool(update.pending), same)

    # -- the parts -----------------------------------------------------------------------
    def _units_of(self, snapshot: Snapshot) -> list[DraUnit]:
        """:func:`dra_units` of the snapshot, computed once per scan generation."""
        if self._units is not None and self._units[0] == snapshot.generation:
            return self._units[1]
        inv = snapshot.inventory
        units = resolve.unservable(  # a named vfioDriver this node lacks: not published
            dra_units(inv, snapshot.config),
            inv,
            lambda a, w: self.core.host.vfio_choices(inv, a, w),
        )
        self._units = (snapshot.generation, units)
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
                or not (hit[0] is u or hit[0] == u)  # `is`: the cheap way to equal
                or not (hit[1] is dev or hit[1] == dev)
            ):
                hit = (u, dev, device_for(u, inv, self._roots, self._vfio_driver(u, dev, inv)))
            fresh[u.name] = hit
        self._built = fresh
        return {n: d for n, (_, _, d) in fresh.items()}

    async def _offers_of(self, snapshot: Snapshot, units: Sequence[DraUnit]) -> Mapping[str, Offer]:
        """How each group offered in more than ``vm`` is offered now: ``container`` only
        while one of its functions has device nodes of its own on its native driver (found
        now, or recorded: :func:`vfio_dp.host.devnodes.native_nodes`; the one rule:
        :func:`vfio_dp.model.devnodes.group_container_problem`)."""
        if self.offers is not None:
            return self.offers(snapshot)
        offering = [u for u in units if u.published and u.personalities != (Personality.VM,)]
        if not offering:
            return {}
        inv = snapshot.inventory
        addresses = [a for u in offering for a in u.endpoints]
        found = await self.core.run(native_nodes, self.core.host.fs, inv, addresses)
        out: dict[str, Offer] = {}
        for u in offering:
            if group_container_problem(u.endpoints, str, found) is None:
                drivers = [n.driver for a in u.endpoints if (n := found.get(a)) and n.nodes]
                out[u.name] = Offer(u.personalities, drivers[0] if drivers else None)
            else:  # said by `vfioctl list` / `check` (container_problems), not offered here
                kept = tuple(p for p in u.personalities if p is not Personality.CONTAINER)
                out[u.name] = Offer(kept)
        return out

    def _vfio_driver(self, unit: DraUnit, dev: PciDevice, inv: Inventory) -> str | None:
        """The VFIO driver a ``bind: onPrepare`` Prepare will bind ``unit``'s primary to
        (published as ``vfioDriver``); None when it is on VFIO already (the slice says that
        one) or not bound by Prepare."""
        if dev.on_vfio or not unit.on_prepare:
            return None
        choice = self.core.host.vfio_choices(inv, [dev.address], unit.vfio_driver).get(dev.address)
        return None if choice is None or choice.problem is not None else choice.driver

    async def _withdraw_held(
        self, snapshot: Snapshot, records: Any
    ) -> tuple[frozenset[tuple[int, str]], list[DraUnit]]:
        """Withdraw published groups whose ``/dev/vfio/<N>`` a process holds open while no
        claim of ours is prepared on them (:func:`vfio_dp.model.serving.withdraw_held`):
        (the groups withheld with why, the units)."""
        inv, units = snapshot.inventory, self._units_of(snapshot)
        ours = frozenset(d.iommu_group for r in records for d in r.devices)
        cached = self._held_nodes
        if cached is not None and cached[0] == snapshot.generation and cached[1] == ours:
            nodes = cached[2]  # an idle resync: the same groups to look for
        else:
            nodes = {
                f"/dev/vfio/{inv.groups[u.group].node}": u.group
                for u in units
                if u.published and u.group not in ours and u.group in inv.groups
            }
            self._held_nodes = (snapshot.generation, ours, nodes)
        if not nodes:
            return frozenset(), units
        scan = await self.core.run(scan_holders, self.core.host.fs, nodes)
        # by_node holds only the nodes someone holds (few, usually none)
        held = {nodes[n]: scan.describe(n) for n in scan.by_node}
        if scan.unreadable:
            log.warning("%s", scan.describe(next(iter(nodes))))
        return frozenset(held.items()), withdraw_held(units, held)

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
        self,
        snapshot: Snapshot,
        units: list[DraUnit],
        devices: list[Device],
        changed: Sequence[DeviceHealth],
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
        for u in units:
            if not u.published and snapshot.trigger in ("start", "config"):
                log.info("IOMMU group %d not published: %s", u.group, "; ".join(u.reasons))
