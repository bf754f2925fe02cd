"""The node core's mdev pass: the config's ``mdev:`` entries made real, as ``numVfs`` is.

Run by :class:`vfio_dp.core.node.NodeCore` before every scan while the config has ``mdev:``
entries of this process's ``path`` or this process has records -- at start before any
front-end answers the kubelet (whose replayed allocations name instances by UUID), on
config reloads, uevents and resyncs. One pass (:meth:`MdevPass.reconcile_sync`):

1. finish or undo this process's interrupted creates and removes
   (:meth:`vfio_dp.host.mdev_ops.Mdevs.recover`);
2. re-make, with its recorded UUID, every instance this process recorded that is gone (a
   reboot: instances do not survive it, as mdevctl knows) while its entry still asks for
   it -- and, in the DRA plugin, every instance a claim holds (``claim:<uid>`` records);
3. for each ``create: static`` entry and each parent it names (a name, a PCI address, or
   every PCI parent its selector takes, read from ``<root>/sys/bus/pci/devices/<bdf>``):
   make instances of its type until this process has ``count`` of them there (``all``: until
   ``available_instances`` is 0), and remove this process's surplus ones;
4. remove this process's instances whose entry is gone from the config.

Never raises for one entry: each change made or refused is a message (a held instance is
never removed: retried at the next pass; a parent that disappeared keeps its records, and
its instances are made again when it is back). Instances made by anyone else are counted by
the kernel's ``available_instances`` and otherwise left alone.
"""

from __future__ import annotations

import logging
import uuid as uuidlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vfio_dp.errors import HostError
from vfio_dp.host import sysfs
from vfio_dp.host.bound_by import BOUND_BY_DRA_PLUGIN, claim_of
from vfio_dp.host.host import Host
from vfio_dp.host.mdev_ops import Mdevs
from vfio_dp.model.config import Config
from vfio_dp.model.mdev import MdevInventory, MdevRecord, is_uuid
from vfio_dp.model.mdev_config import STATIC, MdevEntry

log = logging.getLogger("vfio_dp.core")
Run = Callable[..., Awaitable[Any]]
#: the front-ends' holds (as ``NodeCore.vf_holds``): keys that are UUIDs hold instances
Holds = Sequence[Callable[[], Mapping[Any, Sequence[str]]]]


@dataclass(frozen=True, slots=True)
class Want:
    """``count`` instances (None: all there is room for) of ``type_id`` on ``parent``."""

    parent: str
    type_id: str
    count: int | None
    entry: MdevEntry


def wanted(
    host: Host, config: Config, inv: MdevInventory, path: str, create: str = STATIC
) -> tuple[list[Want], list[str]]:
    """The ``create: static`` (or ``create``) entries of ``path``, one :class:`Want` per
    parent they name (the first entry naming a parent wins), and why an entry names none
    now (the DRA slice feed asks for ``onPrepare`` entries too)."""
    out: dict[str, Want] = {}
    problems: list[str] = []
    by_name = {p.name: p for p in inv.parents}
    for entry in config.mdev:
        if entry.path != path or entry.create != create:
            continue
        if entry.parent is not None:
            if entry.parent not in by_name:
                problems.append(
                    f"mdev {entry.describe()}: no parent {entry.parent} under "
                    "/sys/class/mdev_bus (gone, or its driver is not loaded); made when it is"
                )
                continue
            names = [entry.parent]
        else:
            sel = entry.parent_selector
            names = [
                p.name
                for p in inv.parents
                if p.address is not None
                and sel is not None
                and (dev := sysfs.read_device(host.fs, p.address)) is not None
                and sel.matches(dev)
            ]
            if not names:
                problems.append(f"mdev {entry.describe()}: no mdev parent matches its selector")
        for name in names:
            if by_name[name].type(entry.type_id) is None:
                types = ", ".join(t.type_id for t in by_name[name].types) or "none"
                problems.append(
                    f"mdev {entry.type_id} on {name}: the parent has no such type (its types: "
                    f"{types}); fix the config's type"
                )
                continue
            if name in out and out[name].type_id != entry.type_id:
                problems.append(
                    f"mdev {entry.type_id} on {name}: the parent is already given type "
                    f"{out[name].type_id} by an earlier entry (one type per parent)"
                )
                continue
            out.setdefault(name, Want(name, entry.type_id, entry.count, entry))
    return list(out.values()), problems


def mdev_holds(holds: Holds) -> dict[str, list[str]]:
    """The front-ends' holds on instances, by UUID (``"*"``: one could not say)."""
    out: dict[str, list[str]] = {}
    for hold in holds:
        try:
            for key, who in hold().items():
                if isinstance(key, str) and (key == "*" or is_uuid(key)):
                    out.setdefault(key, []).extend(who)
        except Exception as e:  # unknown holds: hold everything (refuse, retry later)
            out.setdefault("*", []).append(f"a front-end could not say ({e})")
    return out


