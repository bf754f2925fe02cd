"""One health model for the node's IOMMU groups: pure, no I/O.

What the DRA plugin reports on ``DRAResourceHealth.NodeWatchResources``, marks with taints on
its ResourceSlices and writes into the claims' ``Ready`` condition, and what ``vfioctl
list``/``groups`` show, all come from here. It is fed by the node core's scans -- the same
events (uevents, SIGUSR1, the periodic ``--resync``, config reloads) that drive the device
plugin's Healthy/Unhealthy -- and by the facts a front-end knows about claims (which groups
a prepared claim holds, which have a bind/unbind of ours in flight).

The rule (``design.md``, "What the DRA plugin publishes, by group state"):

- a group no claim holds is HEALTHY when its DRA unit is published
  (:func:`vfio_dp.model.serving.dra_units`: viable now, or -- ``bind: onPrepare`` -- idle on
  its host driver and bindable); otherwise it is UNHEALTHY with the unit's reasons (the DRA
  front-end withdraws it, as after a restart);
- a group a prepared claim *holds* is HEALTHY while every function it was given is present,
  in its group, on a vfio driver and unused by the host, the group is viable and
  ``/dev/vfio/<N>`` exists; otherwise UNHEALTHY with one :class:`Fault` per problem, each
  saying what and the fix (it stays published, tainted);
- a group with a bind or unbind of ours in flight keeps the state it had (never a fault);
- a *held* group changes state only when the new verdict is seen by two scans in a row
  (debounce: a state must hold for one scan); a front-end that wants the change within a
  second asks the core for a confirming scan (:attr:`Update.pending`). Unheld groups change
  at once (withdrawal as today);
- UNKNOWN is what kubelet shows when reports stop (its timeout); we report it for a held
  device whose record names no IOMMU group.

Messages are plain text for people; the DRA shell clips them to the API's 1024 characters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass, field

from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory
from vfio_dp.model.serving import DraUnit

HEALTHY = "HEALTHY"
UNHEALTHY = "UNHEALTHY"
UNKNOWN = "UNKNOWN"

#: short fault codes (a taint value is a label value: at most 63 of ``[-A-Za-z0-9_.]``)
GONE = "function-gone"
MOVED = "group-renumbered"
UNBOUND = "unbound"
HOST_DRIVER = "host-driver"
HOST_USE = "host-use"
NOT_VIABLE = "not-viable"
NO_DEVNODE = "devnode-missing"
NOT_READY = "not-ready"


@dataclass(frozen=True, slots=True)
class Fault:
    code: str  # one of the codes above
    message: str  # what is wrong and what to do


@dataclass(frozen=True, slots=True)
class Held:
    """A group a prepared claim holds (from the DRA checkpoint)."""

    device: str  # the DRA device name, ``pci-0000-3b-00-0``
    group: int | None  # None: an adminAccess-only record (the group is not ours)
    addresses: tuple[PciAddress, ...]  # every function the claim was given, first = named
    claims: tuple[str, ...] = ()  # ``ns/name (uid ...)`` of the claims holding it


@dataclass(frozen=True, slots=True)
class Verdict:
    """One scan's raw view of one DRA device."""

    health: str
    faults: tuple[Fault, ...] = ()

    @property
    def message(self) -> str:
        return "; ".join(f.message for f in self.faults)


@dataclass(frozen=True, slots=True)
class DeviceHealth:
    """The reported state of one DRA device."""

    device: str
    health: str
    faults: tuple[Fault, ...]
    since: float  # wall time this state was entered (a taint's timeAdded)
    checked: float  # wall time of the last scan that looked at it
    held: bool = False

    @property
    def message(self) -> str:
        if self.health == HEALTHY:
            return "ready: viable, on vfio-pci (or bindable on Prepare), unused by the host"
        return "; ".join(f.message for f in self.faults)

    @property
    def codes(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f.code for f in self.faults))


def held_faults(
    held: Held, inventory: Inventory, devnode_present: bool | None
) -> tuple[Fault, ...]:
    """Why a group a prepared claim holds can no longer serve it (empty: it can).

    ``devnode_present``: does ``<root>/dev/vfio/<N>`` exist (None: not looked at)."""
    out: list[Fault] = []
    g = held.group
    primary = held.addresses[0] if held.addresses else None
    rebind = f"vfioctl bind --group {primary}"
    for a in held.addresses:
        dev = inventory.devices.get(a)
        if dev is None:
            out.append(
                Fault(
                    GONE,
                    f"function {a} of IOMMU group {g} is gone from sysfs (hot-unplugged or "
                    "removed): the VM has lost it; delete the pod to release the claim",
                )
            )
            continue
        if dev.iommu_group != g:
            out.append(
                Fault(
                    MOVED,
                    f"{dev.describe()} is in IOMMU group {dev.iommu_group}, was {g}: the claim's "
                    "group is gone; delete the pod so that the claim is allocated again",
                )
            )
            continue
        if dev.driver is None:
            out.append(
                Fault(
                    UNBOUND,
                    f"{a} ({dev.ids}) was unbound from vfio-pci underneath the plugin (no "
                    f"driver now); bind it back: {rebind}",
                )
            )
        elif not dev.on_vfio:
            out.append(
                Fault(
                    HOST_DRIVER,
                    f"{dev.describe()} left vfio-pci for host driver {dev.driver}; bind it "
                    f"back: {rebind}",
                )
            )
        for use in dev.in_use:
            out.append(Fault(HOST_USE, f"{dev.describe()} is used by the host: {use}; {use.fix}"))
    group = inventory.groups.get(g) if g is not None else None
    if g is not None and group is None and not any(f.code == GONE for f in out):
        out.append(Fault(GONE, f"IOMMU group {g} is gone from sysfs"))
    if group is not None:
        mine = set(held.addresses)
        for p in group.problems:
            if p.address not in mine:  # a sibling or bridge: the functions' own are above
                out.append(Fault(NOT_VIABLE, f"IOMMU group {g} is not viable: {p.reason}"))
        on_vfio = all(
            (d := inventory.devices.get(a)) is not None and d.on_vfio for a in held.addresses
        )
        if devnode_present is False and on_vfio:
            out.append(
                Fault(
                    NO_DEVNODE,
                    f"/dev/vfio/{group.node} is missing although IOMMU group {g} is on vfio-pci "
                    f"(deleted by hand, or /dev not the host's); rebind to recreate it: {rebind}",
                )
            )
    return tuple(out)


