"""The DRA plugin's checkpoint: which claims it prepared, with what, in which boot.

``<root>/var/lib/vfio_dp/dra-<driver>.checkpoint.json``, rewritten whole and atomically
(:meth:`vfio_dp.host.records.RecordFiles.write`, fsynced) before any change is reported done --
one claim record per line; its format, the records and their one parser are
:mod:`vfio_dp.dra.claimpath.checkpoint_format` (re-exported here).

``state`` is ``preparing`` from before the first bind until the CDI spec and metadata are
written, then ``prepared``; a crash in between leaves ``preparing`` for reconcile to finish or
undo. ``releasing``: kubelet unprepared the claim but a group it bound was still held open;
reconcile gives it back once nobody holds it. Each claim carries the boot ID (``<root>/proc/sys/kernel/random/boot_id``) it was
prepared or last verified in: after a reboot the IOMMU group numbers and drivers may have
changed, so a claim from another boot is *untrusted* until it has been re-verified against
the hardware (:meth:`Checkpoint.untrusted`, :meth:`Checkpoint.mark_verified`).

Who bound a device is NOT here: it is in the bind record (``bound_by``), the one source of
truth the restore follows; the checkpoint only says what each claim was answered.
The file is read and written only through the root (:meth:`vfio_dp.host.root.Root.open_dir`,
like the bind records): a ``var/lib/vfio_dp`` that links out of ``--root`` is refused
(:class:`~vfio_dp.errors.PathEscapeError`), nothing is written there. It is opened
non-blocking and must be a regular file: a FIFO, directory, device or symlink at its path is
moved aside like a checkpoint that cannot be parsed (``.corrupt-<time>``), reported, and the
plugin starts empty: the bind records and the files on disk still let reconcile undo what
claims bound. One record that does not parse (an address from another boot that is not an
address) is skipped, reported, and kept in the file as it was (:attr:`Checkpoint.bad`).

Changes made at the same time are written together (group commit): :meth:`Checkpoint.put`
and :meth:`Checkpoint.remove` return once a write holding their change is on disk. A kubelet
call stages its claims' changes in memory (:meth:`Checkpoint.stage`, ``stage_remove``) and
makes them durable with ONE write before it answers (:meth:`Checkpoint.commit`,
:class:`vfio_dp.dra.claimpath.commit.CallCommit`); a record staged unchanged is no change.
Each record's JSON is encoded once while it does not change. A write that fails undoes every
change it carried, and each of their callers gets the error.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from vfio_dp.dra.claimpath.checkpoint_format import (
    MAX_BYTES,
    PREPARED,
    PREPARING,
    RELEASING,
    SWITCHED,
    VERSION,
    ClaimRecord,
    DeviceRecord,
    bad_message,
    claim_to_json,
    parse,
)
from vfio_dp.errors import DraError, PathEscapeError, StateWriteError
from vfio_dp.host.files import NotRegularFileError
from vfio_dp.host.host import read_boot_id
from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root
from vfio_dp.model import naming

if TYPE_CHECKING:
    from vfio_dp.host import Host

__all__ = [
    "PREPARED",
    "PREPARING",
    "RELEASING",
    "SWITCHED",
    "Checkpoint",
    "ClaimRecord",
    "DeviceRecord",
    "names",
    "peek",
    "read_only",
]

_Undo = tuple[str, "ClaimRecord | None", "tuple[str, object] | None"]  # uid, was, was bad


class Checkpoint:
    """The claims this plugin prepared, kept in memory and on disk; thread-safe."""

    def __init__(self, root: Root, driver: str) -> None:
        self._setup(root, read_boot_id(root), driver)

    @classmethod
    def for_host(cls, host: Host, driver: str) -> Checkpoint:
        """The checkpoint of ``driver`` under ``host``'s root, stamped with its boot ID."""
        self = cls.__new__(cls)
        self._setup(host.fs, host.boot_id(), driver)
        return self

    def _setup(self, root: Root, boot_id: str, driver: str) -> None:
        self.root = root
        self.files = RecordFiles(root, MAX_BYTES)
        self.name = naming.dra_checkpoint_file(driver)
        self.path = root.path(*STATE_DIR, self.name)
        self.driver = naming.check_dra_driver_name(driver)
        self.boot_id = boot_id
        self._lock = threading.Lock()
        self._claims: dict[str, ClaimRecord] = {}
        self._bad: dict[str, tuple[str, object]] = {}  # key → (why, the record as read)
        self._encoded: dict[str, str] = {}  # uid → its record's JSON, while unchanged
        # group commit: changes numbered, written by whoever holds _write_lock
        self._write_lock = threading.Lock()
        self._gen = 0  # the last change made in memory
        self._durable = 0  # the last change on disk
        self._last: dict[str, int] = {}  # uid → the number of its last change
        self._pending: list[tuple[int, _Undo]] = []
        self._failed: dict[int, BaseException] = {}  # changes a failed write carried
        self.problems: list[str] = []  # what load() had to set aside, for the log

    def load(self) -> dict[str, ClaimRecord]:
        """Read the file (absent: empty), through the root (:meth:`Root.open_dir`: a state
        directory that links out of the root raises :class:`PathEscapeError`). A file that
        cannot be parsed, or that is not a regular file (a FIFO, a directory, a link), is
        moved aside and reported in :attr:`problems` -- never opened blocking; the plugin
        starts empty rather than refusing to start. One record that does not parse is
        skipped and reported (:attr:`bad`), kept in the file as it was."""
        try:
            raw = self.files.read(STATE_DIR, self.name)
        except NotRegularFileError as e:
            self._aside(f"not a regular file: {e}")
            return self._set({}, {})
        except OSError as e:
            raise DraError(f"cannot read the DRA checkpoint {self.path}: {e.strerror or e}") from e
        if raw is None:
            return self._set({}, {})
        try:
            claims, bad = parse(raw)
        except (ValueError, TypeError, KeyError, DraError) as e:
            self._aside(str(e))
            return self._set({}, {})
        for key, why in bad.items():
            self.problems.append(bad_message(self.path, key, why[0]))
        return self._set(claims, bad)

    def _set(
        self, claims: dict[str, ClaimRecord], bad: dict[str, tuple[str, object]]
    ) -> dict[str, ClaimRecord]:
        with self._lock:
            self._claims = claims
            self._bad = bad
            self._encoded.clear()
            return dict(claims)

    def _aside(self, why: str) -> None:
        try:
            aside = self.files.set_aside(
                STATE_DIR, self.name, f"{self.name}.corrupt-{int(time.time())}"
            )
        except OSError as e:
            raise DraError(
                f"the DRA checkpoint {self.path} is unusable ({why}) and cannot be moved "
                f"aside: {e.strerror or e}; remove it and restart the plugin"
            ) from e
        self.problems.append(
            f"unreadable DRA checkpoint moved to {aside} ({why}); "
            "starting empty -- reconcile still restores devices claims bound (their bind "
            "records say so)"
        )

    @property
    def bad(self) -> dict[str, str]:
        """Records :meth:`load` could not parse: their key → why (kept on disk as they were
        until kubelet prepares or unprepares that UID again)."""
        with self._lock:
            return {k: why for k, (why, _) in self._bad.items()}

    def _body(self) -> bytes:
        """The file's bytes from memory (under ``_lock``): one claim per line, sorted."""
        lines = []
        for key in sorted(self._claims.keys() | self._bad.keys()):
            enc = self._encoded.get(key)
            if enc is None:
                rec = self._claims.get(key)
                raw = claim_to_json(rec) if rec is not None else self._bad[key][1]
                enc = json.dumps(raw, sort_keys=True, separators=(",", ":"))
                if rec is not None:
                    self._encoded[key] = enc
            lines.append(f"  {json.dumps(key)}: {enc}")
        claims = "{\n" + ",\n".join(lines) + "\n }" if lines else "{}"
        head = json.dumps(self.driver)
        return f'{{"claims": {claims},\n "driver": {head},\n "version": {VERSION}}}\n'.encode()

    def _change(self, uid: str, record: ClaimRecord | None) -> int:
        """Set (``record``) or drop (None) ``uid`` in memory (under ``_lock``), remembering
        how to undo it; returns the change's number for :meth:`commit`."""
        undo = (uid, self._claims.get(uid), self._bad.get(uid))
        if record is None:
            self._claims.pop(uid, None)
        else:
            self._claims[uid] = record
        self._bad.pop(uid, None)  # prepared or unprepared again: a bad record is replaced
        self._encoded.pop(uid, None)
        self._gen += 1
        self._pending.append((self._gen, undo))
        if record is None:
            self._last.pop(uid, None)
        else:
            self._last[uid] = self._gen
        return self._gen

    def commit(self, gen: int) -> None:
        """Return once change ``gen`` is on disk, writing it (and every change made since the
        last write) when no earlier write holds it; raise the write's error if it failed.
        Blocking (an fsync); every number :meth:`stage` gave must be committed once."""
        with self._write_lock:
            failed = self._failed.pop(gen, None)
            if failed is not None:
                raise failed
            if self._durable >= gen:
                return
            with self._lock:
                data = self._body()
                batch, self._pending = self._pending, []
                upto = self._gen
            try:
                self._write(data)
            except BaseException as e:
                with self._lock:  # undo the batch, newest first, where nothing newer replaced it
                    newer = {undo[0] for _g, undo in self._pending}
                    for _g, (uid, claim, bad) in reversed(batch):
                        if uid in newer:
                            continue
                        self._claims.pop(uid, None)
                        if claim is not None:
                            self._claims[uid] = claim
                        self._bad.pop(uid, None)
                        if bad is not None:
                            self._bad[uid] = bad
                        self._encoded.pop(uid, None)
                        self._last.pop(uid, None)  # what is restored was on disk
                for g, _undo in batch:
                    if g != gen:
                        self._failed[g] = e
                raise
            self._durable = upto

    def _write(self, data: bytes) -> None:
        try:
            self.files.write(STATE_DIR, self.name, data)
        except StateWriteError as e:  # the claim path's errors are DraErrors
            raise DraError(str(e)) from e

    def get(self, uid: str) -> ClaimRecord | None:
        with self._lock:
            return self._claims.get(uid)

    def all(self) -> Mapping[str, ClaimRecord]:
        with self._lock:
            return dict(self._claims)

    def stage(self, record: ClaimRecord) -> int:
        """Store (replace) ``record`` stamped with the current boot ID, in memory only;
        returns the change's number for :meth:`commit` (the number of the record's last
        change when it is stored unchanged: nothing new to write)."""
        stamped = replace(record, boot_id=self.boot_id)
        with self._lock:
            if self._claims.get(record.uid) == stamped:  # as on disk, or staged by a peer
                return self._last.get(record.uid, 0)
            return self._change(record.uid, stamped)

    def stage_remove(self, uid: str) -> int | None:
        """Forget a claim in memory only: the number for :meth:`commit`, None when it was
        not there."""
        with self._lock:
            if uid not in self._claims and uid not in self._bad:
                return None
            return self._change(uid, None)

    def put(self, record: ClaimRecord) -> ClaimRecord:
        """Store (replace) ``record`` stamped with the current boot ID, durably before
        returning; returns what was stored."""
        self.commit(self.stage(record))
        return replace(record, boot_id=self.boot_id)

    def remove(self, uid: str) -> bool:
        """Forget a claim durably; False when it was not there."""
        with self._lock:
            present = uid in self._claims
        gen = self.stage_remove(uid)
        if gen is None:
            return False
        self.commit(gen)
        return present

    def trusted(self, record: ClaimRecord) -> bool:
        """Prepared or verified in this boot (and the kernel told us which boot this is)."""
        return bool(self.boot_id) and record.boot_id == self.boot_id

    def untrusted(self) -> list[ClaimRecord]:
        """Claims from another boot: re-verify each against the hardware before trusting it."""
        with self._lock:
            return [c for c in self._claims.values() if not self.trusted(c)]

    def mark_verified(self, uid: str) -> None:
        """The claim's devices were checked against this boot's hardware: trust it."""
        rec = self.get(uid)
        if rec is not None:
            self.put(rec)


