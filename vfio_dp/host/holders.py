"""Which processes hold a VFIO group node open -- without ever opening the node.

Opening ``/dev/vfio/<N>`` to ask the kernel is itself a race (a VM starting at that instant
gets ``EBUSY``), so the long-running DRA plugin never does. Instead it reads the host's
process table through the root::

    <root>/proc/<pid>/fd/<n>  -> /dev/vfio/45      (readlink; the target as the process sees it)
    <root>/proc/<pid>/comm                         (the name, for messages)

A descriptor matches a node when its link text is the node's path, or -- for a process in
another mount namespace (a pod's QEMU) whose path may differ -- when ``stat`` through the
magic link (which does not open anything) shows the same character device number as
``<root>/dev/vfio/<N>``; only descriptors whose target is named like a group node (``45``,
``noiommu-45``) are ``stat``-ed, so the scan costs one ``readlink`` per descriptor of the
host, and the nodes themselves are ``stat``-ed only when such a descriptor shows up. A process
that exits mid-scan is skipped. A process whose ``fd``
directory cannot be read (not root) makes the answer *uncertain*: callers that would give
a device back must then wait, never guess.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from vfio_dp.host.root import Root, read_text


@dataclass(frozen=True, slots=True)
class Holder:
    pid: int
    comm: str
    fd: int

    def __str__(self) -> str:
        return f"pid {self.pid} ({self.comm}) fd {self.fd}"


@dataclass(slots=True)
class HolderScan:
    """Holders per node path (host paths, e.g. ``/dev/vfio/45``; only nodes that were asked
    about AND are held appear), and the pids that could not be inspected."""

    by_node: dict[str, list[Holder]] = field(default_factory=dict)
    unreadable: list[int] = field(default_factory=list)

    def held(self, node: str) -> bool | None:
        """True: someone holds it; False: nobody does; None: cannot tell (unreadable pids)."""
        if self.by_node.get(node):
            return True
        return None if self.unreadable else False

    def describe(self, node: str) -> str:
        """``/dev/vfio/45 is held open by pid 812 (qemu-kvm) fd 31`` (or why we cannot tell)."""
        holders = self.by_node.get(node)
        if holders:
            return f"{node} is held open by " + ", ".join(map(str, holders))
        if self.unreadable:
            shown = ", ".join(map(str, self.unreadable[:5]))
            more = "..." if len(self.unreadable) > 5 else ""
            return (
                f"cannot tell whether {node} is held open: /proc/<pid>/fd of pid(s) {shown}{more} "
                "is unreadable (run the plugin as root with the host's /proc)"
            )
        return f"{node} is not held open"


def _rdev(path: str, dir_fd: int | None = None) -> int | None:
    try:
        st = os.stat(path, dir_fd=dir_fd)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISCHR(st.st_mode) else None


def _group_node_name(target: str) -> bool:
    """Is ``target`` (a descriptor's link text) a path whose name a VFIO group node has --
    ``/dev/vfio/45`` or ``/dev/vfio/noiommu-45``, in whatever directory the process sees it?"""
    if not target.startswith("/"):
        return False  # socket:[...], pipe:[...], anon_inode:[...]
    name = target.rpartition("/")[2]
    return name.isdigit() or (name.startswith("noiommu-") and name[8:].isdigit())


def scan_holders(root: Root, nodes: Iterable[str]) -> HolderScan:
    """Scan ``<root>/proc/*/fd`` once for every node of ``nodes`` (host paths under /dev)."""
    nodes = list(nodes)
    for n in nodes:  # built by us from group numbers; never from input
        if not n.startswith("/dev/") or "/../" in n or n.endswith("/.."):
            raise ValueError(f"not a device node path: {n!r}")
    by_path = set(nodes)
    by_rdev: dict[int, str] | None = None  # read when first needed (see the docstring)
    out = HolderScan()  # a node nobody holds is not in by_node (HolderScan.held: False)
    proc = root.path("proc")
    try:
        pids = [int(p) for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return out
    for pid in sorted(pids):
        try:  # the descriptors are read relative to this dir: no path walk for each one
            fd_dir = os.open(f"{proc}/{pid}/fd", os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue  # exited
        except OSError:
            if os.path.exists(f"{proc}/{pid}"):
                out.unreadable.append(pid)
            continue
        try:
            try:
                fds = os.listdir(fd_dir)
            except FileNotFoundError:
                continue  # exited since
            except OSError:
                out.unreadable.append(pid)
                continue
            for name in fds:
                if not name.isdigit():
                    continue
                try:
                    target = os.readlink(name, dir_fd=fd_dir)
                except OSError:
                    continue  # closed or exited meanwhile
                node = target if target in by_path else None
                # a group node's name ends in a digit: most targets (sockets, pipes, files)
                # are passed over before the name is looked at
                if node is None and target[-1:].isdigit() and _group_node_name(target):
                    if by_rdev is None:
                        rdevs = {n: _rdev(root.prefix + n) for n in nodes}
                        by_rdev = {r: n for n, r in rdevs.items() if r is not None}
                    node = by_rdev.get(_rdev(name, fd_dir) or -1)
                if node is None:
                    continue
                comm = read_text(f"{proc}/{pid}/comm") or "?"
                out.by_node.setdefault(node, []).append(Holder(pid, comm, int(name)))
        finally:
            os.close(fd_dir)
    return out


def holders(root: Root, node: str) -> HolderScan:
    """:func:`scan_holders` for one node."""
    return scan_holders(root, [node])
