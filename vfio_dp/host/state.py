"""Durable state shared by vfioctl and the daemon, under the root.

- ``<root>/var/lib/vfio_dp/original/<bdf>.json`` — the driver a device had before we bound it::

      {"address": "0000:01:00.0", "driver": "e1000e", "driver_override": null,
       "vendor": "8086", "device": "10d3", "bound_by": "operator"}

  ``bound_by`` says who bound it: ``operator`` (``vfioctl bind``), ``device-plugin`` or
  ``dra-plugin`` (a selector's ``bind: true``, in the front-end serving that path),
  ``claim:<uid>`` (a DRA claim with ``bind: onPrepare``) or ``pool:<driver>`` (a claim's
  switch ahead of its pod left the device on its VFIO driver when the claim went away before
  its pod: the DRA driver's pool on this node holds it for its next claim;
  :func:`.bound_by.pool_refusal`). Only a claim's own bindings are ever undone by the DRA plugin's
  Unprepare or reconcile. Records written before the field
  existed read as ``operator``: nobody automatic ever undoes those; ``daemon``, written by
  versions whose two front-ends shared that name, reads as a front-end's ``bind: true``.
  The one writer of these records and of the journals below is :mod:`.ledger`.

  written before the device's first sysfs write and removed once it is restored.
- ``<root>/var/lib/vfio_dp/ops/<id>.json`` — the journal of one bind or unbind while it
  runs: which devices it moves, to which driver, and the sysfs write each device is at::

      {"id": "...", "kind": "bind", "owner": "vfioctl", "pid": 812, "started": 1763898000.1,
       "devices": [{"address": "0000:03:01.0", "target": "vfio-pci", "override": null,
                    "writes_done": 2, "next": "echo '0000:03:01.0' > /sys/bus/pci/drivers_probe"}]}

  ``owner`` is the operation's *runner* (``Operation.runner``; the field keeps its name so
  every release reads every other's journals). Written before the operation's first sysfs
  write and again before EACH write; removed when
  the operation finished (or was rolled back) -- that removal is its commit. A journal left
  behind whose devices' locks nobody holds is an INTERRUPTED operation (the process was
  killed): ``vfioctl list`` names it, ``vfioctl unbind`` and :meth:`Host.recover` undo it.
- ``<root>/run/vfio_dp/<bdf>.lock`` — per-device ``flock`` so concurrent vfioctl runs and the
  daemon never interleave bind steps on one device; held for the whole operation, so a
  free lock means the operation's process is gone.

Every record is written whole or not at all: a temp file in the same directory, ``fsync``,
``rename`` over the old one, ``fsync`` of the directory. A torn record cannot appear; one
found unreadable anyway (a disk error, a hand edit) is reported, kept, and never dropped.
Every path is opened through :meth:`Root.open_dir` (inside the root, see :mod:`.root`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field

from vfio_dp.errors import (
    AddressError,
    HostError,
    LockTimeoutError,
    PathEscapeError,
    StateWriteError,
)
from vfio_dp.host.bound_by import BOUND_BY_OPERATOR
from vfio_dp.host.records import STATE_DIR, RecordFiles, write_failure
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress

ORIGINAL_DIR = (*STATE_DIR, "original")
OPS_DIR = (*STATE_DIR, "ops")
LOCK_DIR = ("run", "vfio_dp")


@dataclass(frozen=True, slots=True)
class OriginalDriver:
    address: str
    driver: str | None
    driver_override: str | None
    vendor: str
    device: str
    bound_by: str = BOUND_BY_OPERATOR


@dataclass(slots=True)
class OpDevice:
    """One device of an operation: where it is going and how far it got."""

    address: str
    target: str | None  # "vfio-pci" for bind; the driver to restore (None: probe) for unbind
    override: str | None  # the driver_override an unbind restores
    writes_done: int = 0
    next: str | None = None  # the sysfs write about to be made, as a shell command


@dataclass(slots=True)
class Operation:
    """The journal of one bind or unbind (see the module docstring)."""

    id: str
    kind: str  # "bind" | "unbind"
    runner: str  # who runs it: "vfioctl", "device-plugin", "dra-plugin" ("daemon": older);
    # stored as the journal's "owner" field (what every release reads and writes)
    pid: int
    started: float
    devices: list[OpDevice] = field(default_factory=list)
    failed: str | None = None  # set when it ended with devices it could not put back

    def addresses(self) -> list[PciAddress]:
        return [PciAddress.parse(d.address) for d in self.devices]

    def describe(self) -> str:
        """``bind by vfioctl (pid 812) started 2026-11-23 11:40:01 UTC``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return f"{self.kind} by {self.runner} (pid {self.pid}) started {when}"

    def progress(self) -> list[str]:
        """One line per device: how far the operation got with it."""
        out = []
        for d in self.devices:
            if d.next is None and d.writes_done == 0:
                out.append(f"{d.address}: not touched yet")
            elif d.next is None:
                out.append(f"{d.address}: all {d.writes_done} sysfs writes made")
            else:
                out.append(
                    f"{d.address}: {d.writes_done} sysfs write(s) made, stopped at: {d.next}"
                )
        return out


