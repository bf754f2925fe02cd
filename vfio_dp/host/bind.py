"""Moving devices to their VFIO driver and back, following the kernel's clean sequence.

Bind one device (``<root>`` omitted) to the VFIO driver chosen for it
(:func:`vfio_dp.host.vfio_drivers.choose_for`: ``vfio-pci`` or a variant such as
``mlx5_vfio_pci``)::

    modprobe <module>                                                 (if not loaded)
    echo <driver>     > /sys/bus/pci/devices/<bdf>/driver_override
    echo <bdf>        > /sys/bus/pci/drivers/<current>/unbind        (if bound)
    echo <bdf>        > /sys/bus/pci/drivers_probe
    readlink /sys/bus/pci/devices/<bdf>/driver  → must name <driver> (probe "succeeds" anyway)

Restore is the reverse: put back the recorded ``driver_override`` (a newline clears it),
unbind from vfio-pci, write the address to ``drivers/<original>/bind`` (or ``drivers_probe``
when none was recorded) and verify. ``new_id`` is never used: it grabs every device with
that ID. The original driver is recorded durably before the first write; any failure rolls
back every device this call touched, so no device is left without its driver.

The binder only executes: it writes no record and no journal itself. Built for one
operation, it is given the operation's journal hook (every write is reported to
:meth:`vfio_dp.host.ledger.Ledger.journal` -- which write each device is about to make,
fsync'ed -- before it is made, so a process killed between any two writes leaves a journal
that says exactly where it stopped) and a hook told of each device given back
(:meth:`~vfio_dp.host.ledger.Ledger.restored`, which drops its record).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from vfio_dp.errors import BindError, PathEscapeError
from vfio_dp.host.kernel import KernelIO
from vfio_dp.host.ledger import Journal, Restored
from vfio_dp.host.root import Root, safe_component
from vfio_dp.host.sysfs import read_device, read_driver
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import PciDevice
from vfio_dp.model.vfio_driver import VFIO_PCI_MODULE, VfioChoice

#: plain vfio-pci: what a bind writes when nothing else was chosen
PLAIN = VfioChoice("vfio-pci", VFIO_PCI_MODULE, "vfio-pci")


def _log_info(msg: str, *args: object) -> None:
    """Log through ``logging`` when the process uses it (the daemon configures it); a CLI run
    that never imported it does not pay for the import (slow under emulation)."""
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.getLogger("vfio_dp.bind").info(msg, *args)


def group_runs(devices: Sequence[PciDevice]) -> list[list[PciDevice]]:
    """``devices`` split by IOMMU group, in order of first appearance, each run in the order
    given (a device without a group is a run of its own)."""
    runs: dict[object, list[PciDevice]] = {}
    for dev in devices:
        key = dev.iommu_group if dev.iommu_group is not None else dev.address
        runs.setdefault(key, []).append(dev)
    return list(runs.values())


#: threads binding or restoring IOMMU groups at once (a node's 1,024 VF groups share them)
GROUP_THREADS = 32


def all_at_once(count: int, work: Callable[[int], None]) -> None:
    """``work(0) .. work(count - 1)``, on up to :data:`GROUP_THREADS` threads when there are
    several (every sysfs write inside has its own timeout, so each one ends; ``work`` reports
    its own failures)."""
    if count <= 1:
        for i in range(count):
            work(i)
        return
    from concurrent.futures import ThreadPoolExecutor  # on use: `vfioctl list` never binds

    workers = min(count, GROUP_THREADS)
    with ThreadPoolExecutor(workers, thread_name_prefix="vfio_dp-bind") as pool:
        list(pool.map(work, range(count)))


def _raise_failures(failed: dict[PciAddress, BaseException], done: list[str]) -> None:
    """Re-raise an unexpected error, or a lone failure when nothing else was done, as it is;
    else one :class:`BindError` naming every failed device (in address order), then what was
    done."""
    for e in failed.values():
        if not isinstance(e, BindError):
            raise e
    if len(failed) == 1 and not done:
        raise next(iter(failed.values()))
    if failed:
        lines = [f"{a}: {failed[a]}" for a in sorted(failed)]
        raise BindError(f"{len(failed)} of the devices failed\n" + "\n".join(lines + done))


def _module_arg(choice: VfioChoice) -> str:
    """What ``modprobe`` is given: ``vfio-pci`` for the plain driver (as before variants
    were chosen: the same dry-run script), else the module's name."""
    return choice.driver if choice is PLAIN or choice.module == VFIO_PCI_MODULE else choice.module


