"""A PCI function's own device nodes, found in sysfs while it is on its native driver, and
their record (format and meaning: :mod:`vfio_dp.model.devnodes`).

Found generically: every ``dev`` file below the function's sysfs directory names a device
node as ``MAJOR:MINOR``, and ``/sys/dev/{char,block}/<MAJOR:MINOR>`` links back to that same
directory, its ``uevent`` giving the name under ``/dev``::

    <root>/sys/bus/pci/devices/0000:01:00.0/nvme/nvme0/dev            242:0
    <root>/sys/bus/pci/devices/0000:01:00.0/nvme/nvme0/nvme0n1/dev    259:0
    <root>/sys/bus/pci/devices/0000:01:00.0/nvme/nvme0/ng0n1/dev      241:0
    <root>/sys/bus/pci/devices/0000:03:00.0/drm/card0/dev             226:0
    <root>/sys/dev/block/259:0 -> ../../devices/pci0000:00/0000:00:04.0/0000:01:00.0/nvme/nvme0/nvme0n1
    <root>/sys/dev/block/259:0/uevent                                 MAJOR=259 MINOR=0 DEVNAME=nvme0n1
    <root>/sys/dev/char/226:0/uevent                                  DEVNAME=dri/card0

→ ``/dev/nvme0``, ``/dev/nvme0n1``, ``/dev/ng0n1``, ``/dev/dri/card0``. A NIC has none (its
``net/eth0`` has no ``dev`` file). On vfio-pci a function has none either, so what was found
is recorded (:class:`DevnodeStore`, ``<root>/var/lib/vfio_dp/devnodes/<bdf>.json``) and read
back while it is elsewhere; :func:`native_nodes` refreshes the record whenever it finds the
function on its native driver.

Every path is hostile: the walk opens directories by fd, never follows a symlink
(``driver``, ``iommu_group``, ``subsystem``, ``physfn`` are links: never entered), never
enters a child PCI function (a bridge's), goes at most :data:`MAX_DEPTH` directories deep
and looks at most :data:`MAX_ENTRIES` entries; ``/sys/dev/...`` is opened inside the root
(:meth:`vfio_dp.host.root.Root.open`) and must be the very directory the ``dev`` file is in
(same inode); a DEVNAME that is not a plain path under ``/dev`` is skipped.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from vfio_dp.errors import CorruptRecordError, HostError, PathEscapeError, StateWriteError
from vfio_dp.host.records import STATE_DIR, RecordFiles
from vfio_dp.host.root import Root, read_text
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory, PciDevice
from vfio_dp.model.devnodes import (
    BLOCK,
    CHAR,
    DevNode,
    NativeNodes,
    dev_path_problem,
    from_json,
    group_container_problem,
    to_json,
)
from vfio_dp.model.personality import Personality

if TYPE_CHECKING:  # `vfioctl check` imports this module: not the config's whole model
    from vfio_dp.model.serving import DraUnit

#: directories below the function's: nvme/nvme0/nvme0n1/nvme0n1p1 is 4
MAX_DEPTH = 4
#: directory entries looked at per function (a GPU's tree has a few hundred)
MAX_ENTRIES = 4096
_DEVNO = re.compile(r"([0-9]{1,10}):([0-9]{1,10})")
_PCI_CHILD = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
DIR = (*STATE_DIR, "devnodes")
_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _read_small(name: str, dir_fd: int) -> str | None:
    """A small regular file of the directory ``dir_fd`` (never through a link), else None."""
    try:
        if not stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return None
    except OSError:
        return None
    return read_text(name, dir_fd=dir_fd, size=4096)


def _dev_files(fd: int) -> list[tuple[str, str, tuple[int, int]]]:
    """``(relative dir, MAJOR:MINOR, (st_dev, st_ino) of that dir)`` of every ``dev`` file
    below the directory ``fd`` (closed here), breadth first, within the bounds."""
    out: list[tuple[str, str, tuple[int, int]]] = []
    queue: list[tuple[int, str, int]] = [(fd, "", 0)]
    seen = 0
    while queue:
        dfd, rel, depth = queue.pop(0)
        try:
            if rel:  # the function's own directory carries no node of its own
                text = _read_small("dev", dfd)
                if text is not None and _DEVNO.fullmatch(text.strip()):
                    st = os.fstat(dfd)
                    out.append((rel, text.strip(), (st.st_dev, st.st_ino)))
            if depth >= MAX_DEPTH:
                continue
            with os.scandir(dfd) as it:
                for entry in it:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        break
                    if not entry.is_dir(follow_symlinks=False) or _PCI_CHILD.fullmatch(entry.name):
                        continue
                    try:
                        child = os.open(entry.name, _FLAGS, dir_fd=dfd)
                    except OSError:
                        continue
                    queue.append((child, f"{rel}/{entry.name}" if rel else entry.name, depth + 1))
        except OSError:
            pass
        finally:
            os.close(dfd)
    for dfd, _, _ in queue:  # left over when the bound stopped the walk
        os.close(dfd)
    return out


def _devname(fs: Root, kind: str, devno: str, inode: tuple[int, int]) -> str | None:
    """``DEVNAME`` of ``<root>/sys/dev/<kind>/<devno>/uevent`` when that directory is the
    one at ``inode`` (resolved inside the root), else None."""
    try:
        dfd = fs.open(fs.path("sys", "dev", kind, devno), os.O_RDONLY | os.O_DIRECTORY)
    except (OSError, PathEscapeError):
        return None
    try:
        st = os.fstat(dfd)
        if (st.st_dev, st.st_ino) != inode or not stat.S_ISDIR(st.st_mode):
            return None
        text = _read_small("uevent", dfd) or ""
    finally:
        os.close(dfd)
    for line in text.splitlines():
        if line.startswith("DEVNAME="):
            return line[len("DEVNAME=") :]
    return None


def discover(fs: Root, dev: PciDevice) -> NativeNodes | None:
    """The device nodes below ``<root>/sys/bus/pci/devices/<bdf>`` now (module docstring),
    on the driver it is on; None when it has no driver or is gone."""
    if dev.driver is None:
        return None
    try:
        fd = fs.open(
            fs.path("sys", "bus", "pci", "devices", str(dev.address)), _FLAGS & ~os.O_NOFOLLOW
        )
    except (OSError, PathEscapeError):
        return None
    nodes: list[DevNode] = []
    for rel, devno, inode in _dev_files(fd):
        for kind in (BLOCK, CHAR):
            name = _devname(fs, kind, devno, inode)
            if name is None:
                continue
            path = "/dev/" + name
            if dev_path_problem(path) is None:
                nodes.append(DevNode(path, kind, devno, rel))
            break
    nodes.sort(key=lambda n: n.sysfs)
    return NativeNodes(dev.address, dev.vendor, dev.device, dev.driver, tuple(nodes))


def _on_dev(fs: Root, path: str) -> bool:
    """Is there an entry at ``path`` (``/dev/nvme0n1``) under the root, reached inside it?"""
    try:
        fd = fs.open(fs.path(*path.split("/")[1:]), os.O_PATH | os.O_NOFOLLOW)
    except (OSError, PathEscapeError, HostError):
        return False
    os.close(fd)
    return True


def missing(fs: Root, found: NativeNodes | None, expected: Iterable[str]) -> list[str]:
    """The paths of ``expected`` (and of every node found) not yet found live below the
    function or not yet under ``<root>/dev``."""
    if found is None or not found.live:
        return list(expected)
    have = set(found.paths)
    want = [*expected, *(p for p in found.paths if p not in expected)]
    return [p for p in want if p not in have or not _on_dev(fs, p)]


class DevnodeStore:
    """The records ``<root>/var/lib/vfio_dp/devnodes/<bdf>.json`` (the one store of them)."""

    def __init__(self, fs: Root) -> None:
        self.fs = fs
        self.files = RecordFiles(fs)

    def get(self, address: PciAddress) -> NativeNodes | None:
        name = f"{address}.json"
        try:
            raw = self.files.read(DIR, name)
            return None if raw is None else from_json(raw)
        except (OSError, PathEscapeError, ValueError, TypeError, UnicodeDecodeError) as e:
            raise CorruptRecordError(
                self.fs.path(*DIR, name),
                str(e),
                "remove it: it is found again on the native driver",
            ) from e

    def put(self, found: NativeNodes) -> None:
        self.files.write(DIR, f"{found.address}.json", to_json(found))


def native_nodes(
    fs: Root, inv: Inventory, addresses: Iterable[PciAddress]
) -> Mapping[PciAddress, NativeNodes | None]:
    """Each function's device nodes on its native driver: found now when it is on a driver
    that is not a VFIO driver (and recorded when they differ from the record), else the
    record when it was made for the same IDs; None: never seen on its native driver."""
    store = DevnodeStore(fs)
    out: dict[PciAddress, NativeNodes | None] = {}
    for a in addresses:
        dev = inv.devices.get(a)
        if dev is None:
            out[a] = None
            continue
        try:
            rec = store.get(a)
        except CorruptRecordError:
            rec = None  # found again below when it is on its native driver
        if rec is not None and (rec.vendor, rec.device) != (dev.vendor, dev.device):
            rec = None  # another card in the slot
        if dev.driver is not None and not dev.on_vfio:
            found = discover(fs, dev)
            if found is not None:
                if rec is None or (rec.driver, rec.nodes) != (found.driver, found.nodes):
                    # a full state dir: still the truth now, recorded next time
                    with contextlib.suppress(StateWriteError, PathEscapeError):
                        store.put(found)
                out[a] = found
                continue
        out[a] = rec
    return out


def wait_for(
    fs: Root,
    read: Callable[[], Inventory],
    expected: Mapping[PciAddress, Sequence[str]],
    timeout: float,
) -> dict[PciAddress, NativeNodes]:
    """Wait (at most ``timeout`` seconds, reading the functions' groups with ``read`` each
    time) until each function of ``expected`` is on its native driver with at least one
    device node, those of ``expected`` among them, each under ``<root>/dev`` (a driver's
    probe makes them a moment after it attaches, an NVMe namespace after its controller).
    :class:`HostError` naming what is missing and the drivers the functions are on."""
    deadline = time.monotonic() + timeout
    pause = 0.02
    while True:
        inv = read()
        found = native_nodes(fs, inv, expected)
        lacking = {a: missing(fs, found.get(a), want) for a, want in expected.items()}
        empty = [
            a for a in expected if not lacking[a] and ((n := found.get(a)) is None or not n.nodes)
        ]
        if not any(lacking.values()) and not empty:
            return {a: n for a, n in found.items() if n is not None}
        if time.monotonic() >= deadline:
            said = [f"{a}: {', '.join(m)} did not appear" for a, m in lacking.items() if m]
            said += [f"{a}: no device node appeared" for a in empty]
            drivers = ", ".join(
                f"{a} on {d.driver or 'no driver'}"
                for a in expected
                if (d := inv.devices.get(a)) is not None
            )
            raise HostError(
                f"waited {timeout:g} s for the device nodes of {drivers}: "
                + "; ".join(said)
                + " (check dmesg for the driver's probe)"
            )
        time.sleep(pause)
        pause = min(pause * 2, 0.25)


def container_problems(fs: Root, inv: Inventory, units: Sequence[DraUnit]) -> dict[str, str]:
    """Each unit offering ``container`` whose container entry cannot be offered on this node
    → why (no device nodes of its own known on its native driver: a NIC); the others are
    absent. Reads (and records) the nodes of those units' functions only. What publication
    and ``vfioctl list`` say, from one rule (:func:`vfio_dp.model.devnodes.group_container_problem`)."""
    offering = [u for u in units if Personality.CONTAINER in u.personalities]
    if not offering:
        return {}
    found = native_nodes(fs, inv, [a for u in offering for a in u.endpoints])

    def describe(a: PciAddress) -> str:
        dev = inv.devices.get(a)
        return dev.describe() if dev is not None else str(a)

    out: dict[str, str] = {}
    for u in offering:
        why = group_container_problem(u.endpoints, describe, found)
        if why is not None:
            out[u.name] = why
    return out
