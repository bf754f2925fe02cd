"""The kernel simulator's locking (tests/kernel_sim.py): as the kernel's ``device_lock``, a
write's reaction holds its device's lock only, so devices in different IOMMU groups react
at once from different threads, and two writes on one group one after the other."""

from __future__ import annotations

import threading
from pathlib import Path

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree

A, B, C = "0000:01:00.0", "0000:02:00.0", "0000:02:00.1"


def _override(tree: SysfsTree, address: str) -> str:
    return str(tree.sys("bus/pci/devices", address, "driver_override"))


def _held_tree(tmp_path: Path) -> tuple[SysfsTree, SimulatedKernel, threading.Event]:
    """A (group 1), B and C (both group 2), no driver; A's ``driver_override`` reaction
    hangs (in the tree, under the simulator's lock) until the returned event is set."""
    tree = SysfsTree(tmp_path)
    tree.add(Dev(A, "15b3", "101c", "020000", driver=None, group=1))
    tree.add(Dev(B, "15b3", "101c", "020000", driver=None, group=2))
    tree.add(Dev(C, "15b3", "101c", "020000", driver=None, group=2))
    sim = SimulatedKernel(tree)
    release, inside = threading.Event(), threading.Event()
    set_override = tree.set_override

    def slow_override(address: str, value: str | None) -> None:
        if address == A:
            inside.set()
            assert release.wait(10)
        set_override(address, value)

    tree.set_override = slow_override  # type: ignore[method-assign]
    first = threading.Thread(
        target=sim.write, args=(_override(tree, A), "vfio-pci\n")
    )
    first.start()
    assert inside.wait(10)
    sim.first = first  # type: ignore[attr-defined]
    return tree, sim, release


def _write_in_thread(sim: SimulatedKernel, path: str, data: str) -> threading.Event:
    done = threading.Event()

    def run() -> None:
        sim.write(path, data)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


def test_a_write_on_another_group_reacts_while_one_is_held(tmp_path: Path) -> None:
    tree, sim, release = _held_tree(tmp_path)
    try:
        # B's override, then B bound to vfio-pci: neither waits for A's reaction
        assert _write_in_thread(sim, _override(tree, B), "vfio-pci\n").wait(5)
        probe = str(tree.root / "sys/bus/pci/drivers_probe")
        assert _write_in_thread(sim, probe, B).wait(5)
        assert tree.driver_of(B) == "vfio-pci"
        assert tree.override_of(A) is None  # A's reaction still held
    finally:
        release.set()
        sim.first.join(10)  # type: ignore[attr-defined]
    assert tree.override_of(A) == "vfio-pci"


def test_a_write_on_the_same_group_waits_for_the_held_one(tmp_path: Path) -> None:
    tree, sim, release = _held_tree(tmp_path)
    # C shares no group with A: reacts; A's own second write waits for the first
    again = _write_in_thread(sim, _override(tree, A), "\n")
    try:
        assert _write_in_thread(sim, _override(tree, C), "x\n").wait(5)
        assert not again.wait(0.3)
    finally:
        release.set()
        sim.first.join(10)  # type: ignore[attr-defined]
    assert again.wait(5)
    assert tree.override_of(A) is None  # the second write (the lone newline) came after


def test_devices_of_one_group_share_its_lock(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.add(Dev(B, "15b3", "101c", "020000", driver=None, group=2))
    tree.add(Dev(C, "15b3", "101c", "020000", driver=None, group=2))
    tree.add(Dev(A, "15b3", "101c", "020000", driver=None, group=1))
    sim = SimulatedKernel(tree)
    assert sim.device_lock(B) is sim.device_lock(C)
    assert sim.device_lock(A) is not sim.device_lock(B)
