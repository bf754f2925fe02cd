"""The :class:`Host`: everything vfio_dp does to a machine, through one root path.

``Host("/")`` on a node, ``Host("/host")`` in the DaemonSet's pod, ``Host(tmp_path)`` in
tests. Composes discovery (:mod:`.sysfs`), host usage (:mod:`.usage`), the durable state
(:mod:`.state`), the VFIO nodes (:mod:`.vfio`) and the binder (:mod:`.bind`) with the pure
rules of :mod:`vfio_dp.model`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vfio_dp.errors import (
    BindError,
    HostError,
    LockTimeoutError,
    NoIommuError,
    PathEscapeError,
    RefusedError,
    StateWriteError,
)
from vfio_dp.host import sysfs
from vfio_dp.host.bind import Binder, BindResult, Step
from vfio_dp.host.kernel import KernelIO, RealKernel
from vfio_dp.host.root import Root, safe_component
from vfio_dp.host.state import BOUND_BY_OPERATOR, OpDevice, Operation, OriginalDriver, StateStore
from vfio_dp.host.vfio import UNKNOWN, device_nodes, probe_groups
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import GroupStatus, Inventory, IommuGroup, PciDevice
from vfio_dp.model.plan import BindPlan, CheckReport, plan_bind, plan_check, plan_unbind

if TYPE_CHECKING:  # not imported at run time: keeps `vfioctl bind` start-up light
    from pathlib import Path


def _log_warning(msg: str, *args: object) -> None:
    """Through ``logging`` when the process uses it (the daemon); free for the CLI."""
    import sys

    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("vfio_dp.bind").warning(msg, *args)


@dataclass(frozen=True, slots=True)
class Interrupted:
    """An operation whose process died midway (its journal is left, its locks are free)."""

    op: Operation
    in_progress: bool  # its process still holds the locks: not interrupted (yet)

    def message(self) -> str:
        addrs = " ".join(d.address for d in self.op.devices)
        if self.in_progress:
            return f"{self.op.describe()} is in progress on {addrs}"
        if self.op.failed:
            lines = [f"UNFINISHED {self.op.describe()}: {self.op.failed}"]
        else:
            lines = [f"INTERRUPTED {self.op.describe()}: the process died midway"]
        lines += [f"  {p}" for p in self.op.progress()]
        lines.append(f"  restore every device of it: vfioctl unbind {addrs}")
        return "\n".join(lines)


@dataclass(slots=True)
class Recovery:
    """What :meth:`Host.recover` did: one line per device restored, and what it could not do."""

    recovered: list[str] = field(default_factory=list)  # operation descriptions
    restored: list[tuple[PciAddress, str | None]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # others' or live operations
    unreadable: list[str] = field(default_factory=list)  # journals that cannot be read (kept)


class Host:
    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        kernel: KernelIO | None = None,
        write_timeout: float = 10.0,
        lock_timeout: float = 10.0,
        scan_processes: int = 1,
        owner: str = "vfioctl",
    ) -> None:
        """``scan_processes`` > 1 lets a big host's full scan use that many processes (the
        CLI passes the CPUs it may use; the daemon, which has threads, keeps 1). ``owner``
        names who runs the operations in their journals (the daemon passes ``"daemon"``)."""
        self.fs = Root(root)
        self.scan_processes = scan_processes
        self.kernel: KernelIO = kernel or RealKernel(self.fs.prefix, write_timeout, self.fs.open)
        self.state = StateStore(self.fs)
        self.lock_timeout = lock_timeout
        self.owner = owner

    @property
    def root(self) -> Path:
        """The root as a :class:`pathlib.Path` (imported on use)."""
        from pathlib import Path

        return Path(self.fs.base)

    @property
    def display(self) -> str:
        """The root as shown in messages, always ending in ``/`` (``/``, ``/host/``)."""
        return self.fs.display

    @staticmethod
    def valid_driver_name(name: str) -> bool:
        """Whether ``name`` can be a kernel driver's name (one harmless path component under
        ``/sys/bus/pci/drivers/``)."""
        try:
            safe_component(name)
        except HostError:
            return False
        return True

    # -- discovery ---------------------------------------------------------------------
    def scan(self, *, usage: bool = True) -> Inventory:
        """Read every device and group; fill ``original_driver`` and, with ``usage``, ``in_use``."""
        devices = sysfs.read_devices(self.fs, workers=self.scan_processes)
        records = self.state.all()
        used = {}
        if usage:  # imported on use: `unbind` never needs it
            from vfio_dp.host.usage import host_usage

            used = host_usage(self.fs, devices)
        for addr in records.keys() | used.keys():
            dev = devices.get(addr)
            if dev is None:
                continue
            rec = records.get(addr)
            devices[addr] = dataclasses.replace(
                dev,
                original_driver=rec.driver if rec else None,
                in_use=tuple(used.get(addr, ())),
            )
        groups = sysfs.read_groups(self.fs, devices)
        return Inventory(devices=devices, groups=groups, iommu_present=bool(groups))

    @staticmethod
    def names(inv: Inventory) -> dict[tuple[str, str | None], str]:
        """Vendor and device names from ``pci.ids`` for the devices of ``inv`` (keys
        ``(vendor, None)`` and ``(vendor, device)``); empty when the database is missing."""
        from vfio_dp.host.pciids import load_names

        return load_names({(d.vendor, d.device) for d in inv.devices.values()})

    def refresh(self, previous: Inventory) -> Inventory:
        """A cheap rescan for the daemon: new addresses are read in full, known ones only for
        what changes while present (driver, override, VFIO cdev), gone ones dropped; groups
        are re-analysed. ``original_driver`` comes from the durable records as in :meth:`scan`;
        ``in_use`` is not computed (the daemon never needs it to judge health).
        """
        records = self.state.all()
        devices = sysfs.refresh_devices(self.fs, previous.devices)
        for addr, dev in devices.items():
            rec = records.get(addr)
            orig = rec.driver if rec else None
            if dev.original_driver != orig or dev.in_use:
                dev = dataclasses.replace(dev, original_driver=orig, in_use=())
            devices[addr] = dev
        groups = sysfs.read_groups(self.fs, devices)
        return Inventory(devices=devices, groups=groups, iommu_present=bool(groups))

    def probe_groups(self, groups: Sequence[IommuGroup]) -> dict[int, GroupStatus]:
        """The kernel's verdict for each group with a node in ``/dev/vfio`` (opens it briefly);
        groups without a node are left out."""
        return probe_groups(self.fs, groups)

    def device_nodes(self, group: IommuGroup, devices: list[PciDevice]) -> list[str]:
        return device_nodes(self.fs, group, devices)

    def group_node(self, group: IommuGroup) -> str:
        """The group's node path under the root (for existence checks only)."""
        return self.fs.path("dev", "vfio", group.node)

    def groups(self, *, probe: bool = True) -> tuple[Inventory, dict[int, GroupStatus]]:
        """Every IOMMU group (``<root>/sys/kernel/iommu_groups/*``) and, with ``probe``, the
        kernel's verdict on each (unknown where there is no ``/dev/vfio/<N>``).

        Raises :class:`~vfio_dp.errors.NoIommuError` when the host has no groups at all.
        """
        inv = self.scan(usage=False)
        if not inv.iommu_present:
            raise NoIommuError(self.fs.display)
        found = self.probe_groups(list(inv.groups.values())) if probe else {}
        return inv, {n: found.get(n, UNKNOWN) for n in inv.groups}

    # -- binding -----------------------------------------------------------------------
    def _check_escapes(self, inv: Inventory, addresses: Sequence[PciAddress]) -> None:
        """An address discovery did not find because its sysfs entry leads out of the root:
        :class:`PathEscapeError` naming the link (rather than "no such device")."""
        for a in addresses:
            if a not in inv.devices:
                self.fs.check_inside(f"{sysfs.pci_devices_dir(self.fs)}/{a}/driver_override")

    def _binder(self) -> Binder:
        return Binder(self.fs, self.kernel, self.state)

    def _groups_in_use(self, inv: Inventory, addrs: Sequence[PciAddress]) -> dict[int, bool]:
        groups = {inv.devices[a].iommu_group for a in addrs if a in inv.devices}
        found = {n: inv.groups[n] for n in groups if n is not None and n in inv.groups}
        return {n: bool(s.in_use) for n, s in self.probe_groups(list(found.values())).items()}

    def _plan_bind(
        self,
        inv: Inventory,
        addresses: Sequence[PciAddress],
        in_use: dict[int, bool] | None,
        *,
        group: bool,
        force: bool,
    ) -> BindPlan:
        plan = plan_bind(
            inv,
            addresses,
            group=group,
            force=force,
            groups_in_use=in_use,
            root_display=self.fs.display,
        )
        if plan.refusals:
            raise RefusedError(list(plan.refusals))
        return plan

    def bind(
        self,
        addresses: Sequence[PciAddress],
        *,
        group: bool = False,
        force: bool = False,
        dry_run: bool = False,
        probe: bool = True,
        bound_by: str = BOUND_BY_OPERATOR,
    ) -> BindResult:
        """Move ``addresses`` (and with ``group`` their group's other endpoints) to vfio-pci.

        Refuses before touching anything (:class:`RefusedError`); on any failure after the
        first write, rolls back every device it touched and raises :class:`BindError`. The
        plan (:func:`vfio_dp.model.plan.plan_bind`) is made from the scan, then made again
        under the devices' locks from their state as it is then (another vfioctl may have
        bound some meanwhile): the binder only executes it. An interrupted operation on these
        devices (its process was killed) is undone first (:meth:`recover`), so the original
        drivers recorded stay the true ones.
        ``bound_by`` goes into each new bind record (``operator``, ``daemon``,
        ``claim:<uid>``); devices already on vfio-pci keep their record and owner.
        """
        undone: list[str] = []
        if not dry_run:
            rec_out = self.recover(only=addresses)
            if rec_out.problems:
                raise BindError("\n".join(rec_out.problems))
            undone = [f"undid the interrupted {d} first" for d in rec_out.recovered]
        inv = self.scan()
        self._check_escapes(inv, addresses)
        in_use = self._groups_in_use(inv, addresses) if probe else None
        plan = self._plan_bind(inv, addresses, in_use, group=group, force=force)
        binder = self._binder()
        binder.bound_by = bound_by
        if dry_run:
            result = BindResult(
                already=list(plan.already),
                dry_run=True,
                warnings=[f"forced: {w}" for w in plan.forced],
            )
            need = not binder.driver_loaded("vfio-pci")
            for a in plan.targets:
                result.steps.extend(binder.bind_steps(inv.devices[a], need))
                need = False
            return result
        touched: list[PciAddress] = []
        locked = [*plan.targets, *plan.already]
        with self._locked(locked):
            now = {a: binder.current(a) for a in locked}
            inv = dataclasses.replace(
                inv,
                devices={
                    **inv.devices,
                    **{
                        a: dataclasses.replace(
                            d,
                            in_use=inv.devices[a].in_use,
                            original_driver=inv.devices[a].original_driver,
                        )
                        for a, d in now.items()
                    },
                },
            )
            plan = self._plan_bind(inv, addresses, in_use, group=group, force=force)
            forced = [f"forced: {w}" for w in plan.forced]
            result = BindResult(already=list(plan.already), warnings=undone + forced)
            targets = [inv.devices[a] for a in plan.targets]
            op = self._begin_bind(binder, targets)
            try:
                binder.bind_all(targets, result, touched)
            except BindError as e:
                problems = binder.rollback(touched)
                msg = f"bind failed: {e}"
                if touched:
                    msg += f"\nrolled back {', '.join(map(str, touched))}"
                if problems:
                    msg += "\n" + "\n".join(problems)
                    self._failed(op, msg)
                else:
                    self._finish(op)
                raise BindError(msg) from e
            self._finish(op)
        return result

    # -- the journal around every operation -----------------------------------------------
    @contextlib.contextmanager
    def _locked(self, addresses: Sequence[PciAddress]) -> Iterator[None]:
        """The devices' locks; a lock that cannot be created refuses the operation."""
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(self.state.locked(list(addresses), self.lock_timeout))
            except StateWriteError as e:
                raise StateWriteError(
                    f"refused before the first sysfs write (nothing was changed): {e}"
                ) from e
            yield

    def _preflight(self, binder: Binder, steps: Sequence[Step]) -> None:
        """Every sysfs file an operation will write resolves inside the root (else refuse
        before the first write, naming the path and the link)."""
        for s in steps:
            if s.path:
                self.fs.check_inside(s.path)

    def _begin_bind(self, binder: Binder, targets: Sequence[PciDevice]) -> Operation | None:
        """Check every path, write the journal and every device's original driver, all
        before the first sysfs write; a failure here refuses the bind, changing nothing."""
        if not targets:
            return None
        for dev in targets:
            self._preflight(binder, binder.bind_steps(dev, need_module=False))
        written: list[PciAddress] = []
        replaced: list[OriginalDriver] = []
        op: Operation | None = None
        try:
            op = self.state.begin(
                "bind", self.owner, [OpDevice(str(d.address), "vfio-pci", None) for d in targets]
            )
            for dev in targets:
                before = self.state.get(dev.address)
                record = binder.record_to_write(dev)
                if record is not None:
                    self.state.put(record)
                    written.append(dev.address)
                    if before is not None:
                        replaced.append(before)
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
        binder.op = op
        return op

    def _begin_unbind(
        self, binder: Binder, jobs: Sequence[tuple[PciDevice, str | None, str | None]]
    ) -> Operation | None:
        """Check every path and write the unbind's journal before its first sysfs write."""
        if not jobs:
            return None
        for dev, target, override in jobs:
            self._preflight(binder, binder.restore_steps(dev, target, override))
        try:
            op = self.state.begin(
                "unbind", self.owner, [OpDevice(str(d.address), t, o) for d, t, o in jobs]
            )
        except (StateWriteError, PathEscapeError) as e:
            raise StateWriteError(
                f"unbind refused before the first sysfs write (nothing was changed): {e}"
            ) from e
        binder.op = op
        return op

    def _finish(self, op: Operation | None) -> None:
        if op is not None:
            self.state.finish(op)

    def _failed(self, op: Operation | None, why: str) -> None:
        """The operation ended with devices it could not put back: keep its journal, marked,
        so ``vfioctl list`` shows it and ``vfioctl unbind`` / :meth:`recover` retry it."""
        if op is None:
            return
        op.failed = why.splitlines()[0][:500]
        with contextlib.suppress(HostError):
            self.state.save(op)

    def interrupted(self) -> tuple[list[Interrupted], list[str]]:
        """Every operation journal on disk (each marked in progress or interrupted), and a
        message for every unreadable record or journal (they are kept, never dropped)."""
        ops, problems = self.state.operations()
        found = [Interrupted(op, self.state.busy(op.addresses())) for op in ops]
        return found, problems + self.state.problems()

    def recover(self, *, owner: str | None = None, only: Sequence[PciAddress] = ()) -> Recovery:
        """Undo every INTERRUPTED operation (a bind or unbind whose process was killed):
        each of its devices goes back to the driver it had before the bind (an interrupted
        bind is rolled back, an interrupted unbind is finished), then its journal is removed.

        ``owner="daemon"``: only what the daemon started (the daemon calls this at start,
        before it binds anything); ``only``: only operations that include one of these
        devices (``vfioctl unbind <addresses>``). An operation whose process still runs (its
        locks are held) is left alone. Reads ``<root>/var/lib/vfio_dp/ops/*.json`` and
        ``original/<bdf>.json``; writes the same sysfs files as :meth:`unbind`. A device
        that cannot be restored keeps its records and is named in ``problems``.
        """
        out = Recovery()
        ops, out.unreadable = self.state.operations()
        wanted = set(only)
        for op in ops:
            addrs = op.addresses()
            if owner is not None and op.owner != owner:
                out.skipped.append(f"{op.describe()}: not started by {owner}")
                continue
            if wanted and not wanted & set(addrs):
                continue
            try:
                with self.state.locked(addrs, timeout=0):
                    self._recover_one(op, out)
            except LockTimeoutError:
                out.skipped.append(f"{op.describe()}: still in progress")
            except HostError as e:  # reported, never fatal: the daemon calls this at start
                out.problems.append(f"{op.describe()}: {e}")
        for p in out.problems + out.unreadable:
            _log_warning("recovery: %s", p)
        return out

    def _recover_one(self, op: Operation, out: Recovery) -> None:
        current, _ = self.state.operations()
        if not any(o.id == op.id for o in current):
            return  # it finished between our listing and our locking
        binder = self._binder()
        binder.op = op
        failures = len(out.problems)
        jobs: list[tuple[PciDevice, str | None, str | None]] = []
        for d in op.devices:
            addr = PciAddress.parse(d.address)
            dev = sysfs.read_device(self.fs, addr)
            if dev is None:
                out.problems.append(f"{addr} ({op.describe()}) is gone from the host")
                continue
            try:
                rec = self.state.get(addr)
            except HostError as e:
                out.problems.append(str(e))
                continue
            if op.kind == "bind":
                if rec is None:
                    continue  # recorded before its first write: never touched
                target, override = rec.driver, rec.driver_override
            else:
                target, override = d.target, d.override
            if dev.driver == target and dev.driver_override == override:
                if rec is not None and rec.driver == target:
                    self.state.remove(addr)
                continue
            jobs.append((dev, target, override))
        try:
            out.restored.extend(binder.restore_all(jobs, explicit=False))
        except BindError as e:
            out.problems.append(f"{op.describe()}: {e}")
            return
        if len(out.problems) == failures:
            self.state.finish(op)
        out.recovered.append(op.describe())
        _log_warning("recovered the interrupted %s", op.describe())

    def unbind(
        self,
        addresses: Sequence[PciAddress],
        *,
        driver: str | None = None,
        force: bool = False,
        dry_run: bool = False,
    ) -> BindResult:
        """Give each device back to the driver recorded before ``bind`` (or ``driver``).

        With no record and no ``driver``, the override is cleared and the kernel probes
        (like ``driverctl unset-override``). Refuses a group a process holds open unless
        ``force`` (the unbind would block until the VM lets go). Planned by
        :func:`vfio_dp.model.plan.plan_unbind` from the state read under the devices' locks.
        """
        return self._unbind(list(addresses), driver=driver, force=force, dry_run=dry_run)

    def unbind_all(self, *, force: bool = False, dry_run: bool = False) -> BindResult:
        """:meth:`unbind` every device with a record (``<root>/var/lib/vfio_dp/original/``):
        the same checks, every device attempted; a record whose device is gone is named in
        the error after the others are restored. No records: an empty result."""
        return self._unbind(sorted(self.state.all()), force=force, dry_run=dry_run, every=True)

    def _unbind(
        self,
        addresses: list[PciAddress],
        *,
        driver: str | None = None,
        force: bool,
        dry_run: bool,
        every: bool = False,
    ) -> BindResult:
        result = BindResult(dry_run=dry_run)
        recovered: set[PciAddress] = set()
        if not dry_run:  # an interrupted bind/unbind of these devices: finish it first
            rec_out = self.recover(only=() if every else addresses)
            result.restored.extend(rec_out.restored)
            recovered = {a for a, _ in rec_out.restored}
            result.warnings.extend(f"undid the interrupted {d}" for d in rec_out.recovered)
            result.warnings.extend(rec_out.unreadable)
            if rec_out.problems:
                raise BindError("\n".join(rec_out.problems))
            if every:
                addresses = sorted(self.state.all())
        if not addresses:
            return result
        binder = self._binder()
        with self._locked(addresses):
            inv = self.scan(usage=False)
            self._check_escapes(inv, addresses)
            for a in addresses:  # an unreadable record refuses (CorruptRecordError), never
                self.state.get(a)  # reads as "no record": it would be restored over, dropped
            if every:
                result.warnings.extend(self.state.problems())
            plan = plan_unbind(
                inv,
                self.state.all(),
                addresses,
                driver=driver,
                force=force,
                groups_in_use=self._groups_in_use(inv, addresses),
                root_display=self.fs.display,
                skip_missing=every,
            )
            if plan.refusals:
                raise RefusedError(list(plan.refusals))
            result.already.extend(a for a in plan.already if a not in recovered)
            jobs = [(inv.devices[r.address], r.driver, r.override) for r in plan.restores]
            if dry_run:  # ``restored`` then says what WOULD go back where
                for dev, target, override in jobs:
                    result.steps.extend(binder.restore_steps(dev, target, override))
                    result.restored.append((dev.address, target))
                return result
            for a in plan.forget:
                self.state.remove(a)
            gone = [
                f"{a}: recorded in {self.state.state_dir}/{a}.json but there is no such device "
                f"under {self.fs.display}sys/bus/pci/devices; nothing to restore (remove the "
                "record once the card is gone for good)"
                for a in plan.missing
            ]
            op = self._begin_unbind(binder, jobs)
            try:
                result.restored.extend(binder.restore_all(jobs, explicit=driver is not None))
            except BindError as e:
                self._failed(op, str(e))
                if not gone:
                    raise
                raise BindError("\n".join([str(e), *gone])) from e
            self._finish(op)
            if gone:
                done = [f"{a}: restored to {d or 'no driver'}" for a, d in result.restored]
                raise BindError(
                    f"{len(gone)} of the recorded devices could not be restored\n"
                    + "\n".join(gone + done)
                )
        return result

    # -- readiness ---------------------------------------------------------------------
    def check(self, addresses: Sequence[PciAddress]) -> list[CheckReport]:
        """Is each device ready for passthrough right now? Every reason, each with its fix
        (:func:`vfio_dp.model.plan.plan_check`); the groups of devices on vfio-pci are probed."""
        inv = self.scan()
        groups = {
            g.number: g
            for a in addresses
            if (d := inv.devices.get(a)) is not None and d.on_vfio and (g := inv.group_of(a))
        }
        status = self.probe_groups(list(groups.values()))
        return plan_check(inv, addresses, status, root_display=self.fs.display)


__all__ = ["BindResult", "CheckReport", "Host", "Interrupted", "Recovery", "Step"]
