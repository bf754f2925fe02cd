"""Bind/unbind logic against the kernel simulator (tests/kernel_sim.py) on temp trees.

The same code paths run against the real kernel in tests/guest/.
"""

from __future__ import annotations

import errno
import json
import threading
from pathlib import Path

import pytest

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from tests.waiting import wait_until
from vfio_dp.errors import (
    BindError,
    DeviceNotFoundError,
    LockTimeoutError,
    RefusedError,
    WriteTimeoutError,
)
from vfio_dp.host import Host
from vfio_dp.host.kernel import RealKernel
from vfio_dp.model.address import PciAddress


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


def host(tree: SysfsTree, kernel: SimulatedKernel, **kw: float) -> Host:
    return Host(tree.root, kernel=kernel, **kw)


def test_bind_group_and_restore(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    h = host(tree, kernel)
    res = h.bind([A("0000:3b:00.0")], group=True)
    assert res.bound == [A("0000:3b:00.0"), A("0000:3b:00.1")]
    assert tree.driver_of("0000:3b:00.0") == tree.driver_of("0000:3b:00.1") == "vfio-pci"
    assert (tree.root / "dev/vfio/45").exists()
    inv = h.scan()
    assert inv.groups[45].viable
    assert inv.devices[A("0000:3b:00.1")].original_driver == "snd_hda_intel"
    # the record is durable JSON under <root>/var/lib/vfio_dp
    rec = json.loads((tree.root / "var/lib/vfio_dp/original/0000:3b:00.1.json").read_text())
    assert rec["driver"] == "snd_hda_intel" and rec["device"] == "10f8"
    # never new_id
    assert not any("new_id" in p for p, _ in kernel.writes)
    # the clean sequence, in order, for the first device
    first = [(p.split("/sys/")[1], d) for p, d in kernel.writes[:3]]
    assert first == [
        ("bus/pci/devices/0000:3b:00.0/driver_override", "vfio-pci"),
        ("bus/pci/drivers/nvidia/unbind", "0000:3b:00.0"),
        ("bus/pci/drivers_probe", "0000:3b:00.0"),
    ]
    res = h.unbind([A("0000:3b:00.0"), A("0000:3b:00.1")])
    assert res.restored == [(A("0000:3b:00.0"), "nvidia"), (A("0000:3b:00.1"), "snd_hda_intel")]
    assert tree.override_of("0000:3b:00.0") is None
    assert not (tree.root / "var/lib/vfio_dp/original/0000:3b:00.0.json").exists()
    assert not (tree.root / "dev/vfio/45").exists()


def test_half_group_is_refused_naming_siblings_and_fix(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    with pytest.raises(RefusedError) as e:
        host(tree, kernel).bind([A("0000:3b:00.0")])
    msg = str(e.value)
    assert "0000:3b:00.1 (10de:10f8, snd_hda_intel) shares IOMMU group 45 with 0000:3b:00.0" in msg
    assert "vfioctl bind --group 0000:3b:00.0" in msg
    assert kernel.writes == []  # nothing touched


def test_shared_bridge_group_binds_endpoints_never_the_bridge(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    res = host(tree, kernel).bind([A("0000:03:01.0")], group=True)
    assert res.bound == [A("0000:03:01.0"), A("0000:03:02.0")]
    assert tree.driver_of("0000:00:1f.0") is None
    assert host(tree, kernel).scan().groups[7].viable


def test_host_used_devices_refused_unless_forced(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    h = host(tree, kernel)
    for addr, why in [
        ("0000:00:02.0", "vda1 is mounted"),
        ("0000:00:03.0", "eth0 is up"),
        ("0000:00:01.0", "boot GPU"),
        ("0000:af:00.0", "VFs enabled"),
    ]:
        with pytest.raises(RefusedError, match=why):
            h.bind([A(addr)])
    assert kernel.writes == []
    res = h.bind([A("0000:00:03.0")], force=True)
    assert res.bound == [A("0000:00:03.0")] and "eth0" in res.warnings[0]


def test_bridge_and_unknown_refused(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    with pytest.raises(RefusedError, match="is a PCI bridge"):
        host(tree, kernel).bind([A("0000:00:1c.0")])
    with pytest.raises(DeviceNotFoundError, match=r"0000:99:00\.0"):
        host(tree, kernel).bind([A("0000:99:00.0")])


def test_already_bound_is_noop(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    res = host(tree, kernel).bind([A("0000:65:00.0")])
    assert res.already == [A("0000:65:00.0")] and res.bound == [] and kernel.writes == []


def test_loads_module_when_missing(tmp_path: Path) -> None:
    t = SysfsTree(tmp_path)
    t.add(Dev("0000:01:00.0", "8086", "10d3", "020000", driver="e1000e", group=1))
    k = SimulatedKernel(t, vfio_loaded=False)
    Host(t.root, kernel=k).bind([A("0000:01:00.0")])
    assert k.modprobed == ["vfio-pci"] and t.driver_of("0000:01:00.0") == "vfio-pci"


def test_dry_run_prints_exact_steps_and_changes_nothing(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    res = host(tree, kernel).bind([A("0000:03:01.0")], group=True, dry_run=True)
    steps = [str(s) for s in res.steps]
    assert (
        steps[0]
        == f"echo 'vfio-pci' > {tree.root}/sys/bus/pci/devices/0000:03:01.0/driver_override"
    )
    assert steps[1] == f"echo '0000:03:01.0' > {tree.root}/sys/bus/pci/drivers/e1000/unbind"
    assert len(steps) == 6 and kernel.writes == []
    assert tree.driver_of("0000:03:01.0") == "e1000"


def test_failed_verify_rolls_back_every_device(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    # vfio-pci refuses the second function: the probe "succeeds" but nothing attaches
    kernel.refuse_attach.add(("0000:3b:00.1", "vfio-pci"))
    with pytest.raises(BindError) as e:
        host(tree, kernel).bind([A("0000:3b:00.0")], group=True)
    assert "not vfio-pci" in str(e.value) and "rolled back" in str(e.value)
    assert tree.driver_of("0000:3b:00.0") == "nvidia"
    assert tree.driver_of("0000:3b:00.1") == "snd_hda_intel"
    assert tree.override_of("0000:3b:00.0") is None and tree.override_of("0000:3b:00.1") is None
    assert list((tree.root / "var/lib/vfio_dp/original").iterdir()) == []


def test_failed_write_rolls_back(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    def fail(path: str, data: str) -> OSError | None:
        if path.endswith("drivers/e1000/unbind") and data == "0000:03:02.0":
            return OSError(errno.EIO, "Input/output error")
        return None

    kernel.fail = fail
    with pytest.raises(BindError, match="Input/output error"):
        host(tree, kernel).bind([A("0000:03:01.0")], group=True)
    assert tree.driver_of("0000:03:01.0") == tree.driver_of("0000:03:02.0") == "e1000"


def test_record_survives_a_crash_between_bind_and_unbind(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    host(tree, kernel).bind([A("0000:03:01.0")], group=True)
    # a new process (new Host, new simulator) restores from the durable record alone
    fresh = Host(tree.root, kernel=SimulatedKernel(tree))
    res = fresh.unbind([A("0000:03:01.0")])
    assert res.restored == [(A("0000:03:01.0"), "e1000")]


def test_unbind_explicit_driver_and_without_record(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    # 0000:65:00.0 was on vfio-pci before we ever ran: no record → kernel probes natively
    tree.ensure_driver("e1000e")
    res = host(tree, kernel).unbind([A("0000:65:00.0")])
    assert res.restored == [(A("0000:65:00.0"), "e1000e")]
    host(tree, kernel).bind([A("0000:65:00.0")])
    res = host(tree, kernel).unbind([A("0000:65:00.0")], driver="e1000e")
    assert tree.driver_of("0000:65:00.0") == "e1000e"
    # unbinding a device that is not on vfio-pci is a no-op success
    res = host(tree, kernel).unbind([A("0000:65:00.0")])
    assert res.already == [A("0000:65:00.0")]


def test_unbind_dry_run(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    host(tree, kernel).bind([A("0000:03:01.0")], group=True)
    n = len(kernel.writes)
    res = host(tree, kernel).unbind([A("0000:03:01.0")], dry_run=True)
    assert [str(s).split("/sys/")[-1] for s in res.steps] == [
        "bus/pci/devices/0000:03:01.0/driver_override",
        "bus/pci/drivers/vfio-pci/unbind",
        "bus/pci/drivers/e1000/bind",
    ]
    assert len(kernel.writes) == n


def test_lock_excludes_concurrent_binders(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    h = host(tree, kernel, lock_timeout=0.3)
    with h.state.locked([A("0000:03:01.0")]), pytest.raises(LockTimeoutError, match="locked"):
        h.bind([A("0000:03:01.0")], group=True)
    assert tree.driver_of("0000:03:01.0") == "e1000"


def test_concurrent_binds_do_not_interleave(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            host(tree, kernel).bind([A("0000:03:01.0")], group=True)
        except BaseException as e:
            errors.append(e)

    kernel.block_seconds["drivers_probe"] = 0.05
    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert tree.driver_of("0000:03:01.0") == "vfio-pci"
    probes = [d for p, d in kernel.writes if p.endswith("drivers_probe")]
    assert probes == ["0000:03:01.0", "0000:03:02.0"]  # bound once, by one of them


def test_real_kernel_write_timeout(tmp_path: Path) -> None:
    fifo = tmp_path / "unbind"
    import os

    os.mkfifo(fifo)  # opening a FIFO for writing blocks like a stuck unbind
    k = RealKernel(timeout=0.2)
    # the write never returns (no reader): only the timeout can end this call (a hang is
    # the per-test timeout's); how close to 0.2 s it returns is no unit test's business
    with pytest.raises(WriteTimeoutError, match="did not return") as e:
        k.write(str(fifo), "0000:01:00.0")
    assert str(fifo) in str(e.value)
    os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # release the writer thread


def test_real_kernel_writes_and_recovers_after_a_timeout(tmp_path: Path) -> None:
    import os

    k = RealKernel(timeout=0.2)
    target = tmp_path / "driver_override"
    target.write_text("")
    k.write(str(target), "vfio-pci")
    assert target.read_text() == "vfio-pci"
    fifo = tmp_path / "stuck"
    os.mkfifo(fifo)
    with pytest.raises(WriteTimeoutError):
        k.write(str(fifo), "x")
    # the stuck worker is abandoned; the next write gets a fresh one and succeeds
    fresh = tmp_path / "unbind"
    fresh.write_text("")
    k.write(str(fresh), "0000:01:00.0")
    assert fresh.read_text() == "0000:01:00.0"
    with pytest.raises(OSError):
        k.write(str(tmp_path / "missing" / "file"), "x")
    os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # release the stranded writer


def test_unbind_refuses_when_the_hardware_behind_a_record_changed(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    host(tree, kernel).bind([A("0000:03:01.0")], group=True)
    # another card at the same address after a reboot: the record no longer describes it
    rec = tree.root / "var/lib/vfio_dp/original/0000:03:01.0.json"
    rec.write_text(rec.read_text().replace('"100e"', '"10d3"'))
    with pytest.raises(BindError, match=r"record says 8086:10d3.*--driver NAME"):
        host(tree, kernel).unbind([A("0000:03:01.0")])
    assert tree.driver_of("0000:03:01.0") == "vfio-pci"  # nothing touched


def _meet_in_pairs(kernel: SimulatedKernel, suffix: str) -> None:
    """Writes to paths ending in ``suffix`` wait for a second one (10 s at most, then the
    write fails). With two IOMMU groups that only works when the groups are worked on at the
    same time: proof of concurrency without timing anything."""
    meet = threading.Barrier(2)

    def rendezvous(path: str, data: str) -> OSError | None:
        if path.endswith(suffix):
            meet.wait(timeout=10)
        return None

    kernel.fail = rendezvous


def test_unbind_restores_groups_concurrently_and_a_cards_functions_in_order(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    h = host(tree, kernel)
    h.bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    # Each restore ends with a write to drivers/<original>/bind.
    _meet_in_pairs(kernel, "/bind")
    start = len(kernel.writes)
    order = [A("0000:3b:00.0"), A("0000:03:01.0"), A("0000:3b:00.1"), A("0000:03:02.0")]
    res = h.unbind(order)
    assert res.restored == [
        (A("0000:3b:00.0"), "nvidia"),
        (A("0000:03:01.0"), "e1000"),
        (A("0000:3b:00.1"), "snd_hda_intel"),
        (A("0000:03:02.0"), "e1000"),
    ]
    # within group 45 (one card) the functions went one after the other, in the order given
    card = [p + " " + d for p, d in kernel.writes[start:] if "0000:3b:00." in p + d]
    last_gpu = max(i for i, w in enumerate(card) if "0000:3b:00.0" in w)
    first_audio = min(i for i, w in enumerate(card) if "0000:3b:00.1" in w)
    assert last_gpu < first_audio, card
    assert all(tree.driver_of(str(a)) is not None for a in order)


def test_unbind_attempts_every_device_and_names_each_failure(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    h = host(tree, kernel)
    h.bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    kernel.refuse_attach.add(("0000:03:01.0", "e1000"))  # the original driver will not take it
    with pytest.raises(BindError) as e:
        h.unbind([A("0000:03:01.0"), A("0000:3b:00.0"), A("0000:3b:00.1")])
    msg = str(e.value)
    assert "0000:03:01.0: restore to e1000 did not take" in msg
    assert "vfioctl unbind --driver e1000 0000:03:01.0" in msg
    assert "0000:3b:00.0: restored to nvidia" in msg
    assert "0000:3b:00.1: restored to snd_hda_intel" in msg
    assert tree.driver_of("0000:3b:00.0") == "nvidia"
    assert tree.driver_of("0000:3b:00.1") == "snd_hda_intel"
    # the failed device keeps its record, so a later unbind can still restore it
    assert (tree.root / "var/lib/vfio_dp/original/0000:03:01.0.json").exists()


def test_real_kernel_reuses_one_writer_and_adds_one_per_concurrent_write(tmp_path: Path) -> None:
    import os

    def writers() -> int:
        return sum(t.name == "sysfs-writer" for t in threading.enumerate())

    before = writers()
    k = RealKernel(timeout=5)
    target = tmp_path / "driver_override"
    target.write_text("")
    for _ in range(5):
        k.write(str(target), "vfio-pci")
    assert writers() == before + 1
    fifo = tmp_path / "slow"
    os.mkfifo(fifo)
    blocked = threading.Thread(target=k.write, args=(str(fifo), "x"))
    blocked.start()  # holds a writer until the FIFO gets a reader
    # until it has taken the idle worker (RealKernel shows that only in its private _idle)
    wait_until(lambda: not k._idle, what="the blocked write to take the idle worker")
    k.write(str(target), "")  # meanwhile another write needs, and gets, a second worker
    assert writers() == before + 2
    fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    blocked.join(timeout=5)
    os.close(fd)
    assert not blocked.is_alive()


def test_bind_binds_groups_concurrently_and_reports_in_plan_order(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    _meet_in_pairs(kernel, "drivers_probe")  # every bind ends with a drivers_probe write
    res = host(tree, kernel).bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    assert res.bound == [A("0000:3b:00.0"), A("0000:03:01.0"), A("0000:3b:00.1"), A("0000:03:02.0")]
    for a in ("0000:3b:00.0", "0000:3b:00.1", "0000:03:01.0", "0000:03:02.0"):
        assert tree.driver_of(a) == "vfio-pci"
    # within group 45 the functions went one after the other, in plan order
    probes = [d for p, d in kernel.writes if p.endswith("drivers_probe")]
    assert probes.index("0000:3b:00.0") < probes.index("0000:3b:00.1")


def test_a_failed_group_rolls_back_the_groups_that_bound(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    kernel.refuse_attach.add(("0000:03:02.0", "vfio-pci"))  # the shared group's 2nd endpoint
    with pytest.raises(BindError) as e:
        host(tree, kernel).bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    msg = str(e.value)
    assert "0000:03:02.0: after drivers_probe the device is on no driver" in msg
    assert "rolled back" in msg and "0000:3b:00.1" in msg  # the GPU's group had bound
    drivers = {
        a: tree.driver_of(a)
        for a in ("0000:3b:00.0", "0000:3b:00.1", "0000:03:01.0", "0000:03:02.0")
    }
    assert drivers == {
        "0000:3b:00.0": "nvidia",
        "0000:3b:00.1": "snd_hda_intel",
        "0000:03:01.0": "e1000",
        "0000:03:02.0": "e1000",
    }
    assert list((tree.root / "var/lib/vfio_dp/original").iterdir()) == []


def test_unbind_all_restores_every_recorded_device(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    h = host(tree, kernel)
    h.bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    res = host(tree, kernel).unbind_all()
    assert dict(res.restored) == {
        A("0000:03:01.0"): "e1000",
        A("0000:03:02.0"): "e1000",
        A("0000:3b:00.0"): "nvidia",
        A("0000:3b:00.1"): "snd_hda_intel",
    }
    assert not list((tree.root / "var/lib/vfio_dp/original").iterdir())
    # 0000:65:00.0 was on vfio-pci with no record: --all leaves it alone
    assert tree.driver_of("0000:65:00.0") == "vfio-pci"
    assert host(tree, kernel).unbind_all().restored == []  # nothing left to do


def test_unbind_all_has_unbinds_checks(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    """A busy group and a record that no longer fits the hardware refuse it all, naming each."""
    h = host(tree, kernel)
    h.bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    rec = tree.root / "var/lib/vfio_dp/original/0000:03:01.0.json"
    rec.write_text(rec.read_text().replace('"100e"', '"10d3"'))
    n = len(kernel.writes)
    with pytest.raises(RefusedError) as e:
        h.unbind_all()
    assert "0000:03:01.0 is now 8086:100e but the record says 8086:10d3" in str(e.value)
    assert len(kernel.writes) == n  # nothing touched
    # a busy group refuses it as it refuses unbind: tests/model/test_plan.py (a temp tree's
    # /dev/vfio/<N> cannot answer EBUSY; the guest's real kernel does, tests/guest/)


def test_unbind_all_attempts_every_device_and_names_each_failure(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    h = host(tree, kernel)
    h.bind([A("0000:3b:00.0"), A("0000:03:01.0")], group=True)
    kernel.refuse_attach.add(("0000:03:01.0", "e1000"))
    tree.remove("0000:3b:00.1")  # the audio function is gone; its record stays
    with pytest.raises(BindError) as e:
        h.unbind_all()
    msg = str(e.value)
    assert "0000:03:01.0: restore to e1000 did not take" in msg
    assert "0000:3b:00.1: recorded in" in msg and "no such device" in msg
    assert "0000:3b:00.0: restored to nvidia" in msg
    assert "0000:03:02.0: restored to e1000" in msg
    assert tree.driver_of("0000:3b:00.0") == "nvidia" and tree.driver_of("0000:03:02.0") == "e1000"
    left = {p.name for p in (tree.root / "var/lib/vfio_dp/original").iterdir()}
    assert left == {"0000:03:01.0.json", "0000:3b:00.1.json"}


def test_reread_after_a_bind_reads_the_bound_groups_alone(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """Host.reread (the DRA Prepare's look after its bind) gives what a full refresh gives for
    the bound group, and reads no other device: a driver changed elsewhere meanwhile is not
    seen (the next resync sees it)."""
    h = host(tree, kernel)
    inv = h.scan()
    gpu, audio = A("0000:3b:00.0"), A("0000:3b:00.1")
    h.bind([gpu], group=True, inventory=inv)
    tree.set_driver("0000:00:03.0", "e1000e")  # elsewhere, behind the scan's back
    after = h.reread(inv, [gpu])
    full = h.refresh(inv)
    for a in (gpu, audio):
        assert after.devices[a] == full.devices[a]
        assert after.devices[a].driver == "vfio-pci"
    assert after.groups[45] == full.groups[45] and after.groups[45].viable
    assert not inv.groups[45].viable  # judged again, not copied
    assert after.devices[A("0000:00:03.0")].driver == "virtio-pci"  # not read again
    assert full.devices[A("0000:00:03.0")].driver == "e1000e"


def test_bind_with_a_stale_inventory_plans_again_under_the_locks(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """The inventory a caller hands Host.bind only seeds the first plan: the devices are read
    again under their locks, so a group bound meanwhile is 'already' bound, not bound twice."""
    h = host(tree, kernel)
    stale = h.scan()  # the GPU's group still on nvidia / snd_hda_intel
    h.bind([A("0000:3b:00.0")], group=True)
    writes = len(kernel.writes)
    res = h.bind([A("0000:3b:00.0")], group=True, inventory=stale)
    assert res.bound == [] and set(res.already) == {A("0000:3b:00.0"), A("0000:3b:00.1")}
    assert len(kernel.writes) == writes  # nothing written again


def test_a_parent_the_config_wants_mdevs_of_is_never_bound(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """Issue 35 item 1: while an ``mdev:`` entry names a parent (by address or by selector,
    whether or not its vendor driver offers types right now), no bind moves it to a VFIO
    driver -- not alone, not as a ``--group`` sibling, not with ``--force``."""
    from vfio_dp.model.config import load_config_text

    by_addr = load_config_text(
        "mdev:\n- {parent: '0000:3b:00.0', type: nvidia-222, count: 2}\n", "t"
    ).mdev
    by_selector = load_config_text(
        "mdev:\n- {parent: {vendor: '10de', device: '1eb8'}, type: nvidia-222, path: dra}\n", "t"
    ).mdev
    h = host(tree, kernel)
    for entries, named in ((by_addr, "0000:3b:00.0"), (by_selector, "a PCI selector")):
        for kw in ({"group": True}, {"group": True, "force": True}):
            with pytest.raises(RefusedError) as e:
                h.bind([A("0000:3b:00.0")], mdev=entries, **kw)  # type: ignore[arg-type]
            msg = str(e.value)
            assert (
                f"0000:3b:00.0 (10de:1eb8, nvidia) is the parent of the config's mdev entry {{parent: {named}, type: nvidia-222"
                in msg
            )
            assert "remove that entry from the config's mdev: section" in msg
        # the audio function's --group takes its sibling, the parent: refused as well
        with pytest.raises(RefusedError, match="is the parent of the config's mdev entry"):
            h.bind([A("0000:3b:00.1")], group=True, mdev=entries)
    assert kernel.writes == []
    # an entry naming another parent leaves this one alone
    other = load_config_text("mdev:\n- {parent: mtty, type: mtty-2}\n", "t").mdev
    assert h.bind([A("0000:3b:00.0")], group=True, mdev=other).bound
