"""A fake node: a real directory tree shaped like a host's ``/sys``, ``/dev`` and ``/proc``
for a described PCI topology, to point ``--root`` at (``vfioctl fake-node``, and the tests'
trees: ``tests/sysfs_tree.py`` is this module).

Writes real files and real RELATIVE symlinks nested like the kernel's tree::

    <root>/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/{vendor,device,class,...}
    <root>/sys/bus/pci/devices/0000:01:00.0 -> ../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0
    <dev>/driver      -> ../../../../bus/pci/drivers/e1000e     (depth follows nesting)
    <dev>/iommu_group -> ../../../../kernel/iommu_groups/5
    <root>/sys/kernel/iommu_groups/5/devices/0000:01:00.0 -> ../../../../devices/...
    <root>/sys/bus/pci/drivers/<name>/{bind,unbind,new_id,remove_id,<bdf> -> device}
    <root>/dev/vfio/vfio, <root>/dev/vfio/<N> (plain files) for groups with a device on a
        VFIO driver (vfio-pci, a variant: load_module(vfio=True), a provider: registers_vfio)
    <root>/lib/modules/<release>/modules.alias, <root>/proc/sys/kernel/osrelease (set_modules_alias)
    <root>/sys/module/<m>/drivers/pci:<driver> (load_module)
    <root>/proc/1/mountinfo, <root>/proc/swaps, <root>/proc/1/net/{route,if_inet6}
    <root>/sys/class/misc/hw_random -> ../../devices/virtual/misc/hw_random (add_hwrng)
    <dev>/nvme/nvme0/nvme0n1/dev, <root>/sys/dev/block/259:0 -> <dev>/nvme/nvme0/nvme0n1,
        <root>/dev/nvme0n1 (a plain file) for a device's own nodes (add_devnode)

It does NOT react to writes: no kernel is behind it, so writing ``driver_override``,
``unbind`` or ``drivers_probe`` changes a plain file and no driver moves (a ``vfioctl bind``
there fails when it reads the device back, and puts back what it wrote); the tests'
``tests/kernel_sim.py`` applies the kernel's reaction.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vfio_dp.model.address import PciAddress


def _put(path: str, data: bytes) -> None:
    """Write ``data`` as the whole file ``path`` (plain ``os`` calls: thousands per tree)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@dataclass
class Dev:
    address: str
    vendor: str
    device: str
    cls: str  # 6 hex, e.g. "020000"
    driver: str | None = None
    group: int | None = None
    numa: int = -1
    parent: str | None = None  # address of the upstream bridge (None: root bus)
    subsystem_vendor: str = "0000"
    subsystem_device: str = "0000"
    boot_vga: bool | None = None
    sriov_totalvfs: int | None = None
    sriov_numvfs: int | None = None
    physfn: str | None = None
    native_driver: str | None = None  # what drivers_probe picks without override (sim)
    extra: dict[str, str] = field(default_factory=dict)
    #: its host driver registers it with VFIO itself (a vendor VFIO provider, e.g. nvidia
    #: vGPU): bound to it, the device's group gets /dev/vfio/<N>
    registers_vfio: bool = False


