"""Finishing what a killed run left: the journals of interrupted binds and unbinds.

A bind or unbind journals each sysfs write before it makes it
(``<root>/var/lib/vfio_dp/ops/<id>.json``, written by :class:`vfio_dp.host.ledger.Ledger`)
under the devices' locks (``<root>/run/vfio_dp/<bdf>.lock``). A journal whose locks are free
is an INTERRUPTED operation (its process died midway): :func:`recover` puts each of its
devices back to what its bind record (``<root>/var/lib/vfio_dp/original/<bdf>.json``) says
-- an interrupted bind is rolled back, an interrupted unbind finished -- then removes the
journal. Every operation (:mod:`vfio_dp.host.operations`) runs it first on its devices; a
front-end runs it at start for what it (or an older version's ``daemon``) started.
:class:`Interrupted` is how ``vfioctl list`` shows a journal left on disk.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from vfio_dp.errors import BindError, HostError, LockTimeoutError
from vfio_dp.host import sysfs
from vfio_dp.host.bind import Binder
from vfio_dp.host.bound_by import recovers
from vfio_dp.host.state import Operation
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import PciDevice

if TYPE_CHECKING:
    from collections.abc import Sequence

    from vfio_dp.host.host import Host


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
    """What :func:`recover` did: one line per device restored, and what it could not do."""

    recovered: list[str] = field(default_factory=list)  # operation descriptions
    restored: list[tuple[PciAddress, str | None]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # others' or live operations
    unreadable: list[str] = field(default_factory=list)  # journals that cannot be read (kept)


def executor(host: Host, op: Operation | None) -> Binder:
    """The binder of one operation: journals into ``op``, reports restores to the ledger."""
    return Binder(
        host.fs, host.kernel, journal=host.ledger.journal(op), restored=host.ledger.restored
    )


def recover(host: Host, *, runner: str | None = None, only: Sequence[PciAddress] = ()) -> Recovery:
    """:meth:`vfio_dp.host.Host.recover` (see there)."""
    out = Recovery()
    ops, out.unreadable = host.state.operations()
    wanted = set(only)
    for op in ops:
        addrs = op.addresses()
        if runner is not None and not recovers(runner, op.runner):
            out.skipped.append(f"{op.describe()}: not started by {runner}")
            continue
        if wanted and not wanted & set(addrs):
            continue
        try:
            with host.state.locked(addrs, timeout=0):
                _recover_one(host, op, out)
        except LockTimeoutError:
            out.skipped.append(f"{op.describe()}: still in progress")
        except HostError as e:  # reported, never fatal: the daemon calls this at start
            out.problems.append(f"{op.describe()}: {e}")
    for p in out.problems + out.unreadable:
        _log_warning("recovery: %s", p)
    return out


def _recover_one(host: Host, op: Operation, out: Recovery) -> None:
    current, _ = host.state.operations()
    if not any(o.id == op.id for o in current):
        return  # it finished between our listing and our locking
    failures = len(out.problems)
    jobs: list[tuple[PciDevice, str | None, str | None]] = []
    for d in op.devices:
        addr = PciAddress.parse(d.address)
        dev = sysfs.read_device(host.fs, addr)
        try:
            rec = host.ledger.record(addr)
        except HostError as e:
            out.problems.append(str(e))
            continue
        if dev is None:  # gone with no record (a VF its PF's count change destroyed):
            if rec is not None:  # nothing to give back, nothing to remember
                out.problems.append(f"{addr} ({op.describe()}) is gone from the host")
            continue
        if op.kind == "bind":
            if rec is None:
                continue  # recorded before its first write: never touched
            target, override = rec.driver, rec.driver_override
        else:
            target, override = d.target, d.override
        if dev.driver == target and dev.driver_override == override:
            if rec is not None and rec.driver == target:
                host.ledger.forget(addr)
            continue
        jobs.append((dev, target, override))
    try:
        out.restored.extend(executor(host, op).restore_all(jobs, explicit=False))
    except BindError as e:
        out.problems.append(f"{op.describe()}: {e}")
        return
    if len(out.problems) == failures:
        host.ledger.finish(op)
    out.recovered.append(op.describe())
    _log_warning("recovered the interrupted %s", op.describe())
