"""Discovery: what :class:`vfio_dp.host.Host` reads of a machine's PCI devices and IOMMU
groups (``<root>/sys/bus/pci/devices/*``, ``<root>/sys/kernel/iommu_groups/*``), with each
device's recorded original driver (``<root>/var/lib/vfio_dp/original/<bdf>.json``) and, on
request, the host's use of it. Reads only: what changes a machine is in
:mod:`vfio_dp.host.operations` and :mod:`vfio_dp.host.bind_pass`.

A mixin of :class:`~vfio_dp.host.Host` (its ``fs``, ``state`` and ``scan_processes``): the
scan flavours a node and a command choose from -- everything (:meth:`Discovery.scan`), the
groups of some devices (:meth:`Discovery.scan_groups`), a cheap refresh of a previous view
(:meth:`Discovery.refresh`), the groups a bind just changed (:meth:`Discovery.reread`).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterable, Mapping

from vfio_dp.errors import HostError
from vfio_dp.host import iommu_groups, sysfs
from vfio_dp.host.root import Root
from vfio_dp.host.state import OriginalDriver, StateStore
from vfio_dp.host.vfio_drivers import mark_on_vfio
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory, PciDevice, analyse_group


class Discovery:
    """The reading half of :class:`~vfio_dp.host.Host` (see the module docstring)."""

    fs: Root
    state: StateStore
    scan_processes: int

    def scan(self, *, usage: bool = True) -> Inventory:
        """Read every device and group; fill ``original_driver`` and, with ``usage``, ``in_use``."""
        devices = sysfs.read_devices(self.fs, workers=self.scan_processes)
        mark_on_vfio(self.fs, devices)
        self._annotate(devices, usage)
        groups = iommu_groups.read_groups(self.fs, devices)
        return Inventory(devices=devices, groups=groups, iommu_present=bool(groups))

    def scan_groups(self, addresses: Iterable[PciAddress], *, usage: bool = True) -> Inventory:
        """:meth:`scan` of the IOMMU groups of ``addresses`` only (:func:`.sysfs.read_group_devices`):
        their members read in full, with ``original_driver`` and, with ``usage``, ``in_use``;
        no other device is read. Every rule that binds, unbinds, releases or checks a device
        (:mod:`vfio_dp.model.plan`, a DRA Prepare) looks only at its group's members, so
        those read this, at the same freshness as a full scan (on a host of thousands of
        devices, a full scan is a few hundred ms)."""
        given = list(addresses)
        devices = sysfs.read_group_devices(self.fs, given)
        mark_on_vfio(self.fs, devices)
        self._annotate(devices, usage, records=self._records_of(devices))
        numbers = {
            g
            for a in given
            if (d := devices.get(a)) is not None and (g := d.iommu_group) is not None
        }
        groups = iommu_groups.read_groups(self.fs, devices, numbers)
        return Inventory(devices=devices, groups=groups, iommu_present=bool(groups))

    def _records_of(self, addresses: Iterable[PciAddress]) -> dict[PciAddress, OriginalDriver]:
        """The bind records (``<root>/var/lib/vfio_dp/original/<bdf>.json``) of ``addresses``
        only (not all: 1,024 VFs bound a group at a time were ~500,000 reads); an unreadable
        one skipped, as :meth:`StateStore.all` skips it."""
        out: dict[PciAddress, OriginalDriver] = {}
        for a in addresses:
            with contextlib.suppress(HostError):
                if (rec := self.state.get(a)) is not None:
                    out[a] = rec
        return out

    def _annotate(self, devices: dict[PciAddress, PciDevice], usage: bool,
                  records: Mapping[PciAddress, OriginalDriver] | None = None) -> None:  # fmt: skip
        """Set each device's ``original_driver`` from the bind records (``records``, or every
        one) and, with ``usage``, its ``in_use`` (in place)."""
        records = self.state.all() if records is None else records
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
        mark_on_vfio(self.fs, devices)
        groups = iommu_groups.read_groups(self.fs, devices)
        return Inventory(devices=devices, groups=groups, iommu_present=bool(groups))

    def reread(self, inv: Inventory, addresses: Iterable[PciAddress]) -> Inventory:
        """``inv`` after a bind or unbind of ``addresses``: their IOMMU groups' members
        re-read for driver, override and VFIO cdev (:func:`.sysfs.reread_devices`) and their
        bind records (``original_driver``), those groups judged again. Nothing else is read
        (a whole :meth:`refresh` reads every device: thousands on a big host)."""
        given = list(addresses)
        groups = {g.number: g for a in given if (g := inv.group_of(a)) is not None}
        members = {*given, *(m for g in groups.values() for m in g.devices)}
        devices = sysfs.reread_devices(self.fs, inv.devices, members)
        judged_now = {a: d for a in members if (d := devices.get(a)) is not None}
        mark_on_vfio(self.fs, judged_now)  # whole groups: a member's answer needs the others
        devices.update(judged_now)
        for a in members:  # the original driver as recorded now (a bind just recorded it)
            dev = devices.get(a)
            if dev is None:
                continue
            rec = self.state.get(a)
            orig = rec.driver if rec else None
            if dev.original_driver != orig:
                devices[a] = dataclasses.replace(dev, original_driver=orig)
        judged = {
            n: analyse_group(
                n, [d for a in g.devices if (d := devices.get(a)) is not None], noiommu=g.noiommu
            )
            for n, g in groups.items()
        }
        return Inventory(
            devices=devices, groups={**inv.groups, **judged}, iommu_present=inv.iommu_present
        )
