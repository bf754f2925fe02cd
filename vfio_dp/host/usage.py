"""Which PCI devices the host is using — the devices ``vfioctl bind`` refuses without --force.

Reasons found (each names the thing in use):
- the boot GPU: ``<bdf>/boot_vga`` = 1;
- a network interface that is up or has addresses/routes: ``<root>/sys/class/net/<if>`` resolves
  to ``.../<bdf>/net/<if>`` or ``.../<bdf>/virtio2/net/<if>``; state from ``<if>/flags``
  (IFF_UP), ``<root>/proc/1/net/if_inet6`` and ``<root>/proc/1/net/route`` (PID 1's view = the
  host's network namespace even when read from a pod through the host root);
- a block device that is mounted, used as swap or held (LVM, md):
  ``<root>/sys/class/block/<dev>`` → ``.../<bdf>/nvme/nvme0/nvme0n1`` or
  ``.../<bdf>/virtio1/block/vda``; ``<root>/proc/1/mountinfo``, ``<root>/proc/swaps``,
  ``<dev>/holders/``;
- an SR-IOV PF with VFs enabled: ``<bdf>/sriov_numvfs`` > 0;
- the host's current hardware RNG: ``<root>/sys/class/misc/hw_random/rng_current`` names it
  (``virtio_rng.0``); a virtio RNG is the PCI ancestor of the virtio device bound to
  ``<root>/sys/bus/virtio/drivers/virtio_rng/virtioN`` (the ``.0`` is the driver's own
  counter, not the virtio index, so with several virtio RNGs each is reported as possibly
  current); an RNG named by its PCI address is that device.
Each use comes with what frees it (:class:`~vfio_dp.model.device.HostUse`).
An open ``/dev/vfio/<N>`` is found only by :func:`vfio_dp.host.vfio.probe_groups` (operator
commands); the daemon never opens group nodes.

Interfaces and disks are mapped to their PCI ancestor by resolving the class links inside
the root — equivalent to walking every device's subtree, at the cost of a few links.
"""

from __future__ import annotations

import os
from collections import defaultdict

from vfio_dp.errors import AddressError, HostError
from vfio_dp.host.root import Root, read_text
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import HostUse, PciDevice

IFF_UP = 0x1


def _pci_ancestor(resolved: str) -> PciAddress | None:
    """The deepest PCI address component of a resolved ``/sys/devices/...`` path."""
    found: PciAddress | None = None
    for part in resolved.split("/"):
        if len(part) == 12 and part[4] == ":" and part[10] == ".":
            try:
                found = PciAddress.parse(part)
            except AddressError:
                continue
    return found


def _class_members(
    root: Root, cls: str, under: tuple[str, ...] = ("sys", "class")
) -> list[tuple[str, str]]:
    """(name, resolved path) of every ``<root>/sys/class/<cls>/*`` entry (or ``<under>/<cls>/*``)."""
    try:
        base = root.path(*under, cls)
        names = os.listdir(base)
    except (OSError, HostError):
        return []
    out = []
    for name in names:
        try:
            out.append((name, root.resolve(f"{base}/{name}")))
        except HostError:
            continue
    return out


def _host_net_state(root: Root) -> tuple[set[str], set[str]]:
    """(interfaces with a global IPv6 address, interfaces with an IPv4 route) in the host netns."""
    with_addr: set[str] = set()
    for line in (read_text(root.path("proc", "1", "net", "if_inet6")) or "").splitlines():
        f = line.split()
        # address ifindex prefixlen scope flags name; scope 0x20 = link-local, 0x10 = host
        if len(f) >= 6 and f[3] not in ("20", "10"):
            with_addr.add(f[5])
    routed: set[str] = set()
    for line in (read_text(root.path("proc", "1", "net", "route")) or "").splitlines()[1:]:
        f = line.split()
        if f:
            routed.add(f[0])
    return with_addr, routed


def _mounted(root: Root) -> tuple[dict[str, str], dict[str, str]]:
    """Mount points of every mount in the host's mount namespace, by major:minor and by
    source basename (the first mount of each)."""
    majmin: dict[str, str] = {}
    sources: dict[str, str] = {}
    text = read_text(root.path("proc", "1", "mountinfo")) or ""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        if len(f) >= 5:
            majmin.setdefault(f[2], f[4])
        r = right.split()
        if len(r) >= 2 and r[1].startswith("/dev/") and len(f) >= 5:
            sources.setdefault(os.path.basename(r[1]), f[4])
    return majmin, sources


def _swaps(root: Root) -> set[str]:
    out: set[str] = set()
    for line in (read_text(root.path("proc", "swaps")) or "").splitlines()[1:]:
        f = line.split()
        if f and f[0].startswith("/dev/"):
            out.add(os.path.basename(f[0]))
    return out


