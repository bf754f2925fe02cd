"""A container claim's steps: the group on its native driver, its own device nodes.

A result naming a group's container entry (``pci-0000-01-00-0-native``,
:func:`vfio_dp.model.naming.dra_entry`; ``personalities: [container]``) gets the group on
its native driver and the device nodes its functions have there (an NVMe controller's
``/dev/nvme0``, ``/dev/nvme0n1``, ``/dev/ng0n1``), never ``/dev/vfio``. Prepare
(:mod:`.prepare`) checks who holds the group first (:func:`refusals`), switches the
functions not on a native driver (:func:`to_switch`: on a VFIO driver, or on none) through
:meth:`vfio_dp.host.Host.to_native` -- the unbind's locks, journal, records and refusals --
waits for the nodes the record says the functions have (bounded:
:func:`vfio_dp.host.devnodes.wait_for`), checks the group once more (:func:`verify`) and
writes a CDI device of those nodes and the metadata (:func:`metadata_device`: the
``pciBusID``, the driver and the node paths). Unprepare leaves the driver: a container
claim holds no bind record, so :meth:`vfio_dp.host.Host.release` gives nothing back.

The other way round, a VFIO claim's group is switched from its native driver by the bind
of :mod:`.prepare` as for any ``bind: onPrepare`` group; what the functions had on their
native driver is recorded first (:func:`vfio_dp.host.devnodes.native_nodes`). Pure, but for
the two steps over the host, :func:`check` and :func:`switch` (blocking).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from vfio_dp.dra.claimpath.checkpoint import ClaimRecord
from vfio_dp.dra.claimpath.resolve import Chosen
from vfio_dp.dra.slices import PCI_BUS_ID, STANDARD, Device
from vfio_dp.errors import ClaimError, HostError, VfioError
from vfio_dp.host import Host, devnodes
from vfio_dp.host.bound_by import bound_by_claim, claim_takes, pool_refusal
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory
from vfio_dp.model.devnodes import NativeNodes, group_container_problem
from vfio_dp.model.dra_metadata import Attribute
from vfio_dp.model.naming import dra_entry
from vfio_dp.model.personality import Personality

#: metadata attributes of a container entry, beside the standard ones
KIND = "kind"
NATIVE = "native"
NATIVE_DRIVER = "nativeDriver"
DEVICE_NODES = "deviceNodes"


def containers(chosen: Sequence[Chosen]) -> list[Chosen]:
    return [c for c in chosen if c.gets_nodes]


def endpoints(chosen: Sequence[Chosen]) -> list[PciAddress]:
    """Every function of every group the claim gets on its native driver."""
    return [a for c in containers(chosen) for a in c.unit.endpoints]


def refusals(
    who: str,
    chosen: Sequence[Chosen],
    uid: str,
    holders: Mapping[PciAddress, str],
    others: Sequence[ClaimRecord],
    driver: str,
) -> None:
    """:class:`ClaimError` before anything is touched, when a group of the claim is held by
    someone else: a pool hold this claim may not take (another DRA driver's pool:
    :func:`vfio_dp.host.bound_by.pool_refusal`), or in the other personality: bound to VFIO by
    the operator or a front-end (``holders``: the bind records' holders), or prepared for
    another claim of ours (``others``: the checkpoint's other claims) as VFIO for a
    container entry, or as a container for a VFIO entry. The scheduler gives out one entry
    of a group at a time (a counter of value 1): this is the node's own check of the same
    rule. A stale claim's binding and ``driver``'s own pool hold are taken over
    (:func:`vfio_dp.host.bound_by.claim_takes`)."""
    theirs: dict[str, tuple[str, bool]] = {}  # group name -> (claim, as a container)
    for rec in others:
        if rec.uid == uid:
            continue
        for d in rec.devices:
            if not d.admin_access:
                base, native = dra_entry(d.device)
                theirs[base] = (rec.ref, native)
    for c in chosen:
        if c.result.admin_access:
            continue
        ref, native = theirs.get(c.unit.name, ("", c.gets_nodes))
        if native != c.gets_nodes:  # a stale claim of the same kind is taken over as ever
            held_as = "a container (its native driver)" if native else "VFIO"
            raise ClaimError(
                who,
                f"IOMMU group {c.unit.group} is prepared for claim {ref} as {held_as}; one "
                "personality at a time: it is handed over once that claim is unprepared",
                c.result.device,
            )
        for a in c.unit.endpoints:
            holder = holders.get(a)
            if holder is None:
                continue
            why = pool_refusal(a, holder, bound_by_claim(uid), driver)
            if why is not None:
                raise ClaimError(who, why, c.result.device)
            if c.gets_nodes and not claim_takes(holder, driver):
                raise ClaimError(
                    who,
                    f"{a} is bound to VFIO by {holder}, not by a claim; give it back first "
                    f"(vfioctl unbind {a}) to offer it as a container",
                    c.result.device,
                )


def known_nodes(
    who: str,
    chosen: Sequence[Chosen],
    inv: Inventory,
    found: Mapping[PciAddress, NativeNodes | None],
) -> dict[PciAddress, tuple[str, ...]]:
    """The node paths each function of the container groups is known to have on its native
    driver (what Prepare waits for), or :class:`ClaimError` for a group none of whose
    functions has one (a NIC: never offered as a container;
    :func:`vfio_dp.model.devnodes.group_container_problem`)."""

    def describe(a: PciAddress) -> str:
        dev = inv.devices.get(a)
        return dev.describe() if dev is not None else str(a)

    out: dict[PciAddress, tuple[str, ...]] = {}
    for c in containers(chosen):
        why = group_container_problem(c.unit.endpoints, describe, found)
        if why is not None:
            raise ClaimError(who, why, c.result.device)
        for a in c.unit.endpoints:
            n = found.get(a)
            out[a] = n.paths if n is not None else ()
    return out


def to_switch(chosen: Sequence[Chosen], inv: Inventory) -> list[PciAddress]:
    """The functions of the container groups not on a native driver (on a VFIO driver, on
    none, or gone: the switch names the gone ones)."""
    return [
        a
        for a in endpoints(chosen)
        if (d := inv.devices.get(a)) is None or d.driver is None or d.on_vfio
    ]


def verify(who: str, chosen: Sequence[Chosen], inv: Inventory) -> None:
    """Each container group still exists whole and is on its native drivers."""
    for c in containers(chosen):
        group = inv.groups.get(c.unit.group)
        if group is None or c.unit.primary not in group.devices:
            raise ClaimError(who, f"IOMMU group {c.unit.group} is gone from sysfs", c.result.device)
        off = [
            str(a)
            for a in c.unit.endpoints
            if (d := inv.devices.get(a)) is None or d.driver is None or d.on_vfio
        ]
        if off:
            raise ClaimError(
                who,
                f"{', '.join(off)} of IOMMU group {c.unit.group} not on a native driver",
                c.result.device,
            )


def node_paths(c: Chosen, found: Mapping[PciAddress, NativeNodes]) -> tuple[str, ...]:
    """The device nodes of the group's functions, in function order, each once."""
    paths = [p for a in c.unit.endpoints if (n := found.get(a)) is not None for p in n.paths]
    return tuple(dict.fromkeys(paths))


def metadata_device(c: Chosen, vfio_entry: Device, driver: str, paths: Sequence[str]) -> Device:
    """What the metadata file says of a container entry: the VFIO entry's standard
    attributes (``pciBusID``, ``pcieRoot``, ``numaNode``), ``kind: native``, its native
    driver and its device nodes (``/dev/nvme0,/dev/nvme0n1``)."""
    attrs = {k: v for k, v in vfio_entry.attributes.items() if k.startswith(f"{STANDARD}/")}
    attrs[PCI_BUS_ID] = Attribute("string", str(c.unit.primary))
    attrs[KIND] = Attribute("string", NATIVE)
    attrs[NATIVE_DRIVER] = Attribute("string", driver)
    attrs[DEVICE_NODES] = Attribute("string", ",".join(paths))
    if "numaNode" in vfio_entry.attributes:
        attrs["numaNode"] = vfio_entry.attributes["numaNode"]
    return Device(c.result.device, dict(sorted(attrs.items())))


def check(
    host: Host,
    checkpointed: Mapping[str, ClaimRecord],
    who: str,
    uid: str,
    chosen: Sequence[Chosen],
    inv: Inventory,
    driver: str,
) -> dict[PciAddress, tuple[str, ...]]:
    """Before anything is touched: refuse a group held by someone else (:func:`refusals`;
    ``driver``: the claim's DRA driver); record the device nodes of every function of a group offered as a
    container that is on its native driver now (a VFIO claim's too, before its bind takes
    them away); for a container claim, the nodes each function is known to have (what
    :func:`switch` waits for). Blocking."""
    offered = [
        a
        for c in chosen
        if Personality.CONTAINER in c.unit.personalities and not c.result.admin_access
        for a in c.unit.endpoints
    ]
    if not offered:  # VM-only groups (today's pools): nothing to check, nothing read
        return {}
    wants_nodes = bool(containers(chosen))
    holders: dict[PciAddress, str] = {}
    for a in offered:  # these groups' records only; an unreadable one refuses at the bind
        with contextlib.suppress(HostError):
            if (rec := host.ledger.record(a)) is not None:
                holders[a] = rec.bound_by
    refusals(who, chosen, uid, holders, list(checkpointed.values()), driver)
    found = devnodes.native_nodes(host.fs, inv, offered)
    return known_nodes(who, chosen, inv, found) if wants_nodes else {}


def switch(
    host: Host,
    who: str,
    chosen: Sequence[Chosen],
    inv: Inventory,
    expected: Mapping[PciAddress, Sequence[str]],
    timeout: float,
) -> tuple[Inventory, dict[PciAddress, NativeNodes]]:
    """Put the container groups' functions on their native drivers
    (:meth:`vfio_dp.host.Host.to_native`: a switch that fails leaves them as they were),
    re-read those, and wait (at most ``timeout`` seconds) for the device nodes they are
    known to have. Blocking."""
    targets = to_switch(chosen, inv)
    names = ", ".join(c.result.device for c in containers(chosen))
    if targets:
        try:
            host.to_native(targets)
        except VfioError as e:
            raise ClaimError(
                who, f"putting the IOMMU group on its native driver failed: {e}", names
            ) from e
        inv = host.reread(inv, targets)
    waited = {a: tuple(p) for a, p in expected.items() if p}
    if not containers(chosen) or not waited:
        return inv, {}
    try:
        found = devnodes.wait_for(
            host.fs, lambda: host.scan_groups(list(waited), usage=False), waited, timeout
        )
    except HostError as e:
        raise ClaimError(who, str(e), names) from e
    return inv, found
