"""The kubelet's DRA Handler: NodePrepareResources, NodeUnprepareResources and reconcile.

Prepare, for each claim kubelet names (namespace, uid, name), is a recipe over pure steps:

1. **read** the ResourceClaim through the injected reader (the Kubernetes client lives in the
   plugin's API shell), refuse a re-created one, take the results of our driver on this node
   (:mod:`.claims`: opaque config for our driver, a foreign pool, a request name that is not
   a DNS label are refused before anything is touched);
2. **resolve** each result's ``device`` (``pci-0000-3b-00-0``) to its IOMMU group
   (:mod:`.resolve`), read fresh from sysfs for that claim alone -- the groups its devices
   name, whole, with the host's use of them, and no other device
   (:meth:`vfio_dp.host.Host.scan_groups`: what a full scan says of them, at the cost of a
   few devices on a host of thousands) -- and checkpoint the claim as ``preparing`` when it
   has a group to bind (before the bind; a claim with nothing to bind is recorded once,
   ``prepared``; the checkpoint format: :mod:`.checkpoint`);
3. **take ownership** (:class:`~.steps.DeviceSteps`, the switch ahead's steps too): for
   ``bind: onPrepare`` bind every group of the claim not yet on
   vfio-pci in ONE :meth:`vfio_dp.host.Host.bind` (``group=True``: the same refusals, the
   same rollback and the same durable record, holder ``claim:<uid>``; never ``probe``: the
   plugin does not open group nodes; it plans from the read of step 2, and again under the
   devices' locks), re-read those groups' devices only then
   (:meth:`vfio_dp.host.Host.reread`), and adopt bind records a stale claim or the
   claim's pool (``pool:<driver>``) left on these groups; then verify each group is
   viable, on vfio-pci, and still has the number published;
4. **write** the KEP-5304 metadata file per request and the claim's CDI spec (:mod:`.edits`);
   for a claim the scheduler made for a pod's extended-resource limits (KEP-5004), each
   request's devices also carry the variables the device plugin's Allocate gives
   (:mod:`.extended`: request → deviceClassName → the class's resource, read before any
   bind);
5. **record** the claim as ``prepared`` and answer every CDI device ID once the checkpoint
   holds it on disk -- one durable write for all the claims of the call
   (:class:`~vfio_dp.dra.claimpath.commit.CallCommit`). A claim not prepared before whose
   files or record cannot be written (a full or read-only CDI, metadata or state
   directory) has its files removed again: nothing of it is left for a container.

``adminAccess: true`` results never bind and never get the VFIO group: their device carries
only the metadata mount. A claim reserved for several pods (``status.reservedFor``) is
prepared once per node, but a VFIO group can be opened by ONE process only: the first VM to
open ``/dev/vfio/<N>`` has it, the others get ``EBUSY``. Every per-claim error names the
claim, the device and the reason.

One claim is handled by one worker at a time (an ``asyncio.Lock`` per UID); kubelet's
retry of a claim whose bind is still running waits for it, then answers from the device
state it finds (a bound group is ``already`` bound: nothing is written twice).

Unprepare and reconcile (releasing claims, re-verifying after a reboot): :mod:`.reconcile`.
Importing this module loads no ``grpc`` (the gRPC shell is :mod:`.kubelet`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from vfio_dp.core.logs import claim_context
from vfio_dp.dra.claimpath import cdi, extended, mdev, native, resolve
from vfio_dp.dra.claimpath.checkpoint import (
    PREPARED,
    PREPARING,
    Checkpoint,
    ClaimRecord,
    DeviceRecord,
)
from vfio_dp.dra.claimpath.claims import (
    AllocationResult,
    ClaimRef,
    ClaimResult,
    ClaimView,
    PreparedDevice,
    check_current,
    check_identity,
    describe,
    ours,
)
from vfio_dp.dra.claimpath.commit import CallCommit
from vfio_dp.dra.claimpath.edits import ClaimDirs, ClaimFiles, build
from vfio_dp.dra.claimpath.outcome import outcome
from vfio_dp.dra.claimpath.reconcile import ClaimReader, Reconciler, ReconcileReport
from vfio_dp.dra.claimpath.resolve import Chosen
from vfio_dp.dra.claimpath.steps import DeviceSteps
from vfio_dp.dra.slices import Device, device_for
from vfio_dp.errors import ClaimError, VfioError
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vfio_dp.model.device import Inventory
from vfio_dp.model.devnodes import NativeNodes

__all__ = ["ClaimPreparer", "ClaimReader", "ReconcileReport"]

log = logging.getLogger("vfio_dp.dra.claimpath.prepare")


class Metrics(Protocol):
    def inc(self, name: str, amount: float = 1.0) -> None: ...
    def set(self, name: str, value: float) -> None: ...


def _describe(ref: ClaimRef) -> str:
    return describe(ref.namespace, ref.name, ref.uid)


class ClaimPreparer:
    """The :class:`vfio_dp.dra.claimpath.claims.Handler` of the DRA plugin (see module doc)."""

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
        published: Callable[[], Mapping[str, Device]] | None = None,
        metrics: Metrics | None = None,
        checkpoint: Checkpoint | None = None,
        read_class: extended.ClassResource | None = None,
        node_timeout: float = 20.0,
    ) -> None:
        """``config``: the node core's current configuration. ``published``: the devices the
        publisher last wrote, by name; None: compare with the current scan. ``node_timeout``:
        how long a container claim waits for its device nodes after the switch to the
        native driver (kubelet's own deadline is ~45 s)."""
        self.host = host
        self.driver = cdi.check_driver(driver)
        self.node = node
        self.dirs = ClaimDirs(self.driver, cdi_dir, plugins_dir)
        self.read_claim = read_claim
        self.read_class = read_class
        self.config = config
        self.published = published
        self.metrics = metrics
        self.checkpoint = checkpoint or Checkpoint.for_host(host, driver)
        #: the steps over a claim's devices, Prepare's and the switch ahead's
        self.steps = DeviceSteps(
            host=host, driver=self.driver, config=config, published=published,
            node_timeout=node_timeout,
        )  # fmt: skip
        self.reconciler = Reconciler(
            host=host,
            driver=self.driver,
            node=node,
            dirs=self.dirs,
            checkpoint=self.checkpoint,
            read_claim=read_claim,
            lock=self.lock,
            metric=self._metric,
        )
        self._locks: dict[str, asyncio.Lock] = {}
        #: held by a worker thread over a claim's reads, checks and files (never over a
        #: bind, a switch or a wait): the others wait on it, not on the GIL, so a call of
        #: 1,000 claims is not ~30 GIL hand-offs between threads per claim
        self._cpu = threading.Lock()
        self._loaded = False
        self.mdev_costs: dict[tuple[str, str], int] = {}  # mdev_slices.type_cost's memory

    # -- what the switch ahead (.ahead) and the plugin use ----------------------------------
    def lock(self, uid: str) -> asyncio.Lock:
        """The claim's lock: one worker at a time per claim (Prepare, Unprepare, reconcile,
        the switch ahead)."""
        lock = self._locks.get(uid)
        if lock is None:
            lock = self._locks[uid] = asyncio.Lock()
        return lock

    async def loaded(self) -> None:
        """The checkpoint read (once; its unreadable records logged)."""
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
        await self.loaded()
        once = list({c.uid: c for c in reversed(claims)}.values())  # a UID named twice: once
        call = CallCommit(self.checkpoint, len(once))
        results = await asyncio.gather(*(self._prepare_serialized(c, call) for c in once))
        return {c.uid: r for c, r in zip(once, results, strict=True)}

    async def _prepare_serialized(self, claim: ClaimRef, call: CallCommit) -> ClaimResult:
        claim_context(claim.namespace, claim.name, claim.uid)  # its own task (gather)
        async with self.lock(claim.uid):  # a retry while its Prepare runs reads after it
            try:
                try:
                    devices, gen, keep = await self._prepare(claim)
                except BaseException:
                    call.leave()
                    raise
                try:
                    await call.arrive(lambda: gen)  # the call's one checkpoint write
                except Exception:
                    if not keep:
                        await asyncio.to_thread(self._discard_files, claim.uid, _describe(claim))
                    raise
            except Exception as e:  # one claim's failure, whatever it is, fails it alone
                failed = outcome(_describe(claim), e, self.checkpoint.path)
                failed.log(log, "NodePrepareResources")
                self._metric("vfio_dp_dra_prepare_errors_total")
                return ClaimResult(error=failed.error)
            self._metric("vfio_dp_dra_prepared_total")
            return ClaimResult(devices=devices)

    async def _prepare(self, claim: ClaimRef) -> tuple[tuple[PreparedDevice, ...], int, bool]:
        """The recipe (module docstring): read here, the rest in one worker thread."""
        who = _describe(claim)
        held = self.checkpoint.get(claim.uid)
        if held is not None:  # before the read: nothing of the first claim's is touched
            check_identity(claim, held.namespace, held.name)
        view = await self._read(claim)
        wanted = ours(view, self.driver, self.node, who)
        if any(mdev.is_mdev(r.device) for r in wanted):  # mediated devices: .mdev
            return await asyncio.to_thread(self._settle_mdev, claim, view, wanted)
        resources = await self._resources(view, wanted, who)
        return await asyncio.to_thread(self._settle, claim, view, wanted, resources)

    def _settle(
        self,
        claim: ClaimRef,
        view: ClaimView,
        wanted: Sequence[AllocationResult],
        resources: Mapping[str, str],
    ) -> tuple[tuple[PreparedDevice, ...], int, bool]:
        """Resolve → take ownership → write → record: sysfs, the bind, the files and the
        checkpoint are all blocking, so they run in one hop off the event loop (a hop per
        step was a tenth of a Prepare). Blocking; under the claim's lock. → (the devices,
        the number of the staged ``prepared`` record for the call's commit, whether the
        claim was prepared before: its files stay if that commit fails)."""
        who, steps = _describe(claim), self.steps
        with self._cpu:
            inv, chosen = steps.resolve(who, claim.uid, wanted)
            expected = steps.check(self.checkpoint.all(), who, claim.uid, chosen, inv)
            records = resolve.device_records(chosen, inv)
            previous = self.checkpoint.get(claim.uid)
            keep = previous is not None and previous.state == PREPARED
            moves = steps.moves(chosen, inv)
        if moves and not keep:  # durable before the bind
            self.checkpoint.commit(self.record(claim, view, PREPARING, records))
        inv, found = steps.take(who, claim.uid, chosen, inv, expected)
        with self._cpu:
            steps.verify(who, chosen, inv)
            try:
                files = self._write(claim, view, chosen, inv, resources, found)
                ids = [d.cdi_device_ids for d in files.prepared]
                records = tuple(
                    replace(r, cdi_device_ids=i) for r, i in zip(records, ids, strict=True)
                )
                gen = self.record(claim, view, PREPARED, records)
            except BaseException:
                if not keep:
                    self._discard_files(claim.uid, who)
                raise
        devices = ", ".join(r.device for r in records) or "-"
        log.info("prepared claim %s: %s", who, devices, extra={"device": devices})
        return files.prepared, gen, keep

    def _settle_mdev(
        self, claim: ClaimRef, view: ClaimView, wanted: Sequence[AllocationResult]
    ) -> tuple[tuple[PreparedDevice, ...], int, bool]:
        """:func:`vfio_dp.dra.claimpath.mdev.prepare`, for a claim of mdev entries."""
        claims = self.checkpoint.all()
        entries = mdev.pool(self.host, self.config(), claims, self.mdev_costs)
        return mdev.prepare(
            self.host, _describe(claim), claim, view.pod_claim_name, wanted,
            entries={m.device.name: m for m in entries}, claims=claims,
            commit=self.checkpoint.commit, dirs=self.dirs,
            record=lambda state, devices: self.record(claim, view, state, devices),
        )  # fmt: skip

    async def _read(self, claim: ClaimRef) -> ClaimView:
        try:
            obj = await self.read_claim(claim.namespace, claim.name)
        except Exception as e:
            raise ClaimError(
                _describe(claim), f"cannot read the ResourceClaim from the API server: {e}"
            ) from e
        return check_current(claim, obj)

    async def _resources(
        self, view: ClaimView, wanted: Sequence[AllocationResult], who: str
    ) -> dict[str, str]:
        """An extended-resource claim's request → resource (empty for an ordinary claim)."""
        if not view.extended:
            return {}
        if self.read_class is None:
            raise ClaimError(
                who,
                "this plugin reads no DeviceClasses: it cannot name the resource of an "
                "extended-resource claim",
            )
        requests = sorted({r.request for r in wanted if not r.admin_access})
        return await extended.request_resources(
            dict(view.request_classes), requests, self.read_class, who
        )

    def _write(
        self,
        claim: ClaimRef,
        view: ClaimView,
        chosen: Sequence[Chosen],
        inv: Inventory,
        resources: Mapping[str, str],
        native_found: Mapping[PciAddress, NativeNodes],
    ) -> ClaimFiles:
        """Read what the files show (PCIe roots, device nodes), build them, write them; a
        container entry's nodes are those ``native_found`` on its native driver."""
        config = self.config()
        endpoints: dict[str, list[PciAddress]] = {}
        for c in chosen:
            if c.result.request in resources and c.gets_group:
                found = extended.resource_endpoints(c.unit, inv, config)
                endpoints.setdefault(c.result.request, []).extend(found)
        roots = self.host.pcie_roots([c.unit.primary for c in chosen])
        nodes = {
            c.result.device: self.host.device_nodes(
                inv.groups[c.unit.group], [inv.devices[a] for a in c.unit.endpoints]
            )
            for c in chosen
            if c.gets_group
        }
        slice_devices = {c.result.device: device_for(c.unit, inv, roots) for c in chosen}
        for c in native.containers(chosen):
            nodes[c.result.device] = list(native.node_paths(c, native_found))
            slice_devices[c.result.device] = native.metadata_device(
                c,
                slice_devices[c.result.device],
                inv.devices[c.unit.primary].driver or "",
                nodes[c.result.device],
            )
        files = build(
            claim,
            view.pod_claim_name,
            chosen,
            driver=self.driver,
            plugins_dir=self.dirs.plugins_dir,
            slice_devices=slice_devices,
            group_nodes=nodes,
            env=extended.request_env(resources, endpoints),
        )
        self.dirs.write(claim.uid, files)
        return files

    def _discard_files(self, uid: str, who: str) -> None:
        """A Prepare that failed at its files or its checkpoint (ENOSPC, EROFS on the CDI,
        metadata or state directory) leaves none of its files behind: no container may be
        given a metadata file or spec of a claim that is not prepared. A claim prepared
        before keeps its files (its pod may run; kubelet retries). Blocking."""
        try:
            self.dirs.remove(uid)
        except VfioError as e:
            log.warning("claim %s: its files could not be removed after the failure: %s", who, e)

    def record(
        self, claim: ClaimRef, view: ClaimView, state: str, devices: tuple[DeviceRecord, ...]
    ) -> int:
        """The claim's checkpoint record, staged: its number for
        :meth:`~vfio_dp.dra.claimpath.checkpoint.Checkpoint.commit`."""
        record = ClaimRecord(
            claim.namespace, claim.name, claim.uid, state, "", view.pod_claim_name, devices
        )
        return self.checkpoint.stage(record)

    # -- NodeUnprepareResources ----------------------------------------------------------
    async def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        await self.loaded()
        once = list({c.uid: c for c in reversed(claims)}.values())  # a UID named twice: once
        call = CallCommit(self.checkpoint, len(once), before=self.dirs.sync)
        results = await asyncio.gather(*(self._unprepare_serialized(c, call) for c in once))
        return {c.uid: r for c, r in zip(once, results, strict=True)}

    async def _unprepare_serialized(self, claim: ClaimRef, call: CallCommit) -> str:
        claim_context(claim.namespace, claim.name, claim.uid)  # its own task (gather)
        async with self.lock(claim.uid):
            try:
                try:
                    held = self.checkpoint.get(claim.uid)
                    if held is not None:  # never release another claim's devices by its uid
                        check_identity(claim, held.namespace, held.name)
                    restored = await asyncio.to_thread(
                        self.reconciler.give_back, claim.uid, _describe(claim)
                    )
                except BaseException:
                    call.leave()
                    raise
                # its files gone on disk, then forgotten on disk, before kubelet hears it
                await call.arrive(lambda: self.checkpoint.stage_remove(claim.uid))
            except Exception as e:  # one claim's failure, whatever it is, fails it alone
                failed = outcome(_describe(claim), e, self.checkpoint.path)
                failed.log(log, "NodeUnprepareResources")
                self._metric("vfio_dp_dra_unprepare_errors_total")
                return failed.error
            log.info(
                "unprepared claim %s%s",
                _describe(claim),
                f"; restored {', '.join(restored)}" if restored else "",
            )
            return ""

    # -- reconcile -----------------------------------------------------------------------
    async def reconcile(self, budget: int | None = None) -> ReconcileReport:
        """Release what is no longer ours; re-verify claims of another boot
        (:meth:`vfio_dp.dra.claimpath.reconcile.Reconciler.reconcile`; ``budget``: claims
        read from the API server at most, None: all)."""
        await self.loaded()
        return await self.reconciler.reconcile(budget)
