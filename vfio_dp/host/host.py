"""The :class:`Host`: everything vfio_dp does to a machine, through one root path.

``Host("/")`` on a node, ``Host("/host")`` in the DaemonSet's pod, ``Host(tmp_path)`` in
tests. Composes discovery (:mod:`.sysfs`), host usage (:mod:`.usage`), the durable state
(:mod:`.state`), the VFIO nodes (:mod:`.vfio`) and the binder (:mod:`.bind`) with the pure
rules of :mod:`vfio_dp.model`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vfio_dp.errors import BindError, HostError, NoIommuError, RefusedError
from vfio_dp.host import sysfs
from vfio_dp.host.bind import Binder, BindResult, Step
from vfio_dp.host.kernel import KernelIO, RealKernel
from vfio_dp.host.root import Root, safe_component
from vfio_dp.host.state import StateStore
from vfio_dp.host.vfio import UNKNOWN, device_nodes, probe_groups
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import GroupStatus, Inventory, IommuGroup, PciDevice
from vfio_dp.model.plan import BindPlan, CheckReport, plan_bind, plan_check, plan_unbind

if TYPE_CHECKING:  # not imported at run time: keeps `vfioctl bind` start-up light
    from pathlib import Path


class Host:
    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        kernel: KernelIO | None = None,
        write_timeout: float = 10.0,
        lock_timeout: float = 10.0,
        scan_processes: int = 1,
    ) -> None:
        """``scan_processes`` > 1 lets a big host's full scan use that many processes (the
        CLI passes the CPUs it may use; the daemon, which has threads, keeps 1)."""
        self.fs = Root(root)
        self.scan_processes = scan_processes
        self.kernel: KernelIO = kernel or RealKernel(self.fs.prefix, write_timeout)
        self.state = StateStore(self.fs)
        self.lock_timeout = lock_timeout

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
    ) -> BindResult:
        """Move ``addresses`` (and with ``group`` their group's other endpoints) to vfio-pci.

        Refuses before touching anything (:class:`RefusedError`); on any failure after the
        first write, rolls back every device it touched and raises :class:`BindError`. The
        plan (:func:`vfio_dp.model.plan.plan_bind`) is made from the scan, then made again
        under the devices' locks from their state as it is then (another vfioctl may have
        bound some meanwhile): the binder only executes it.
        """
        inv = self.scan()
        in_use = self._groups_in_use(inv, addresses) if probe else None
        plan = self._plan_bind(inv, addresses, in_use, group=group, force=force)
        binder = self._binder()
        if dry_run:
            result = BindResult(
                already=list(plan.already), dry_run=True, warnings=list(plan.forced)
            )
            need = not binder.driver_loaded("vfio-pci")
            for a in plan.targets:
                result.steps.extend(binder.bind_steps(inv.devices[a], need))
                need = False
            return result
        touched: list[PciAddress] = []
        locked = [*plan.targets, *plan.already]
        with self.state.locked(locked, self.lock_timeout):
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
            result = BindResult(already=list(plan.already), warnings=list(plan.forced))
            try:
                binder.bind_all([inv.devices[a] for a in plan.targets], result, touched)
            except BindError as e:
                problems = binder.rollback(touched)
                msg = f"bind failed: {e}"
                if touched:
                    msg += f"\nrolled back {', '.join(map(str, touched))}"
                if problems:
                    msg += "\n" + "\n".join(problems)
                raise BindError(msg) from e
        return result

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
        if not addresses:
            return result
        binder = self._binder()
        with self.state.locked(addresses, self.lock_timeout):
            inv = self.scan(usage=False)
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
            result.already.extend(plan.already)
            jobs = [(inv.devices[r.address], r.driver, r.override) for r in plan.restores]
            if dry_run:
                for dev, target, override in jobs:
                    result.steps.extend(binder.restore_steps(dev, target, override))
                return result
            for a in plan.forget:
                self.state.remove(a)
            gone = [
                f"{a}: recorded in {self.state.state_dir}/{a}.json but there is no such device "
                f"under {self.fs.display}sys/bus/pci/devices; nothing to restore (remove the "
                "record once the card is gone for good)"
                for a in plan.missing
            ]
            try:
                result.restored.extend(binder.restore_all(jobs, explicit=driver is not None))
            except BindError as e:
                if not gone:
                    raise
                raise BindError("\n".join([str(e), *gone])) from e
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


__all__ = ["BindResult", "CheckReport", "Host", "Step"]
