"""Who holds /dev/vfio/<N> open: temp /proc trees with real symlinks, and this machine's /proc."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vfio_dp.host.holders import holders, scan_holders
from vfio_dp.host.root import Root


def _proc(root: Path, pid: int, comm: str, fds: dict[int, str]) -> None:
    d = root / "proc" / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "comm").write_text(comm + "\n")
    for n, target in fds.items():
        (d / "fd" / str(n)).symlink_to(target)  # real (dangling) links, as /proc shows them


def test_finds_every_holder_and_only_them(tmp_path: Path) -> None:
    _proc(tmp_path, 812, "qemu-kvm", {0: "/dev/null", 31: "/dev/vfio/45", 32: "/dev/vfio/vfio"})
    _proc(tmp_path, 900, "bash", {0: "/dev/pts/0", 1: "socket:[1234]"})
    _proc(tmp_path, 901, "virt-launcher", {7: "/dev/vfio/46", 8: "/dev/vfio/45"})
    (tmp_path / "proc" / "self").symlink_to("900")  # not a pid: ignored
    scan = scan_holders(Root(tmp_path), ["/dev/vfio/45", "/dev/vfio/46", "/dev/vfio/47"])
    assert [(h.pid, h.comm, h.fd) for h in scan.by_node["/dev/vfio/45"]] == [
        (812, "qemu-kvm", 31),
        (901, "virt-launcher", 8),
    ]
    assert scan.held("/dev/vfio/46") is True
    assert scan.held("/dev/vfio/47") is False
    assert scan.describe("/dev/vfio/45") == (
        "/dev/vfio/45 is held open by pid 812 (qemu-kvm) fd 31, pid 901 (virt-launcher) fd 8"
    )


def test_no_proc_means_nobody(tmp_path: Path) -> None:
    assert holders(Root(tmp_path), "/dev/vfio/45").held("/dev/vfio/45") is False


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every /proc/<pid>/fd: no EACCES here")
def test_unreadable_fd_dir_means_cannot_tell(tmp_path: Path) -> None:
    _proc(tmp_path, 812, "qemu-kvm", {})
    os.chmod(tmp_path / "proc/812/fd", 0)
    scan = holders(Root(tmp_path), "/dev/vfio/45")
    assert scan.held("/dev/vfio/45") is None and "cannot tell" in scan.describe("/dev/vfio/45")


def test_unreadable_fd_dir_means_cannot_tell_as_root(tmp_path: Path) -> None:
    """Root ignores modes, so make the fd 'directory' a file: listdir fails with ENOTDIR."""
    d = tmp_path / "proc/812"
    d.mkdir(parents=True)
    (d / "fd").write_text("")
    scan = holders(Root(tmp_path), "/dev/vfio/45")
    assert scan.held("/dev/vfio/45") is None
    assert scan.unreadable == [812]
    assert "pid(s) 812" in scan.describe("/dev/vfio/45")


def test_real_proc_matches_by_path_and_device_number() -> None:
    """On this machine's real /proc (read only): this process opening /dev/null is found,
    by link text and by st_rdev; nothing is ever opened by the scan itself."""
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fd = os.open("/dev/null", os.O_RDONLY)
    try:
        scan = holders(Root("/"), "/dev/null")
        mine = [h for h in scan.by_node["/dev/null"] if h.pid == os.getpid()]
        assert fd in [h.fd for h in mine]
    finally:
        os.close(fd)
    scan = holders(Root("/"), "/dev/null")
    assert fd not in [h.fd for h in scan.by_node.get("/dev/null", []) if h.pid == os.getpid()]


def test_real_proc_matches_by_device_number_across_names(tmp_path: Path) -> None:
    """A process in another mount namespace may see the node under another path (a pod's
    root file system seen from the host: ``.../rootfs/dev/vfio/45``): the link text differs,
    the character device number is the same (found through stat of the link). Only targets
    named like a group node are stat-ed: the same device under another name is not looked at
    (a scan costs one readlink per descriptor, not a stat of every open file)."""
    if os.geteuid() != 0:
        pytest.skip("mknod of a character device needs root")
    rdev = os.stat("/dev/null").st_rdev  # a harmless character device stands for the group
    pod = tmp_path / "pod-rootfs" / "dev" / "vfio"
    pod.mkdir(parents=True)
    os.mknod(pod / "45", stat.S_IFCHR | 0o600, rdev)
    os.mknod(pod / "renamed", stat.S_IFCHR | 0o600, rdev)
    root = tmp_path / "root"
    (root / "dev" / "vfio").mkdir(parents=True)
    os.symlink("/proc", root / "proc")
    os.mknod(root / "dev" / "vfio" / "45", stat.S_IFCHR | 0o600, rdev)
    fd = os.open(pod / "45", os.O_RDONLY)
    other = os.open(pod / "renamed", os.O_RDONLY)
    try:
        scan = holders(Root(root), "/dev/vfio/45")
        mine = [h.fd for h in scan.by_node["/dev/vfio/45"] if h.pid == os.getpid()]
        assert fd in mine and other not in mine
    finally:
        os.close(fd)
        os.close(other)
