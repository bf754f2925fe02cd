"""The :class:`Host`: everything vfio_dp does to a machine, through one root path.

``Host("/")`` on a node, ``Host("/host")`` in the DaemonSet's pod, ``Host(tmp_path)`` in
tests. Composes discovery (:mod:`.sysfs`), host usage (:mod:`.usage`), the VFIO nodes
(:mod:`.vfio`) and the operations that change a machine -- bind, unbind, recovery, release
(:mod:`.operations`, executed by :mod:`.bind`, recorded by :mod:`.ledger`, the one writer of
bind records and journals in :mod:`.state`) -- with the pure rules of :mod:`vfio_dp.model`.

Holding: every binding has a holder, the one its bind record names (``bound_by``:
``operator``, ``device-plugin``, ``dra-plugin``, ``claim:<uid>``); :meth:`Host.record_holders`,
:meth:`Host.holdings`, :meth:`Host.adopt` and :meth:`Host.release` are how front-ends ask and
act on it. Every journalled operation names its runner (:attr:`Host.runner`: ``vfioctl``,
``device-plugin``, ``dra-plugin``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import cached_property
from typing import TYPE_CHECKING

from vfio_dp.errors import HostError, NoIommuError, PathEscapeError
from vfio_dp.host.bound_by import BOUND_BY_OPERATOR
from vfio_dp.host.discovery import Discovery
from vfio_dp.host.kernel import KernelIO, RealKernel
from vfio_dp.host.records import STATE_DIR
from vfio_dp.host.root import Root, read_text, safe_component
from vfio_dp.host.state import StateStore
from vfio_dp.host.vfio import UNKNOWN, device_nodes, probe_groups
from vfio_dp.model.device import GroupStatus, Inventory, IommuGroup

if TYPE_CHECKING:
    # Not imported at run time: what changes a machine (the binder, the ledger, the
    # operations, the check rules) is imported by the methods that use it, so a read-only
    # `vfioctl list` loads none of it (start-up of a one-shot command).
    from pathlib import Path

    from vfio_dp.host.bind import BindResult
    from vfio_dp.host.bind_pass import PassResult
    from vfio_dp.host.ledger import Ledger
    from vfio_dp.host.operations import Release
    from vfio_dp.host.recovery import Interrupted, Recovery
    from vfio_dp.model.address import PciAddress
    from vfio_dp.model.device import PciDevice
    from vfio_dp.model.mdev_config import MdevEntry
    from vfio_dp.model.plan import CheckReport
    from vfio_dp.model.vfio_driver import VfioChoice


def read_boot_id(fs: Root) -> str:
    """``<root>/proc/sys/kernel/random/boot_id`` (``""`` when the kernel does not say)."""
    return read_text(fs.path("proc", "sys", "kernel", "random", "boot_id")) or ""


class Host(Discovery):
    def __init__(
        self,
        root: str | os.PathLike[str] = "/",
        *,
        kernel: KernelIO | None = None,
        write_timeout: float = 10.0,
        lock_timeout: float = 10.0,
        scan_processes: int = 1,
        runner: str = "vfioctl",
    ) -> None:
        """``scan_processes`` > 1 lets a big host's full scan use that many processes (the
        CLI passes the CPUs it may use; the daemon, which has threads, keeps 1). ``runner``
        names who runs the operations in their journals (the front-ends pass ``"device-plugin"``
        and ``"dra-plugin"``)."""
        self.fs = Root(root)
        self.scan_processes = scan_processes
        self.kernel: KernelIO = kernel or RealKernel(self.fs.prefix, write_timeout, self.fs.open)
        self.state = StateStore(self.fs)
        self.lock_timeout = lock_timeout
        self.runner = runner

    @cached_property
    def ledger(self) -> Ledger:
        """The one writer of bind records and journals (:mod:`.ledger`), made on first use."""
        from vfio_dp.host.ledger import Ledger

        return Ledger(self.state, self.lock_timeout)

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

    def probe_groups(self, groups: Sequence[IommuGroup]) -> dict[int, GroupStatus]:
        """The kernel's verdict for each group with a node in ``/dev/vfio`` (opens it briefly);
        groups without a node are left out."""
        return probe_groups(self.fs, groups)

    def device_nodes(self, group: IommuGroup, devices: list[PciDevice]) -> list[str]:
        return device_nodes(self.fs, group, devices)

    def pcie_roots(self, addresses: Iterable[PciAddress]) -> dict[PciAddress, str]:
        """``{address: "pci0000:00"}``: each device's PCIe root (:mod:`.topology`)."""
        from vfio_dp.host.topology import pcie_roots

        return pcie_roots(self.fs, addresses)

    def boot_id(self) -> str:
        """``<root>/proc/sys/kernel/random/boot_id`` (``""`` when the kernel does not say)."""
        return read_boot_id(self.fs)

    def state_file(self, name: str) -> str:
        """``<root>/var/lib/vfio_dp/<name>``: where a front-end keeps its own durable file."""
        return self.fs.path(*STATE_DIR, safe_component(name))

    def has_state_file(self, name: str) -> bool | None:
        """Is there an entry ``<root>/var/lib/vfio_dp/<name>``? Looked up inside the root
        (never through a link out of it). None: cannot tell (the directory links out of the
        root or cannot be opened); the caller reads the file and reports why."""
        try:
            dfd = self.fs.open_dir(*STATE_DIR)
        except FileNotFoundError:
            return False
        except (OSError, PathEscapeError):
            return None
        try:
            os.stat(safe_component(name), dir_fd=dfd, follow_symlinks=False)
            return True
        except FileNotFoundError:
            return False
        except OSError:
            return None
        finally:
            os.close(dfd)

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

    # -- binding (flows in :mod:`.operations`, records and journals by :mod:`.ledger`) ------
    def bind(
        self,
        addresses: Sequence[PciAddress],
        *,
        group: bool = False,
        force: bool = False,
        dry_run: bool = False,
        probe: bool = True,
        bound_by: str = BOUND_BY_OPERATOR,
        inventory: Inventory | None = None,
        vfio_driver: str | Mapping[PciAddress, str] = "auto",
        mdev: Sequence[MdevEntry] = (),
    ) -> BindResult:
        """Move ``addresses`` (and with ``group`` their group's other endpoints) to their VFIO
        driver: ``vfio_driver`` is ``auto`` (the kernel's choice from ``modules.alias``:
        :func:`vfio_dp.host.vfio_drivers.choose_for`), ``vfio-pci`` or a driver's name, for
        every device or per address (left out: ``auto``). A device the wanted driver cannot
        serve refuses the bind before anything is written; a device already on VFIO (a
        variant, a vendor provider) is never rebound.

        Refuses before touching anything (:class:`RefusedError`); on any failure after the
        first write, rolls back every device it touched and raises :class:`BindError`. The
        plan (:func:`vfio_dp.model.plan.plan_bind`) is made from the groups of ``addresses``
        (:meth:`scan_groups`: no other device is read), then made again under the devices'
        locks from their state as it is then (another vfioctl may have bound some meanwhile):
        the binder only executes it. An interrupted operation on these devices (its process
        was killed) is undone first (:meth:`recover`), so the original drivers recorded stay
        the true ones.
        ``bound_by`` goes into each new bind record (``operator``, ``device-plugin``,
        ``dra-plugin``, ``claim:<uid>``); devices already on vfio-pci keep their record and
        holder. ``inventory``: a :meth:`scan` (or :meth:`scan_groups` of ``addresses``) the
        caller has just made, used for the first plan instead of reading the groups again
        (the plan is made again under the locks from the devices as they are then; it is not
        used when an interrupted operation was undone).
        ``mdev``: the config's ``mdev:`` entries; a parent one names is refused
        (:func:`vfio_dp.model.plan.mdev_parent_wanted`).
        """
        from vfio_dp.host import operations

        return operations.bind(
            self, addresses, group=group, force=force, dry_run=dry_run, probe=probe,
            bound_by=bound_by, inventory=inventory, vfio_driver=vfio_driver, mdev=mdev,
        )  # fmt: skip

    def bind_groups(
        self,
        groups: Sequence[Sequence[PciAddress]],
        *,
        bound_by: str,
        inventory: Inventory | None = None,
        vfio_driver: Mapping[PciAddress, str] | None = None,
        mdev: Sequence[MdevEntry] = (),
    ) -> PassResult:
        """:meth:`bind` (``group=True``, no probe) of each of ``groups`` -- one IOMMU group's
        devices each -- as one pass: one journal, every bind record durable together, the
        groups bound concurrently; a group refused or failed is rolled back alone, the
        others stay bound (:mod:`.bind_pass`). ``PassResult`` says per group's index what
        was bound or why not. The node core's ``bind: true`` pass (256 new VFs at a time)."""
        from vfio_dp.host import bind_pass

        return bind_pass.bind_groups(
            self, groups, bound_by=bound_by, inventory=inventory, vfio_driver=vfio_driver,
            mdev=mdev,
        )  # fmt: skip

    def interrupted(self) -> tuple[list[Interrupted], list[str]]:
        """Every operation journal on disk (each marked in progress or interrupted), and a
        message for every unreadable record or journal (they are kept, never dropped)."""
        ops, problems = self.state.operations()
        problems += self.state.problems()
        if not ops:  # the usual case: no need for the operations module
            return [], problems
        from vfio_dp.host.recovery import Interrupted

        return [Interrupted(op, self.state.busy(op.addresses())) for op in ops], problems

    def recover(self, *, runner: str | None = None, only: Sequence[PciAddress] = ()) -> Recovery:
        """Undo every INTERRUPTED operation (a bind or unbind whose process was killed):
        each of its devices goes back to the driver it had before the bind (an interrupted
        bind is rolled back, an interrupted unbind is finished), then its journal is removed.

        ``runner="device-plugin"``: only what that front-end started (it calls this at start,
        before it binds anything; a front-end also finishes what an older version recorded
        as ``daemon``); ``only``: only operations that include one of these devices
        (``vfioctl unbind <addresses>``). An operation whose process still runs (its locks
        are held) is left alone. Reads ``<root>/var/lib/vfio_dp/ops/*.json`` and
        ``original/<bdf>.json``; writes the same sysfs files as :meth:`unbind`. A device
        that cannot be restored keeps its records and is named in ``problems``.
        """
        from vfio_dp.host import recovery

        return recovery.recover(self, runner=runner, only=only)

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
        :func:`vfio_dp.model.plan.plan_unbind` from their groups (:meth:`scan_groups`) as read
        under the devices' locks.
        """
        from vfio_dp.host import operations

        return operations.unbind(self, list(addresses), driver=driver, force=force, dry_run=dry_run)

    def to_native(self, addresses: Sequence[PciAddress]) -> BindResult:
        """Put ``addresses`` (a DRA group's functions, for a container) on their native
        drivers: :meth:`unbind` -- the same locks, journal, records and refusals (a group a
        process holds open) -- where a device no driver takes is a failure too, and a
        failure puts every device back where it was, with its bind record
        (:class:`BindError` saying so). Devices on their driver already are left."""
        from vfio_dp.host import operations

        return operations.unbind(self, list(addresses), force=False, dry_run=False, native=True)

    def unbind_all(self, *, force: bool = False, dry_run: bool = False) -> BindResult:
        """:meth:`unbind` every device with a record (``<root>/var/lib/vfio_dp/original/``):
        the same checks, every device attempted; a record whose device is gone, or a record
        that cannot be read (a FIFO, a directory, a link, not JSON: its device is left as it
        is), is named in the error after the others are restored -- never "all given back"
        while one may still be on vfio-pci (``dry_run``: named in the warnings). No records:
        an empty result."""
        from vfio_dp.host import operations

        return operations.unbind_all(self, force=force, dry_run=dry_run)

    # -- holding -----------------------------------------------------------------------
    def record_holders(self) -> dict[PciAddress, str]:
        """Every device with a bind record → who bound it (``operator``, ``device-plugin``,
        ``dra-plugin``, ``claim:<uid>``; ``daemon`` from older versions)."""
        return self.state.holders()

    def holdings(self, holder: str) -> list[PciAddress]:
        """The devices ``holder`` bound (their bind records name it), in address order."""
        return self.ledger.holdings(holder)

    def adopt(
        self, addresses: Sequence[PciAddress], holder: str, *, replacing: Callable[[str], bool]
    ) -> list[tuple[PciAddress, str]]:
        """Make ``holder`` the holder of the bindings of ``addresses`` now held by one
        ``replacing`` accepts (:meth:`vfio_dp.host.ledger.Ledger.adopt`)."""
        return self.ledger.adopt(addresses, holder, replacing=replacing)

    def release(self, holder: str) -> Release:
        """Give back every device ``holder`` bound, IOMMU group by group, to its recorded
        driver -- except groups a process holds open (``/dev/vfio/<N>``, found through
        ``<root>/proc/*/fd``: a VM's QEMU): those are kept and named, to be released later.
        Records of devices gone from the host are forgotten (nothing to give back). Reads the
        groups of the devices ``holder`` bound (:meth:`scan_groups`), no other device."""
        from vfio_dp.host import operations

        return operations.release(self, holder)

    # -- readiness ---------------------------------------------------------------------
    def check(
        self,
        addresses: Sequence[PciAddress],
        *,
        vfio_driver: str = "auto",
        inv: Inventory | None = None,
    ) -> list[CheckReport]:
        """Is each device ready for passthrough right now? Every reason, each with its fix
        (:func:`vfio_dp.model.plan.plan_check`), from the devices' groups read alone
        (:meth:`scan_groups`; ``inv``: that read, made by a caller that asks more of the same
        groups); the groups of devices on VFIO are probed. Each report says the VFIO driver a
        bind would choose (``vfio_driver``: ``auto``, ``vfio-pci`` or a driver's name;
        :meth:`vfio_choices`)."""
        from vfio_dp.model.plan import plan_check

        if inv is None:
            inv = self.scan_groups(addresses)
        groups = {
            g.number: g
            for a in addresses
            if (d := inv.devices.get(a)) is not None and d.on_vfio and (g := inv.group_of(a))
        }
        status = self.probe_groups(list(groups.values()))
        choices = self.vfio_choices(inv, addresses, vfio_driver)
        return plan_check(inv, addresses, status, root_display=self.fs.display, choices=choices)

    def vfio_choices(
        self,
        inv: Inventory,
        addresses: Iterable[PciAddress],
        wanted: str | Mapping[PciAddress, str] = "auto",
    ) -> dict[PciAddress, VfioChoice]:
        """The VFIO driver a bind would write for each of ``addresses`` that could be bound,
        and why (:func:`.vfio_drivers.choices_for`)."""
        from vfio_dp.host.vfio_drivers import choices_for

        return choices_for(self.fs, inv, addresses, wanted)


__all__ = ["Host", "read_boot_id"]