class SysfsTree:
    """Builds ``<base>/sys``, ``<base>/dev``, ``<base>/proc`` for a list of :class:`Dev`."""

    def __init__(self, base: Path, *, iommu: bool = True) -> None:
        self.root = Path(base)
        self.iommu = iommu
        self.devs: dict[str, Dev] = {}
        #: drivers that register their devices with VFIO (vfio-pci, variants: load_module)
        self.vfio_drivers: set[str] = {"vfio-pci"}
        self._virtfns: dict[str, int] = {}  # per PF: where to look for its next virtfn link
        for d in (
            "sys/bus/pci/devices",
            "sys/bus/pci/drivers",
            "sys/kernel/iommu_groups",
            "sys/class/net",
            "sys/class/block",
            "dev/vfio",
            "proc/1/net",
        ):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        (self.root / "sys/bus/pci/drivers_probe").write_text("")
        (self.root / "dev/vfio/vfio").write_text("")
        self.set_proc()

    # -- paths -----------------------------------------------------------------------
    def sys(self, *parts: str) -> Path:
        return self.root.joinpath("sys", *parts)

    def dev_dir(self, address: str) -> Path:
        chain = []
        a: str | None = address
        while a is not None:
            chain.append(a)
            a = self.devs[a].parent
        domain, bus = address.split(":")[0], "00"
        del bus
        return self.sys("devices", f"pci{domain}:00", *reversed(chain))

    def _link(self, link: Path, target: Path) -> None:
        """``link`` -> ``target`` as a relative symlink, replacing whatever ``link`` was
        (its directory made when missing). Plain ``os`` calls, no look before: a PF's 256
        VFs are ~2,000 links."""
        parent = os.path.dirname(link)
        rel = os.path.relpath(target, parent)
        try:
            os.symlink(rel, link)
        except FileExistsError:
            os.unlink(link)
            os.symlink(rel, link)
        except FileNotFoundError:
            os.makedirs(parent, exist_ok=True)
            os.symlink(rel, link)

    def _next_virtfn(self, physfn: str, pf: Path) -> int:
        """The PF's first free ``virtfn<n>`` (its links are ``virtfn0``..``virtfn<n-1>``),
        from where the last one was made: 256 VFs made are not 256 listings of the PF."""
        n = self._virtfns.get(physfn, 0)
        if n and not os.path.lexists(pf / f"virtfn{n - 1}"):
            n = 0  # its VFs were destroyed since: count again
        while os.path.lexists(pf / f"virtfn{n}"):
            n += 1
        self._virtfns[physfn] = n + 1
        return n

    # -- building ----------------------------------------------------------------------
    def add(self, dev: Dev) -> Dev:
        dev.address = str(PciAddress.parse(dev.address))
        self.devs[dev.address] = dev
        d = self.dev_dir(dev.address)
        d.mkdir(parents=True, exist_ok=True)
        files = {
            "vendor": f"0x{dev.vendor}",
            "device": f"0x{dev.device}",
            "class": f"0x{dev.cls}",
            "subsystem_vendor": f"0x{dev.subsystem_vendor}",
            "subsystem_device": f"0x{dev.subsystem_device}",
            "numa_node": str(dev.numa),
            "driver_override": "(null)",
            "enable": "1",
            "reset_method": "flr bus",
        }
        if dev.boot_vga is not None:
            files["boot_vga"] = "1" if dev.boot_vga else "0"
        if dev.sriov_totalvfs is not None:
            files["sriov_totalvfs"] = str(dev.sriov_totalvfs)
            files["sriov_numvfs"] = str(dev.sriov_numvfs or 0)
            files["sriov_drivers_autoprobe"] = "1"
        files.update(dev.extra)
        for name, value in files.items():
            _put(os.path.join(d, name), (value + "\n").encode())
        _put(os.path.join(d, "config"), self._config_space(dev))
        self._link(self.sys("bus/pci/devices", dev.address), d)
        if dev.physfn:
            pf = self.dev_dir(dev.physfn)
            self._link(d / "physfn", pf)
            self._link(pf / f"virtfn{self._next_virtfn(dev.physfn, pf)}", d)
        if dev.group is not None and self.iommu:
            g = self.sys("kernel/iommu_groups", str(dev.group))
            (g / "devices").mkdir(parents=True, exist_ok=True)
            self._link(g / "devices" / dev.address, d)
            self._link(d / "iommu_group", g)
        if dev.native_driver is None:
            dev.native_driver = dev.driver
        self.set_driver(dev.address, dev.driver)
        return dev

    @staticmethod
    def _config_space(dev: Dev) -> bytes:
        """The first 64 bytes of config space, as ``<bdf>/config`` exposes them (lspci reads it)."""
        import struct

        cls = int(dev.cls, 16)
        header = 1 if dev.cls.startswith("0604") else 0
        head = struct.pack(
            "<HHHHBBBBBBBB",
            int(dev.vendor, 16),
            int(dev.device, 16),
            0x0007,
            0x0010,
            0x01,
            cls & 0xFF,
            (cls >> 8) & 0xFF,
            (cls >> 16) & 0xFF,
            0,
            0,
            header,
            0,
        )
        body = bytearray(64)
        body[: len(head)] = head
        if header == 0:
            body[0x2C:0x30] = struct.pack(
                "<HH", int(dev.subsystem_vendor, 16), int(dev.subsystem_device, 16)
            )
        return bytes(body)

    def ensure_driver(self, name: str) -> Path:
        p = self.sys("bus/pci/drivers", name)
        if not p.exists():
            p.mkdir(parents=True)
            for f in ("bind", "unbind", "new_id", "remove_id"):
                (p / f).write_text("")
        return p

    def driver_of(self, address: str) -> str | None:
        """The device's driver, read once: the plugin under test may re-link ``driver`` at the
        same moment (reconcile giving a group back), so "absent" is "no driver", not an error."""
        try:
            return os.path.basename(os.readlink(self.dev_dir(address) / "driver"))
        except OSError:  # gone (FileNotFoundError) or not a link (EINVAL)
            return None

    def set_driver(self, address: str, driver: str | None) -> None:
        """Move the device's ``driver`` link (and the driver's back link); vfio nodes follow."""
        d = self.dev_dir(address)
        old = self.driver_of(address)
        if old:
            (d / "driver").unlink(missing_ok=True)
            back = self.sys("bus/pci/drivers", old, address)
            if back.is_symlink():
                back.unlink()
        dev = self.devs[address]
        dev.driver = driver
        if driver:
            drv = self.ensure_driver(driver)
            self._link(d / "driver", drv)
            self._link(drv / address, d)
        self._write_uevent(dev)
        self._sync_vfio_node(dev.group)

    def _write_uevent(self, dev: Dev) -> None:
        """``<bdf>/uevent`` as the kernel renders it (``PCI_CLASS`` is ``%04X``, IDs upper-case)."""
        lines = [f"DRIVER={dev.driver}"] if dev.driver else []
        lines += [
            f"PCI_CLASS={int(dev.cls, 16):04X}",
            f"PCI_ID={dev.vendor.upper()}:{dev.device.upper()}",
            f"PCI_SUBSYS_ID={dev.subsystem_vendor.upper()}:{dev.subsystem_device.upper()}",
            f"PCI_SLOT_NAME={dev.address}",
        ]
        _put(os.path.join(self.dev_dir(dev.address), "uevent"), ("\n".join(lines) + "\n").encode())

    def _sync_vfio_node(self, group: int | None) -> None:
        if group is None or not self.iommu:
            return
        node = self.root / "dev/vfio" / str(group)
        try:  # the group's members, as its links say (not every device: 1,024 VFs bound)
            listed = os.listdir(self.sys("kernel/iommu_groups", str(group), "devices"))
            members = [x for a in listed if (x := self.devs.get(a)) is not None]
        except FileNotFoundError:
            members = list(self.devs.values())
        on_vfio = any(
            x.group == group
            and x.driver is not None
            and (
                x.driver in self.vfio_drivers or (x.registers_vfio and x.driver == x.native_driver)
            )
            for x in members
        )
        if on_vfio and not node.exists():
            node.write_text("")
        elif not on_vfio and node.exists():
            node.unlink()

    # -- kernel modules (modules.alias, /sys/module) -------------------------------------
    def set_modules_alias(self, lines: list[str] | None, *, release: str = "6.1.0-test") -> Path:
        """``<root>/proc/sys/kernel/osrelease`` = ``release`` and
        ``<root>/lib/modules/<release>/modules.alias`` holding ``lines`` (None: no file)."""
        (self.root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
        (self.root / "proc/sys/kernel/osrelease").write_text(release + "\n")
        path = self.root / "lib/modules" / release / "modules.alias"
        path.parent.mkdir(parents=True, exist_ok=True)
        if lines is None:
            path.unlink(missing_ok=True)
        else:
            head = "# Aliases extracted from modules themselves.\n"
            path.write_text(head + "\n".join(lines) + "\n")
        return path

    def load_module(self, module: str, driver: str | None = None, *, vfio: bool = False) -> None:
        """A loaded module: ``/sys/module/<m>/drivers/pci:<driver>`` → the driver's dir
        (``/sys/bus/pci/drivers/<driver>``, whose ``module`` links back); ``vfio``: the driver
        registers its devices with VFIO (a variant driver on vfio_pci_core)."""
        name = driver or module
        drv = self.ensure_driver(name)
        mod = self.sys("module", module)
        (mod / "drivers").mkdir(parents=True, exist_ok=True)
        self._link(mod / "drivers" / f"pci:{name}", drv)
        self._link(drv / "module", mod)
        if vfio:
            self.vfio_drivers.add(name)

    def set_override(self, address: str, value: str | None) -> None:
        (self.dev_dir(address) / "driver_override").write_text((value or "(null)") + "\n")

    def override_of(self, address: str) -> str | None:
        v = (self.dev_dir(address) / "driver_override").read_text().strip()
        return None if v in ("", "(null)") else v

    def remove(self, address: str) -> None:
        """Hot-unplug: the device and every link to it disappear."""
        import shutil

        directory = self.dev_dir(address)  # while the device still knows its parents
        dev = self.devs.pop(address)
        for link in (
            self.sys("bus/pci/devices", address),
            self.sys("kernel/iommu_groups", str(dev.group), "devices", address),
        ):
            if link.is_symlink():
                link.unlink()
        if dev.driver:
            back = self.sys("bus/pci/drivers", dev.driver, address)
            if back.is_symlink():
                back.unlink()
        shutil.rmtree(directory)
        self._sync_vfio_node(dev.group)

    def add_net(self, address: str, ifname: str, *, up: bool, via: str | None = None) -> None:
        """An interface under the device (``via``: e.g. ``virtio2`` in between)."""
        d = self.dev_dir(address) / (via or "") / "net" / ifname
        d.mkdir(parents=True, exist_ok=True)
        (d / "flags").write_text("0x1003\n" if up else "0x1002\n")
        (d / "operstate").write_text("up\n" if up else "down\n")
        self._link(self.sys("class/net", ifname), d)

    def add_block(
        self, address: str, path: str, *, devno: str, holders: Sequence[str] = ()
    ) -> None:
        """A block device at ``<bdf>/<path>`` (e.g. ``virtio1/block/vda``, ``nvme/nvme0/nvme0n1``)."""
        d = self.dev_dir(address) / path
        (d / "holders").mkdir(parents=True, exist_ok=True)
        for h in holders:
            (d / "holders" / h).mkdir(exist_ok=True)
        (d / "dev").write_text(devno + "\n")
        self._link(self.sys("class/block", os.path.basename(path)), d)

    def add_devnode(self, address: str, path: str, *, kind: str, devno: str, devname: str) -> None:
        """A device node of the device: ``<bdf>/<path>/dev`` = ``devno`` and
        ``/sys/dev/<kind>/<devno>`` linking back to that directory, its ``uevent`` naming
        ``DEVNAME`` (``nvme/nvme0/nvme0n1``, block, ``259:0``, ``nvme0n1``)."""
        d = self.dev_dir(address) / path
        d.mkdir(parents=True, exist_ok=True)
        major, minor = devno.split(":")
        (d / "dev").write_text(devno + "\n")
        (d / "uevent").write_text(f"MAJOR={major}\nMINOR={minor}\nDEVNAME={devname}\n")
        self._link(self.sys("dev", kind, devno), d)
        node = self.root / "dev" / devname  # devtmpfs makes it (a plain file here)
        node.parent.mkdir(parents=True, exist_ok=True)
        node.write_text("")

    def remove_devnodes(self, address: str, top: str) -> None:
        """Remove ``<bdf>/<top>`` and every ``/sys/dev`` link into it (a driver unbinding)."""
        import shutil

        d = self.dev_dir(address) / top
        for kind in ("char", "block"):
            base = self.sys("dev", kind)
            if not base.is_dir():
                continue
            for link in base.iterdir():
                target = os.path.normpath(os.path.join(base, os.readlink(link)))
                if target == str(d) or target.startswith(str(d) + "/"):
                    uevent = Path(target) / "uevent"
                    for line in uevent.read_text().splitlines() if uevent.is_file() else []:
                        if line.startswith("DEVNAME="):
                            (self.root / "dev" / line[8:]).unlink(missing_ok=True)
                    link.unlink()
        if d.is_dir():
            shutil.rmtree(d)

    def add_hwrng(
        self, address: str | None, current: str, *, via: str = "virtio3", available: str = ""
    ) -> None:
        """A hardware RNG: ``/sys/class/misc/hw_random`` (a link into
        ``devices/virtual/misc/hw_random``, as on a real host) with ``rng_current`` =
        ``current``; with ``address``, a virtio RNG at ``<bdf>/<via>`` bound to
        ``bus/virtio/drivers/virtio_rng``."""
        misc = self.sys("devices/virtual/misc/hw_random")
        misc.mkdir(parents=True, exist_ok=True)
        (misc / "rng_current").write_text(current + "\n")
        (misc / "rng_available").write_text((available or current) + "\n")
        self._link(self.sys("class/misc/hw_random"), misc)
        if address is not None:
            d = self.dev_dir(address) / via
            d.mkdir(parents=True, exist_ok=True)
            drv = self.sys("bus/virtio/drivers/virtio_rng")
            drv.mkdir(parents=True, exist_ok=True)
            (drv / "bind").write_text("")
            self._link(drv / via, d)
            self._link(d / "driver", drv)

    def set_proc(
        self,
        *,
        mounts: Sequence[tuple[str, str, str]] = (),
        swaps: Sequence[str] = (),
        routes: Sequence[str] = (),
    ) -> None:
        """mounts: (major:minor, mountpoint, source) rows of the host's mountinfo."""
        lines = [
            f"{20 + i} 1 {mm} / {mp} rw,relatime shared:1 - ext4 {src} rw"
            for i, (mm, mp, src) in enumerate(mounts)
        ]
        lines.append("30 1 0:21 / /proc rw,nosuid shared:5 - proc proc rw")
        (self.root / "proc/1/mountinfo").write_text("\n".join(lines) + "\n")
        (self.root / "proc/swaps").write_text(
            "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
            + "".join(f"{s}\tpartition\t1000\t0\t-2\n" for s in swaps)
        )
        (self.root / "proc/1/net/route").write_text(
            "Iface\tDestination\tGateway\tFlags\tRefCnt\tUse\tMetric\tMask\n"
            + "".join(f"{r}\t00000000\t0100000A\t0003\t0\t0\t0\t00000000\n" for r in routes)
        )
        (self.root / "proc/1/net/if_inet6").write_text("")
