"""A simulator of the kernel's reaction to PCI sysfs writes, for bind/unbind logic tests.

Named for what it is: it is not the kernel. It applies the documented behaviour
(``../shared/reference/vfio-kernel.md``) to a :class:`tests.sysfs_tree.SysfsTree`, and the
real-kernel tests in the QEMU guest cross-check the same code paths:

- ``driver_override``: stores the value; a lone newline clears it. Neither unbinds nor probes.
- ``drivers/<d>/unbind``: ``ENODEV`` unless the device is bound to ``<d>``; else unbinds.
- ``drivers_probe``: if the device has no driver, attach ``driver_override`` when set and that
  driver is loaded, else the device's native driver when loaded -- but a VF whose PF has
  ``sriov_drivers_autoprobe`` 0 only to its override (the kernel's ``pci_device_can_probe``);
  always "succeeds" (like the kernel, even when nothing attached).
- ``drivers/<d>/bind``: ``EBUSY`` when already bound; ``ENODEV`` when an override names another
  driver or ``<d>`` is neither the native driver nor the override; else attaches.
- ``modprobe vfio-pci`` creates ``drivers/vfio-pci``; ``modprobe <m>`` of a module in
  :attr:`SimulatedKernel.modules` (module -> the driver it registers, and whether that driver
  registers its devices with VFIO: a variant) loads it as the kernel does
  (``/sys/module/<m>/drivers/pci:<driver>``, ``drivers/<driver>/module``); a module in
  :attr:`SimulatedKernel.broken_modules` fails to load (``modprobe`` exits non-zero).
- ``<pf>/sriov_numvfs`` (the kernel's ``sriov_numvfs_store``): the same count succeeds
  whatever the state; above ``sriov_totalvfs`` is ``ERANGE``; a PF without a driver, or on a
  driver without ``sriov_configure`` (:attr:`SimulatedKernel.no_sriov_drivers`), is
  ``ENOENT``; N > 0 while VFs exist is ``EBUSY``; 0 removes every VF (directories, links,
  groups); N creates VFs at routing IDs PF+1, PF+2, ... with ``physfn`` / ``virtfn<i>``
  links, each in a new IOMMU group (ACS; ``vf_group_with_pf`` puts them in the PF's), bound
  to the PF's driver only when ``sriov_drivers_autoprobe`` is 1 (QEMU's NVMe VFs, seen in
  the guest: driverless with autoprobe 0).
- ``<pf>/sriov_drivers_autoprobe``: stores 0 or 1 (else ``EINVAL``).
- a device's native driver makes its device nodes when it attaches (:attr:`SimulatedKernel.native_nodes`:
  ``<bdf>/nvme/nvme0/nvme0n1/dev``, ``/sys/dev/block/259:0``, ``/dev/nvme0n1``), after
  :attr:`SimulatedKernel.node_delay` seconds (a probe's async part); its unbind removes them.

Locking, as the kernel's: each write's reaction holds the lock of the device it acts on (the
kernel's ``device_lock``; devices of one IOMMU group share it, as vfio's group mutex guards
the group's ``/dev/vfio`` node), so writes to different groups react at once, from different
threads, as the kernel binds different devices in parallel; ``sriov_numvfs`` also holds one
lock for every structure change (the kernel's ``pci_rescan_remove_lock``: VFs made or
destroyed, IOMMU group numbers handed out), and each VF's lock while it is destroyed.

Hooks let a test make a write fail or hang, to exercise rollback and timeouts: ``fail``
(an error for a write), ``block_seconds`` (a slow device: the write takes that long) and
``gates`` (the write hangs until the test opens the gate: the test decides when it ends).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.sysfs_tree import SysfsTree


def shown(attr: Path, text: str) -> None:
    """Set a sysfs attribute's value whole: the kernel's ``show()`` is read in one go, so a
    reader never sees it half written (``write_text`` truncates first: a reader in between
    reads "")."""
    new = attr.with_name(f".{attr.name}.new")
    new.write_text(text)
    os.replace(new, attr)


class SimulatedKernel:
    def __init__(self, tree: SysfsTree, *, vfio_loaded: bool = True) -> None:
        self.tree = tree
        self.writes: list[tuple[str, str]] = []
        self.modprobed: list[str] = []
        self.fail: Callable[[str, str], OSError | None] | None = None
        self.block_seconds: dict[str, float] = {}  # path suffix -> seconds a write hangs
        self.gates: dict[str, threading.Event] = {}  # path suffix -> a write waits until set
        self.refuse_attach: set[tuple[str, str]] = set()  # (address, driver) probe won't attach
        self.no_sriov_drivers: set[str] = {"vfio-pci", "pci-stub"}  # no sriov_configure
        self.vf_device: dict[str, str] = {}  # PF address -> its VFs' device ID (default: PF's)
        self.vf_group_with_pf: set[str] = set()  # PFs whose VFs share the PF's group (no ACS)
        #: loadable modules: name -> (the PCI driver it registers, does it register with VFIO)
        self.modules: dict[str, tuple[str, bool]] = {"vfio_pci": ("vfio-pci", True)}
        self.broken_modules: set[str] = set()  # modprobe fails for these
        #: device nodes a device's native driver makes when it attaches (removed when it
        #: unbinds): address -> [(path below <bdf>, char|block, MAJOR:MINOR, DEVNAME)]
        self.native_nodes: dict[str, list[tuple[str, str, str, str]]] = {}
        #: seconds after the attach the nodes appear (a driver's probe creates them async)
        self.node_delay = 0.0
        #: structure changes (``sriov_numvfs``) one at a time, as the kernel's
        #: ``pci_rescan_remove_lock``; each device's reactions under its own lock
        #: (:meth:`device_lock`), as the kernel's ``device_lock`` makes each one atomic
        self._lock = threading.Lock()
        self._device_locks: dict[object, threading.RLock] = {}
        self._device_locks_guard = threading.Lock()
        if vfio_loaded:
            tree.ensure_driver("vfio-pci")

    def _rel(self, path: str) -> list[str]:
        rel = os.path.relpath(path, self.tree.root)
        return rel.split("/")

    def modprobe(self, module: str) -> None:
        self.modprobed.append(module)
        name = module.replace("-", "_")
        if name in self.broken_modules:
            from vfio_dp.errors import BindError

            raise BindError(
                f"modprobe {module} failed: modprobe: ERROR: could not insert '{name}': "
                "Unknown symbol in module, or unknown parameter (see dmesg)"
            )
        if name in self.modules:
            driver, vfio = self.modules[name]
            self.tree.load_module(name, driver, vfio=vfio)
            return
        self.tree.ensure_driver(module)

    def _attach(self, addr: str, driver: str) -> bool:
        if (addr, driver) in self.refuse_attach:
            return False
        if not self.tree.sys("bus/pci/drivers", driver).is_dir():
            return False
        self.tree.set_driver(addr, driver)
        if driver == self.tree.devs[addr].native_driver and addr in self.native_nodes:
            if self.node_delay:
                timer = threading.Timer(self.node_delay, self.make_nodes, (addr,))
                timer.daemon = True
                timer.start()
            else:
                self.make_nodes(addr)
        return True

    def make_nodes(self, addr: str) -> None:
        """The device nodes of ``addr``'s native driver appear (:attr:`native_nodes`)."""
        if self.tree.driver_of(addr) != self.tree.devs[addr].native_driver:
            return
        for path, kind, devno, devname in self.native_nodes.get(addr, ()):
            self.tree.add_devnode(addr, path, kind=kind, devno=devno, devname=devname)

    def _drop_nodes(self, addr: str) -> None:
        for top in {p.split("/")[0] for p, _, _, _ in self.native_nodes.get(addr, ())}:
            self.tree.remove_devnodes(addr, top)

    def write(self, path: str, data: str) -> None:
        self.writes.append((path, data))
        for suffix, secs in self.block_seconds.items():
            if path.endswith(suffix):
                time.sleep(secs)  # the scenario: a device that takes this long to let go
        for suffix, gate in self.gates.items():
            if path.endswith(suffix) and not gate.wait(timeout=60):
                raise TimeoutError(f"simulated kernel: the gate for {suffix} was never opened")
        if self.fail is not None:
            err = self.fail(path, data)
            if err is not None:
                raise err
        addr, structure = self._target(path, data)
        with (
            self._lock if structure else contextlib.nullcontext(),
            self.device_lock(addr) if addr else contextlib.nullcontext(),
        ):
            self._react(path, data)

    def device_lock(self, addr: str) -> threading.RLock:
        """The lock a write's reaction on ``addr`` holds: one per IOMMU group (the kernel's
        ``device_lock``, and vfio's group mutex over the group's ``/dev/vfio`` node), one per
        address for a device without a group (or not there)."""
        dev = self.tree.devs.get(addr)
        key: object = dev.group if dev is not None and dev.group is not None else addr
        with self._device_locks_guard:
            return self._device_locks.setdefault(key, threading.RLock())

    def _target(self, path: str, data: str) -> tuple[str | None, bool]:
        """(the device a write to ``path`` acts on, or None; does it change the structure
        -- make or destroy devices -- or touch no device: then under the global lock)."""
        parts = self._rel(path)
        if parts[:4] == ["sys", "bus", "pci", "devices"] and len(parts) == 6:
            return parts[4], parts[5] == "sriov_numvfs"
        if parts == ["sys", "bus", "pci", "drivers_probe"] or (
            parts[:4] == ["sys", "bus", "pci", "drivers"] and len(parts) == 6
        ):
            return data.strip(), False
        return None, True

    def _react(self, path: str, data: str) -> None:
        parts = self._rel(path)
        value = data.strip()
        if parts[:4] == ["sys", "bus", "pci", "devices"] and len(parts) == 6:
            if parts[5] == "sriov_numvfs":
                self._numvfs(parts[4], value)
                return
            if parts[5] == "sriov_drivers_autoprobe":
                if value not in ("0", "1"):
                    raise OSError(errno.EINVAL, "Invalid argument")
                shown(self.tree.dev_dir(parts[4]) / "sriov_drivers_autoprobe", value + "\n")
                return
        if parts[:4] == ["sys", "bus", "pci", "devices"] and parts[5] == "driver_override":
            self.tree.set_override(parts[4], None if data in ("\n", "") else value)
            return
        if parts == ["sys", "bus", "pci", "drivers_probe"]:
            addr = value
            if addr not in self.tree.devs:
                raise OSError(errno.ENODEV, "No such device")
            if self.tree.driver_of(addr) is None:
                override = self.tree.override_of(addr)
                if override:
                    self._attach(addr, override)
                elif self.tree.devs[addr].native_driver and self._may_probe(addr):
                    self._attach(addr, self.tree.devs[addr].native_driver or "")
            return
        if parts[:4] == ["sys", "bus", "pci", "drivers"] and len(parts) == 6:
            driver, op, addr = parts[4], parts[5], value
            if addr not in self.tree.devs:
                raise OSError(errno.ENODEV, "No such device")
            if op == "unbind":
                if self.tree.driver_of(addr) != driver:
                    raise OSError(errno.ENODEV, "No such device")
                self._drop_nodes(addr)
                self.tree.set_driver(addr, None)
                return
            if op == "bind":
                if self.tree.driver_of(addr) is not None:
                    raise OSError(errno.EBUSY, "Device or resource busy")
                override = self.tree.override_of(addr)
                native = self.tree.devs[addr].native_driver
                if (override and override != driver) or (not override and driver != native):
                    raise OSError(errno.ENODEV, "No such device")
                if not override and not self._may_probe(addr):
                    raise OSError(errno.ENODEV, "No such device")
                if not self._attach(addr, driver):
                    raise OSError(errno.ENODEV, "No such device")
                return
            if op in ("new_id", "remove_id"):
                raise AssertionError("vfio_dp must never use new_id/remove_id")
        raise OSError(errno.EACCES, f"simulated kernel does not handle writes to {path}")

    # -- SR-IOV ----------------------------------------------------------------------------
    def _may_probe(self, addr: str) -> bool:
        """The kernel's ``pci_device_can_probe``: a VF whose PF has
        ``sriov_drivers_autoprobe`` 0 attaches to no driver unless ``driver_override`` names one."""
        pf = self.tree.devs[addr].physfn
        if pf is None or pf not in self.tree.devs:
            return True
        return (self.tree.dev_dir(pf) / "sriov_drivers_autoprobe").read_text().strip() == "1"

    def _numvfs(self, pf: str, value: str) -> None:
        try:
            want = int(value, 0)
        except ValueError:
            raise OSError(errno.EINVAL, "Invalid argument") from None
        d = self.tree.dev_dir(pf)
        have = int((d / "sriov_numvfs").read_text())
        if want < 0:
            raise OSError(errno.EINVAL, "Invalid argument")
        if want > int((d / "sriov_totalvfs").read_text()):
            raise OSError(errno.ERANGE, "Numerical result out of range")
        if want == have:
            return
        driver = self.tree.driver_of(pf)
        if driver is None or driver in self.no_sriov_drivers:
            raise OSError(errno.ENOENT, "No such file or directory")
        if want == 0:
            for link in sorted(d.glob("virtfn*")):
                vf = os.path.basename(os.readlink(link))
                with self.device_lock(vf):  # a write on it under way ends first
                    link.unlink()
                    if vf in self.tree.devs:
                        self.tree.remove(vf)
            shown(d / "sriov_numvfs", "0\n")
            return
        if have:
            raise OSError(errno.EBUSY, "Device or resource busy")
        self._make_vfs(pf, want)

    def _make_vfs(self, pf: str, count: int) -> None:
        from tests.sysfs_tree import Dev

        d = self.tree.dev_dir(pf)
        parent = self.tree.devs[pf]
        autoprobe = (d / "sriov_drivers_autoprobe").read_text().strip() == "1"
        domain, bus, rest = pf.split(":")
        slot, func = (int(x, 16) for x in rest.split("."))
        groups = [int(p.name) for p in self.tree.sys("kernel/iommu_groups").iterdir()]
        next_group = max(groups, default=0) + 1
        for i in range(count):
            devfn = (slot << 3 | func) + 1 + i  # First VF Offset 1, VF Stride 1
            vbus = int(bus, 16) + (devfn >> 8)  # past function 0xff: the next bus (256 VFs)
            vf = f"{domain}:{vbus:02x}:{(devfn & 0xFF) >> 3:02x}.{devfn & 7:x}"
            group = parent.group if pf in self.vf_group_with_pf else next_group + i
            self.tree.add(
                Dev(
                    vf,
                    parent.vendor,
                    self.vf_device.get(pf, parent.device),
                    parent.cls,
                    driver=parent.driver if autoprobe else None,
                    native_driver=parent.native_driver,
                    group=group,
                    parent=parent.parent,
                    numa=parent.numa,
                    physfn=pf,
                )
            )
        shown(d / "sriov_numvfs", f"{count}\n")
