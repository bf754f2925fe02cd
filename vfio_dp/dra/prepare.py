"""The kubelet's DRA Handler: NodePrepareResources, NodeUnprepareResources and reconcile.

For each claim kubelet names (namespace, uid, name), :meth:`ClaimPreparer.prepare`:

1. reads the ResourceClaim through the injected reader (the Kubernetes client lives in the
   plugin's API shell) and checks its UID;
2. takes ``status.allocation.devices.results[]`` whose ``driver`` is ours and ``pool`` is this
   node; refuses opaque ``config`` for our driver (we define no parameters) naming the claim;
3. maps each result's ``device`` (``pci-0000-3b-00-0``) to the IOMMU group it stands for
   (:func:`vfio_dp.model.serving.dra_units`); for ``bind: onPrepare`` binds every group of
   the claim in ONE :meth:`vfio_dp.host.Host.bind` (``group=True``: the same refusals --
   host-used devices, a bridge on a DMA driver --, the same rollback and the same durable
   record, ``bound_by = claim:<uid>``; never ``probe``: the plugin does not open group nodes);
4. re-reads sysfs and verifies each group is viable and still has the number published;
5. writes the KEP-5304 metadata file per request and the claim's CDI spec, then checkpoints
   the claim as ``prepared`` and returns every CDI device ID.

``adminAccess: true`` results never bind and never get the VFIO group: their device carries
only the metadata mount. A claim reserved for several pods (``status.reservedFor``) is
prepared once per node, but a VFIO group can be opened by ONE process only: the first VM to
open ``/dev/vfio/<N>`` has it, the others get ``EBUSY``. Every per-claim error names the claim, the device and the reason.

One claim is handled by one worker at a time (an ``asyncio.Lock`` per UID); kubelet's
retry of a claim whose bind is still running waits for it, then answers from the device
state it finds (a bound group is ``already`` bound: nothing is written twice).

:meth:`ClaimPreparer.unprepare` removes the CDI spec and metadata and gives back exactly the
devices whose bind record says ``claim:<uid>`` (an operator's or the daemon's bindings are
never undone); it answers every claim, known or not.

:meth:`ClaimPreparer.reconcile` (at start and every resync) unprepares each checkpointed
claim whose ResourceClaim is gone, has another UID, or is no longer allocated on this node
-- and any device a claim bound that no checkpoint knows (a crash before the checkpoint) --
but restores a group only when no process holds ``/dev/vfio/<N>`` open
(:mod:`vfio_dp.host.holders`; a force-deleted pod's QEMU may still run). Until then the
claim is kept, retried next resync, logged and counted (``vfio_dp_dra_held_groups``). After a
reboot (boot ID changed) each checkpointed claim is re-verified against the hardware; one
whose devices moved or changed loses its CDI spec until kubelet prepares it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from vfio_dp.dra import cdi
from vfio_dp.dra import metadata as mdfile
from vfio_dp.dra.checkpoint import (
    PREPARED,
    PREPARING,
    RELEASING,
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
)
from vfio_dp.dra.kubelet import ClaimRef, ClaimResult, PreparedDevice
from vfio_dp.dra.slices import device_for
from vfio_dp.errors import ClaimError, VfioError
from vfio_dp.host import Host
from vfio_dp.host.holders import scan_holders
from vfio_dp.host.state import bound_by_claim, claim_of
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model import dra_metadata as md
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vfio_dp.model.device import Inventory
from vfio_dp.model.serving import DraUnit, dra_units

log = logging.getLogger("vfio_dp.dra.prepare")

#: ``await reader(namespace, name)`` → the ResourceClaim in its API JSON form, None if absent.
ClaimReader = Callable[[str, str], Awaitable[dict[str, Any] | None]]


class Metrics(Protocol):
    def inc(self, name: str, amount: float = 1.0) -> None: ...
    def set(self, name: str, value: float) -> None: ...


# -- the ResourceClaim, as far as we read it ---------------------------------------------------
@dataclass(frozen=True, slots=True)
class AllocationResult:
    """``status.allocation.devices.results[]``: ``{request, driver, pool, device, adminAccess}``."""

    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class ClaimView:
    uid: str
    name: str
    namespace: str
    pod_claim_name: str | None
    allocated: bool
    results: tuple[AllocationResult, ...]
    opaque_config: tuple[tuple[str, tuple[str, ...]], ...]  # (driver, requests) per entry


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def view_claim(obj: Mapping[str, Any]) -> ClaimView:
    """The parts of a ResourceClaim (API JSON, ``resource.k8s.io/v1``) that Prepare reads."""
    results: list[AllocationResult] = []
    for r in _get(obj, "status", "allocation", "devices", "results") or []:
        if not isinstance(r, dict):
            continue
        results.append(
            AllocationResult(
                request=str(r.get("request", "")),
                driver=str(r.get("driver", "")),
                pool=str(r.get("pool", "")),
                device=str(r.get("device", "")),
                admin_access=r.get("adminAccess") is True,
            )
        )
    configs: list[tuple[str, tuple[str, ...]]] = []
    for c in _get(obj, "status", "allocation", "devices", "config") or []:
        opaque = _get(c, "opaque")
        if isinstance(opaque, dict):
            reqs = _get(c, "requests") or []
            configs.append((str(opaque.get("driver", "")), tuple(str(x) for x in reqs)))
    annotations = _get(obj, "metadata", "annotations")
    return ClaimView(
        uid=str(_get(obj, "metadata", "uid") or ""),
        name=str(_get(obj, "metadata", "name") or ""),
        namespace=str(_get(obj, "metadata", "namespace") or ""),
        pod_claim_name=md.pod_claim_name(annotations if isinstance(annotations, dict) else None),
        allocated=isinstance(_get(obj, "status", "allocation"), dict),
        results=tuple(results),
        opaque_config=tuple(configs),
    )


# -- reports -------------------------------------------------------------------------------
@dataclass(slots=True)
class ReconcileReport:
    """What one reconcile did; ``kept`` are groups still held open (retried next time)."""

    unprepared: list[str] = field(default_factory=list)
    restored: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    reverified: list[str] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _describe(ref: ClaimRef | ClaimRecord) -> str:
    return f"{ref.namespace}/{ref.name} (uid {ref.uid})"


class _Restore(Exception):
    """Devices a claim bound could not be given back yet (held open, or a failed restore)."""


class ClaimPreparer:
    """The :class:`vfio_dp.dra.kubelet.Handler` of the DRA plugin (see module doc)."""

    def __init__(
        self,
        *,
        host: Host,
        driver: str,
        node: str,
        cdi_dir: str,
        plugins_dir: str,
        read_claim: ClaimReader,
        config: Callable[[], Config],
        published: Callable[[], Mapping[str, Mapping[str, Any]]] | None = None,
        metrics: Metrics | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        """``config``: the node core's current configuration. ``published``: the devices the
        publisher last wrote, by name (the slice form); None: compare with the current scan."""
        self.host = host
        self.driver = cdi.check_driver(driver)
        self.node = node
        self.cdi_dir = cdi_dir
        self.plugins_dir = plugins_dir
        self.read_claim = read_claim
        self.config = config
        self.published = published
        self.metrics = metrics
        self.checkpoint = checkpoint or Checkpoint(host.fs, driver)
        self._locks: dict[str, asyncio.Lock] = {}
        self._loaded = False

    # -- plumbing ------------------------------------------------------------------------
    def _lock(self, uid: str) -> asyncio.Lock:
        lock = self._locks.get(uid)
        if lock is None:
            lock = self._locks[uid] = asyncio.Lock()
        return lock

    async def _ensure_loaded(self) -> None:
        if not self._loaded:
            await asyncio.to_thread(self.checkpoint.load)
            for p in self.checkpoint.problems:
                log.error("%s", p)
            self._loaded = True

    def _metric(self, name: str, value: float | None = None) -> None:
        if self.metrics is None:
            return
        if value is None:
            self.metrics.inc(name)
        else:
            self.metrics.set(name, value)

    # -- NodePrepareResources ------------------------------------------------------------
    async def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, ClaimResult]:
        await self._ensure_loaded()
        results = await asyncio.gather(*(self._prepare_serialized(c) for c in claims))
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def _prepare_serialized(self, claim: ClaimRef) -> ClaimResult:
        async with self._lock(claim.uid):
            try:
                devices = await self._prepare(claim)
            except ClaimError as e:
                log.warning("NodePrepareResources: %s", e)
                self._metric("vfio_dp_dra_prepare_errors_total")
                return ClaimResult(error=str(e))
            except VfioError as e:
                msg = str(ClaimError(_describe(claim), str(e)))
                log.warning("NodePrepareResources: %s", msg)
                self._metric("vfio_dp_dra_prepare_errors_total")
                return ClaimResult(error=msg)
            self._metric("vfio_dp_dra_prepared_total")
            return ClaimResult(devices=devices)

    async def _read(self, claim: ClaimRef) -> ClaimView:
        who = _describe(claim)
        try:
            obj = await self.read_claim(claim.namespace, claim.name)
        except Exception as e:
            raise ClaimError(who, f"cannot read the ResourceClaim from the API server: {e}") from e
        if obj is None:
            raise ClaimError(
                who,
                f"the ResourceClaim {claim.namespace}/{claim.name} does not exist in the API "
                "server (deleted?); nothing was bound",
            )
        view = view_claim(obj)
        if view.uid != claim.uid:
            raise ClaimError(
                who,
                f"the ResourceClaim {claim.namespace}/{claim.name} now has uid {view.uid!r}: it "
                "was deleted and re-created; this request is for the old one",
            )
        return view

    def _ours(self, view: ClaimView, who: str) -> list[AllocationResult]:
        if not view.allocated:
            raise ClaimError(who, "the ResourceClaim is not allocated (no status.allocation)")
        ours = [r for r in view.results if r.driver == self.driver]
        for r in ours:
            if r.pool != self.node:
                raise ClaimError(
                    who,
                    f"allocated from pool {r.pool!r}, but this is node {self.node!r}: the "
                    "device is not ours to prepare",
                    r.device,
                )
        if not ours:
            raise ClaimError(who, f"no device of driver {self.driver} is allocated to it")
        for r in ours:  # request names reach file paths: refuse before anything is touched
            if not naming.is_dns_label(md.request_base(r.request)):
                raise ClaimError(
                    who, f"request name {r.request[:80]!r} is not a DNS label", r.device[:80]
                )
        requests = {md.request_base(r.request) for r in ours} | {r.request for r in ours}
        for driver, reqs in view.opaque_config:
            if driver != self.driver:
                continue
            if reqs and not requests.intersection(reqs):
                continue
            raise ClaimError(
                who,
                f"opaque configuration for driver {driver} (requests "
                f"{', '.join(reqs) or 'all'}) is not understood: {self.driver} takes no "
                "parameters; remove the config from the claim or its DeviceClass",
            )
        return ours

    def _units(self, inv: Inventory) -> dict[str, DraUnit]:
        return {u.name: u for u in dra_units(inv, self.config())}

    async def _prepare(self, claim: ClaimRef) -> tuple[PreparedDevice, ...]:
        who = _describe(claim)
        view = await self._read(claim)
        ours = self._ours(view, who)
        inv = await asyncio.to_thread(self.host.scan)
        units = self._units(inv)
        chosen: list[tuple[AllocationResult, DraUnit]] = []
        for r in ours:
            unit = units.get(r.device)
            if unit is None:
                raise ClaimError(
                    who,
                    "no such device on this node (no IOMMU group of that name is selected "
                    "for path: dra); the ResourceSlices may be stale -- they are republished "
                    "within one resync",
                    r.device,
                )
            if not r.admin_access and not unit.published:
                already_ours = self._bound_by_this_claim(unit, claim.uid)
                if not (already_ours and all(inv.devices[a].on_vfio for a in unit.endpoints)):
                    raise ClaimError(who, "; ".join(unit.reasons), r.device)
            chosen.append((r, unit))
        records = tuple(
            DeviceRecord(
                requests=(r.request,),
                pool=r.pool,
                device=r.device,
                iommu_group=None if r.admin_access else unit.group,
                addresses=tuple(str(a) for a in unit.endpoints),
                ids=tuple(inv.devices[a].ids for a in unit.endpoints),
                admin_access=r.admin_access,
            )
            for r, unit in chosen
        )
        record = ClaimRecord(
            claim.namespace, claim.name, claim.uid, PREPARING, "", view.pod_claim_name, records
        )
        previous = self.checkpoint.get(claim.uid)
        if previous is None or previous.state != PREPARED:
            await asyncio.to_thread(self.checkpoint.put, record)  # before the first bind
        to_bind = [
            unit.primary
            for r, unit in chosen
            if not r.admin_access
            and unit.on_prepare
            and not all(inv.devices[a].on_vfio for a in unit.endpoints)
        ]
        if to_bind:
            names = ", ".join(u.name for r, u in chosen if u.primary in to_bind)
            try:
                await asyncio.to_thread(
                    self.host.bind,
                    to_bind,
                    group=True,
                    probe=False,
                    bound_by=bound_by_claim(claim.uid),
                )
            except VfioError as e:
                raise ClaimError(
                    who, f"binding the IOMMU group to vfio-pci failed: {e}", names
                ) from e
            inv = await asyncio.to_thread(self.host.scan, usage=False)
        await asyncio.to_thread(self._adopt, chosen, claim.uid)
        self._verify(who, chosen, inv)
        devices = await asyncio.to_thread(self._write_files, claim, view, chosen, inv)
        stored = ClaimRecord(
            claim.namespace,
            claim.name,
            claim.uid,
            PREPARED,
            "",
            view.pod_claim_name,
            tuple(
                DeviceRecord(
                    rec.requests,
                    rec.pool,
                    rec.device,
                    rec.iommu_group,
                    rec.addresses,
                    rec.ids,
                    rec.admin_access,
                    d.cdi_device_ids,
                )
                for rec, d in zip(records, devices, strict=True)
            ),
        )
        await asyncio.to_thread(self.checkpoint.put, stored)
        log.info(
            "prepared claim %s: %s", who, ", ".join(f"{d.device_name}" for d in devices) or "-"
        )
        return devices

    def _adopt(self, chosen: Sequence[tuple[AllocationResult, DraUnit]], uid: str) -> None:
        """A group another (stale, not yet reconciled) claim bound now belongs to this claim:
        its record is rewritten to ``claim:<uid>``, so the stale claim's release never gives
        back a group this claim hands to its pod. Operator and daemon bindings stay theirs."""
        addrs = [a for r, u in chosen if not r.admin_access for a in u.endpoints]
        foreign = [
            a
            for a in addrs
            if (rec := self.host.state.get(a)) is not None
            and claim_of(rec.bound_by) not in (None, uid)
        ]
        if not foreign:
            return
        with self.host.state.locked(foreign, self.host.lock_timeout):
            for a in foreign:
                rec = self.host.state.get(a)
                if rec is not None and claim_of(rec.bound_by) not in (None, uid):
                    self.host.state.put(replace(rec, bound_by=bound_by_claim(uid)))
                    log.info(
                        "%s: bind record taken over from %s by claim uid %s", a, rec.bound_by, uid
                    )

    def _bound_by_this_claim(self, unit: DraUnit, uid: str) -> bool:
        owner = bound_by_claim(uid)
        for a in unit.endpoints:
            rec = self.host.state.get(a)
            if rec is not None and rec.bound_by == owner:
                return True
        return False

    def _verify(
        self, who: str, chosen: Sequence[tuple[AllocationResult, DraUnit]], inv: Inventory
    ) -> None:
        """Each handed-over group is viable, fully on vfio, and still has the number published."""
        published = self.published() if self.published is not None else None
        for r, unit in chosen:
            if r.admin_access:
                continue
            group = inv.groups.get(unit.group)
            if group is None or unit.primary not in group.devices:
                raise ClaimError(who, f"IOMMU group {unit.group} is gone from sysfs", r.device)
            dev = inv.devices.get(unit.primary)
            if dev is None or dev.iommu_group != unit.group:
                raise ClaimError(
                    who, f"{unit.primary} is no longer in IOMMU group {unit.group}", r.device
                )
            if not group.viable:
                reasons = "; ".join(p.reason for p in group.problems)
                raise ClaimError(
                    who, f"IOMMU group {unit.group} is not viable: {reasons}", r.device
                )
            off = [str(a) for a in unit.endpoints if not inv.devices[a].on_vfio]
            if off:
                raise ClaimError(
                    who,
                    f"{', '.join(off)} of IOMMU group {unit.group} not on vfio-pci; select the "
                    "group with bind: onPrepare (or bind: true), or vfioctl bind --group "
                    f"{unit.primary}",
                    r.device,
                )
            if published is not None:
                attrs = (published.get(r.device) or {}).get("attributes") or {}
                number = (attrs.get("iommuGroup") or {}).get("int")
                if number is None:
                    raise ClaimError(who, "the device is not in the published slices", r.device)
                if number != unit.group:
                    raise ClaimError(
                        who,
                        f"published as IOMMU group {number} but it is group {unit.group} now "
                        "(renumbered, e.g. after a reboot); the slice is being republished: "
                        "delete the pod so that the claim is allocated again",
                        r.device,
                    )

    def _write_files(
        self,
        claim: ClaimRef,
        view: ClaimView,
        chosen: Sequence[tuple[AllocationResult, DraUnit]],
        inv: Inventory,
    ) -> tuple[PreparedDevice, ...]:
        roots = pcie_roots(self.host.fs, [u.primary for _, u in chosen])
        by_request: dict[str, list[tuple[str, md.MetadataDevice]]] = {}
        for r, unit in chosen:
            attrs = device_for(unit, inv, roots)["attributes"]
            mdev = md.MetadataDevice(
                driver=self.driver,
                pool=r.pool,
                name=r.device,
                attributes={k: md.attribute(a, k) for k, a in attrs.items()},
            )
            by_request.setdefault(md.request_base(r.request), []).append((r.request, mdev))
        files = mdfile.write_claim(
            self.plugins_dir,
            self.driver,
            claim_name=claim.name,
            namespace=claim.namespace,
            uid=claim.uid,
            pod_claim_name=view.pod_claim_name,
            devices_by_request=by_request,
        )
        cdi_devices: list[cdi.CdiDevice] = []  # the groups first, then the metadata mounts
        metadata_devices: list[cdi.CdiDevice] = []
        metadata_ids: dict[str, str] = {}
        for req, (host_path, container_path) in files.items():
            dev = cdi.CdiDevice(
                cdi.metadata_device_name(claim.uid, req),
                mounts=(cdi.Mount(host_path, container_path),),
            )
            metadata_devices.append(dev)
            metadata_ids[req] = cdi.device_id(self.driver, dev.name)
        out: list[PreparedDevice] = []
        given_metadata: set[str] = set()
        for r, unit in chosen:
            ids: list[str] = []
            if not r.admin_access:
                group = inv.groups[unit.group]
                nodes = self.host.device_nodes(group, [inv.devices[a] for a in unit.endpoints])
                gdev = cdi.CdiDevice(cdi.group_device_name(claim.uid, unit.name), tuple(nodes))
                cdi_devices.append(gdev)
                ids.append(cdi.device_id(self.driver, gdev.name))
            req = md.request_base(r.request)
            if req not in given_metadata:  # one mount per request (on its first device)
                given_metadata.add(req)
                ids.append(metadata_ids[req])
            out.append(PreparedDevice((r.request,), r.pool, r.device, tuple(ids)))
        cdi.write_spec(self.cdi_dir, self.driver, claim.uid, cdi_devices + metadata_devices)
        return tuple(out)

    # -- NodeUnprepareResources ----------------------------------------------------------
    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        await self._ensure_loaded()
        results = await asyncio.gather(*(self._unprepare_serialized(c) for c in claims))
        return {c.uid: r for c, r in zip(claims, results, strict=True)}

    async def _unprepare_serialized(self, claim: ClaimRef) -> str:
        async with self._lock(claim.uid):
            try:
                restored = await asyncio.to_thread(self._release, claim.uid, _describe(claim))
            except _Restore as e:
                self._metric("vfio_dp_dra_unprepare_errors_total")
                log.warning("NodeUnprepareResources: %s", e)
                return str(e)
            except VfioError as e:
                self._metric("vfio_dp_dra_unprepare_errors_total")
                msg = f"claim {_describe(claim)}: {e}"
                log.warning("NodeUnprepareResources: %s", msg)
                return msg
            log.info(
                "unprepared claim %s%s",
                _describe(claim),
                f"; restored {', '.join(restored)}" if restored else "",
            )
            return ""

    def _release(self, uid: str, who: str) -> list[str]:
        """Remove the claim's CDI spec and metadata; give back the devices it bound (held
        groups are kept: :class:`_Restore`); forget the claim once all is done. Blocking."""
        cdi.remove_spec(self.cdi_dir, self.driver, uid)
        mdfile.remove_claim(self.plugins_dir, self.driver, uid)
        try:
            restored = self._restore_claim_devices(uid, who)
        except _Restore:
            rec = self.checkpoint.get(uid)
            if rec is not None and rec.state != RELEASING:  # reconcile retries it
                self.checkpoint.put(replace(rec, state=RELEASING))
            raise
        self.checkpoint.remove(uid)
        return restored

    def _restore_claim_devices(self, uid: str, who: str) -> list[str]:
        """Restore every device whose bind record says ``claim:<uid>``, group by group, only
        groups no process holds open; raise :class:`_Restore` naming what was kept."""
        owner = bound_by_claim(uid)
        mine = [a for a, rec in self.host.state.all().items() if rec.bound_by == owner]
        if not mine:
            return []
        inv = self.host.scan(usage=False)
        by_group: dict[int | None, list[PciAddress]] = {}
        for a in mine:
            dev = inv.devices.get(a)
            by_group.setdefault(dev.iommu_group if dev else None, []).append(a)
        nodes = {
            n: f"/dev/vfio/{inv.groups[n].node}"
            for n in by_group
            if n is not None and n in inv.groups
        }
        scan = scan_holders(self.host.fs, nodes.values())
        restored: list[str] = []
        problems: list[str] = []
        for n, addrs in sorted(by_group.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
            node = nodes.get(n) if n is not None else None
            if node is not None and scan.held(node) is not False:
                problems.append(
                    f"IOMMU group {n} ({', '.join(map(str, addrs))}) kept on vfio-pci: "
                    f"{scan.describe(node)} (a VFIO group is opened by one process only, "
                    "typically the VM's QEMU); it is given back once that process closes it"
                )
                continue
            present = [a for a in addrs if a in inv.devices]
            for a in addrs:
                if a not in inv.devices:  # unplugged: nothing to give back, forget it
                    self.host.state.remove(a)
            if not present:
                continue
            try:
                res = self.host.unbind(present)
            except VfioError as e:
                problems.append(f"IOMMU group {n}: restoring {', '.join(map(str, present))}: {e}")
                continue
            restored.extend(f"{a} → {d or 'no driver'}" for a, d in res.restored)
            restored.extend(f"{a} (already on its driver)" for a in res.already)
        if problems:
            self._metric("vfio_dp_dra_held_groups", float(len(problems)))
            raise _Restore(f"claim {who}: " + "; ".join(problems))
        return restored

    # -- reconcile -----------------------------------------------------------------------
    async def reconcile(self) -> ReconcileReport:
        """Unprepare what is no longer ours (see module doc); re-verify claims of another
        boot. Never unprepares a claim whose ResourceClaim could not be read."""
        await self._ensure_loaded()
        report = ReconcileReport()
        for rec in await asyncio.to_thread(self.checkpoint.untrusted):
            async with self._lock(rec.uid):
                await asyncio.to_thread(self._reverify, rec, report)
        known = self.checkpoint.all()
        for uid, rec in sorted(known.items()):
            obj: dict[str, Any] | None = None
            try:
                if rec.state != RELEASING:
                    obj = await self.read_claim(rec.namespace, rec.name)
            except Exception as e:
                report.errors.append(f"claim {rec.ref}: cannot read it, kept: {e}")
                continue
            why = self._stale(rec, obj)
            if why is None:
                continue
            await self._reconcile_release(uid, rec.ref, why, report)
        # devices a claim bound that no checkpoint entry names (crash before the checkpoint
        # was written, or a checkpoint set aside as corrupt)
        orphans = sorted(
            {u for rec in self.host.state.all().values() if (u := claim_of(rec.bound_by))}
            - set(self.checkpoint.all())
        )
        for uid in orphans:
            await self._reconcile_release(uid, f"(uid {uid}, not checkpointed)", "unknown", report)
        held = len(report.kept)
        self._metric("vfio_dp_dra_held_groups", float(held))
        for line in report.kept:
            log.warning("reconcile: %s", line)
        for line in report.errors:
            log.error("reconcile: %s", line)
        return report

    def _stale(self, rec: ClaimRecord, obj: Mapping[str, Any] | None) -> str | None:
        if rec.state == RELEASING:
            return "kubelet unprepared it while its group was held open"
        if obj is None:
            return "its ResourceClaim is gone"
        view = view_claim(obj)
        if view.uid != rec.uid:
            return f"its ResourceClaim was re-created (uid {view.uid})"
        if not any(r.driver == self.driver and r.pool == self.node for r in view.results):
            return "it is no longer allocated on this node"
        return None

    async def _reconcile_release(
        self, uid: str, ref: str, why: str, report: ReconcileReport
    ) -> None:
        async with self._lock(uid):
            try:
                restored = await asyncio.to_thread(self._release, uid, ref)
            except _Restore as e:
                report.kept.append(f"{e} ({why})")
                return
            except VfioError as e:
                report.errors.append(f"claim {ref}: {e}")
                return
        report.unprepared.append(f"{ref}: {why}")
        report.restored.extend(restored)
        log.info("reconcile: unprepared claim %s: %s", ref, why)

    def _reverify(self, rec: ClaimRecord, report: ReconcileReport) -> None:
        """After a reboot: do the claim's devices still exist with the same IDs and IOMMU
        groups? Yes: trust it again. No: withdraw its CDI spec and metadata (a container
        must not get another device's group) until kubelet prepares it again."""
        inv = self.host.scan(usage=False)
        problems: list[str] = []
        for d in rec.devices:
            for addr_text, ids in zip(d.addresses, d.ids, strict=False):
                dev = inv.devices.get(PciAddress.parse(addr_text))
                if dev is None:
                    problems.append(f"{addr_text} is gone")
                elif dev.ids != ids:
                    problems.append(f"{addr_text} is now {dev.ids}, was {ids}")
                elif not d.admin_access and dev.iommu_group != d.iommu_group:
                    problems.append(
                        f"{addr_text} is in IOMMU group {dev.iommu_group}, was {d.iommu_group}"
                    )
        if not problems:
            self.checkpoint.mark_verified(rec.uid)
            report.reverified.append(rec.ref)
            return
        cdi.remove_spec(self.cdi_dir, self.driver, rec.uid)
        mdfile.remove_claim(self.plugins_dir, self.driver, rec.uid)
        self.checkpoint.put(replace(rec, state=PREPARING))
        report.invalidated.append(f"{rec.ref}: {'; '.join(problems)}")
        log.warning(
            "after reboot, claim %s no longer matches the hardware: %s",
            rec.ref,
            "; ".join(problems),
        )