@dataclass(frozen=True, slots=True)
class Step:
    """One sysfs write or module load, printable as the shell command it equals."""

    path: str  # "" for modprobe
    data: str

    def __str__(self) -> str:
        """The shell command a person can paste to make the same write: ``echo 'vfio-pci' >
        …/driver_override``; the clearing write (a lone newline) is ``echo > …``. ``echo``'s
        own trailing newline is what sysfs attributes expect."""
        if not self.path:
            return f"modprobe {shlex.quote(self.data)}"
        text = self.data[:-1] if self.data.endswith("\n") else self.data
        if not text:
            return f"echo > {shlex.quote(self.path)}"
        shown = f"'{text}'" if "'" not in text and "\n" not in text else shlex.quote(text)
        return f"echo {shown} > {shlex.quote(self.path)}"


@dataclass(slots=True)
class BindResult:
    bound: list[PciAddress] = field(default_factory=list)
    restored: list[tuple[PciAddress, str | None]] = field(default_factory=list)
    already: list[PciAddress] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False
    #: the VFIO driver each target goes to (or, dry run, would go to), and why
    drivers: dict[PciAddress, VfioChoice] = field(default_factory=dict)


@dataclass(slots=True)
class Run:
    """The devices of one IOMMU group bound by :meth:`Binder.bind_runs`, and how it went."""

    devices: list[PciDevice]
    result: BindResult = field(default_factory=BindResult)
    touched: list[PciAddress] = field(default_factory=list)
    failed: tuple[PciAddress, BaseException] | None = None


