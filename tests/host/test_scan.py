"""Discovery, groups and host-usage on real temp sysfs trees."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import PathEscapeError
from vfio_dp.host import Host
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory, PciDevice


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


def test_scan_reads_every_field(tree: SysfsTree) -> None:
    inv = Host(tree.root).scan()
    gpu = inv.devices[A("0000:3b:00.0")]
    assert (gpu.vendor, gpu.device, gpu.class_code) == ("10de", "1eb8", "030200")
    assert (gpu.subsystem_vendor, gpu.subsystem_device) == ("10de", "12a2")
    assert gpu.driver == "nvidia" and gpu.iommu_group == 45 and gpu.numa_node == 0
    assert gpu.driver_override is None and not gpu.is_bridge
    vf = inv.devices[A("0000:af:00.1")]
    assert vf.physfn == A("0000:af:00.0")
    assert inv.devices[A("0000:af:00.0")].sriov_numvfs == 2
    assert inv.devices[A("0000:00:00.0")].numa_node is None  # -1 → None
    assert inv.devices[A("0000:00:1c.0")].is_bridge
    # nesting like real sysfs: the device lives under its bridge
    assert "0000:00:1c.0/0000:3b:00.0" in os.path.realpath(tree.sys("bus/pci/devices/0000:3b:00.0"))


def test_groups_follow_the_kernel_rule(tree: SysfsTree) -> None:
    inv = Host(tree.root).scan()
    g45 = inv.groups[45]
    assert g45.devices == (A("0000:3b:00.0"), A("0000:3b:00.1"))
    assert not g45.viable
    assert {p.address for p in g45.problems} == {A("0000:3b:00.0"), A("0000:3b:00.1")}
    assert inv.groups[50].viable  # lone device on vfio-pci
    assert inv.groups[4].viable  # a root port on pcieport is no problem
    g7 = inv.groups[7]  # driverless bridge + two e1000: bridge is a member, not a problem
    assert A("0000:00:1f.0") in g7.devices
    assert {p.address for p in g7.problems} == {A("0000:03:01.0"), A("0000:03:02.0")}
    # half-bound: one e1000 on vfio-pci, the other still on e1000 → not viable
    tree.set_driver("0000:03:01.0", "vfio-pci")
    g7 = Host(tree.root).scan().groups[7]
    assert not g7.viable and [p.address for p in g7.problems] == [A("0000:03:02.0")]
    # both on vfio-pci (or one driverless) → viable
    tree.set_driver("0000:03:02.0", None)
    assert Host(tree.root).scan().groups[7].viable


def test_bridge_on_dma_driver_is_a_problem(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:00:1e.0", "8086", "244e", "060401", driver="shpchp", group=3))
    t.add(
        Dev(
            "0000:05:00.0",
            "8086",
            "100e",
            "020000",
            driver="vfio-pci",
            group=3,
            parent="0000:00:1e.0",
        )
    )
    g = Host(t.root).scan().groups[3]
    assert not g.viable
    assert "bridge" in g.problems[0].reason and "shpchp" in g.problems[0].reason


def test_host_usage(tree: SysfsTree) -> None:
    inv = Host(tree.root).scan()
    used = {str(a): [str(u) for u in d.in_use] for a, d in inv.devices.items() if d.in_use}
    fixes = {str(a): [u.fix for u in d.in_use] for a, d in inv.devices.items() if d.in_use}
    assert "boot GPU" in used["0000:00:01.0"][0]
    assert "pick another GPU" in fixes["0000:00:01.0"][0]
    # the boot disk: not "unmount it" but another device
    assert any("the host cannot run without its root disk" in f for f in fixes["0000:00:02.0"])
    # eth0 is the only interface that is up: taking it cuts the host off, and says so
    assert any("only interface that is up" in f for f in fixes["0000:00:03.0"])
    numvfs = f"{tree.root}/sys/bus/pci/devices/0000:af:00.0/sriov_numvfs"
    assert any(f"echo 0 > {numvfs} first" in f for f in fixes["0000:af:00.0"])
    # virtio disk: 0000:00:02.0/virtio1/block/vda/vda1 is mounted at /
    assert "block device vda1 is mounted at / (the host's root filesystem)" in used["0000:00:02.0"]
    # virtio NIC: 0000:00:03.0/virtio2/net/eth0 is up and routed
    assert any("eth0 is up" in r for r in used["0000:00:03.0"])
    assert any("VFs enabled" in r for r in used["0000:af:00.0"])
    assert set(used) == {"0000:00:01.0", "0000:00:02.0", "0000:00:03.0", "0000:af:00.0"}


def test_a_data_disk_is_freed_by_unmounting_it(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:01:00.0", "144d", "a808", "010802", driver="nvme", group=1))
    t.add_block("0000:01:00.0", "nvme/nvme0/nvme0n1", devno="259:0")
    t.add_block("0000:01:00.0", "nvme/nvme0/nvme0n1/nvme0n1p1", devno="259:1")
    t.set_proc(mounts=[("259:1", "/srv/data", "/dev/nvme0n1p1")])
    (use,) = Host(t.root).scan().devices[A("0000:01:00.0")].in_use
    assert (str(use), use.fix) == (
        "block device nvme0n1p1 is mounted",
        "unmount it first: umount /srv/data",
    )


def test_usage_swap_holders_and_down_interface(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:01:00.0", "144d", "a808", "010802", driver="nvme", group=1))
    t.add_block("0000:01:00.0", "nvme/nvme0/nvme0n1", devno="259:0", holders=["dm-0"])
    t.add(Dev("0000:02:00.0", "144d", "a808", "010802", driver="nvme", group=2))
    t.add_block("0000:02:00.0", "nvme/nvme1/nvme1n1", devno="259:1")
    t.add(Dev("0000:03:00.0", "8086", "10d3", "020000", driver="e1000e", group=3))
    t.add_net("0000:03:00.0", "enp3s0", up=False)
    t.add(Dev("0000:04:00.0", "8086", "10d3", "020000", driver="e1000e", group=4))
    t.add_net("0000:04:00.0", "enp4s0", up=False)
    t.set_proc(swaps=["/dev/nvme1n1"], routes=["enp4s0"])
    inv = Host(t.root).scan()
    used = {a: tuple(map(str, d.in_use)) for a, d in inv.devices.items()}
    assert used[A("0000:01:00.0")] == ("block device nvme0n1 is held by dm-0",)
    assert used[A("0000:02:00.0")] == ("block device nvme1n1 is used as swap",)
    assert used[A("0000:03:00.0")] == ()  # down, no address: free to take
    assert used[A("0000:04:00.0")] == ("network interface enp4s0 has routes",)
    assert inv.devices[A("0000:02:00.0")].in_use[0].fix == "swapoff /dev/nvme1n1 first"
    assert "ip link set enp4s0 down" in inv.devices[A("0000:04:00.0")].in_use[0].fix


def test_no_iommu_host(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path, iommu=False)
    t.add(Dev("0000:01:00.0", "8086", "10d3", "020000", driver="e1000e", group=1))
    inv = Host(t.root).scan()
    assert not inv.iommu_present and inv.groups == {}
    assert inv.devices[A("0000:01:00.0")].iommu_group is None


def test_root_never_resolves_outside(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path / "r")
    (tmp_path / "outside").mkdir()
    # a hostile absolute link is re-rooted, a climbing one refused
    os.symlink("/etc", t.root / "sys/class/net/evil-abs")
    os.symlink("../../../../outside", t.root / "sys/class/net/evil-rel")
    r = Root(t.root)
    assert r.resolve(r.path("sys", "class", "net", "evil-abs")) == r.prefix + "/etc"
    with pytest.raises(PathEscapeError):
        r.resolve(r.path("sys", "class", "net", "evil-rel"))
    Host(t.root).scan()  # and a scan survives both
    with pytest.raises(Exception, match="refusing path component"):
        r.path("sys", "..", "etc")


def test_refresh_sees_driver_changes_hotplug_and_removal(tree: SysfsTree) -> None:
    h = Host(tree.root)
    before = h.scan(usage=False)
    tree.set_driver("0000:65:00.0", None)  # left vfio-pci
    tree.remove("0000:af:00.2")  # hot-unplugged
    tree.add(
        Dev(
            "0000:66:00.0",
            "8086",
            "10d3",
            "020000",
            driver="vfio-pci",
            group=51,
            parent="0000:00:1d.0",
            numa=1,
        )
    )  # hot-added
    after = h.refresh(before)
    assert after.devices[A("0000:65:00.0")].driver is None
    assert after.groups[50].viable  # driverless and alone: viable (just not on vfio-pci)
    assert A("0000:af:00.2") not in after.devices
    assert after.devices[A("0000:66:00.0")].numa_node == 1 and after.groups[51].viable
    # a refresh equals a full scan of the same tree (for the fields a refresh keeps)
    full = h.scan(usage=False)
    assert after.devices == full.devices and after.groups == full.groups
    # unchanged devices are the very same objects (cheap comparisons in the daemon)
    assert after.devices[A("0000:3b:00.0")] is before.devices[A("0000:3b:00.0")]


def test_uevent_and_individual_files_agree(tree: SysfsTree) -> None:
    """Discovery reads <bdf>/uevent (one read); without it, the individual files — same result."""
    with_uevent = Host(tree.root).scan(usage=False).devices
    for addr in tree.devs:
        (tree.dev_dir(addr) / "uevent").unlink()
    without = Host(tree.root).scan(usage=False).devices
    assert with_uevent == without
    assert without[A("0000:3b:00.0")].subsystem_device == "12a2"


# -- a big host's scan split across processes (the CLI's `list` / `groups`) -----------------


def _vfs_tree(base: Path, pfs: int = 3, vfs: int = 7) -> SysfsTree:
    """PFs with VFs on vfio-pci (one with a VFIO cdev), overrides and NUMA: every field set."""
    t = SysfsTree(base)
    group = 10
    for pf in range(pfs):
        bus = 0x10 + pf
        pfa = f"0000:{bus:02x}:00.0"
        t.add(Dev(pfa, "15b3", "101b", "020000", driver="mlx5_core", group=group, numa=pf % 2,
                  sriov_totalvfs=vfs, sriov_numvfs=vfs))  # fmt: skip
        group += 1
        for vf in range(1, vfs + 1):
            addr = f"0000:{bus:02x}:00.{vf}"
            t.add(Dev(addr, "15b3", "101c", "020000", driver="vfio-pci", group=group, physfn=pfa,
                      numa=pf % 2))  # fmt: skip
            group += 1
    t.set_override("0000:12:00.3", "vfio-pci")  # read by a child
    cdev = t.dev_dir("0000:11:00.2") / "vfio-dev" / "vfio7"
    cdev.mkdir(parents=True)
    return t


def _split_ready(tmp_path: Path) -> tuple[Root, list[PciAddress], dict[PciAddress, PciDevice]]:
    """The VF tree's root, its addresses, and what one process reads from it."""
    from vfio_dp.host import sysfs

    t = _vfs_tree(tmp_path / "root")
    root = Root(t.root)
    addrs = sysfs.list_addresses(root)
    return root, addrs, dict(sysfs.read_devices(root, addrs))


