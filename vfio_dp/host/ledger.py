"""The one writer of bind records (who holds each binding, what to give back) and journals.

Files (formats in :mod:`.state`)::

    <root>/var/lib/vfio_dp/original/<bdf>.json   the bind record: driver before the bind, holder
    <root>/var/lib/vfio_dp/ops/<id>.json         the journal of one bind or unbind while it runs

Holders (the record's ``bound_by``): ``operator`` (``vfioctl bind``), ``device-plugin`` / ``dra-plugin``
(a selector's ``bind: true`` in that front-end), ``claim:<uid>`` (a DRA claim's Prepare),
``pool:<driver>`` (a pool hold: who may take it, :func:`vfio_dp.host.bound_by.pool_refusal`);
``daemon``, what versions before the split wrote for either front-end, still reads as an
automatic front-end binding (never a claim's), and its interrupted operations are recovered
by either front-end (:func:`vfio_dp.host.bound_by.recovers`).

Every write of a record or a journal for bind, unbind and recovery is made here: the record
to write is decided once per device (:meth:`Ledger.record_for`), all of them before the
first sysfs write (:meth:`Ledger.begin_bind`); the binder only executes sysfs writes,
reporting each one before making it (:meth:`Ledger.journal`) and each device it gave back
(:meth:`Ledger.restored`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from vfio_dp.errors import HostError, PathEscapeError, StateWriteError
from vfio_dp.host.bound_by import claim_of
from vfio_dp.host.state import OpDevice, Operation, OriginalDriver, StateStore
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import PciDevice

#: ``journal(address, writes_done, next_write)``: called before each sysfs write
Journal = Callable[[PciAddress, int, str], None]
#: ``journal_all([(address, writes_done, next_write)])``: before the writes of a pass's phase
JournalAll = Callable[[Sequence[tuple[PciAddress, int, str]]], None]
#: ``restored(address, target, driver_now, explicit)``: called after each device given back
Restored = Callable[[PciAddress, str | None, str | None, bool], None]


def _log_info(msg: str, *args: object) -> None:
    """Through ``logging`` when the process uses it (the daemon); free for the CLI."""
    import sys

    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("vfio_dp.bind").info(msg, *args)


def _record_for(rec: OriginalDriver | None, dev: PciDevice, holder: str) -> OriginalDriver | None:
    """:meth:`Ledger.record_for` given the device's record as read (``rec``)."""
    if rec is not None and rec.bound_by == holder and dev.driver is None:
        return None
    keep = rec is not None and dev.driver is None
    new = OriginalDriver(
        str(dev.address),
        rec.driver if keep and rec is not None else dev.driver,
        rec.driver_override if keep and rec is not None else dev.driver_override,
        dev.vendor,
        dev.device,
        holder,
    )
    return None if new == rec else new


