"""What the DRA plugin publishes and reports, by group state: pure, no I/O.

Joins the core's health model (:mod:`vfio_dp.core.health`) with the DRA facts -- the
prepared claims of the checkpoint, the devices built for the slices -- into the pool
(``design.md``, "What the DRA plugin publishes, by group state"):

- an unheld device is published while HEALTHY and withdrawn otherwise (as after a restart);
- a device a prepared claim holds is never withdrawn from under it: while UNHEALTHY it is
  published with ONE taint (at most 16 are allowed per device)::

      {"key": "<driver>/unhealthy", "value": "unbound", "effect": "NoSchedule",
       "timeAdded": "2026-11-24T18:41:14Z"}

  ``value`` names the faults (:mod:`vfio_dp.core.health` codes, ``.``-joined, a label
  value); ``effect`` is ``NoSchedule`` unless the device's selector says ``taintEffect:
  NoExecute`` (which evicts the running VM); ``timeAdded`` is when the state was entered.
  The taint goes when the state clears. A device the scan can no longer describe (its
  functions are gone from sysfs) is published as it was last built.

Claims in ``preparing`` or ``releasing`` state (a bind or restore of ours under way, or a
group still held open after Unprepare) are *in flight*: their devices keep their state.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from vfio_dp.core.health import HEALTHY, UNHEALTHY, DeviceHealth, HealthModel, Held, assess
from vfio_dp.dra.claimpath.checkpoint import (
    PREPARED,
    PREPARING,
    RELEASING,
    SWITCHED,
    ClaimRecord,
)
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import NO_SCHEDULE
from vfio_dp.model.device import Inventory, IommuGroup
from vfio_dp.model.naming import dra_entry
from vfio_dp.model.serving import DraUnit

if TYPE_CHECKING:  # `vfioctl list` shows the node's view without loading the slices' format
    from vfio_dp.dra.slices import Device

TAINT_NAME = "unhealthy"
MAX_TAINTS = 16  # per device (resource.k8s.io/v1 validation)
MAX_LABEL_VALUE = 63
MAX_MESSAGE = 1024  # DeviceHealth.message (kubelet truncates longer ones)


@dataclass(frozen=True, slots=True)
class ClaimHolds:
    """The checkpoint's prepared claims as the health model needs them."""

    held: dict[str, Held]  # device name -> the group a prepared claim holds
    in_flight: frozenset[str]  # device names with a prepare/release of ours under way


def claim_holds(records: Iterable[ClaimRecord]) -> ClaimHolds:
    held: dict[str, Held] = {}
    in_flight: set[str] = set()
    for rec in records:
        for d in rec.devices:
            if d.admin_access or d.iommu_group is None:
                continue  # monitoring access: the group is not the claim's
            if rec.state in (PREPARING, RELEASING, SWITCHED):
                in_flight.add(d.device)
            if rec.state != PREPARED:
                continue
            before = held.get(d.device)
            held[d.device] = Held(
                device=d.device,
                group=d.iommu_group,
                addresses=tuple(PciAddress.parse(a) for a in d.addresses),
                claims=(before.claims if before else ()) + (rec.ref,),
            )
    return ClaimHolds(held, frozenset(in_flight))


def taint_value(h: DeviceHealth) -> str:
    """The fault codes, ``.``-joined while they fit a label value."""
    value = ""
    for code in h.codes:
        joined = f"{value}.{code}" if value else code
        if len(joined) > MAX_LABEL_VALUE:
            break
        value = joined
    return value or "unhealthy"


def rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def taint(h: DeviceHealth, driver: str, effect: str = NO_SCHEDULE) -> dict[str, str]:
    return {
        "key": f"{driver}/{TAINT_NAME}",
        "value": taint_value(h),
        "effect": effect,
        "timeAdded": rfc3339(h.since),
    }


