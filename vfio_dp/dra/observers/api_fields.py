"""What the API server keeps of the fields the DRA plugin publishes, for ``vfioctl list``.

A cluster with ``DRAPartitionableDevices`` or ``DRADeviceBindingConditions`` off drops the
counter or binding fields of a ResourceSlice on write; the publisher sees it in the
server's answer (:func:`vfio_dp.dra.personalities.dropped`), says it once in its log, and
publishes each group in its first personality only. The plugin records what it found (the
one writer of this file: :class:`ApiFieldsStore`), so ``vfioctl list`` -- which never talks
to the API server -- can say it too::

    <root>/var/lib/vfio_dp/dra-<driver>.api.json
    {"version": 1, "counters": false, "binding": false}

Rewritten whenever what the server keeps changes (a gate turned on, a plugin restarted on
an upgraded cluster: ``true`` again); absent until the plugin has published once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from vfio_dp.errors import PathEscapeError
from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root
from vfio_dp.model.naming import check_dra_driver_name

VERSION = 1


def file_name(driver: str) -> str:
    """``dra-<driver>.api.json``."""
    return f"dra-{check_dra_driver_name(driver)}.api.json"


@dataclass(frozen=True, slots=True)
class ApiFields:
    """Does the API server keep the counter fields / the binding fields we send?"""

    counters: bool = True
    binding: bool = True

    def first_only(self, personalities: Sequence[str]) -> str | None:
        """Why a group offered in ``personalities`` (``["container", "vm"]``) is published
        in the first alone, naming each one left out (None: it is not)."""
        first, rest = personalities[0], [p for p in personalities[1:] if p != personalities[0]]
        if self.counters or not rest:
            return None
        return (
            "the API server drops ResourceSlice counters (DRAPartitionableDevices is off): "
            f"each group is published in its first personality only ({first}); "
            f"{' and '.join(rest)} left out (two entries of one device need a shared counter "
            "so that the scheduler never allocates both)"
        )


class ApiFieldsStore:
    """``<root>/var/lib/vfio_dp/dra-<driver>.api.json`` (the one reader and writer)."""

    def __init__(self, fs: Root, driver: str) -> None:
        self.files = RecordFiles(fs)
        self.name = file_name(driver)

    def get(self) -> ApiFields | None:
        """What the plugin last found; None: never recorded. Raises
        :class:`CorruptRecordError` for a file that does not parse."""
        try:
            raw = self.files.read(STATE_DIR, self.name)
            if raw is None:
                return None
            data = json.loads(raw)
            return ApiFields(bool(data["counters"]), bool(data["binding"]))
        except (OSError, PathEscapeError, ValueError, KeyError, TypeError) as e:
            raise self.files.unreadable(
                STATE_DIR, self.name, e, "remove it: the DRA plugin writes it again"
            ) from e

    def put(self, fields: ApiFields) -> None:
        data = {"version": VERSION, "counters": fields.counters, "binding": fields.binding}
        self.files.write(STATE_DIR, self.name, (json.dumps(data) + "\n").encode())