class Ledger:
    """Bind records and operation journals of one root (see the module docstring)."""

    def __init__(self, state: StateStore, lock_timeout: float) -> None:
        self.state = state
        self.lock_timeout = lock_timeout

    # -- reading -------------------------------------------------------------------------
    def record(self, address: PciAddress) -> OriginalDriver | None:
        """The device's bind record (raises :class:`CorruptRecordError` when unreadable)."""
        return self.state.get(address)

    def records(self) -> dict[PciAddress, OriginalDriver]:
        """Every readable bind record, by address."""
        return self.state.all()

    def record_holders(self) -> dict[PciAddress, str]:
        """Every device with a readable bind record → its holder (``bound_by``)."""
        return self.state.holders()

    def holdings(self, holder: str) -> list[PciAddress]:
        """The devices whose bind record names ``holder``, in address order."""
        return sorted(a for a, h in self.record_holders().items() if h == holder)

    def claims(self) -> set[str]:
        """The UIDs of every claim that holds a device (``claim:<uid>`` records)."""
        return {u for h in self.record_holders().values() if (u := claim_of(h)) is not None}

    # -- holding -------------------------------------------------------------------------
    def adopt(
        self, addresses: Sequence[PciAddress], holder: str, *, replacing: Callable[[str], bool]
    ) -> list[tuple[PciAddress, str]]:
        """Rewrite the bind record of each of ``addresses`` whose holder ``replacing`` accepts
        (and is not ``holder``) to name ``holder``, under the devices' locks; the driver to
        give back stays. Returns ``[(address, previous holder)]``."""

        def takes(a: PciAddress) -> OriginalDriver | None:
            rec = self.state.get(a)
            if rec is None or rec.bound_by == holder or not replacing(rec.bound_by):
                return None
            return rec

        wanted = [a for a in addresses if takes(a) is not None]
        if not wanted:
            return []
        taken: list[tuple[PciAddress, str]] = []
        with self.state.locked(wanted, self.lock_timeout):
            for a in wanted:
                rec = takes(a)  # again, under the lock
                if rec is not None:
                    self.state.put(replace(rec, bound_by=holder))
                    taken.append((a, rec.bound_by))
                    _log_info("%s: bind record taken over from %s by %s", a, rec.bound_by, holder)
        return taken

    def record_for(self, dev: PciDevice, holder: str) -> OriginalDriver | None:
        """The bind record to write before binding ``dev`` (not on vfio), or None to keep the
        existing one (also when it already says exactly this). A record left from an earlier
        boot (the device is back on a host driver) or by an interrupted bind is taken over:
        the driver the device has now is what to give back (driverless: keep the recorded
        one), and ``holder``, who binds it now, holds the binding."""
        return _record_for(self.state.get(dev.address), dev, holder)

    def put_back(self, record: OriginalDriver) -> None:
        """Write ``record`` again: an unbind that is undone (its device put back where it
        was: :func:`vfio_dp.host.operations.unbind` with ``native``) keeps its record."""
        self.state.put(record)

    def forget(self, address: PciAddress) -> None:
        """Drop the device's record (it is on its recorded driver again, or gone)."""
        self.state.remove(address)

    def restored(
        self, address: PciAddress, target: str | None, now: str | None, explicit: bool
    ) -> None:
        """A device was given back and is on ``now``: its record goes -- unless the driver
        was named explicitly (``vfioctl unbind --driver``) and did not take."""
        if not explicit or now == target:
            self.state.remove(address)

    # -- journals ------------------------------------------------------------------------
    def begin_bind(
        self,
        runner: str,
        targets: Sequence[PciDevice],
        holder: str,
        drivers: Mapping[PciAddress, str] | None = None,
    ) -> Operation | None:
        """Write the journal (run by ``runner``; each device's ``target`` is the VFIO driver
        it goes to, ``drivers``, else vfio-pci) and every device's bind record (held by
        ``holder``), all before the first sysfs write; a failure here undoes what was
        written and refuses the bind (:class:`StateWriteError`), changing nothing."""
        if not targets:
            return None
        written: list[PciAddress] = []
        replaced: list[OriginalDriver] = []
        op: Operation | None = None
        try:
            op = self.state.begin(
                "bind",
                runner,
                [
                    OpDevice(str(d.address), (drivers or {}).get(d.address, "vfio-pci"), None)
                    for d in targets
                ],
            )
            new: list[OriginalDriver] = []
            for dev in targets:
                before = self.state.get(dev.address)
                record = _record_for(before, dev, holder)
                if record is not None:
                    new.append(record)
                    written.append(dev.address)
                    if before is not None:
                        replaced.append(before)
            self.state.put_many(new)  # durable together: one bind of 1,024 VFs, not 1,024
        except HostError as e:  # full, read-only, escaping, or an unreadable old record
            for a in written:
                self.state.remove(a)
            for rec in replaced:
                with contextlib.suppress(StateWriteError, PathEscapeError):
                    self.state.put(rec)
            if op is not None:
                self.state.finish(op)
            if not isinstance(e, (StateWriteError, PathEscapeError)):
                raise
            raise StateWriteError(
                f"bind refused before the first sysfs write (nothing was changed): {e}"
            ) from e
        return op

    def begin_unbind(
        self, runner: str, jobs: Sequence[tuple[PciDevice, str | None, str | None]]
    ) -> Operation | None:
        """Write the journal of an unbind of ``(device, driver, override)`` jobs before its
        first sysfs write."""
        if not jobs:
            return None
        try:
            return self.state.begin(
                "unbind", runner, [OpDevice(str(d.address), t, o) for d, t, o in jobs]
            )
        except (StateWriteError, PathEscapeError) as e:
            raise StateWriteError(
                f"unbind refused before the first sysfs write (nothing was changed): {e}"
            ) from e

    def journal(self, op: Operation | None) -> Journal | None:
        """The binder's hook for ``op``: records each write before it is made."""
        if op is None:
            return None

        def step(address: PciAddress, done: int, next_write: str) -> None:
            self.state.step(op, str(address), done, next_write)

        return step

    def journal_all(self, op: Operation) -> JournalAll:
        """The hook of a pass (:mod:`.bind_pass`) for ``op``: records the next write of each
        of many devices, in one durable write, before they are made."""

        def steps(moves: Sequence[tuple[PciAddress, int, str]]) -> None:
            self.state.steps(op, [(str(a), done, nxt) for a, done, nxt in moves])

        return steps

    def finish(self, op: Operation | None) -> None:
        """The operation completed (or was fully rolled back): its journal goes."""
        if op is not None:
            self.state.finish(op)

    def failed(self, op: Operation | None, why: str) -> None:
        """The operation ended with devices it could not put back: keep its journal, marked,
        so ``vfioctl list`` shows it and ``vfioctl unbind`` / recovery retry it."""
        if op is None:
            return
        op.failed = why.splitlines()[0][:500]
        with contextlib.suppress(HostError):
            self.state.save(op)