def _operation_to_json(op: Operation) -> dict[str, object]:
    """The journal's JSON: the runner under its field name ``owner`` (every release's).
    Built field by field (``asdict`` deep-copies: a journal of 1,024 devices is rewritten
    before each of its sysfs writes)."""
    devices = [
        {"address": d.address, "target": d.target, "override": d.override,
         "writes_done": d.writes_done, "next": d.next}
        for d in op.devices
    ]  # fmt: skip
    return {
        "id": op.id, "kind": op.kind, "owner": op.runner, "pid": op.pid,
        "started": op.started, "devices": devices, "failed": op.failed,
    }  # fmt: skip


def _original_from_json(data: object) -> OriginalDriver:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    return OriginalDriver(**data)


def _operation_from_json(data: object) -> Operation:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    devices = data.get("devices")
    if not isinstance(devices, list):
        raise TypeError("no device list")
    op = Operation(
        id=str(data["id"]),
        kind=str(data["kind"]),
        runner=str(data["owner"]),
        pid=int(data["pid"]),
        started=float(data["started"]),
        devices=[OpDevice(**d) for d in devices],
        failed=None if data.get("failed") is None else str(data["failed"]),
    )
    if op.kind not in ("bind", "unbind"):
        raise ValueError(f"unknown operation kind {op.kind!r}")
    for d in op.devices:
        PciAddress.parse(d.address)
    return op


