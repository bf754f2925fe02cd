"""Binds that survive a reboot, on disk: the record and the udev rule (format:
:mod:`vfio_dp.model.persist`).

- ``<root>/var/lib/vfio_dp/persist.json`` -- the devices ``vfioctl bind --persist`` bound;
- ``<root>/etc/udev/rules.d/05-vfio-dp-persist.rules`` -- rewritten from the record on every
  change, removed with its last device.

Both are written atomically through the root (a ``var/lib/vfio_dp`` or ``etc/udev/rules.d``
that links out of it is refused). A record that does not parse is never applied nor
rewritten: :class:`~vfio_dp.errors.CorruptRecordError` names it and the fix.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from vfio_dp.errors import CorruptRecordError
from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import VFIO_PCI, PciDevice
from vfio_dp.model.persist import (
    PLAIN_MODULE,
    RULES_NAME,
    PersistedBind,
    drivers_to_json,
    from_json,
    to_json,
    udev_rules,
    with_drivers,
)

RECORD_NAME = "persist.json"
#: the VFIO driver of each persisted device not on plain vfio-pci (a file of its own:
#: ``persist.json`` keeps its exact fields for the previous release)
DRIVERS_NAME = "persist-drivers.json"
RULES_DIR = ("etc", "udev", "rules.d")
_MAX_BYTES = 4 << 20


class Persistence:
    """The persistent binds under one root."""

    def __init__(self, root: Root) -> None:
        self.root = root
        self.files = RecordFiles(root, _MAX_BYTES)
        self.record_path = root.path(*STATE_DIR, RECORD_NAME)
        self.rules_path = root.path(*RULES_DIR, RULES_NAME)

    def _read(self, name: str) -> bytes | None:
        """``<root>/var/lib/vfio_dp/<name>`` (None: absent), through RecordFiles: never
        blocking, never through a link."""
        try:
            return self.files.read(STATE_DIR, name)
        except OSError as e:
            raise CorruptRecordError(
                self.root.path(*STATE_DIR, name), str(e), "remove it and bind again with --persist"
            ) from e

    def load(self) -> dict[PciAddress, PersistedBind]:
        """The recorded devices (none when there is no record), each with its VFIO driver
        (``persist-drivers.json``; vfio-pci when it names none)."""
        raw = self._read(RECORD_NAME)
        if raw is None:
            return {}
        try:
            records = from_json(raw)
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise CorruptRecordError(
                self.record_path,
                f"not valid persistent binds ({e}); nothing was applied",
                "remove it and bind again with --persist",
            ) from e
        extra = self._read(DRIVERS_NAME)
        if extra is None:
            return records
        try:
            return with_drivers(records, extra)
        except (ValueError, TypeError, UnicodeDecodeError) as e:
            raise CorruptRecordError(
                self.root.path(*STATE_DIR, DRIVERS_NAME),
                f"not valid persistent VFIO drivers ({e}); nothing was applied",
                "remove it and bind again with --persist",
            ) from e

    def add(
        self, devices: Iterable[PciDevice], drivers: Mapping[PciAddress, tuple[str, str]] = {}
    ) -> list[PciAddress]:
        """Record ``devices`` (with their IDs as they are now, and the ``(driver, module)``
        of ``drivers``: plain vfio-pci where left out); returns the addresses added."""
        records = self.load()
        added = []
        for d in devices:
            driver, module = drivers.get(d.address, (VFIO_PCI, PLAIN_MODULE))
            rec = PersistedBind(
                d.address, d.vendor, d.device, d.subsystem_vendor, d.subsystem_device,
                driver, module,
            )  # fmt: skip
            if records.get(d.address) != rec:
                records[d.address] = rec
                added.append(d.address)
        if added:
            self._save(records)
        return added

    def drop(self, addresses: Iterable[PciAddress] | None) -> list[PciAddress]:
        """Forget ``addresses`` (None: all); returns those that were recorded."""
        records = self.load()
        gone = sorted(records if addresses is None else set(addresses) & set(records))
        if gone:
            self._save({a: r for a, r in records.items() if a not in gone})
        return gone

    def _save(self, records: Mapping[PciAddress, PersistedBind]) -> None:
        if records:  # the rule only ever names devices the record holds
            self.files.write(STATE_DIR, RECORD_NAME, to_json(records.values()))
            drivers = drivers_to_json(records.values())
            if drivers is None:
                self.files.remove(STATE_DIR, DRIVERS_NAME)
            else:
                self.files.write(STATE_DIR, DRIVERS_NAME, drivers)
            self.files.write(RULES_DIR, RULES_NAME, udev_rules(records.values()).encode())
        else:  # the rule goes first: never a rule without its record
            self.files.remove(RULES_DIR, RULES_NAME)
            self.files.remove(STATE_DIR, DRIVERS_NAME)
            self.files.remove(STATE_DIR, RECORD_NAME)