class Binder:
    """Executes bind/restore steps through a :class:`KernelIO`, reporting as it goes."""

    def __init__(
        self,
        root: Root,
        kernel: KernelIO,
        *,
        journal: Journal | None = None,
        restored: Restored | None = None,
    ) -> None:
        """``journal``: told of each sysfs write before it is made (the operation's journal);
        ``restored``: told of each device given back. None: planning only (dry runs)."""
        self.root = root
        self.kernel = kernel
        self.journal = journal
        self.restored = restored

    # -- paths -------------------------------------------------------------------------
    def _dev(self, addr: PciAddress, name: str) -> str:
        return self.root.path("sys", "bus", "pci", "devices", str(addr), name)

    def _drv(self, driver: str, name: str) -> str:
        return self.root.path("sys", "bus", "pci", "drivers", safe_component(driver), name)

    def _probe(self) -> str:
        return self.root.path("sys", "bus", "pci", "drivers_probe")

    def driver_loaded(self, driver: str) -> bool:
        return os.path.isdir(self.root.path("sys", "bus", "pci", "drivers", safe_component(driver)))

    # -- steps ---------------------------------------------------------------------------
    def bind_steps(
        self, dev: PciDevice, need_module: bool, choice: VfioChoice = PLAIN
    ) -> list[Step]:
        """The writes that move ``dev`` to ``choice.driver`` (after ``modprobe`` of its module
        when ``need_module``)."""
        a = str(dev.address)
        steps = [Step("", _module_arg(choice))] if need_module else []
        steps.append(Step(self._dev(dev.address, "driver_override"), choice.driver))
        if dev.driver:
            steps.append(Step(self._drv(dev.driver, "unbind"), a))
        steps.append(Step(self._probe(), a))
        return steps

    def restore_steps(self, dev: PciDevice, driver: str | None, override: str | None) -> list[Step]:
        a = str(dev.address)
        steps = [Step(self._dev(dev.address, "driver_override"), (override or "") + "\n")]
        if driver and dev.driver == driver:
            return steps  # interrupted before its unbind: only the override to put back
        if dev.driver:
            steps.append(Step(self._drv(dev.driver, "unbind"), a))
        if driver and not self.driver_loaded(driver):
            steps.append(Step("", driver))
        if driver:
            steps.append(Step(self._drv(driver, "bind"), a))
        else:
            steps.append(Step(self._probe(), a))
        return steps

    def run(
        self,
        steps: Sequence[Step],
        on_step: Callable[[Step], None] | None = None,
        *,
        addr: PciAddress | None = None,
    ) -> None:
        """Make each write (journaled first for ``addr`` when inside an operation)."""
        done = 0
        for s in steps:
            if on_step:
                on_step(s)
            if not s.path:
                self.kernel.modprobe(s.data)
                continue
            if self.journal is not None and addr is not None:
                self.journal(addr, done, str(s))
            try:
                self.kernel.write(s.path, s.data)
            except OSError as e:
                raise BindError(f"{s} failed: {e.strerror or e}") from e
            except PathEscapeError as e:
                raise BindError(f"{s} refused: {e}") from e
            done += 1

    def _gone(self, addr: PciAddress) -> BindError:
        return BindError(f"{addr} disappeared from {self.root.display}sys/bus/pci/devices")

    def current(self, addr: PciAddress) -> PciDevice:
        dev = read_device(self.root, addr)
        if dev is None:
            raise self._gone(addr)
        return dev

    # -- operations ----------------------------------------------------------------------
    def bind_one(
        self,
        dev: PciDevice,
        result: BindResult,
        touched: list[PciAddress],
        choice: VfioChoice = PLAIN,
    ) -> None:
        """Move ``dev`` (as read under its lock, planned to move, its record written) to
        ``choice.driver``."""
        addr = dev.address
        touched.append(addr)
        steps = self.bind_steps(dev, not self.driver_loaded(choice.driver), choice)
        result.steps.extend(steps)
        self.run(steps, addr=addr)
        self.verify_bound(dev, result, choice)

    def verify_bound(self, dev: PciDevice, result: BindResult, choice: VfioChoice) -> None:
        """After the last write of its bind: ``dev`` is on ``choice.driver`` now (readlink
        ``<bdf>/driver``), else :class:`BindError`."""
        addr = dev.address
        present, now = read_driver(self.root, addr)
        if not present:
            raise self._gone(addr)
        if now != choice.driver:
            raise BindError(
                f"{addr}: after drivers_probe the device is on {now or 'no driver'}, "
                f"not {choice.driver} (the kernel reports success even when nothing "
                f"attached); check `dmesg` for {choice.driver} errors"
            )
        result.bound.append(addr)
        _log_info(
            "bound %s (%s) to %s (%s); original driver %s",
            addr, dev.ids, choice.driver, choice.why, dev.driver,
        )  # fmt: skip

    def load_modules(
        self, choices: Mapping[PciAddress, VfioChoice], result: BindResult
    ) -> dict[PciAddress, VfioChoice]:
        """``modprobe`` each chosen module whose driver is not loaded yet (each once), before
        any device is touched; ``choices`` with the driver names the loaded modules registered
        (``/sys/module/<m>/drivers/pci:<driver>``). A module that fails to load raises
        :class:`BindError` naming it: nothing has been written."""
        from vfio_dp.host.vfio_drivers import after_load

        loaded: set[str] = set()
        for choice in choices.values():
            if choice.module in loaded or self.driver_loaded(choice.driver):
                continue
            load = Step("", _module_arg(choice))
            result.steps.append(load)
            try:
                self.run([load])
            except BindError as e:
                raise BindError(
                    f"loading {choice.module} for {choice.driver} ({choice.why}) failed, "
                    f"nothing was bound: {e}; fix the module, or bind with --vfio-driver "
                    "vfio-pci (vfioDriver: vfio-pci)"
                ) from e
            loaded.add(choice.module)
        return {a: after_load(self.root, c) for a, c in choices.items()}

    def bind_all(
        self,
        devices: Sequence[PciDevice],
        result: BindResult,
        touched: list[PciAddress],
        choices: Mapping[PciAddress, VfioChoice] | None = None,
    ) -> None:
        """:meth:`bind_one` for each device, to its driver in ``choices`` (plain vfio-pci when
        left out). Loads the modules first when needed (:meth:`load_modules`); then IOMMU
        groups are bound concurrently, one thread per group (unbinding a host driver can take
        a while: a GPU driver's seconds), the devices of one group one after another. A
        failure stops its group only; every other group finishes, ``touched`` then holds every
        device any of them touched (the caller rolls them all back) and the
        :class:`BindError` names each failure. ``result`` lists devices in the order given.
        """
        wanted = {d.address: (choices or {}).get(d.address, PLAIN) for d in devices}
        wanted = self.load_modules(wanted, result)
        failed: dict[PciAddress, BaseException] = {}
        order = {dev.address: i for i, dev in enumerate(devices)}
        for run in self.bind_runs(devices, wanted):
            result.bound.extend(run.result.bound)
            result.steps.extend(run.result.steps)
            touched.extend(run.touched)
            if run.failed is not None:
                failed[run.failed[0]] = run.failed[1]
        result.bound.sort(key=order.__getitem__)
        _raise_failures(failed, [])

    def bind_runs(
        self, devices: Sequence[PciDevice], choices: Mapping[PciAddress, VfioChoice]
    ) -> list[Run]:
        """The binding of :meth:`bind_all`, its modules loaded: one :class:`Run` per IOMMU
        group of ``devices``, in order of first appearance, each saying what it bound, what it
        touched and the failure that stopped it (every other group went on)."""
        runs = [Run(devs) for devs in group_runs(devices)]

        def bind_run(i: int) -> None:
            run = runs[i]
            for dev in run.devices:
                try:
                    self.bind_one(dev, run.result, run.touched, choices[dev.address])
                except BaseException as e:  # reported by the calling thread
                    run.failed = (dev.address, e)
                    return  # the rest of this group stays as it is

        all_at_once(len(runs), bind_run)
        return runs

    def restore_one(
        self, addr: PciAddress, driver: str | None, override: str | None, *, explicit: bool
    ) -> str | None:
        """Restore ``addr`` to ``driver`` (None: let the kernel probe). Returns the new driver."""
        dev = self.current(addr)
        steps = self.restore_steps(dev, driver, override)
        try:
            self.run(steps, addr=addr)
        except BindError:
            if not driver:
                raise
            # The original driver refused a direct bind: let the kernel choose.
            self.run([Step(self._probe(), str(addr))], addr=addr)
        after = self.current(addr)
        if driver and after.driver != driver:
            raise BindError(
                f"{addr}: restore to {driver} did not take (now on {after.driver or 'no driver'}); "
                f"try: vfioctl unbind --driver {driver} {addr}, and check `dmesg`"
            )
        if self.restored is not None:
            self.restored(addr, driver, after.driver, explicit)
        _log_info("restored %s to %s", addr, after.driver or "no driver")
        return after.driver

    def restore_all(
        self, jobs: Sequence[tuple[PciDevice, str | None, str | None]], *, explicit: bool
    ) -> list[tuple[PciAddress, str | None]]:
        """:meth:`restore_one` for each ``(device, driver, override)``; ``[(address, driver
        now)]`` in the order given.

        Devices in different IOMMU groups are restored concurrently, one thread per group: a
        driver's probe is most of a restore (e1000e's takes 0.15 s under emulation, a GPU
        driver's can take seconds), and the kernel probes different devices in parallel. The
        functions of one group -- one card -- go one after another, in the order given. Every
        device is attempted; the failures are reported together, naming each device.
        """
        target = {dev.address: (driver, override) for dev, driver, override in jobs}
        runs = group_runs([dev for dev, _, _ in jobs])
        now: dict[PciAddress, str | None] = {}
        failed: dict[PciAddress, BaseException] = {}

        def restore_run(i: int) -> None:
            for dev in runs[i]:
                driver, override = target[dev.address]
                try:
                    now[dev.address] = self.restore_one(
                        dev.address, driver, override, explicit=explicit
                    )
                except BaseException as e:  # reported by the calling thread
                    failed[dev.address] = e

        all_at_once(len(runs), restore_run)
        done = [f"{a}: restored to {d or 'no driver'}" for a, d in now.items()]
        _raise_failures(failed, done)
        return [(dev.address, now[dev.address]) for dev, _, _ in jobs]
