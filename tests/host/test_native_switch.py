"""A group switched to its native driver for a container (issue 36, item 3), on the kernel
simulator: through the unbind's locks, journal and records; a driver that refuses leaves the
device as it was; the device nodes are waited for, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.host.test_devnodes import NVME, NVME_NODES
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.errors import BindError, HostError
from vfio_dp.host import Host
from vfio_dp.host.devnodes import wait_for
from vfio_dp.model.address import PciAddress

A = PciAddress.parse(NVME)


def bound_nvme(tmp_path: Path) -> tuple[SysfsTree, SimulatedKernel, Host]:
    """An NVMe controller bound to vfio-pci by a claim (its record says nvme)."""
    t = SysfsTree(tmp_path)
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    k = SimulatedKernel(t)
    k.native_nodes[NVME] = list(NVME_NODES)
    k.make_nodes(NVME)
    host = Host(t.root, kernel=k, runner="dra-plugin")
    host.bind([A], group=True, probe=False, bound_by="claim:u1")
    assert t.driver_of(NVME) == "vfio-pci" and not (t.root / "dev/nvme0n1").exists()
    return t, k, host


def test_the_group_goes_back_to_nvme_and_its_record_goes(tmp_path: Path) -> None:
    t, _k, host = bound_nvme(tmp_path)
    res = host.to_native([A])
    assert res.restored == [(A, "nvme")]
    assert t.driver_of(NVME) == "nvme" and t.override_of(NVME) is None
    assert host.record_holders() == {}
    assert not list((t.root / "var/lib/vfio_dp/ops").glob("*.json"))
    found = wait_for(host.fs, lambda: host.scan_groups([A], usage=False), {A: ()}, 5)
    assert set(found[A].paths) == {"/dev/nvme0", "/dev/nvme0n1", "/dev/ng0n1"}


def test_a_device_on_its_driver_already_is_left(tmp_path: Path) -> None:
    _t, k, host = bound_nvme(tmp_path)
    host.to_native([A])
    writes = len(k.writes)
    assert host.to_native([A]).already == [A]
    assert len(k.writes) == writes


def test_a_native_driver_that_refuses_leaves_the_device_as_it_was(tmp_path: Path) -> None:
    t, k, host = bound_nvme(tmp_path)
    before = host.ledger.record(A)
    k.refuse_attach.add((NVME, "nvme"))
    with pytest.raises(BindError) as e:
        host.to_native([A])
    said = str(e.value)
    assert "restore to nvme did not take" in said and "put back as it was" in said, said
    assert t.driver_of(NVME) == "vfio-pci" and t.override_of(NVME) == "vfio-pci"
    assert host.ledger.record(A) == before  # still the claim's, still "give back nvme"
    assert not list((t.root / "var/lib/vfio_dp/ops").glob("*.json"))  # nothing half-done


def test_a_device_no_driver_takes_without_a_record_is_put_back_too(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="vfio-pci", native_driver="nvme", group=3))
    t.set_override(NVME, "vfio-pci")
    k = SimulatedKernel(t)
    k.refuse_attach.add((NVME, "nvme"))
    host = Host(t.root, kernel=k)
    with pytest.raises(BindError) as e:
        host.to_native([A])
    assert "no driver took it" in str(e.value) and "put back as it was" in str(e.value)
    assert t.driver_of(NVME) == "vfio-pci" and t.override_of(NVME) == "vfio-pci"
    assert host.record_holders() == {}


def test_the_wait_for_nodes_is_bounded_and_names_what_is_missing(tmp_path: Path) -> None:
    _t, k, host = bound_nvme(tmp_path)
    k.native_nodes[NVME] = [n for n in NVME_NODES if n[0] != "nvme/nvme0/nvme0n1"]
    host.to_native([A])
    with pytest.raises(HostError) as e:
        wait_for(
            host.fs,
            lambda: host.scan_groups([A], usage=False),
            {A: ("/dev/nvme0", "/dev/nvme0n1")},
            0.3,
        )
    assert "/dev/nvme0n1 did not appear" in str(e.value)
    assert f"{NVME} on nvme" in str(e.value)


def test_nodes_that_appear_late_are_waited_for(tmp_path: Path) -> None:
    t, k, host = bound_nvme(tmp_path)
    k.node_delay = 0.3
    host.to_native([A])
    assert not (t.root / "dev/nvme0n1").exists()
    found = wait_for(
        host.fs, lambda: host.scan_groups([A], usage=False), {A: ("/dev/nvme0n1",)}, 30
    )
    assert "/dev/nvme0n1" in found[A].paths