def _split(
    root: Root, addrs: list[PciAddress], *, fork: Callable[[], int] = os.fork
) -> dict[PciAddress, PciDevice]:
    """The scanner with a threshold that splits the tree's 24 devices across 3 processes, in
    a process taken as single-threaded (threads other tests left in this pytest process
    would keep it in one; the guard itself: test_no_split_while_other_threads_run)."""
    from vfio_dp.host import sysfs
    from vfio_dp.host.parallel_scan import read_split

    return dict(
        read_split(
            addrs,
            lambda run: sysfs.read_devices(root, run),
            processes=3,
            min_per_process=4,
            alone=lambda: True,
            fork=fork,
        )
    )


def _watching_fork(allowed: int = 99) -> tuple[Callable[[], int], list[int]]:
    """A fork that records the pid of every child; forks beyond ``allowed`` fail like a pid
    limit."""
    import errno

    pids: list[int] = []

    def fork() -> int:
        if len(pids) >= allowed:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        pid = os.fork()
        if pid:
            pids.append(pid)
        return pid

    return fork, pids


def test_a_scan_split_across_processes_reads_what_one_process_reads(tmp_path: Path) -> None:
    root, addrs, one = _split_ready(tmp_path)
    fork, pids = _watching_fork()
    split = _split(root, addrs, fork=fork)
    assert len(pids) == 2, "the scan was not split"
    assert split == one
    assert list(split) == list(one)  # address order kept
    assert split[A("0000:12:00.3")].driver_override == "vfio-pci"
    assert split[A("0000:11:00.2")].vfio_cdev == "vfio7"
    assert split[A("0000:12:00.7")].physfn == A("0000:12:00.0")


