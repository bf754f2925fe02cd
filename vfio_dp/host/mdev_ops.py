"""Mediated-device instances made and removed, journalled like every write of vfio_dp.

The two sysfs writes (``../shared/reference/vfio-kernel.md``)::

    echo <uuid> > <root>/sys/class/mdev_bus/<parent>/mdev_supported_types/<type>/create
    echo 1      > <root>/sys/bus/mdev/devices/<uuid>/remove

each made under the parent's lock (``<root>/run/vfio_dp/<parent>.lock``; a PCI parent's is the
one binds of it take), after the journal and before the record of :mod:`.mdev_store`:

- create: journal (with the record to write) -> ``create`` -> record -> journal removed;
- remove: journal (with the record it drops) -> ``remove`` -> record removed -> journal removed.

An operation killed between two steps leaves its journal; the next run of anyone
(:meth:`Mdevs.recover`: ``vfioctl mdev create/remove``, a node process at start) finishes it
when the kernel made the change (a made instance gets its record; a removed one loses it)
and undoes it otherwise (the record as it was before). So an instance we made always has a
record, and a record never outlives an instance we removed.

An instance is *held* (never removed, even with ``--force``) while its ``/dev/vfio/<N>`` is
open (:mod:`.holders`, never opening it), a DRA claim holds it (a ``claim:<uid>`` record),
or a front-end says so (``extra``: a prepared claim, a pod's allocation, by UUID; ``"*"``:
a front-end that cannot tell holds every instance).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vfio_dp.errors import AddressError, BindError, HostError, LockTimeoutError, RefusedError
from vfio_dp.host.bound_by import (
    BOUND_BY_OPERATOR,
    bound_by_claim,
    claim_of,
    recovers,
)
from vfio_dp.host.holders import scan_holders
from vfio_dp.host.host import Host
from vfio_dp.host.mdev import MDEV_BUS, MDEV_DEVICES, read_mdevs
from vfio_dp.host.mdev_store import RECORD_DIR, MdevStore
from vfio_dp.model.address import PciAddress
from vfio_dp.model.mdev import (
    CREATE,
    MdevInstance,
    MdevInventory,
    MdevOp,
    MdevParent,
    MdevRecord,
    MdevType,
    is_uuid,
)

#: who holds an instance, from outside the host layer: UUID -> who; ``"*"`` holds all
Held = Mapping[str, Sequence[str]]

UUID_FIX = "a lowercase UUID, 8-4-4-4-12 hex digits (make one with uuidgen)"


@dataclass(slots=True)
class MdevResult:
    """What a create or remove did (or, with ``dry_run``, would do)."""

    uuids: list[str] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)  # the writes, as pasteable shell commands
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False


def parent_name(text: str) -> str:
    """A parent as written (``0000:3B:00.0``, ``3b:00.0``, ``mtty``) as sysfs names it."""
    try:
        return str(PciAddress.parse(text))
    except AddressError:
        return text


class Mdevs:
    """mdev creates and removes on one :class:`Host`; ``by`` goes into the records
    (``operator`` for vfioctl, the front-end's name for a node process)."""

    def __init__(self, host: Host, *, by: str = BOUND_BY_OPERATOR) -> None:
        self.host = host
        self.by = by
        self.store = MdevStore(host.fs)

    # -- paths ---------------------------------------------------------------------------
    def create_path(self, parent: str, type_id: str) -> str:
        return self.host.fs.path(*MDEV_BUS, parent, "mdev_supported_types", type_id, "create")

    def remove_path(self, uuid: str) -> str:
        return self.host.fs.path(*MDEV_DEVICES, uuid, "remove")

    def read(self) -> MdevInventory:
        return read_mdevs(self.host.fs)

    # -- checks --------------------------------------------------------------------------
    def _parent(self, inv: MdevInventory, parent: str) -> MdevParent:
        found = next((p for p in inv.parents if p.name == parent), None)
        if found is None:
            names = ", ".join(p.name for p in inv.parents) or "none: is the mdev module loaded?"
            raise RefusedError(
                [
                    f"no mdev parent {parent!r} under /{'/'.join(MDEV_BUS)} (parents: {names}); "
                    "name one of them, or load its vendor driver (e.g. modprobe mtty)"
                ]
            )
        return found

    def _type(self, parent: MdevParent, type_id: str) -> MdevType:
        found = parent.type(type_id)
        if found is None:
            types = ", ".join(f"{t.type_id} ({t.name})" for t in parent.types) or "none"
            raise RefusedError(
                [f"mdev parent {parent.name} has no type {type_id!r} (its types: {types})"]
            )
        return found

    def check_create(
        self, inv: MdevInventory, parent: str, type_id: str, uuids: Sequence[str]
    ) -> MdevType:
        """The type to make ``uuids`` of, or :class:`RefusedError` naming every problem."""
        p = self._parent(inv, parent)
        t = self._type(p, type_id)
        problems = [f"{u!r} is not an mdev UUID: give {UUID_FIX}" for u in uuids if not is_uuid(u)]
        existing = {i.uuid for i in inv.instances}
        problems += [
            f"an mdev {u} already exists (vfioctl mdev shows it); pick another UUID"
            for u in uuids
            if u in existing
        ]
        if len(set(uuids)) != len(uuids):
            problems.append("a UUID is given twice; give each instance its own")
        if t.available is not None and t.available < len(uuids):
            problems.append(
                f"type {type_id} of {parent} has available_instances {t.available}, "
                f"{len(uuids)} asked: remove instances of {parent} (vfioctl mdev remove) "
                "or ask fewer"
            )
        if problems:
            raise RefusedError(problems)
        return t

    def holders(
        self, insts: Sequence[MdevInstance], extra: Held | None = None, owner: str | None = None
    ) -> dict[str, list[str]]:
        """For each of ``insts`` that something holds: who (an open ``/dev/vfio/<N>``, a
        ``claim:<uid>`` record other than ``owner``, ``extra``)."""
        out: dict[str, list[str]] = {}
        extra = extra or {}
        nodes = {i.vfio_node: i.uuid for i in insts if i.vfio_node}
        scan = scan_holders(self.host.fs, nodes) if nodes else None
        for i in insts:
            who = [*extra.get(i.uuid, ()), *extra.get("*", ())]
            if scan is not None and i.vfio_node and scan.held(i.vfio_node) is not False:
                who.append(scan.describe(i.vfio_node))
            rec = self.store.get(i.uuid)
            if rec is not None and rec.by != owner and (uid := claim_of(rec.by)) is not None:
                who.append(f"claim {uid} (its record {self.store.shown(RECORD_DIR, i.uuid)})")
            if who:
                out[i.uuid] = who
        return out

    # -- create --------------------------------------------------------------------------
    def create(
        self,
        parent: str,
        type_id: str,
        uuids: Sequence[str],
        *,
        dry_run: bool = False,
        by: str | None = None,
    ) -> MdevResult:
        """Make one instance of ``type_id`` on ``parent`` per UUID, recorded as ``by``
        (default: this :class:`Mdevs`'s). Refuses (:class:`RefusedError`, nothing changed)
        an unknown parent or type, a bad or taken UUID, too few ``available_instances``;
        a failed write raises :class:`BindError` naming the kernel's answer."""
        parent = parent_name(parent)
        result = MdevResult(dry_run=dry_run)
        if dry_run:
            self.check_create(self.read(), parent, type_id, uuids)
            result.steps = [f"echo {u} > {self.create_path(parent, type_id)}" for u in uuids]
            result.uuids = list(uuids)
            return result
        with self.host.state.locked([parent], self.host.lock_timeout):
            result.warnings += self._recover_locked(parent)
            self.check_create(self.read(), parent, type_id, uuids)
            for u in uuids:
                self._create_one(MdevRecord(u, parent, type_id, by or self.by), result)
        return result

    def remake(self, rec: MdevRecord) -> MdevResult:
        """Make again the recorded instance ``rec`` that is gone (a reboot), with its UUID --
        only if, under the parent's lock, its record is still ``rec`` and the instance still
        gone: a pass that read both before a claim's Unprepare removed the instance and
        then its record must not bring it back. ``uuids`` empty: nothing to make now."""
        result = MdevResult()
        with self.host.state.locked([rec.parent], self.host.lock_timeout):
            result.warnings += self._recover_locked(rec.parent)
            if self.store.get(rec.uuid) != rec or self._exists(rec.uuid):
                return result
            self.check_create(self.read(), rec.parent, rec.type_id, [rec.uuid])
            self._create_one(rec, result)
        return result

    def _create_one(self, rec: MdevRecord, result: MdevResult) -> None:
        path = self.create_path(rec.parent, rec.type_id)
        self.host.fs.check_inside(path)
        op = MdevOp(
            CREATE, rec.uuid, rec.parent, rec.type_id, self.host.runner, os.getpid(),
            time.time(), previous=self.store.get(rec.uuid), record=rec,
        )  # fmt: skip
        self.store.begin(op)
        try:
            self.host.kernel.write(path, f"{rec.uuid}\n")
        except (OSError, HostError) as e:
            self.store.finish(op)  # nothing was made: nothing to record
            raise BindError(
                f"mdev create of {rec.uuid} ({rec.type_id} on {rec.parent}) failed: "
                f"{self._why(e, rec)}"
                + (f"; made before it: {', '.join(result.uuids)}" if result.uuids else "")
            ) from e
        self.store.put(rec)
        self.store.finish(op)
        result.uuids.append(rec.uuid)
        result.steps.append(f"echo {rec.uuid} > {path}")

    def _why(self, e: BaseException, rec: MdevRecord) -> str:
        code = getattr(e, "errno", None)
        if code == errno.EEXIST:
            return f"the kernel refused (EEXIST): an mdev {rec.uuid} exists; pick another UUID"
        if code in (errno.ENOSPC, errno.EUSERS):
            return (
                f"the kernel refused ({errno.errorcode.get(code or 0, code)}): no instance of "
                f"{rec.type_id} is available on {rec.parent}; remove one (vfioctl mdev remove)"
            )
        return str(e)

    # -- remove --------------------------------------------------------------------------
    def remove(
        self,
        uuids: Sequence[str],
        *,
        force: bool = False,
        dry_run: bool = False,
        extra: Held | None = None,
        for_claim: str | None = None,
    ) -> MdevResult:
        """Remove each instance in ``uuids``. Refuses (:class:`RefusedError`, nothing
        changed) a bad UUID, an instance that does not exist, a held one (always), and one
        that is not this caller's (made by someone else, or by a node process's config)
        unless ``force``. A recorded instance that is already gone loses its record.
        ``for_claim``: a DRA claim's Unprepare removes the instance its Prepare made (its
        ``claim:<uid>`` record is then the caller's, not a hold)."""
        owner = bound_by_claim(for_claim) if for_claim is not None else self.by
        result = MdevResult(dry_run=dry_run)
        problems = [f"{u!r} is not an mdev UUID: give {UUID_FIX}" for u in uuids if not is_uuid(u)]
        if problems:
            raise RefusedError(problems)
        inv = self.read()
        present = {i.uuid: i for i in inv.instances}
        insts: list[MdevInstance] = []
        for u in uuids:
            rec = self.store.get(u)
            if u not in present:
                if rec is None:
                    problems.append(
                        f"no mdev {u} under /{'/'.join(MDEV_DEVICES)} (vfioctl mdev lists them)"
                    )
                elif not dry_run:
                    self.store.remove(u)
                    result.warnings.append(f"mdev {u} was already gone; its record is dropped")
                continue
            if rec is None and not force:
                problems.append(
                    f"mdev {u} was not made by vfio_dp (no record): left alone; add --force "
                    "to remove it anyway"
                )
            elif rec is not None and rec.by != owner and claim_of(rec.by) is None and not force:
                problems.append(
                    f"mdev {u} was made by {rec.by} (its config's mdev: section makes it again "
                    "while it asks for it): change that config, or add --force"
                )
            insts.append(present[u])
        for u, who in self.holders(insts, extra, owner).items():
            problems.append(f"mdev {u} is held: {'; '.join(who)}; stop its user first")
        if problems:
            raise RefusedError(problems)
        for inst in insts:
            if dry_run:
                result.steps.append(f"echo 1 > {self.remove_path(inst.uuid)}")
                result.uuids.append(inst.uuid)
                continue
            with self.host.state.locked([inst.parent], self.host.lock_timeout):
                result.warnings += self._recover_locked(inst.parent)
                self._remove_one(inst, result)
        return result

    def _remove_one(self, inst: MdevInstance, result: MdevResult) -> None:
        path = self.remove_path(inst.uuid)
        self.host.fs.check_inside(path)
        rec = self.store.get(inst.uuid)
        op = MdevOp(
            "remove", inst.uuid, inst.parent, inst.type_id or "", self.host.runner, os.getpid(),
            time.time(), previous=rec,
        )  # fmt: skip
        self.store.begin(op)
        try:
            self.host.kernel.write(path, "1\n")
        except (OSError, HostError) as e:
            self.store.finish(op)  # still there: its record stays
            raise BindError(f"mdev remove of {inst.uuid} on {inst.parent} failed: {e}") from e
        if rec is not None:
            self.store.remove(inst.uuid)
        self.store.finish(op)
        result.uuids.append(inst.uuid)
        result.steps.append(f"echo 1 > {path}")

    # -- recovery ------------------------------------------------------------------------
    def _exists(self, uuid: str) -> bool:
        try:
            os.lstat(self.host.fs.path(*MDEV_DEVICES, uuid))
            return True
        except OSError:
            return False

    def _finish_or_undo(self, op: MdevOp) -> str:
        """Finish ``op`` when the kernel made its change, else undo it (see the module
        docstring); what was done."""
        there = self._exists(op.uuid)
        if op.action == CREATE:
            if there and op.record is not None:
                self.store.put(op.record)
                done = f"finished the interrupted {op.describe()}: it was made; recorded"
            else:
                self._put_back(op)
                done = f"undid the interrupted {op.describe()}: it was not made"
        elif there:
            self._put_back(op)
            done = f"undid the interrupted {op.describe()}: it is still there; kept"
        else:
            self.store.remove(op.uuid)
            done = f"finished the interrupted {op.describe()}: it is gone; its record dropped"
        self.store.finish(op)
        return done

    def _put_back(self, op: MdevOp) -> None:
        if op.previous is None:
            self.store.remove(op.uuid)
        else:
            self.store.put(op.previous)

    def _recover_locked(self, parent: str | None) -> list[str]:
        out: list[str] = []
        for uuid in self.store.journaled():
            op = self.store.op(uuid)
            if op is not None and (parent is None or op.parent == parent):
                out.append(self._finish_or_undo(op))
        return out

    def recover(self, *, runner: str | None = None) -> list[str]:
        """Finish or undo every interrupted create or remove (its parent's lock is free;
        with ``runner``, only the ones it :func:`~vfio_dp.host.bound_by.recovers`). Never
        raises for one: a problem is said."""
        out: list[str] = []
        for uuid in self.store.journaled():
            try:
                op = self.store.op(uuid)
                if op is None or (runner is not None and not recovers(runner, op.runner)):
                    continue
                with self.host.state.locked([op.parent], timeout=0):
                    if self.store.op(uuid) is not None:  # again, under the lock
                        out.append(self._finish_or_undo(op))
            except LockTimeoutError:
                continue  # in progress
            except HostError as e:
                out.append(f"mdev {uuid}: {e}")
        return out