def peek(host: Host, driver: str) -> tuple[list[ClaimRecord], str | None]:
    """The checkpointed claims, read-only (``vfioctl``: never moves a bad file aside, never
    writes): (records, None), or (records, why) when the file or some of its records cannot
    be read or parsed."""
    return read_only(host.fs, naming.dra_checkpoint_file(driver))


def names(root: Root) -> dict[str, str]:
    """Every checkpoint file in ``<root>/var/lib/vfio_dp`` → its DRA driver name (listed
    inside the root; none when the directory is absent or unusable)."""
    prefix, suffix = "dra-", ".checkpoint.json"  # naming.dra_checkpoint_file, read back
    return {
        n: n[len(prefix) : -len(suffix)]
        for n in RecordFiles(root).names(STATE_DIR)
        if n.startswith(prefix) and n.endswith(suffix) and len(n) > len(prefix) + len(suffix)
    }


def read_only(root: Root, name: str) -> tuple[list[ClaimRecord], str | None]:
    """The claims of the checkpoint file ``name`` under ``root``, read-only, never blocking
    (a FIFO, a directory or a link at its path is not opened): (records, None), or
    (records, why) when the file or some of its records cannot be read or parsed -- the
    one parser every reader shares (:func:`~vfio_dp.dra.claimpath.checkpoint_format.parse`)."""
    path = root.path(*STATE_DIR, name)
    try:
        raw = RecordFiles(root, MAX_BYTES).read(STATE_DIR, name)
    except (OSError, PathEscapeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        return [], f"cannot read the DRA checkpoint {path}: {why}"
    if raw is None:
        return [], None
    try:
        claims, bad = parse(raw)
    except (ValueError, TypeError, KeyError, AttributeError, DraError) as e:
        return [], f"the DRA checkpoint {path} is unreadable ({e})"
    problem = "; ".join(bad_message(path, k, why) for k, (why, _) in bad.items()) or None
    return list(claims.values()), problem