_HW_RANDOM = ("sys", "class", "misc", "hw_random")


def _hw_rng(root: Root, devices: dict[PciAddress, PciDevice]) -> dict[PciAddress, HostUse]:
    """The device(s) behind the host's current hardware RNG (``rng_current``), if any."""
    try:
        base = root.resolve(root.path(*_HW_RANDOM))
    except HostError:
        return {}
    current = read_text(base + "/rng_current")
    if not current or current == "none":
        return {}
    path = root.path(*_HW_RANDOM, "rng_current")
    fix = (
        f"make the host use another RNG first: echo NAME > {path} (NAME from rng_available "
        "in the same directory), or pick another device"
    )
    funcs: list[PciAddress] = []
    if current.startswith("virtio_rng."):
        for _, resolved in _class_members(root, "virtio_rng", ("sys", "bus", "virtio", "drivers")):
            func = _pci_ancestor(resolved)
            if func is not None and func in devices:
                funcs.append(func)
    else:
        func = _pci_ancestor(current) if len(current) == 12 else None
        if func is not None and func in devices:
            funcs.append(func)
    what = f"it is the host's current hardware RNG ({current})"
    if len(funcs) > 1:
        what = f"it may be the host's current hardware RNG ({current}; one of {len(funcs)} virtio RNGs)"
    return {o: HostUse(what, fix) for o in funcs}


def host_usage(root: Root, devices: dict[PciAddress, PciDevice]) -> dict[PciAddress, list[HostUse]]:
    """Every use the host makes of each device (devices not in use are left out)."""
    reasons: dict[PciAddress, list[HostUse]] = defaultdict(list)
    for addr, dev in devices.items():
        if dev.boot_vga:
            reasons[addr].append(
                HostUse(
                    "boot GPU (boot_vga=1): the host console is on it",
                    "pick another GPU (the host would lose its console)",
                    critical=True,
                )
            )
        if dev.sriov_numvfs:
            reasons[addr].append(
                HostUse(
                    f"SR-IOV PF with {dev.sriov_numvfs} VFs enabled: unbinding it destroys them",
                    f"echo 0 > {root.path('sys', 'bus', 'pci', 'devices', str(addr), 'sriov_numvfs')} "
                    "first, or pass the VFs through instead",
                )
            )
    nets = _class_members(root, "net")
    if nets:
        with_addr, routed = _host_net_state(root)
        used: list[tuple[PciAddress, str, list[str]]] = []
        up_count = 0
        for name, resolved in nets:
            flags = read_text(resolved + "/flags")
            unreadable = False
            try:
                up = flags is not None and bool(int(flags, 16) & IFF_UP)
            except ValueError:  # not what the kernel writes (0x1003): count it as in use
                up, unreadable = False, True
            up_count += up and name != "lo"
            func = _pci_ancestor(resolved)
            if func is None or func not in devices:
                continue
            why = []
            if up:
                why.append("is up")
            if unreadable:
                why.append(f"has unreadable flags {str(flags)[:20]!r}")
            if name in with_addr:
                why.append("has addresses")
            if name in routed:
                why.append("has routes")
            if why:
                used.append((func, name, why))
        for func, name, why in used:
            fix = f"bring it down first: ip link set {name} down"
            only = "is up" in why and up_count == 1
            if only:
                fix = (
                    f"pick another device: {name} is the host's only interface that is up, "
                    "so taking it cuts the host off the network"
                )
            reasons[func].append(
                HostUse(f"network interface {name} {' and '.join(why)}", fix, critical=only)
            )
    blocks = _class_members(root, "block")
    if blocks:
        majmin, sources = _mounted(root)
        swaps = _swaps(root)
        for name, resolved in blocks:
            func = _pci_ancestor(resolved)
            if func is None or func not in devices:
                continue
            dev_no = read_text(resolved + "/dev")
            where = majmin.get(dev_no or "") or sources.get(name)
            if where == "/":
                reasons[func].append(
                    HostUse(
                        f"block device {name} is mounted at / (the host's root filesystem)",
                        "pick another device: the host cannot run without its root disk",
                        critical=True,
                    )
                )
            elif where is not None:
                reasons[func].append(
                    HostUse(f"block device {name} is mounted", f"unmount it first: umount {where}")
                )
            if name in swaps:
                reasons[func].append(
                    HostUse(f"block device {name} is used as swap", f"swapoff /dev/{name} first")
                )
            try:
                holders = os.listdir(resolved + "/holders")
            except OSError:
                holders = []
            if holders:
                reasons[func].append(
                    HostUse(
                        f"block device {name} is held by {', '.join(sorted(holders))}",
                        "stop what holds it first (deactivate the LVM volume group or stop "
                        "the md array)",
                    )
                )
    for func, use in _hw_rng(root, devices).items():
        reasons[func].append(use)
    return dict(reasons)
