"""The durable SR-IOV state: what vfio_dp did to each PF's VF count, and the journal of a
count change while it runs. Both under the root, both written whole or not at all
(:func:`vfio_dp.host.atomic.replace_at` in a directory opened with :meth:`Root.open_dir`).

- ``<root>/var/lib/vfio_dp/sriov/<pf>.json`` — the record, kept while the PF is not at the
  count it had before we first changed it::

      {"address": "0000:01:00.0", "before": 0, "autoprobe_before": 1, "count": 2,
       "by": "daemon:devicePlugin"}

  ``vfioctl unbind --all``, uninstall and the daemon (for a PF the config no longer asks VFs
  of) put the PF back to ``before`` and its ``sriov_drivers_autoprobe`` to
  ``autoprobe_before``, then remove the record.
- ``<root>/var/lib/vfio_dp/sriov/ops/<pf>.json`` — the journal of one count change, written
  before its first sysfs write and again before each write; removed when it finished::

      {"pf": "0000:01:00.0", "owner": "daemon", "pid": 812, "started": 1763898000.1,
       "from_count": 0, "from_autoprobe": 1, "previous": null,
       "writes": [["sriov_drivers_autoprobe", 0], ["sriov_numvfs", 2]], "done": 1}

  One left behind while nobody holds the PF's lock (``<root>/run/vfio_dp/<pf>.lock``, the
  same lock binds take) is an interrupted change: :meth:`Sriov.recover` puts the PF back to
  ``from_count`` / ``from_autoprobe`` and the record back to ``previous``.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress
from vfio_dp.model.sriov import SriovRecord

RECORD_DIR = (*STATE_DIR, "sriov")
OPS_DIR = (*RECORD_DIR, "ops")
_MAX = 1 << 16


@dataclass(slots=True)
class SriovOp:
    """The journal of one count change (see the module docstring)."""

    pf: str
    runner: str  # who runs it; stored as the journal's "owner" field (every release's)
    pid: int
    started: float
    from_count: int
    from_autoprobe: int | None
    previous: SriovRecord | None
    writes: list[tuple[str, int]] = field(default_factory=list)
    done: int = 0

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (
            f"SR-IOV count change of {self.pf} by {self.runner} (pid {self.pid}) started {when}, "
            f"{self.done} of {len(self.writes)} writes made"
        )


def _record(data: object) -> SriovRecord:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    rec = SriovRecord(
        address=str(PciAddress.parse(str(data["address"]))),
        before=int(data["before"]),
        autoprobe_before=None
        if data.get("autoprobe_before") is None
        else int(data["autoprobe_before"]),
        count=int(data["count"]),
        by=str(data["by"]),
    )
    if rec.before < 0 or rec.count < 0:
        raise ValueError("negative count")
    return rec


def _op_to_json(op: SriovOp) -> dict[str, object]:
    data = asdict(op)
    data["owner"] = data.pop("runner")  # the journal's field name, as every release wrote it
    return data


def _op(data: object) -> SriovOp:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    prev = data.get("previous")
    return SriovOp(
        pf=str(PciAddress.parse(str(data["pf"]))),
        runner=str(data["owner"]),
        pid=int(data["pid"]),
        started=float(data["started"]),
        from_count=int(data["from_count"]),
        from_autoprobe=None if data.get("from_autoprobe") is None else int(data["from_autoprobe"]),
        previous=None if prev is None else _record(prev),
        writes=[(str(a), int(v)) for a, v in data.get("writes", [])],
        done=int(data.get("done", 0)),
    )


class SriovStore:
    def __init__(self, root: Root) -> None:
        self.root = root
        self.files = RecordFiles(root, _MAX)

    def shown(self, parts: tuple[str, ...], address: str) -> str:
        return f"{self.root.path(*parts)}/{address}.json"

    def _write(self, parts: tuple[str, ...], name: str, value: object) -> None:
        self.files.write(parts, name, json.dumps(value, sort_keys=True).encode())

    def _addresses(self, parts: tuple[str, ...]) -> list[PciAddress]:
        """The PFs with a file in ``parts`` (names that are not addresses are ignored)."""
        return self.files.keys(parts, PciAddress.parse)

    # -- records -----------------------------------------------------------------------
    def get(self, pf: PciAddress) -> SriovRecord | None:
        """The PF's record (None: none); :class:`CorruptRecordError` when it cannot be read
        (a FIFO, a directory or a link where it should be is never opened blocking)."""
        fix = f"set the count by hand (echo N > .../{pf}/sriov_numvfs), then remove it"
        return self.files.load(RECORD_DIR, f"{pf}.json", fix, _record)

    def put(self, rec: SriovRecord) -> None:
        self._write(RECORD_DIR, f"{rec.address}.json", asdict(rec))

    def remove(self, pf: PciAddress) -> None:
        self.files.remove(RECORD_DIR, f"{pf}.json")

    def recorded(self) -> list[PciAddress]:
        """Every PF with a record (names that are not addresses are ignored)."""
        return self._addresses(RECORD_DIR)

    # -- journal -----------------------------------------------------------------------
    def begin(self, op: SriovOp) -> None:
        self._write(OPS_DIR, f"{op.pf}.json", _op_to_json(op))

    def step(self, op: SriovOp, done: int) -> None:
        op.done = done
        self._write(OPS_DIR, f"{op.pf}.json", _op_to_json(op))

    def finish(self, op: SriovOp) -> None:
        self.files.remove(OPS_DIR, f"{op.pf}.json")

    def op(self, pf: PciAddress) -> SriovOp | None:
        """The PF's interrupted change (None: none); :class:`CorruptRecordError` when its
        journal cannot be read."""
        fix = "check the PF's sriov_numvfs by hand, then remove the journal"
        return self.files.load(OPS_DIR, f"{pf}.json", fix, _op)

    def journaled(self) -> list[PciAddress]:
        """Every PF with an interrupted change's journal."""
        return self._addresses(OPS_DIR)