def test_a_reader_process_that_fails_is_not_trusted(tmp_path: Path) -> None:
    from vfio_dp.host import sysfs
    from vfio_dp.host.parallel_scan import read_split

    root, addrs, one = _split_ready(tmp_path)
    parent = os.getpid()
    reread: list[int] = []

    def read(run: Sequence[PciAddress]) -> dict[PciAddress, PciDevice]:
        if os.getpid() != parent:  # a child: fail as a broken reader would
            raise RuntimeError("reader process broke")
        reread.append(1)
        return sysfs.read_devices(root, run)

    split = read_split(addrs, read, processes=3, min_per_process=4, alone=lambda: True)
    assert split == one and list(split) == list(one)  # the parent re-read their runs
    assert len(reread) == 3  # its own run and the two children's


def test_a_child_handing_back_the_wrong_shape_is_not_trusted() -> None:
    from vfio_dp.host.parallel_scan import from_wire, to_wire

    dev = PciDevice(A("0000:12:00.3"), "15b3", "101c", "020000", physfn=A("0000:12:00.0"))
    assert from_wire(to_wire(dev), {}) == dev
    with pytest.raises(ValueError, match="values, not"):
        from_wire(to_wire(dev)[:-1], {})


def test_a_scan_that_cannot_fork_reads_everything_itself(tmp_path: Path) -> None:
    root, addrs, one = _split_ready(tmp_path)
    fork, pids = _watching_fork(allowed=1)  # the second fork hits a pid limit
    split = _split(root, addrs, fork=fork)
    assert len(pids) == 1
    assert split == one and list(split) == list(one)