def pool_devices(
    states: Mapping[str, DeviceHealth],
    built: Mapping[str, Device],
    last: Mapping[str, Device],
    effects: Mapping[str, str],
    driver: str,
    previous: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
    kept: Mapping[str, Device] | None = None,
) -> list[Device]:
    """The devices of the pool, by name: ``built`` are this scan's devices of every unit
    whose functions are present; ``last`` what was built before (for held devices the scan
    cannot describe); ``effects`` each device's taint effect; ``previous`` the taints published
    by device name (after a restart: what the server holds): the same taint keeps its
    ``timeAdded``. A held device equal to what it was is handed out as the same object: its
    ``base`` when its taints are the base's, else its entry in ``kept`` (the pool before, by
    name) when equal -- so the comparisons after and the publisher's encoding cache (by
    identity) see 1,000 prepared devices unchanged, not 1,000 new ones at every scan."""
    out: list[Device] = []
    for name in sorted(states):
        h = states[name]
        if not h.held:
            if h.health == HEALTHY and name in built:
                out.append(built[name])
            continue
        base = built.get(name) or last.get(name)
        if base is None:
            continue  # never described (cannot happen after a publish); nothing to show
        taints: tuple[Mapping[str, str], ...] = ()
        if h.health == UNHEALTHY:
            t = taint(h, driver, effects.get(name, NO_SCHEDULE))
            for old in (previous or {}).get(name) or ():
                same = all(old.get(k) == t[k] for k in ("key", "value", "effect"))
                if same and old.get("timeAdded"):
                    t["timeAdded"] = old["timeAdded"]
            taints = (t,)
        if base.taints == taints:
            out.append(base)
            continue
        made = replace(base, taints=taints)
        was = (kept or {}).get(name)
        out.append(was if was is not None and was == made else made)
    return out


@dataclass(frozen=True, slots=True)
class Report:
    """One device's line on the health stream (and in ``vfioctl``)."""

    device: str
    health: str
    message: str
    checked: int  # unix seconds of the last scan that looked at it


def reports(
    states: Mapping[str, DeviceHealth],
    published: Iterable[str],
    checked: Callable[[str], float] | None = None,
) -> list[Report]:
    """The full device list of the pool as kubelet wants it (published devices only);
    ``checked`` gives a device's last check (:meth:`vfio_dp.core.health.HealthModel.checked`;
    default: the state's own)."""
    out: list[Report] = []
    for name in sorted(set(published)):
        unit = dra_entry(name)[0]  # a group's container entry has the group's health
        h = states.get(unit)
        if h is None:
            continue
        message = h.message
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        out.append(Report(name, h.health, message, int(checked(unit) if checked else h.checked)))
    return out


def nodes_to_check(
    inventory: Inventory, units: Sequence[DraUnit], holds: ClaimHolds
) -> list[IommuGroup]:
    """Groups that must have ``/dev/vfio/<N>``: held ones, and published ones on vfio-pci
    (an idle ``bind: onPrepare`` group has none until Prepare binds it)."""
    wanted = {h.group for h in holds.held.values() if h.group is not None}
    wanted |= {u.group for u in units if u.published and not u.on_prepare}
    return [inventory.groups[g] for g in sorted(wanted) if g in inventory.groups]


@dataclass(frozen=True, slots=True)
class GroupView:
    """What the DRA plugin would publish and report for one IOMMU group, now (``vfioctl``)."""

    device: str
    group: int
    health: str
    message: str
    held: bool  # a prepared claim holds it
    published: bool
    taint: dict[str, str] | None


def node_view(
    units: Sequence[DraUnit],
    inventory: Inventory,
    holds: ClaimHolds,
    missing_nodes: Set[int],
    driver: str,
    now: float,
) -> dict[int, GroupView]:
    """One scan's answer, without debounce (a fresh model takes every verdict at once): by
    IOMMU group, every group the DRA path selects or a claim holds."""
    model = HealthModel()
    verdicts = assess(units, inventory, holds.held, missing_nodes)
    model.update(verdicts, held=set(holds.held), in_flight=holds.in_flight, now=now)
    groups = {u.name: u.group for u in units}
    groups.update({n: h.group for n, h in holds.held.items() if h.group is not None})
    effects = {u.name: u.taint_effect for u in units}
    out: dict[int, GroupView] = {}
    for name, h in model.states.items():
        if name not in groups:
            continue
        tainted = h.held and h.health == UNHEALTHY
        out[groups[name]] = GroupView(
            device=name,
            group=groups[name],
            health=h.health,
            message=h.message,
            held=h.held,
            published=h.held or h.health == HEALTHY,
            taint=taint(h, driver, effects.get(name, NO_SCHEDULE)) if tainted else None,
        )
    return out


def describe(v: GroupView) -> str:
    """``HEALTHY``, ``UNHEALTHY, withdrawn``, ``UNHEALTHY, tainted <value>:<effect>``."""
    if v.taint is not None:
        return f"{v.health}, tainted {v.taint['value']}:{v.taint['effect']}"
    return v.health if v.published else f"{v.health}, withdrawn"
