"""The allocation record on disk: ``<root>/var/lib/vfio_dp/allocations.json``.

Written atomically (temp file in the same directory, fsync, rename, fsync of the directory)
on the host's disk (the DaemonSet mounts the host root), so it survives node reboots like the
kubelet's checkpoint. The format and its meaning are in :mod:`vfio_dp.deviceplugin.allocation`.

Write-behind, on purpose: Allocate updates the in-memory record (what PreStartContainer in
this boot checks) and a writer persists it right after, off the request path — an fsync costs
1.5-12 ms on these disks, more than the whole Allocate budget. The window is safe: if the node
dies before the write lands, the replayed response finds either no record or an older one for
that ID, and PreStartContainer fails loudly ("no record" / "renumbered") — never a wrong
device. ``flush()`` runs on stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

from vfio_dp.deviceplugin.allocation import (
    AllocationRecord,
    Grant,
    record_from_json,
    record_grants,
    record_to_json,
)
from vfio_dp.errors import VfioError
from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root

log = logging.getLogger("vfio_dp.core")

RECORD_PATH = (*STATE_DIR, "allocations.json")
_MAX_BYTES = 64 << 20  # ~300 bytes a grant: far more grants than a node can hold


class AllocationStore:
    """Load once, keep in memory, rewrite atomically on every Allocate."""

    def __init__(self, root: Root) -> None:
        # every open is resolved inside the root: a symlinked var/lib/vfio_dp cannot send
        # the record (or its read) outside it (PathEscapeError, an OSError's sibling: logged)
        self.fs = root
        self.files = RecordFiles(root, _MAX_BYTES)
        self.path = root.path(*RECORD_PATH)
        self.record: AllocationRecord = {}
        self.problem: str | None = None
        self.dirty = False
        # flushes come from the executor (behind Allocate) and from stop(): one at a time, so
        # stop() waits for a write in progress instead of seeing "clean" and leaving early
        self._flush_lock = threading.Lock()

    def load(self) -> None:
        """Read ``<root>/var/lib/vfio_dp/allocations.json``; a missing file is an empty record.
        Read through :class:`~vfio_dp.host.records.RecordFiles` (inside the root, never
        blocking: a FIFO, a directory or a link there is reported, not opened)."""
        try:
            raw = self.files.read(RECORD_PATH[:-1], RECORD_PATH[-1])
            if raw is not None and len(raw) > _MAX_BYTES:
                raise ValueError(f"larger than {_MAX_BYTES} bytes")
            self.record = {} if raw is None else record_from_json(raw.decode())
        except (OSError, ValueError, KeyError, TypeError, VfioError) as e:
            self.problem = f"{self.path} is unreadable ({e}); PreStartContainer cannot verify"
            log.error("%s: treating it as empty", self.problem)
            self.record = {}

    def add(self, grants: Sequence[Grant]) -> None:
        """Record ``grants`` in memory; :meth:`flush` makes it durable."""
        self.record = record_grants(self.record, grants)
        self.dirty = True

    def flush(self) -> None:
        """Write the record if it changed (raises OSError when the disk refuses)."""
        with self._flush_lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        record = self.record
        try:
            self.files.write(RECORD_PATH[:-1], RECORD_PATH[-1], record_to_json(record).encode())
        except VfioError as e:  # full, read-only, or the state dir leads out of the root
            raise OSError(f"cannot write {self.path}: {e}") from e
        del record