def test_no_split_while_other_threads_run(tmp_path: Path) -> None:
    import threading

    from vfio_dp.host import sysfs
    from vfio_dp.host.parallel_scan import read_split

    root, addrs, one = _split_ready(tmp_path)
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        split = read_split(
            addrs,
            lambda run: sysfs.read_devices(root, run),
            processes=3,
            min_per_process=4,
            fork=lambda: pytest.fail("forked with another thread running"),
        )
        assert split == one
    finally:
        stop.set()
        worker.join()


def _rng_host(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:00:04.0", "1af4", "1005", "00ff00", driver="virtio-pci", group=4))
    t.add(Dev("0000:00:05.0", "8086", "10d3", "020000", driver="e1000e", group=5))
    return t


def test_current_hardware_rng_is_a_host_use(tmp_path: Path) -> None:
    """``rng_current`` names the virtio RNG at 0000:00:04.0/virtio3: the host uses it."""
    t = _rng_host(tmp_path)
    t.add_hwrng("0000:00:04.0", "virtio_rng.0", available="virtio_rng.0 tpm-rng-0")
    inv = Host(t.root).scan()
    (use,) = inv.devices[A("0000:00:04.0")].in_use
    assert str(use) == "it is the host's current hardware RNG (virtio_rng.0)"
    assert "sys/class/misc/hw_random/rng_current" in use.fix and "rng_available" in use.fix
    assert inv.devices[A("0000:00:05.0")].in_use == ()


def test_hardware_rng_not_current_or_absent_is_no_use(tmp_path: Path) -> None:
    t = _rng_host(tmp_path)
    assert Host(t.root).scan().devices[A("0000:00:04.0")].in_use == ()  # no hw_random at all
    t.add_hwrng("0000:00:04.0", "none", available="virtio_rng.0")
    assert Host(t.root).scan().devices[A("0000:00:04.0")].in_use == ()  # host uses no RNG
    t.add_hwrng("0000:00:04.0", "tpm-rng-0", available="virtio_rng.0 tpm-rng-0")
    assert Host(t.root).scan().devices[A("0000:00:04.0")].in_use == ()  # another RNG is current


def test_several_virtio_rngs_are_each_reported_as_possibly_current(tmp_path: Path) -> None:
    """The ``.N`` of ``virtio_rng.N`` is the driver's counter, not a virtio index: with two
    virtio RNGs sysfs does not say which is current, so neither is taken silently."""
    t = _rng_host(tmp_path)
    t.add(Dev("0000:00:06.0", "1af4", "1005", "00ff00", driver="virtio-pci", group=6))
    t.add_hwrng("0000:00:04.0", "virtio_rng.1", via="virtio3")
    t.add_hwrng("0000:00:06.0", "virtio_rng.1", via="virtio4")
    inv = Host(t.root).scan()
    for a in ("0000:00:04.0", "0000:00:06.0"):
        (use,) = inv.devices[A(a)].in_use
        assert "may be the host's current hardware RNG (virtio_rng.1; one of 2" in str(use)


def test_bind_refuses_the_current_hardware_rng_unless_forced(tmp_path: Path) -> None:
    from tests.kernel_sim import SimulatedKernel
    from vfio_dp.errors import RefusedError

    t = _rng_host(tmp_path)
    t.add_hwrng("0000:00:04.0", "virtio_rng.0")
    kernel = SimulatedKernel(t)
    with pytest.raises(RefusedError, match=r"current hardware RNG.*--force"):
        Host(t.root, kernel=kernel).bind([A("0000:00:04.0")])
    assert kernel.writes == []
    res = Host(t.root, kernel=kernel).bind([A("0000:00:04.0")], force=True)
    assert res.bound == [A("0000:00:04.0")] and "hardware RNG" in res.warnings[0]


# --- garbage in sysfs: the device is skipped with the file named, never trusted --------------

NIC_DIR = "bus/pci/devices/0000:65:00.0"


def _scan_skipping(tree: SysfsTree, caplog: pytest.LogCaptureFixture) -> tuple[Inventory, str]:
    with caplog.at_level("WARNING", logger="vfio_dp.host"):
        inv = Host(tree.root).scan()
    return inv, caplog.text


@pytest.mark.parametrize(
    ("file", "content", "shows"),
    [
        ("vendor", b"\x00\x00\x00\x00\n", "vendor reads '\\x00\\x00\\x00\\x00'"),
        ("vendor", b"0xzz10\n", "not a hex number"),
        ("device", b"0x10d3d\n", "at most 4 digits"),  # too wide: never truncated
        ("class", b"-0x0200\n", "class reads '-0x0200'"),
        ("numa_node", b"one\n", "not a decimal number"),
        ("driver_override", b"../../x\n", "not a kernel driver name"),
    ],
)
def test_garbage_attribute_skips_the_device(
    tree: SysfsTree, caplog: pytest.LogCaptureFixture, file: str, content: bytes, shows: str
) -> None:
    d = tree.sys(NIC_DIR)
    (d / "uevent").unlink()  # the files are read only without a usable uevent
    (d / file).write_bytes(content)
    inv, log = _scan_skipping(tree, caplog)
    assert A("0000:65:00.0") not in inv.devices
    assert A("0000:3b:00.0") in inv.devices  # the others are still read
    assert f"0000:65:00.0/{file}" in log and shows in log and "skipped" in log


@pytest.mark.parametrize(
    "uevent",
    [
        "PCI_CLASS=20000\nPCI_ID=\x00\x00\x00\x00:10D3\nPCI_SUBSYS_ID=8086:A01F\n",
        "PCI_CLASS=20000\nPCI_ID=8086:10D3\nPCI_SUBSYS_ID=8086:A01F\nDRIVER=a/../b\n",
        "PCI_CLASS=2000000\nPCI_ID=8086:10D3\nPCI_SUBSYS_ID=8086:A01F\n",
    ],
)
def test_garbage_uevent_skips_the_device(
    tree: SysfsTree, caplog: pytest.LogCaptureFixture, uevent: str
) -> None:
    (tree.sys(NIC_DIR) / "uevent").write_text(uevent)
    inv, log = _scan_skipping(tree, caplog)
    assert A("0000:65:00.0") not in inv.devices and "0000:65:00.0/uevent" in log
    # nothing of it reaches a resource name
    assert not any("\x00" in d.vendor for d in inv.devices.values())


def test_garbage_links_skip_the_device(tree: SysfsTree, caplog: pytest.LogCaptureFixture) -> None:
    d = tree.sys(NIC_DIR)
    (d / "iommu_group").unlink()
    (d / "iommu_group").symlink_to("../../../kernel/iommu_groups/5x")
    inv, log = _scan_skipping(tree, caplog)
    assert A("0000:65:00.0") not in inv.devices and "iommu_group reads '5x'" in log


def test_a_fifo_uevent_or_attribute_never_blocks(tree: SysfsTree) -> None:
    """A FIFO without a writer would block a plain open() forever: read with O_NONBLOCK it
    is empty, so the uevent is ignored (the files are read) and a FIFO vendor is garbage."""
    import subprocess
    import sys

    d = tree.sys(NIC_DIR)
    (d / "uevent").unlink()
    os.mkfifo(d / "uevent")
    gpu = tree.sys("bus/pci/devices/0000:3b:00.0")
    (gpu / "uevent").unlink()
    (gpu / "vendor").unlink()
    os.mkfifo(gpu / "uevent")
    os.mkfifo(gpu / "vendor")
    code = (
        "import sys; from vfio_dp.host import Host; inv = Host(sys.argv[1]).scan(); "
        "print(sorted(str(a) for a in inv.devices))"
    )
    p = subprocess.run(
        [sys.executable, "-c", code, str(tree.root)], capture_output=True, text=True, timeout=30
    )
    assert p.returncode == 0, p.stderr
    assert "0000:65:00.0" in p.stdout  # FIFO uevent: its files were read instead
    assert "0000:3b:00.0" not in p.stdout and "0000:3b:00.0/vendor" in p.stderr


def test_odd_entries_under_vfio_dev_are_ignored(tree: SysfsTree) -> None:
    vdev = tree.sys(NIC_DIR) / "vfio-dev"
    vdev.mkdir()
    for odd in ("..x", "vfio", "vfio3a", "vfio\u0663", "evil name"):
        (vdev / odd).mkdir()
    inv = Host(tree.root).scan()
    assert inv.devices[A("0000:65:00.0")].vfio_cdev is None
    (vdev / "vfio12").mkdir()
    (vdev / "vfio9").mkdir()
    assert Host(tree.root).scan().devices[A("0000:65:00.0")].vfio_cdev == "vfio9"


def test_read_device_names_the_garbage_file(tree: SysfsTree) -> None:
    from vfio_dp.errors import SysfsValueError
    from vfio_dp.host.sysfs import read_device

    d = tree.sys(NIC_DIR)
    (d / "uevent").unlink()
    (d / "vendor").write_bytes(b"\xff\xfe\n")
    with pytest.raises(SysfsValueError) as err:
        read_device(Root(tree.root), A("0000:65:00.0"))
    assert err.value.path.endswith("0000:65:00.0/vendor")
