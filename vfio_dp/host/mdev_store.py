"""The durable mdev state: the instances vfio_dp made, and the journal of a create or remove
while it runs. Both under the root, written whole or not at all (:class:`RecordFiles`).

- ``<root>/var/lib/vfio_dp/mdev/<uuid>.json`` -- the record of an instance we made, kept
  while we answer for it (it is re-made with this UUID at the next start when it is gone:
  instances vanish at reboot)::

      {"uuid": "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001", "parent": "mtty",
       "type_id": "mtty-2", "by": "operator"}

- ``<root>/var/lib/vfio_dp/mdev/ops/<uuid>.json`` -- the journal of one create or remove,
  written before its sysfs write, removed when it finished::

      {"action": "create", "uuid": "83b8…", "parent": "mtty", "type_id": "mtty-2",
       "owner": "operator", "pid": 812, "started": 1763898000.1, "previous": null,
       "record": {"uuid": "83b8…", "parent": "mtty", "type_id": "mtty-2", "by": "operator"}}

  One left behind while nobody holds the parent's lock (``<root>/run/vfio_dp/<parent>.lock``)
  is an interrupted operation: :meth:`vfio_dp.host.mdev_ops.Mdevs.recover` finishes it
  when the kernel made the change, else undoes it (the record back to ``previous``).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root
from vfio_dp.model.mdev import CREATE, REMOVE, MdevOp, MdevRecord, is_uuid

RECORD_DIR = (*STATE_DIR, "mdev")
OPS_DIR = (*RECORD_DIR, "ops")
_MAX = 1 << 16


def _record_fix(uuid: str) -> str:
    return f"check /sys/bus/mdev/devices/{uuid} by hand, then remove the file"


def _record(data: object) -> MdevRecord:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    rec = MdevRecord(
        uuid=str(data["uuid"]),
        parent=str(data["parent"]),
        type_id=str(data["type_id"]),
        by=str(data["by"]),
    )
    if not is_uuid(rec.uuid) or "/" in rec.parent or "/" in rec.type_id:
        raise ValueError(f"not an mdev record: {rec}")
    return rec


def _op(data: object) -> MdevOp:
    if not isinstance(data, dict):
        raise TypeError("not a JSON object")
    prev, rec = data.get("previous"), data.get("record")
    op = MdevOp(
        action=str(data["action"]),
        uuid=str(data["uuid"]),
        parent=str(data["parent"]),
        type_id=str(data["type_id"]),
        runner=str(data["owner"]),
        pid=int(data["pid"]),
        started=float(data["started"]),
        previous=None if prev is None else _record(prev),
        record=None if rec is None else _record(rec),
    )
    if op.action not in (CREATE, REMOVE) or not is_uuid(op.uuid):
        raise ValueError(f"not an mdev journal: {op.action} {op.uuid}")
    return op


class MdevStore:
    """Records and journals of mdev instances beneath ``root`` (the module docstring)."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.files = RecordFiles(root, _MAX)

    def shown(self, parts: tuple[str, ...], uuid: str) -> str:
        return f"{self.root.path(*parts)}/{uuid}.json"

    @staticmethod
    def _uuid(stem: str) -> str:
        if not is_uuid(stem):
            raise ValueError(f"not a UUID: {stem!r}")
        return stem

    def _uuids(self, parts: tuple[str, ...]) -> list[str]:
        return self.files.keys(parts, self._uuid)

    # -- records -----------------------------------------------------------------------
    def get(self, uuid: str) -> MdevRecord | None:
        """The instance's record (None: not ours); :class:`CorruptRecordError` when it
        cannot be read."""
        return self.files.load(RECORD_DIR, f"{uuid}.json", _record_fix(uuid), _record)

    def put(self, rec: MdevRecord) -> None:
        self.files.write(RECORD_DIR, f"{rec.uuid}.json", json.dumps(asdict(rec)).encode())

    def remove(self, uuid: str) -> None:
        self.files.remove(RECORD_DIR, f"{uuid}.json")

    def recorded(self) -> list[str]:
        """The UUIDs with a record."""
        return self._uuids(RECORD_DIR)

    def records(self) -> tuple[list[MdevRecord], list[str]]:
        """Every readable record, and a problem per unreadable one."""
        return self.files.load_all(RECORD_DIR, self._uuid, _record, _record_fix)

    # -- journal -----------------------------------------------------------------------
    def begin(self, op: MdevOp) -> None:
        data = asdict(op)
        data["owner"] = data.pop("runner")
        self.files.write(OPS_DIR, f"{op.uuid}.json", json.dumps(data).encode())

    def finish(self, op: MdevOp) -> None:
        self.files.remove(OPS_DIR, f"{op.uuid}.json")

    def op(self, uuid: str) -> MdevOp | None:
        """The instance's interrupted operation (None: none); :class:`CorruptRecordError`
        when its journal cannot be read."""
        fix = f"check /sys/bus/mdev/devices/{uuid} by hand, then remove the journal"
        return self.files.load(OPS_DIR, f"{uuid}.json", fix, _op)

    def journaled(self) -> list[str]:
        """The UUIDs with a journal (an operation running, or interrupted)."""
        return self._uuids(OPS_DIR)