def assess(
    units: Sequence[DraUnit],
    inventory: Inventory,
    held: Mapping[str, Held],
    devnodes_missing: Set[int] = frozenset(),
) -> dict[str, Verdict]:
    """The raw verdict, this scan, for every DRA unit and every held device, by name."""
    out: dict[str, Verdict] = {}
    for u in units:
        if u.name in held:
            continue
        if u.published and u.group in devnodes_missing and not u.on_prepare:
            fault = Fault(NO_DEVNODE, f"/dev/vfio/{u.group} is missing")
            out[u.name] = Verdict(UNHEALTHY, (fault,))
        elif u.published:
            out[u.name] = Verdict(HEALTHY)
        else:
            out[u.name] = Verdict(UNHEALTHY, tuple(Fault(NOT_READY, r) for r in u.reasons))
    for name, h in held.items():
        if h.group is None:
            out[name] = Verdict(UNKNOWN)
            continue
        present = h.group not in devnodes_missing
        faults = held_faults(h, inventory, present)
        out[name] = Verdict(UNHEALTHY if faults else HEALTHY, faults)
    return out


@dataclass(frozen=True, slots=True)
class Update:
    """What one :meth:`HealthModel.update` changed."""

    changed: tuple[DeviceHealth, ...] = ()  # entered a new state (or appeared)
    gone: tuple[str, ...] = ()  # no longer a DRA device at all
    pending: tuple[str, ...] = ()  # a new verdict waits for a confirming scan


@dataclass(slots=True)
class HealthModel:
    """The debounced state of every DRA device (see the module docstring)."""

    states: dict[str, DeviceHealth] = field(default_factory=dict)
    _pending: dict[str, Verdict] = field(default_factory=dict)
    #: wall time of the last update: every device it confirmed was checked then (a state
    #: whose only news is that time is not rebuilt; :meth:`checked` gives it)
    scanned: float = 0.0

    def update(
        self,
        verdicts: Mapping[str, Verdict],
        *,
        held: Set[str],
        in_flight: Set[str] = frozenset(),
        now: float,
    ) -> Update:
        changed: list[DeviceHealth] = []
        lagging = {n: self.checked(n) for n in self._pending}  # their checked stays
        before, self.scanned = self.scanned, now
        for name, v in sorted(verdicts.items()):
            cur = self.states.get(name)
            is_held = name in held
            if cur is not None and (
                name in in_flight or (cur.health, cur.faults) == (v.health, v.faults)
            ):
                if cur.held != is_held:
                    self.states[name] = _replace(cur, checked=now, held=is_held)
                self._pending.pop(name, None)
                continue
            debounce = cur is not None and is_held and self._pending.get(name) != v
            if debounce:
                assert cur is not None
                self._pending[name] = v
                last = lagging.get(name, max(cur.checked, before))
                self.states[name] = _replace(cur, checked=last, held=is_held)
                continue
            self._pending.pop(name, None)
            new = DeviceHealth(name, v.health, v.faults, since=now, checked=now, held=is_held)
            self.states[name] = new
            changed.append(new)
        gone = sorted(set(self.states) - set(verdicts))
        for name in gone:
            del self.states[name]
            self._pending.pop(name, None)
        for name in set(self._pending) - set(verdicts):
            del self._pending[name]
        return Update(tuple(changed), tuple(gone), tuple(sorted(self._pending)))

    @property
    def waiting(self) -> bool:
        """Does a new verdict wait for a confirming scan?"""
        return bool(self._pending)

    def checked(self, name: str) -> float:
        """Wall time of the last scan that looked at device ``name`` (the last update, unless
        its new verdict waits for confirmation: then the scan before)."""
        h = self.states[name]
        return h.checked if name in self._pending else max(h.checked, self.scanned)


def _replace(h: DeviceHealth, *, checked: float | None = None, held: bool) -> DeviceHealth:
    return DeviceHealth(
        h.device,
        h.health,
        h.faults,
        since=h.since,
        checked=h.checked if checked is None else checked,
        held=held,
    )
