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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vfio_dp.errors import BindError, DeviceNotFoundError, RefusedError
from vfio_dp.host import sysfs
from vfio_dp.host.bind import Binder, BindResult, Step
from vfio_dp.host.kernel import KernelIO, RealKernel
from vfio_dp.host.root import Root
from vfio_dp.host.state import BOUND_BY_OPERATOR, StateStore
from vfio_dp.host.vfio import (
    GroupStatus,
    device_nodes,
    group_node_name,
    probe_group,
    probe_groups,
)
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory, IommuGroup, PciDevice, is_vfio_driver

if TYPE_CHECKING:  # not imported at run time: keeps `vfioctl bind` start-up light
    from pathlib import Path


@dataclass(frozen=True, slots=True)
class CheckReport:
    address: PciAddress
    ready: bool
    reasons: tuple[str, ...]  # each says the fix


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
        return self.fs.path("dev", "vfio", group_node_name(group))

    # -- binding -----------------------------------------------------------------------
    def _binder(self) -> Binder:
        return Binder(self.fs, self.kernel, self.state)

    def _groups_in_use(self, inv: Inventory, addrs: Sequence[PciAddress]) -> dict[int, bool]:
        groups = {inv.devices[a].iommu_group for a in addrs if a in inv.devices}
        found = {n: inv.groups[n] for n in groups if n is not None and n in inv.groups}
        return {n: bool(s.in_use) for n, s in self.probe_groups(list(found.values())).items()}

    def bind(
        self,
        addresses: Sequence[PciAddress],
        *,
        group: bool = False,
        force: bool = False,
        dry_run: bool = False,
        probe: bool = True,
        bound_by: str = BOUND_BY_OPERATOR,
    ) -> BindResult:
        """Move ``addresses`` (and with ``group`` their group's other endpoints) to vfio-pci.

        Refuses before touching anything (:class:`RefusedError`); on any failure after the
        first write, rolls back every device it touched and raises :class:`BindError`.
        ``bound_by`` goes into each new bind record (``operator``, ``daemon``,
        ``claim:<uid>``); devices already on vfio-pci keep their record and owner.
        """
        inv = self.scan()
        for a in addresses:
            if a not in inv.devices:
                raise DeviceNotFoundError(str(a), self.fs.display)
        in_use = self._groups_in_use(inv, addresses) if probe else None
        from vfio_dp.model.plan import plan_bind  # only binding plans: `unbind` stays lighter

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
        result = BindResult(already=list(plan.already), dry_run=dry_run, warnings=list(plan.forced))
        binder = self._binder()
        binder.bound_by = bound_by
        if dry_run:
            need = not binder.driver_loaded("vfio-pci")
            for a in plan.targets:
                result.steps.extend(binder.bind_steps(inv.devices[a], need))
                need = False
            return result
        touched: list[PciAddress] = []
        with self.state.locked([*plan.targets, *plan.already], self.lock_timeout):
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
        ``force`` (the unbind would block until the VM lets go).
        """
        inv = self.scan(usage=False)
        for a in addresses:
            if a not in inv.devices:
                raise DeviceNotFoundError(str(a), self.fs.display)
        refusals = []
        for n, busy in self._groups_in_use(inv, addresses).items():
            if busy and not force:
                refusals.append(
                    f"IOMMU group {n} is in use: /dev/vfio/{n} is held open (a VM has it); "
                    "stop the VM first (or --force, and the unbind waits for it)"
                )
        if refusals:
            raise RefusedError(refusals)
        result = BindResult(dry_run=dry_run)
        binder = self._binder()
        with self.state.locked(list(addresses), self.lock_timeout):
            jobs: list[tuple[PciDevice, str | None, str | None]] = []
            for a in addresses:
                dev = binder.current(a)
                rec = self.state.get(a)
                target = driver or (rec.driver if rec else None)
                override = None if driver else (rec.driver_override if rec else None)
                if (
                    not is_vfio_driver(dev.driver)
                    and dev.driver_override is None
                    and (driver is None or dev.driver == driver)
                ):
                    result.already.append(a)
                    if rec is not None and dev.driver == rec.driver:
                        self.state.remove(a)
                    continue
                if rec is not None and (rec.vendor, rec.device) != (dev.vendor, dev.device):
                    raise BindError(
                        f"{a} is now {dev.ids} but the record says {rec.vendor}:{rec.device} "
                        f"(hardware changed?); restore explicitly: vfioctl unbind --driver NAME {a}"
                    )
                if dry_run:
                    result.steps.extend(binder.restore_steps(dev, target, override))
                    continue
                jobs.append((dev, target, override))
            # every device was checked before the first write
            result.restored.extend(binder.restore_all(jobs, explicit=driver is not None))
        return result

    # -- readiness ---------------------------------------------------------------------
    def check(self, addresses: Sequence[PciAddress]) -> list[CheckReport]:
        """Is each device ready for passthrough right now? Every reason, each with its fix."""
        inv = self.scan()
        out = []
        for a in addresses:
            dev = inv.devices.get(a)
            if dev is None:
                raise DeviceNotFoundError(str(a), self.fs.display)
            reasons: list[str] = []
            grp = inv.group_of(a)
            if dev.is_bridge:
                reasons.append(f"{dev.describe()} is a PCI bridge; bridges are not passed through")
            if grp is None:
                reasons.append(
                    f"{a} has no IOMMU group: enable VT-d/AMD-Vi and boot with intel_iommu=on"
                )
            if not dev.on_vfio and not dev.is_bridge:
                many = grp is not None and len(grp.endpoints(inv.devices)) > 1
                fix = f"vfioctl bind --group {a}" if many else f"vfioctl bind {a}"
                reasons.append(f"{dev.describe()} is not on vfio-pci; fix: {fix}")
            for why in dev.in_use:
                reasons.append(f"the host is using {a}: {why}")
            if grp is not None:
                for p in grp.problems:
                    if p.address != a:
                        reasons.append(p.reason)
                if dev.on_vfio:
                    status = probe_group(self.fs, grp)
                    if not os.path.exists(self.group_node(grp)):
                        reasons.append(
                            f"/dev/vfio/{group_node_name(grp)} does not exist although {a} is on "
                            "vfio-pci; check `dmesg` and that udev/devtmpfs created it"
                        )
                    elif status.in_use:
                        reasons.append(
                            f"IOMMU group {grp.number} is in use: /dev/vfio/{grp.number} is "
                            "held open by another process (a VM)"
                        )
                    elif status.viable is False:
                        reasons.append(
                            f"the kernel reports IOMMU group {grp.number} not viable "
                            "(VFIO_GROUP_GET_STATUS); bind every member: "
                            f"vfioctl bind --group {a}"
                        )
            out.append(CheckReport(a, not reasons, tuple(dict.fromkeys(reasons))))
        return out


__all__ = ["BindResult", "CheckReport", "Host", "Step"]
