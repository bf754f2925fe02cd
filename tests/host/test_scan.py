"""Discovery, groups and host-usage on real temp sysfs trees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import PathEscapeError
from vfio_dp.host import Host
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import Inventory


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
    used = {str(a): d.in_use for a, d in inv.devices.items() if d.in_use}
    assert "boot GPU" in used["0000:00:01.0"][0]
    # virtio disk: 0000:00:02.0/virtio1/block/vda/vda1 is mounted at /
    assert any("vda1 is mounted" in r for r in used["0000:00:02.0"])
    # virtio NIC: 0000:00:03.0/virtio2/net/eth0 is up and routed
    assert any("eth0 is up" in r for r in used["0000:00:03.0"])
    assert any("VFs enabled" in r for r in used["0000:af:00.0"])
    assert set(used) == {"0000:00:01.0", "0000:00:02.0", "0000:00:03.0", "0000:af:00.0"}


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
    assert inv.devices[A("0000:01:00.0")].in_use == ("block device nvme0n1 is held by dm-0",)
    assert inv.devices[A("0000:02:00.0")].in_use == ("block device nvme1n1 is used as swap",)
    assert inv.devices[A("0000:03:00.0")].in_use == ()  # down, no address: free to take
    assert inv.devices[A("0000:04:00.0")].in_use == ("network interface enp4s0 has routes",)


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


def _as_if_single_threaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Threads other tests left in this pytest process (gRPC, asyncio executors) would make
    the scan stay in one process; the CLI, where the split happens, has none. The guard
    itself is checked with a real thread in test_no_split_while_other_threads_run."""
    import threading

    monkeypatch.setattr(threading, "active_count", lambda: 1)


def _split_ready(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SysfsTree, Inventory]:
    """The VF tree, what one process reads from it, and a threshold that splits its 24
    devices across 3 processes."""
    from vfio_dp.host import sysfs

    t = _vfs_tree(tmp_path / "root")
    one = Host(t.root).scan()
    monkeypatch.setattr(sysfs, "PARALLEL_MIN_DEVICES", 4)
    _as_if_single_threaded(monkeypatch)
    return t, one


def _watch_forks(monkeypatch: pytest.MonkeyPatch, allowed: int = 99) -> list[int]:
    """Record the pid of every child forked; forks beyond ``allowed`` fail like a pid limit."""
    import errno

    pids: list[int] = []
    real_fork = os.fork

    def fork() -> int:
        if len(pids) >= allowed:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def test_a_scan_split_across_processes_reads_what_one_process_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, one = _split_ready(tmp_path, monkeypatch)
    pids = _watch_forks(monkeypatch)
    split = Host(t.root, scan_processes=3).scan()
    assert len(pids) == 2, "the scan was not split"
    assert split == one
    assert list(split.devices) == list(one.devices)  # address order kept
    assert split.devices[A("0000:12:00.3")].driver_override == "vfio-pci"
    assert split.devices[A("0000:11:00.2")].vfio_cdev == "vfio7"
    assert split.devices[A("0000:12:00.7")].physfn == A("0000:12:00.0")


def test_a_reader_process_that_fails_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vfio_dp.host import sysfs

    t, one = _split_ready(tmp_path, monkeypatch)

    def broken(dev: object) -> tuple[object, ...]:  # only children hand devices back
        raise RuntimeError("reader process broke")

    monkeypatch.setattr(sysfs, "_to_wire", broken)
    assert Host(t.root, scan_processes=3).scan() == one  # the parent re-read their runs


def test_a_scan_that_cannot_fork_reads_everything_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t, one = _split_ready(tmp_path, monkeypatch)
    pids = _watch_forks(monkeypatch, allowed=1)  # the second fork hits a pid limit
    split = Host(t.root, scan_processes=3).scan()
    assert len(pids) == 1
    assert split == one and list(split.devices) == list(one.devices)


def test_no_split_while_other_threads_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from vfio_dp.host import sysfs

    t = _vfs_tree(tmp_path / "root")
    monkeypatch.setattr(sysfs, "PARALLEL_MIN_DEVICES", 4)
    monkeypatch.setattr(os, "fork", lambda: pytest.fail("forked with another thread running"))
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        assert len(Host(t.root, scan_processes=3).scan().devices) == 24
    finally:
        stop.set()
        worker.join()


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
