"""Instances made and removed (:class:`vfio_dp.host.mdev_ops.Mdevs`) on a fake tree whose
``create`` and ``remove`` react as the kernel's do (tests/mdev_tree.py ``MdevKernel``):
refusals naming the value and the fix, holds, ownership, and the journal -- a create or a
remove killed on either side of its sysfs write is finished or undone by the next run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.mdev_tree import MdevKernel, add_instance, add_parent
from tests.sysfs_tree import SysfsTree, gpu_host
from vfio_dp.errors import BindError, RefusedError
from vfio_dp.host import Host
from vfio_dp.host.mdev import read_mdevs
from vfio_dp.host.mdev_ops import Mdevs
from vfio_dp.model.mdev import MdevRecord

GPU = "0000:3b:00.0"
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"  # made by someone else
U2 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
U3 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1003"
U4 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1004"


class Killed(BaseException):
    """What a SIGKILL leaves: the process stops here, nothing after it runs."""


@pytest.fixture
def t(tmp_path: Path) -> SysfsTree:
    t = gpu_host(tmp_path / "root")
    add_parent(t, "mtty", {"mtty-1": ("Single port serial", 24, "vfio-pci"),
                           "mtty-2": ("Dual port serial", 3, "vfio-pci")}, driver="mtty")  # fmt: skip
    add_instance(t, "mtty", "mtty-2", U1, group=70)
    add_parent(t, GPU, {"nvidia-222": ("GRID T4-1Q / 1 GB", 0, "vfio-pci"),
                        "nvidia-223": ("GRID T4-2Q", 8, "vfio-pci")})  # fmt: skip
    return t


def mdevs(t: SysfsTree, kernel: MdevKernel | None = None, by: str = "operator") -> Mdevs:
    return Mdevs(Host(str(t.root), kernel=kernel or MdevKernel(t)), by=by)


def uuids(t: SysfsTree) -> set[str]:
    return {i.uuid for i in read_mdevs(Mdevs(Host(str(t.root))).host.fs).instances}


def available(t: SysfsTree, parent: str, type_id: str) -> int:
    p = next(p for p in read_mdevs(Mdevs(Host(str(t.root))).host.fs).parents if p.name == parent)
    t_ = p.type(type_id)
    assert t_ is not None and t_.available is not None
    return t_.available


def state(t: SysfsTree) -> tuple[list[str], list[str]]:
    d = t.root / "var/lib/vfio_dp/mdev"
    recs = sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []
    ops = sorted(p.stem for p in (d / "ops").glob("*.json")) if (d / "ops").is_dir() else []
    return recs, ops


def test_create_makes_records_and_decrements(t: SysfsTree) -> None:
    m = mdevs(t)
    res = m.create("mtty", "mtty-2", [U2, U3])
    assert res.uuids == [U2, U3]
    assert res.steps[0] == (
        f"echo {U2} > {t.root}/sys/class/mdev_bus/mtty/mdev_supported_types/mtty-2/create"
    )
    assert uuids(t) == {U1, U2, U3}
    assert available(t, "mtty", "mtty-2") == 1
    assert state(t) == ([U2, U3], [])
    rec = json.loads((t.root / f"var/lib/vfio_dp/mdev/{U2}.json").read_text())
    assert rec == {"uuid": U2, "parent": "mtty", "type_id": "mtty-2", "by": "operator"}
    inst = next(i for i in read_mdevs(m.host.fs).instances if i.uuid == U2)
    assert inst.vfio_node is not None and inst.iommu_group is not None


def test_create_by_pci_address_as_typed(t: SysfsTree) -> None:
    mdevs(t).create("3B:00.0", "nvidia-223", [U2])  # normalized to the parent's name
    assert U2 in uuids(t) and available(t, GPU, "nvidia-223") == 7


@pytest.mark.parametrize(
    ("parent", "type_id", "given", "says"),
    [
        ("mtty0", "mtty-2", [U2], "no mdev parent 'mtty0' under /sys/class/mdev_bus (parents: "
         f"{GPU}, mtty); name one of them, or load its vendor driver"),
        ("mtty", "mtty-3", [U2], "mdev parent mtty has no type 'mtty-3' (its types: mtty-1 "
         "(Single port serial), mtty-2 (Dual port serial))"),
        (GPU, "nvidia-222", [U2], f"type nvidia-222 of {GPU} has available_instances 0, 1 asked:"
         f" remove instances of {GPU} (vfioctl mdev remove) or ask fewer"),
        ("mtty", "mtty-2", ["83B8-nope"], "'83B8-nope' is not an mdev UUID: give a lowercase UUID"),
        ("mtty", "mtty-2", [U1], f"an mdev {U1} already exists (vfioctl mdev shows it)"),
        ("mtty", "mtty-2", [U2, U3, U4, U4], "available_instances 3, 4 asked"),
    ],
)  # fmt: skip
def test_create_refusals_name_the_value_and_the_fix(
    t: SysfsTree, parent: str, type_id: str, given: list[str], says: str
) -> None:
    k = MdevKernel(t)
    with pytest.raises(RefusedError) as e:
        mdevs(t, k).create(parent, type_id, given)
    assert says in str(e.value)
    assert k.writes == [] and state(t) == ([], [])


def test_a_kernel_refusal_is_named_and_nothing_is_recorded(t: SysfsTree) -> None:
    """The instance appears between the check and the write (another tool): EEXIST."""
    k = MdevKernel(t)
    k.fail = lambda path, data: (add_instance(t, "mtty", "mtty-2", U2, group=80), None)[1]
    with pytest.raises(BindError, match=f"the kernel refused \\(EEXIST\\): an mdev {U2} exists"):
        mdevs(t, k).create("mtty", "mtty-2", [U2])
    assert state(t) == ([], [])  # not ours: no record, no journal


def test_remove_ours_and_refuse_others_unless_forced(t: SysfsTree) -> None:
    m = mdevs(t)
    m.create("mtty", "mtty-2", [U2])
    with pytest.raises(RefusedError, match=f"mdev {U1} was not made by vfio_dp .no record.: "
                       "left alone; add --force"):  # fmt: skip
        m.remove([U1, U2])
    assert uuids(t) == {U1, U2}  # nothing removed: all or nothing
    dry = m.remove([U2], dry_run=True)
    assert dry.steps == [f"echo 1 > {t.root}/sys/bus/mdev/devices/{U2}/remove"]
    assert m.remove([U2]).uuids == [U2]
    assert uuids(t) == {U1} and state(t) == ([], []) and available(t, "mtty", "mtty-2") == 3
    assert m.remove([U1], force=True).uuids == [U1]
    assert uuids(t) == set()


def test_a_config_made_instance_needs_force(t: SysfsTree) -> None:
    mdevs(t, by="device-plugin").create("mtty", "mtty-2", [U2])
    with pytest.raises(RefusedError, match=r"made by device-plugin .* change that config, or"):
        mdevs(t).remove([U2])
    mdevs(t).remove([U2], force=True)
    assert U2 not in uuids(t)


def test_held_instances_are_never_removed(t: SysfsTree) -> None:
    m = mdevs(t)
    m.create("mtty", "mtty-2", [U2, U3, U4])
    node = next(i.vfio_node for i in read_mdevs(m.host.fs).instances if i.uuid == U2)
    fd = t.root / "proc/812/fd"
    fd.mkdir(parents=True)
    (t.root / "proc/812/comm").write_text("qemu-kvm\n")
    (fd / "31").symlink_to(str(node))
    m.store.put(MdevRecord(U3, "mtty", "mtty-2", "claim:5d1e"))
    for u, why in ((U2, f"{node} is held open by pid 812 (qemu-kvm) fd 31"),
                   (U3, "claim 5d1e"), (U4, "pod default/vm (kubelet)")):  # fmt: skip
        with pytest.raises(RefusedError, match=f"mdev {u} is held: .*{re.escape(why)}"):
            m.remove([u], force=True, extra={U4: ["pod default/vm (kubelet)"]})
    with pytest.raises(RefusedError, match="held: a front-end could not say"):
        m.remove([U4], extra={"*": ["a front-end could not say"]})
    assert {U2, U3, U4} <= uuids(t)


def test_a_recorded_instance_already_gone_loses_its_record(t: SysfsTree) -> None:
    m = mdevs(t)
    m.store.put(MdevRecord(U2, "mtty", "mtty-2", "operator"))
    res = m.remove([U2])
    assert res.warnings == [f"mdev {U2} was already gone; its record is dropped"]
    assert state(t) == ([], [])
    with pytest.raises(RefusedError, match=f"no mdev {U3} under /sys/bus/mdev/devices"):
        m.remove([U3])


# -- killed on either side of the sysfs write ---------------------------------------------
def _killed_before(path: str, data: str) -> None:
    raise Killed(path)


class KilledAfter(MdevKernel):
    def _react(self, path: str, data: str) -> None:
        super()._react(path, data)
        raise Killed(path)


def test_create_killed_before_its_write_is_undone(t: SysfsTree) -> None:
    k = MdevKernel(t)
    k.fail = _killed_before  # type: ignore[assignment]
    with pytest.raises(Killed):
        mdevs(t, k).create("mtty", "mtty-2", [U2])
    assert state(t) == ([], [U2]) and U2 not in uuids(t)  # the journal tells
    said = mdevs(t).recover()
    assert said == [f"undid the interrupted mdev create of {U2} (mtty-2 on mtty) by vfioctl "
                    f"(pid {said[0].split('pid ')[1].split(')')[0]}): it was not made"]  # fmt: skip
    assert state(t) == ([], []) and U2 not in uuids(t)


def test_create_killed_after_its_write_is_finished(t: SysfsTree) -> None:
    with pytest.raises(Killed):
        mdevs(t, KilledAfter(t)).create("mtty", "mtty-2", [U2])
    assert state(t) == ([], [U2]) and U2 in uuids(t)  # made, not yet recorded
    # the next create on the parent finishes it first: never an instance nobody records
    res = mdevs(t).create("mtty", "mtty-2", [U3])
    assert "finished the interrupted mdev create of " + U2 in res.warnings[0]
    assert state(t) == ([U2, U3], [])


def test_remove_killed_before_its_write_is_undone(t: SysfsTree) -> None:
    mdevs(t).create("mtty", "mtty-2", [U2])
    k = MdevKernel(t)
    k.fail = _killed_before  # type: ignore[assignment]
    with pytest.raises(Killed):
        mdevs(t, k).remove([U2])
    assert state(t) == ([U2], [U2])
    assert "it is still there; kept" in mdevs(t).recover()[0]
    assert state(t) == ([U2], []) and U2 in uuids(t)


def test_remove_killed_after_its_write_is_finished(t: SysfsTree) -> None:
    mdevs(t).create("mtty", "mtty-2", [U2])
    with pytest.raises(Killed):
        mdevs(t, KilledAfter(t)).remove([U2])
    assert state(t) == ([U2], [U2]) and U2 not in uuids(t)
    assert "it is gone; its record dropped" in mdevs(t).recover()[0]
    assert state(t) == ([], [])


def test_recovery_leaves_a_running_operation_alone(t: SysfsTree) -> None:
    """A journal whose parent's lock is held is in progress, not interrupted."""
    k = MdevKernel(t)
    k.fail = _killed_before  # type: ignore[assignment]
    with pytest.raises(Killed):
        mdevs(t, k).create("mtty", "mtty-2", [U2])
    m = mdevs(t)
    with m.host.state.locked(["mtty"]):
        assert m.recover() == []
    assert state(t) == ([], [U2])


def test_a_claims_unprepare_removes_the_instance_its_prepare_made(t: SysfsTree) -> None:
    """The DRA path's calls (item 4): made for claim 5d1e, held against everyone else,
    removed by that claim's Unprepare."""
    m = mdevs(t, by="dra-plugin")
    m.create("mtty", "mtty-2", [U2], by="claim:5d1e")
    with pytest.raises(RefusedError, match=f"mdev {U2} is held: claim 5d1e"):
        m.remove([U2], force=True)
    with pytest.raises(RefusedError, match=f"mdev {U2} is held: claim 5d1e"):
        m.remove([U2], for_claim="other")
    assert m.remove([U2], for_claim="5d1e").uuids == [U2]
    assert U2 not in uuids(t) and state(t) == ([], [])
