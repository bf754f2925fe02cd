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
- an SR-IOV PF with VFs enabled: ``<bdf>/sriov_numvfs`` > 0.
An open ``/dev/vfio/<N>`` is found only by :func:`vfio_dp.host.vfio.probe_group` (operator
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
from vfio_dp.model.device import PciDevice

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


def _class_members(root: Root, cls: str) -> list[tuple[str, str]]:
    """(name, resolved path) of every ``<root>/sys/class/<cls>/*`` entry."""
    try:
        base = root.path("sys", "class", cls)
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


def _mounted(root: Root) -> tuple[set[str], set[str]]:
    """(major:minor, source basenames) of every mount in the host's mount namespace."""
    majmin: set[str] = set()
    sources: set[str] = set()
    text = read_text(root.path("proc", "1", "mountinfo")) or ""
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        if len(f) >= 3:
            majmin.add(f[2])
        r = right.split()
        if len(r) >= 2 and r[1].startswith("/dev/"):
            sources.add(os.path.basename(r[1]))
    return majmin, sources


def _swaps(root: Root) -> set[str]:
    out: set[str] = set()
    for line in (read_text(root.path("proc", "swaps")) or "").splitlines()[1:]:
        f = line.split()
        if f and f[0].startswith("/dev/"):
            out.add(os.path.basename(f[0]))
    return out


def host_usage(root: Root, devices: dict[PciAddress, PciDevice]) -> dict[PciAddress, list[str]]:
    """Every reason the host is using each device (devices not in use are left out)."""
    reasons: dict[PciAddress, list[str]] = defaultdict(list)
    for addr, dev in devices.items():
        if dev.boot_vga:
            reasons[addr].append("boot GPU (boot_vga=1): the host console is on it")
        if dev.sriov_numvfs:
            reasons[addr].append(
                f"SR-IOV PF with {dev.sriov_numvfs} VFs enabled: unbinding it destroys them "
                f"(echo 0 > sriov_numvfs first, or pass the VFs through instead)"
            )
    nets = _class_members(root, "net")
    if nets:
        with_addr, routed = _host_net_state(root)
        for name, resolved in nets:
            owner = _pci_ancestor(resolved)
            if owner is None or owner not in devices:
                continue
            flags = read_text(resolved + "/flags")
            why = []
            try:
                if flags is not None and int(flags, 16) & IFF_UP:
                    why.append("is up")
            except ValueError:  # not what the kernel writes (0x1003): count it as in use
                why.append(f"has unreadable flags {str(flags)[:20]!r}")
            if name in with_addr:
                why.append("has addresses")
            if name in routed:
                why.append("has routes")
            if why:
                reasons[owner].append(f"network interface {name} {' and '.join(why)}")
    blocks = _class_members(root, "block")
    if blocks:
        majmin, sources = _mounted(root)
        swaps = _swaps(root)
        for name, resolved in blocks:
            owner = _pci_ancestor(resolved)
            if owner is None or owner not in devices:
                continue
            dev_no = read_text(resolved + "/dev")
            if (dev_no and dev_no in majmin) or name in sources:
                reasons[owner].append(f"block device {name} is mounted")
            if name in swaps:
                reasons[owner].append(f"block device {name} is used as swap")
            try:
                holders = os.listdir(resolved + "/holders")
            except OSError:
                holders = []
            if holders:
                reasons[owner].append(
                    f"block device {name} is held by {', '.join(sorted(holders))}"
                )
    return dict(reasons)
