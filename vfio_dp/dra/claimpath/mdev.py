"""Claims on mediated devices (issue 35 item 4): the pool's mdev entries read from the host,
Prepare and Unprepare of a claim whose results name them (``mdev-…``).

- A **static** instance (``mdev-<uuid>``): Prepare checks it is there with its IOMMU group
  and ``/dev/vfio/<N>`` and hands it over; Unprepare leaves it (the config made it).
- A **slot** (``mdev-<parent>-<type>-<k>``): Prepare picks a UUID, records it in the
  checkpoint (``"mdevUUID"`` of the device's entry, made durable by one
  :meth:`~vfio_dp.dra.claimpath.checkpoint.Checkpoint.commit` BEFORE anything is made), then
  makes the instance through the journalled create
  (:meth:`vfio_dp.host.mdev_ops.Mdevs.create`: ``echo <uuid> >
  /sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/create``, its record
  ``<root>/var/lib/vfio_dp/mdev/<uuid>.json`` saying ``claim:<uid>``). A crash between the
  two leaves a ``preparing`` record naming a UUID nobody made: kubelet's retry makes that
  same UUID, a claim that is gone is released with nothing to remove. Unprepare removes the
  instance (``echo 1 > /sys/bus/mdev/devices/<uuid>/remove``), refused while its
  ``/dev/vfio/<N>`` is held open (the claim stays ``releasing`` and reconcile retries), then
  the claim is forgotten. After a reboot the DRA plugin's mdev pass
  (:mod:`vfio_dp.core.mdev_reconcile`) re-makes every ``claim:<uid>`` instance with its UUID.

What a claim gets: CDI ``/dev/vfio/vfio`` and ``/dev/vfio/<N>`` of the instance's group, and
the KEP-5304 metadata with the slice's attributes plus the bare ``mdevUUID`` (KubeVirt's
launcher takes the instance from it; it wins over ``pciBusID``). A claim naming both mdev and
PCI devices of this driver is refused (ask for them in two claims).
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace

from vfio_dp.dra.claimpath.checkpoint import PREPARED, PREPARING, ClaimRecord, DeviceRecord
from vfio_dp.dra.claimpath.claims import AllocationResult, ClaimRef, PreparedDevice
from vfio_dp.dra.claimpath.edits import ClaimDirs, build
from vfio_dp.dra.mdev_slices import PREFIX, MdevDevice, MdevWant, mdev_devices
from vfio_dp.dra.slices import Device
from vfio_dp.errors import ClaimError, HostError, RefusedError
from vfio_dp.host import Host, sysfs
from vfio_dp.host.bound_by import BOUND_BY_DRA_PLUGIN, bound_by_claim, claim_of
from vfio_dp.host.mdev_ops import Mdevs
from vfio_dp.model.config import Config
from vfio_dp.model.dra_metadata import MDEV_UUID, Attribute
from vfio_dp.model.mdev_config import ON_PREPARE, STATIC

log = logging.getLogger("vfio_dp.dra.claimpath.prepare")

__all__ = ["claim_uids", "is_mdev", "pool", "prepare", "release"]


def is_mdev(device: str) -> bool:
    """A result naming an mdev entry (``mdev-…``; PCI entries are ``pci-…``)."""
    return device.startswith(PREFIX)


def pool(
    host: Host,
    config: Config,
    claims: Mapping[str, ClaimRecord],
    costs: MutableMapping[tuple[str, str], int],
) -> list[MdevDevice]:
    """The pool's mdev entries now (:func:`vfio_dp.dra.mdev_slices.mdev_devices`), read from
    ``<root>/sys/class/mdev_bus``, the mdev records and the PCI parents' sysfs; [] without
    ``path: dra`` entries (nothing read). Blocking."""
    if not any(e.path == "dra" for e in config.mdev):
        return []
    from vfio_dp.core.mdev_reconcile import wanted  # core: the one parent resolver

    mdevs = Mdevs(host, by=BOUND_BY_DRA_PLUGIN)
    inv = mdevs.read()
    wants: list[MdevWant] = []
    for create in (STATIC, ON_PREPARE):
        found, _problems = wanted(host, config, inv, "dra", create)
        wants += [MdevWant(w.parent, w.type_id, w.count, create) for w in found]
    records, _bad = mdevs.store.records()
    pci = [p for p in inv.parents if p.address is not None]
    by_addr = host.pcie_roots([p.address for p in pci if p.address is not None])
    roots = {p.name: by_addr[p.address] for p in pci if p.address in by_addr}
    numa: dict[str, int] = {}
    for p in pci:
        dev = sysfs.read_device(host.fs, p.address) if p.address is not None else None
        if dev is not None and dev.numa_node is not None:
            numa[p.name] = dev.numa_node
    held = [d.device for c in claims.values() for d in c.devices if d.mdev_uuid]
    return mdev_devices(inv, wants, records, roots, numa, costs, held)


@dataclass(frozen=True, slots=True)
class Handed:
    """One mdev result and the instance it gets (:func:`vfio_dp.dra.claimpath.edits.build`
    takes it as it takes a PCI group's :class:`~vfio_dp.dra.claimpath.resolve.Chosen`)."""

    result: AllocationResult
    entry: MdevDevice
    uuid: str

    @property
    def gets_group(self) -> bool:
        return not self.result.admin_access

    @property
    def gets_nodes(self) -> bool:
        return False


Record = Callable[[str, tuple[DeviceRecord, ...]], int]


def prepare(
    host: Host,
    who: str,
    claim: ClaimRef,
    pod_claim_name: str | None,
    wanted: Sequence[AllocationResult],
    *,
    entries: Mapping[str, MdevDevice],
    claims: Mapping[str, ClaimRecord],
    commit: Callable[[int], None],
    record: Record,
    dirs: ClaimDirs,
) -> tuple[tuple[PreparedDevice, ...], int, bool]:
    """Prepare a claim of mdev entries (module docstring). ``entries``: the pool's mdev
    entries now, by name; ``record(state, devices)`` stages the claim's checkpoint record
    and returns its number, ``commit`` makes one durable. → (devices, the staged
    ``prepared`` record's number, whether it was prepared before). Blocking."""
    other = [r.device for r in wanted if not is_mdev(r.device)]
    if other:
        raise ClaimError(
            who,
            "a claim of both mediated devices and PCI devices of this driver is not "
            "supported: ask for them in two claims",
            ", ".join(other),
        )
    previous = claims.get(claim.uid)
    before = {d.device: d.mdev_uuid for d in previous.devices} if previous else {}
    taken = {
        d.mdev_uuid: rec.ref
        for rec in claims.values()
        if rec.uid != claim.uid
        for d in rec.devices
        if d.mdev_uuid
    }
    handed: list[Handed] = []
    for r in wanted:
        entry = entries.get(r.device)
        if entry is None:
            raise ClaimError(
                who,
                "no such mediated device on this node (no mdev: entry with path: dra offers "
                "it now); the ResourceSlices may be stale -- they are republished within "
                "one resync",
                r.device,
            )
        if entry.slot and r.admin_access:
            raise ClaimError(who, "adminAccess to an mdev slot: there is no instance", r.device)
        uuid = entry.uuid or before.get(r.device) or str(uuidlib.uuid4())
        if uuid in taken:
            raise ClaimError(who, f"mdev {uuid} is prepared for claim {taken[uuid]}", r.device)
        handed.append(Handed(r, entry, uuid))
    records = tuple(
        DeviceRecord(
            requests=(h.result.request,),
            pool=h.result.pool,
            device=h.result.device,
            iommu_group=None,  # an instance's group is re-made with it: the UUID says it
            addresses=(),
            ids=(),
            admin_access=h.result.admin_access,
            mdev_uuid=h.uuid,
        )
        for h in handed
    )
    keep = previous is not None and previous.state == PREPARED
    slots = [h for h in handed if h.entry.slot]
    if slots and not keep:  # the UUIDs on disk before any instance is made
        commit(record(PREPARING, records))
    mdevs = Mdevs(host, by=BOUND_BY_DRA_PLUGIN)
    holder = bound_by_claim(claim.uid)
    present = {i.uuid for i in mdevs.read().instances}
    for h in slots:
        if h.uuid in present:
            rec = mdevs.store.get(h.uuid)
            if rec is not None and rec.by == holder:
                continue  # made by this claim's earlier Prepare (a retry)
            raise ClaimError(
                who, f"mdev {h.uuid} exists and is not this claim's instance", h.result.device
            )
        try:
            mdevs.create(h.entry.parent, h.entry.type_id, [h.uuid], by=holder)
        except HostError as e:
            raise ClaimError(who, f"making the mdev instance failed: {e}", h.result.device) from e
    instances = {i.uuid: i for i in mdevs.read().instances}
    nodes: dict[str, list[str]] = {}
    shown: dict[str, Device] = {}
    for h in handed:
        inst = instances.get(h.uuid)
        if h.result.admin_access:
            pass
        elif inst is None or inst.vfio_node is None:
            raise ClaimError(
                who,
                f"mdev {h.uuid} is not usable: "
                + ("it is gone" if inst is None else "it has no IOMMU group node /dev/vfio/<N>")
                + " (is the vfio_mdev driver loaded?)",
                h.result.device,
            )
        else:
            nodes[h.result.device] = ["/dev/vfio/vfio", inst.vfio_node]
        attrs = {**h.entry.device.attributes, MDEV_UUID: Attribute("string", h.uuid)}
        shown[h.result.device] = Device(h.result.device, dict(sorted(attrs.items())))
    files = build(
        claim,
        pod_claim_name,
        handed,
        driver=dirs.driver,
        plugins_dir=dirs.plugins_dir,
        slice_devices=shown,
        group_nodes=nodes,
    )
    dirs.write(claim.uid, files)
    ids = [d.cdi_device_ids for d in files.prepared]
    records = tuple(replace(r, cdi_device_ids=i) for r, i in zip(records, ids, strict=True))
    gen = record(PREPARED, records)
    made = ", ".join(f"{h.result.device}={h.uuid}" for h in handed)
    log.info("prepared claim %s: %s", who, made, extra={"device": made})
    return files.prepared, gen, keep


def claim_uids(host: Host) -> set[str]:
    """The claims that made instances (records ``claim:<uid>`` under
    ``<root>/var/lib/vfio_dp/mdev``): reconcile releases those the checkpoint does not name
    (set aside as corrupt, or written by an earlier release that dropped the claim)."""
    records, _bad = Mdevs(host, by=BOUND_BY_DRA_PLUGIN).store.records()
    return {uid for r in records if (uid := claim_of(r.by)) is not None}


def release(host: Host, uid: str) -> tuple[list[str], list[str]]:
    """Remove the instances the claim's Prepare made (their records say ``claim:<uid>``:
    the one source of what a claim made; static ones are not the claim's). → (removed, why
    each held one stays: its ``/dev/vfio/<N>`` open). An instance already gone loses its
    record. Blocking."""
    mdevs = Mdevs(host, by=BOUND_BY_DRA_PLUGIN)
    holder = bound_by_claim(uid)
    records, _bad = mdevs.store.records()
    uuids = [r.uuid for r in records if r.by == holder]
    if not uuids:
        return [], []
    present = {i.uuid for i in mdevs.read().instances}
    removed: list[str] = []
    kept: list[str] = []
    for u in uuids:
        if u not in present:
            mdevs.store.remove(u)
            continue
        try:
            mdevs.remove([u], for_claim=uid)
        except RefusedError as e:
            kept.append("; ".join(e.reasons))
            continue
        except HostError as e:
            kept.append(f"mdev {u}: {e}")
            continue
        removed.append(f"mdev {u}")
    return removed, kept