class MdevPass:
    """The pass of one node process (``front_end`` names its records; ``path`` picks its
    entries)."""

    def __init__(self, host: Host, front_end: str, path: str) -> None:
        self.mdevs = Mdevs(host, by=front_end)
        self.path = path
        self._said: set[str] = set()

    def needed(self, config: Config) -> bool:
        """Is there anything to do (entries of this path, records, journals)? Two
        directory listings on a host without mdevs."""
        store = self.mdevs.store
        return (
            any(e.path == self.path for e in config.mdev)
            or bool(store.recorded())
            or bool(store.journaled())
        )

    async def reconcile(self, config: Config, run: Run, holds: Holds) -> None:
        """One pass on the host-I/O executor, the front-ends' holds asked there too (a
        blocking gRPC call to the kubelet: never on the event loop); a message repeated pass
        after pass (a held instance) is logged once."""
        try:
            said: list[str] = await run(lambda: self.reconcile_sync(config, mdev_holds(holds)))
        except HostError as e:
            said = [f"mdev: {e}"]
        for msg in said:
            if msg not in self._said:
                (log.warning if "not " in msg or ": no " in msg else log.info)("%s", msg)
        self._said = set(said)

    def reconcile_sync(self, config: Config, extra: Mapping[str, Sequence[str]]) -> list[str]:
        m = self.mdevs
        out = m.recover(runner=m.by)
        inv = m.read()
        wants, problems = wanted(m.host, config, inv, self.path)
        out += problems
        records, bad = m.store.records()
        out += bad
        present = {i.uuid for i in inv.instances}
        parents = {p.name: p for p in inv.parents}
        want_of = {w.parent: w for w in wants}
        claims = m.by == BOUND_BY_DRA_PLUGIN
        for rec in records:  # 2: re-made with their UUIDs
            if rec.uuid in present or rec.parent not in parents:
                continue
            w = want_of.get(rec.parent)
            ours = rec.by == m.by and w is not None and w.type_id == rec.type_id
            if ours or (claims and claim_of(rec.by) is not None):
                out += self._remake(rec)
        inv = m.read()
        present = {i.uuid for i in inv.instances}
        mine = [r for r in records if r.by == m.by and r.uuid in present]
        for w in wants:  # 3: counts
            have = sorted(r.uuid for r in mine if (r.parent, r.type_id) == (w.parent, w.type_id))
            t = next((p.type(w.type_id) for p in inv.parents if p.name == w.parent), None)
            room = t.available if t is not None and t.available is not None else 0
            target = len(have) + room if w.count is None else w.count
            if len(have) < target:
                n = min(target - len(have), room)
                if n < target - len(have):
                    out.append(
                        f"mdev {w.type_id} on {w.parent}: {len(have) + n} of {target} wanted: "
                        f"available_instances is {room} (other instances use the parent); "
                        "not made, retried at the next pass"
                    )
                if n:
                    fresh = sorted(str(uuidlib.uuid4()) for _ in range(n))
                    out += self._make(w.parent, w.type_id, fresh, m.by, "made")
            elif len(have) > target:
                out += self._remove(have[target:], extra, "surplus")
        gone = [  # 4: entry gone (a parent that is gone keeps its records)
            r.uuid
            for r in mine
            if r.parent in parents
            and (r.parent not in want_of or want_of[r.parent].type_id != r.type_id)
        ]
        out += self._remove(gone, extra, "no longer in the config")
        return out

    def _make(self, parent: str, type_id: str, uuids: list[str], by: str, how: str) -> list[str]:
        try:
            self.mdevs.create(parent, type_id, uuids, by=by)
        except HostError as e:
            return [f"mdev {type_id} on {parent}: not {how}: {e}"]
        return [f"mdev {type_id} on {parent}: {how} {', '.join(uuids)}"]

    def _remake(self, rec: MdevRecord) -> list[str]:
        try:
            made = self.mdevs.remake(rec).uuids
        except HostError as e:
            return [f"mdev {rec.type_id} on {rec.parent}: not re-made: {e}"]
        return [f"mdev {rec.type_id} on {rec.parent}: re-made {rec.uuid}"] if made else []

    def _remove(self, uuids: list[str], extra: Mapping[str, Sequence[str]], why: str) -> list[str]:
        out: list[str] = []
        for u in uuids:
            try:
                self.mdevs.remove([u], extra=extra)
            except HostError as e:
                out.append(f"mdev {u} ({why}): not removed: {e}")
                continue
            out.append(f"mdev {u}: removed ({why})")
        return out