class StateStore:
    def __init__(self, root: Root) -> None:
        self.root = root
        self.files = RecordFiles(root)
        self._journal_lock = threading.Lock()  # guards the journals in memory and the counts
        self._commit_lock = threading.Lock()  # one journal write at a time
        #: per journal id: changes made in memory, and how many of them are on disk
        self._changes: dict[str, int] = {}
        self._saved: dict[str, int] = {}
        #: per journal id: its device list and each device by address (a step finds its
        #: device at once among 1,024)
        self._index: dict[str, tuple[list[OpDevice], dict[str, OpDevice]]] = {}

    @property
    def state_dir(self) -> str:
        return self.root.path(*ORIGINAL_DIR)

    @property
    def ops_dir(self) -> str:
        return self.root.path(*OPS_DIR)

    @property
    def lock_dir(self) -> str:
        return self.root.path(*LOCK_DIR)

    def _file(self, address: PciAddress) -> str:
        return f"{self.state_dir}/{address}.json"

    # -- original drivers ----------------------------------------------------------------
    def get(self, address: PciAddress) -> OriginalDriver | None:
        fix = f"restore by hand: vfioctl unbind --driver NAME {address}, then remove it"
        return self.files.load(ORIGINAL_DIR, f"{address}.json", fix, _original_from_json)

    def all(self) -> dict[PciAddress, OriginalDriver]:
        """Every readable record, by address (see :meth:`problems` for the unreadable)."""
        out: dict[PciAddress, OriginalDriver] = {}
        for addr in self.files.keys(ORIGINAL_DIR, PciAddress.parse):
            try:
                rec = self.get(addr)
            except HostError:
                continue
            if rec is not None:
                out[addr] = rec
        return out

    def holders(self) -> dict[PciAddress, str]:
        """Every device with a readable bind record → its holder (``bound_by``): read here,
        so a read-only ``vfioctl list`` naming holders loads no writer (:mod:`.ledger`)."""
        return {a: rec.bound_by for a, rec in self.all().items()}

    def put(self, record: OriginalDriver) -> None:
        """Write atomically: temp file + fsync + rename + fsync(dir)."""
        import json

        address = PciAddress.parse(record.address)
        data = json.dumps(asdict(record), sort_keys=True).encode()
        self.files.write(ORIGINAL_DIR, f"{address}.json", data)

    def put_many(self, records: Sequence[OriginalDriver]) -> None:
        """:meth:`put` of every record, made durable together (their ``fsync`` calls at once,
        the directory synced once: :meth:`RecordFiles.write_many`)."""
        import json

        self.files.write_many(
            ORIGINAL_DIR,
            [
                (
                    f"{PciAddress.parse(r.address)}.json",
                    json.dumps(asdict(r), sort_keys=True).encode(),
                )
                for r in records
            ],
        )

    def remove(self, address: PciAddress) -> None:
        self.files.remove(ORIGINAL_DIR, f"{address}.json")

    # -- operation journal ---------------------------------------------------------------
    def begin(self, kind: str, runner: str, devices: list[OpDevice]) -> Operation:
        """Write the journal of a new operation (before its first sysfs write)."""
        op = Operation(
            id=f"{time.time_ns():x}-{os.getpid()}",
            kind=kind,
            runner=runner,
            pid=os.getpid(),
            started=time.time(),
            devices=devices,
        )
        self.save(op)
        return op

    def save(self, op: Operation) -> None:
        """Rewrite ``op``'s journal (atomically; threads of one operation take turns)."""
        with self._journal_lock:
            self._changes[op.id] = self._changes.get(op.id, 0) + 1
            mine = self._changes[op.id]
        self._commit(op, mine)

    def _commit(self, op: Operation, mine: int) -> None:
        """Make ``op``'s journal on disk hold its ``mine``-th change (group commit): the
        threads of one operation (one per IOMMU group: :meth:`Binder.bind_all`) that change
        it while another writes it are all written by the next write, one ``fsync`` for
        them all; each returns once a write that holds its change is durable."""
        import json

        with self._commit_lock:
            if self._saved.get(op.id, 0) >= mine:
                return  # written, with ours, while we waited
            with self._journal_lock:
                upto = self._changes.get(op.id, mine)
                data = json.dumps(_operation_to_json(op), sort_keys=True).encode()
            self.files.write(OPS_DIR, f"{op.id}.json", data)
            self._saved[op.id] = upto

    def step(self, op: Operation, address: str, writes_done: int, next_write: str | None) -> None:
        """Record, durably, that ``address`` has made ``writes_done`` writes and is about to
        make ``next_write`` (called before each sysfs write; concurrent steps of one
        operation share a write: :meth:`_commit`)."""
        self.steps(op, [(address, writes_done, next_write)])

    def steps(self, op: Operation, moves: Sequence[tuple[str, int, str | None]]) -> None:
        """:meth:`step` of each ``(address, writes_done, next_write)``, in ONE durable write
        of the journal (a bind pass's next write of every group, made together)."""
        with self._journal_lock:
            if (at := self._index.get(op.id)) is None or at[0] is not op.devices:
                at = self._index[op.id] = (op.devices, {d.address: d for d in op.devices})
            for address, writes_done, next_write in moves:
                d = at[1].get(address)
                if d is None:
                    d = OpDevice(address, None, None, writes_done, next_write)
                    op.devices.append(d)
                    at[1][address] = d
                d.writes_done, d.next = writes_done, next_write
            self._changes[op.id] = self._changes.get(op.id, 0) + 1
            mine = self._changes[op.id]
        self._commit(op, mine)

    def finish(self, op: Operation) -> None:
        """The operation is complete (or fully rolled back): remove its journal."""
        self.files.remove(OPS_DIR, f"{op.id}.json")
        with self._journal_lock:
            for counts in (self._changes, self._saved, self._index):
                counts.pop(op.id, None)

    def operations(self) -> tuple[list[Operation], list[str]]:
        """Every journal on disk, and a message for each unreadable one (kept as it is)."""
        fix = f"the original drivers are in {self.state_dir}: restore with vfioctl unbind <address>"
        return self.files.load_all(OPS_DIR, str, _operation_from_json, lambda _id: fix)

    def problems(self) -> list[str]:
        """A message for every unreadable original-driver record (each is kept) and every
        odd file beside them."""
        return self._problems(odd=True)

    def unreadable(self) -> list[str]:
        """A message for every bind record that exists but cannot be read (a FIFO, a
        directory, a link, not JSON): each names the file, its device and the fix."""
        return self._problems(odd=False)

    def _problems(self, *, odd: bool) -> list[str]:
        out = []
        for name in self.files.names(ORIGINAL_DIR):
            if not name.endswith(".json") or name.startswith("."):
                continue
            try:
                self.get(PciAddress.parse(name[:-5]))
            except AddressError:
                if odd:
                    out.append(f"odd file {self.state_dir}/{name} (not <address>.json); ignored")
            except HostError as e:
                out.append(str(e))
        return out

    def busy(self, addresses: list[PciAddress]) -> bool:
        """Does a live process hold any of these devices' locks (an operation in progress)?"""
        try:
            dfd = self.root.open_dir(*LOCK_DIR)
        except (OSError, PathEscapeError):
            return False  # no lock directory (e.g. after a reboot): nobody holds a lock
        try:
            for addr in addresses:
                try:
                    fd = os.open(f"{addr}.lock", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
                except OSError:
                    continue
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                except OSError as e:
                    if e.errno in (errno.EAGAIN, errno.EACCES):
                        return True
                    raise
                finally:
                    os.close(fd)  # also drops our probe lock
            return False
        finally:
            os.close(dfd)

    # -- locks ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(
        self, addresses: Sequence[PciAddress] | Sequence[str], timeout: float = 10.0
    ) -> Iterator[None]:
        """Hold the per-device locks of ``addresses`` (taken in sorted order: no deadlock);
        an mdev parent's lock is named by the parent (``mtty.lock``)."""
        fds: list[int] = []
        try:
            dfd = self.root.open_dir(*LOCK_DIR, create=True)
        except OSError as e:
            raise StateWriteError(write_failure(self.lock_dir, e)) from e
        try:
            for addr in sorted({str(a) for a in addresses}):
                try:
                    fd = os.open(
                        f"{addr}.lock",
                        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o600,
                        dir_fd=dfd,
                    )
                except OSError as e:
                    raise StateWriteError(write_failure(f"{self.lock_dir}/{addr}.lock", e)) from e
                fds.append(fd)
                deadline = time.monotonic() + timeout
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except OSError as e:
                        if e.errno not in (errno.EAGAIN, errno.EACCES):
                            raise
                        if time.monotonic() >= deadline:
                            raise LockTimeoutError(
                                f"{addr} is locked by another vfioctl or the vfio_dp daemon "
                                f"({self.lock_dir}/{addr}.lock) for over {timeout:g}s; "
                                "wait for it to finish and retry"
                            ) from None
                        time.sleep(0.05)
            yield
        finally:
            os.close(dfd)
            for fd in fds:
                os.close(fd)
