"""A function's own device nodes on its native driver (issue 36, item 1): found below its
sysfs directory through ``/sys/dev/{char,block}``, recorded, read back while it is on
vfio-pci, and never taken from a hostile tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.host import Host
from vfio_dp.host.devnodes import MAX_DEPTH, discover, native_nodes
from vfio_dp.model.address import PciAddress
from vfio_dp.model.devnodes import container_problem, group_container_problem

NVME = "0000:01:00.0"
NIC = "0000:02:00.0"
NVME_NODES = [
    ("nvme/nvme0", "char", "242:0", "nvme0"),
    ("nvme/nvme0/nvme0n1", "block", "259:0", "nvme0n1"),
    ("nvme/nvme0/ng0n1", "char", "241:0", "ng0n1"),
]


def nvme_tree(tmp_path: Path) -> tuple[SysfsTree, SimulatedKernel]:
    t = SysfsTree(tmp_path)
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    t.add(Dev(NIC, "8086", "10d3", "020000", driver="e1000e", group=4))
    t.add_net(NIC, "eth0", up=False)
    k = SimulatedKernel(t)
    k.native_nodes[NVME] = list(NVME_NODES)
    k.make_nodes(NVME)
    return t, k


def test_an_nvme_controllers_nodes_are_found_and_a_nics_are_none(tmp_path: Path) -> None:
    t, k = nvme_tree(tmp_path)
    host = Host(t.root, kernel=k)
    inv = host.scan(usage=False)
    found = native_nodes(host.fs, inv, [PciAddress.parse(NVME), PciAddress.parse(NIC)])
    nvme = found[PciAddress.parse(NVME)]
    assert nvme is not None and nvme.driver == "nvme" and nvme.live
    assert set(nvme.paths) == {"/dev/nvme0", "/dev/nvme0n1", "/dev/ng0n1"}
    assert {n.path: n.type for n in nvme.nodes}["/dev/nvme0n1"] == "block"
    nic = found[PciAddress.parse(NIC)]
    assert nic is not None and nic.nodes == ()


def test_a_gpus_dri_nodes_keep_their_directory(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:03:00.0", "10de", "1eb8", "030200", driver="nouveau", group=5))
    t.add_devnode("0000:03:00.0", "drm/card0", kind="char", devno="226:0", devname="dri/card0")
    t.add_devnode(
        "0000:03:00.0", "drm/renderD128", kind="char", devno="226:128", devname="dri/renderD128"
    )
    host = Host(t.root)
    a = PciAddress.parse("0000:03:00.0")
    found = native_nodes(host.fs, host.scan(usage=False), [a])[a]
    assert found is not None and found.paths == ("/dev/dri/card0", "/dev/dri/renderD128")


def test_a_nic_with_only_a_ptp_clock_is_not_offered_as_a_container(tmp_path: Path) -> None:
    """A NIC's PTP hardware clock (``<bdf>/ptp/ptp0/dev`` → ``/dev/ptp0``) is found, but it
    is a side facility: alone it gives the NIC no device nodes of its own for container; a
    group with a function that has real nodes still is offered."""
    t, k = nvme_tree(tmp_path)
    t.add_devnode(NIC, "ptp/ptp0", kind="char", devno="248:0", devname="ptp0")
    host = Host(t.root, kernel=k)
    nic, nvme = PciAddress.parse(NIC), PciAddress.parse(NVME)
    found = native_nodes(host.fs, host.scan(usage=False), [nic, nvme])
    assert found[nic] is not None and found[nic].paths == ("/dev/ptp0",)  # type: ignore[union-attr]
    why = container_problem(nic, "the NIC", found[nic])
    assert why is not None and "only /dev/ptp0" in why and "PTP clock" in why
    assert group_container_problem([nic], str, found) is not None
    assert group_container_problem([nvme, nic], str, found) is None


def test_the_record_answers_while_the_device_is_on_vfio_pci(tmp_path: Path) -> None:
    t, k = nvme_tree(tmp_path)
    host = Host(t.root, kernel=k)
    a = PciAddress.parse(NVME)
    native_nodes(host.fs, host.scan(usage=False), [a])  # seen on nvme: recorded
    assert (t.root / "var/lib/vfio_dp/devnodes" / f"{NVME}.json").is_file()
    host.bind([a], group=True, probe=False)
    assert t.driver_of(NVME) == "vfio-pci"
    assert not (t.dev_dir(NVME) / "nvme").exists()  # on vfio-pci it has none
    found = native_nodes(host.fs, host.scan(usage=False), [a])[a]
    assert found is not None and not found.live and found.driver == "nvme"
    assert set(found.paths) == {"/dev/nvme0", "/dev/nvme0n1", "/dev/ng0n1"}


def test_a_record_of_another_card_is_never_used(tmp_path: Path) -> None:
    t, k = nvme_tree(tmp_path)
    host = Host(t.root, kernel=k)
    a = PciAddress.parse(NVME)
    native_nodes(host.fs, host.scan(usage=False), [a])
    host.bind([a], group=True, probe=False)
    t.devs[NVME].device = "0011"  # another card in the slot
    t.set_driver(NVME, "vfio-pci")  # rewrites its uevent (PCI_ID)
    (t.dev_dir(NVME) / "device").write_text("0x0011\n")
    assert native_nodes(host.fs, host.scan(usage=False), [a])[a] is None


def test_a_never_seen_device_on_vfio_pci_has_none_known(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="vfio-pci", native_driver="nvme", group=3))
    host = Host(t.root)
    a = PciAddress.parse(NVME)
    assert native_nodes(host.fs, host.scan(usage=False), [a])[a] is None


@pytest.mark.parametrize(
    "devname", ["../etc/shadow", "nvme0n1/../../etc", "/etc/passwd", "a b", "x" * 300, ""]
)
def test_a_hostile_devname_is_skipped(tmp_path: Path, devname: str) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    t.add_devnode(NVME, "nvme/nvme0", kind="char", devno="242:0", devname="nvme0")
    d = t.dev_dir(NVME) / "nvme/nvme0/nvme0n1"
    d.mkdir(parents=True)
    (d / "dev").write_text("259:0\n")
    (d / "uevent").write_text(f"DEVNAME={devname}\n")
    t.sys("dev/block").mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(d, t.sys("dev/block")), t.sys("dev/block/259:0"))
    host = Host(t.root)
    found = discover(host.fs, host.scan(usage=False).devices[PciAddress.parse(NVME)])
    assert found is not None and found.paths == ("/dev/nvme0",)


def test_links_out_of_the_root_and_foreign_directories_are_never_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "dev").write_text("1:3\n")
    (outside / "uevent").write_text("DEVNAME=null\n")
    t = SysfsTree(tmp_path / "root")
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    # a link below the function to a directory with a dev file: never entered
    os.symlink(outside, t.dev_dir(NVME) / "evil")
    # a /sys/dev entry that points out of the root, named by a real dev file: refused
    d = t.dev_dir(NVME) / "nvme/nvme0"
    d.mkdir(parents=True)
    (d / "dev").write_text("1:3\n")
    t.sys("dev/char").mkdir(parents=True, exist_ok=True)
    os.symlink(outside, t.sys("dev/char/1:3"))
    # a /sys/dev entry for a DIFFERENT directory than the dev file's: not this device's
    e = t.dev_dir(NVME) / "nvme/nvme1"
    e.mkdir(parents=True)
    (e / "dev").write_text("242:1\n")
    other = t.sys("devices/virtual/misc/other")
    other.mkdir(parents=True)
    (other / "uevent").write_text("DEVNAME=other\n")
    os.symlink(os.path.relpath(other, t.sys("dev/char")), t.sys("dev/char/242:1"))
    host = Host(t.root)
    found = discover(host.fs, host.scan(usage=False).devices[PciAddress.parse(NVME)])
    assert found is not None and found.nodes == ()


def test_the_walk_is_bounded_in_depth(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    deep = "/".join(f"d{i}" for i in range(MAX_DEPTH + 1))
    t.add_devnode(NVME, deep, kind="char", devno="242:9", devname="deep")
    t.add_devnode(NVME, "a/b/c/d", kind="char", devno="242:8", devname="shallow")
    host = Host(t.root)
    found = discover(host.fs, host.scan(usage=False).devices[PciAddress.parse(NVME)])
    assert found is not None and found.paths == ("/dev/shallow",)
