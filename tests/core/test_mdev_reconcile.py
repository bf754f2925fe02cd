"""The node core makes the instances the config's ``mdev:`` section asks, at start, on
reload and resync, re-makes recorded ones with their UUIDs (a reboot), removes its own when
the config stops asking, and leaves other people's and held ones alone (a fake tree whose
``create``/``remove`` react as the kernel's: tests/mdev_tree.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.mdev_tree import MdevKernel, add_instance, add_parent, remove_instance
from tests.sysfs_tree import SysfsTree, gpu_host
from vfio_dp.core.mdev_reconcile import MdevPass
from vfio_dp.core.node import CoreOptions, NodeCore
from vfio_dp.host import Host
from vfio_dp.host.mdev import read_mdevs
from vfio_dp.model.config import Config, load_config_text
from vfio_dp.model.mdev import MdevRecord

GPU = "0000:3b:00.0"
OTHER = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"  # made by someone else
CLAIMED = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1009"


def tree(base: Path) -> SysfsTree:
    t = gpu_host(base)
    add_parent(t, "mtty", {"mtty-1": ("Single port serial", 24, "vfio-pci"),
                           "mtty-2": ("Dual port serial", 4, "vfio-pci")}, driver="mtty")  # fmt: skip
    add_instance(t, "mtty", "mtty-2", OTHER, group=70)
    add_parent(t, GPU, {"nvidia-222": ("GRID T4-1Q / 1 GB", 0, "vfio-pci"),
                        "nvidia-223": ("GRID T4-2Q/B (8 slices)", 2, "vfio-pci")})  # fmt: skip
    return t


def cfg(text: str) -> Config:
    return load_config_text(text, "t")


def ours(t: SysfsTree, parent: str, type_id: str, by: str = "device-plugin") -> list[str]:
    """Our instances of ``type_id`` on ``parent`` that exist and are recorded as ``by``."""
    p = Pass(t).mdevs
    recs = [r for r in p.store.records()[0] if r.by == by]
    present = {i.uuid: i for i in read_mdevs(p.host.fs).instances}
    return sorted(
        r.uuid for r in recs
        if r.uuid in present and (r.parent, r.type_id) == (parent, type_id)
        and present[r.uuid].type_id == type_id
    )  # fmt: skip


def Pass(t: SysfsTree, front_end: str = "device-plugin", path: str = "devicePlugin") -> MdevPass:
    return MdevPass(Host(t.root, kernel=MdevKernel(t), runner=front_end), front_end, path)


MTTY2 = "mdev:\n- {parent: mtty, type: mtty-2, count: %s}\n"


def test_counts_made_lowered_and_given_back(tmp_path: Path) -> None:
    t = tree(tmp_path / "root")
    said = Pass(t).reconcile_sync(cfg(MTTY2 % 2), {})
    made = ours(t, "mtty", "mtty-2")
    assert len(made) == 2 and f"mdev mtty-2 on mtty: made {', '.join(made)}" in said[0]
    assert Pass(t).reconcile_sync(cfg(MTTY2 % 2), {}) == []  # steady: nothing to say
    Pass(t).reconcile_sync(cfg(MTTY2 % 1), {})
    assert len(ours(t, "mtty", "mtty-2")) == 1
    Pass(t).reconcile_sync(cfg(MTTY2 % "all"), {})  # ours (1) + the 3 available
    assert len(ours(t, "mtty", "mtty-2")) == 4
    said = Pass(t).reconcile_sync(cfg('selectors: [{vendor: "8086"}]\n'), {})
    assert ours(t, "mtty", "mtty-2") == [] and len(said) == 4
    assert {i.uuid for i in read_mdevs(Pass(t).mdevs.host.fs).instances} == {OTHER}


def test_other_paths_entries_and_onprepare_are_not_made_here(tmp_path: Path) -> None:
    t = tree(tmp_path / "root")
    c = cfg("mdev:\n- {parent: mtty, type: mtty-2, count: 2, path: dra}\n"
            "- {parent: '0000:3b:00.0', type: nvidia-223, path: dra, create: onPrepare}\n")  # fmt: skip
    assert Pass(t).reconcile_sync(c, {}) == []
    assert ours(t, "mtty", "mtty-2") == []
    Pass(t, "dra-plugin", "dra").reconcile_sync(c, {})
    assert len(ours(t, "mtty", "mtty-2", by="dra-plugin")) == 2
    assert ours(t, GPU, "nvidia-223", by="dra-plugin") == []  # onPrepare: at Prepare


def test_a_pci_selector_parent_and_vendor_names_with_slashes(tmp_path: Path) -> None:
    t = tree(tmp_path / "root")
    dev = t.devs[GPU]
    c = cfg(f'mdev:\n- parent: {{vendor: "{dev.vendor}", device: "{dev.device}"}}\n'
            "  type: nvidia-223\n  count: all\n")  # fmt: skip
    Pass(t).reconcile_sync(c, {})
    assert len(ours(t, GPU, "nvidia-223")) == 2
    said = Pass(t).reconcile_sync(cfg(f"mdev:\n- {{parent: '{GPU}', type: nvidia-222}}\n"), {})
    assert said[0] == (
        f"mdev nvidia-222 on {GPU}: 0 of 1 wanted: available_instances is 0 (other "
        "instances use the parent); not made, retried at the next pass"
    )
    assert len(ours(t, GPU, "nvidia-223")) == 0  # its entry is gone: given back


def test_a_reboot_remakes_recorded_instances_with_their_uuids(tmp_path: Path) -> None:
    t = tree(tmp_path / "root")
    Pass(t).reconcile_sync(cfg(MTTY2 % 2), {})
    before = ours(t, "mtty", "mtty-2")
    dra = Pass(t, "dra-plugin", "dra")
    dra.mdevs.create("mtty", "mtty-1", [CLAIMED], by="claim:5d1e")
    for u in [*before, CLAIMED]:  # the reboot: instances gone, records kept
        remove_instance(t, u)
    Pass(t).reconcile_sync(cfg(MTTY2 % 2), {})
    assert ours(t, "mtty", "mtty-2") == before  # the same UUIDs: the kubelet's replay finds them
    assert CLAIMED not in {i.uuid for i in read_mdevs(dra.mdevs.host.fs).instances}
    said = dra.reconcile_sync(cfg(MTTY2 % 2), {})  # the DRA plugin re-makes its claims' ones
    assert said == [f"mdev mtty-1 on mtty: re-made {CLAIMED}"]
    assert ours(t, "mtty", "mtty-1", by="claim:5d1e") == [CLAIMED]


def test_an_unprepare_between_the_pass_reading_and_remaking_is_not_undone(
    tmp_path: Path,
) -> None:
    """A claim's Unprepare removes the instance, then its record (both under the parent's
    lock). A pass that read the instances after the first step and the records before the
    second must not make the instance again for a claim that is gone (it did: the instance
    stayed, taking a slot, until a later reconcile released it)."""
    t = tree(tmp_path / "root")
    dra = Pass(t, "dra-plugin", "dra")
    dra.mdevs.create("mtty", "mtty-1", [CLAIMED], by="claim:5d1e")
    store = dra.mdevs.store
    read_records = store.records

    def records_then_unprepare_ends() -> tuple[list[MdevRecord], list[str]]:
        seen = read_records()
        store.remove(CLAIMED)  # the Unprepare's last step, right after the pass's read
        return seen

    remove_instance(t, CLAIMED)  # the Unprepare's first step: the instance is gone
    store.records = records_then_unprepare_ends  # type: ignore[method-assign]
    said = dra.reconcile_sync(cfg(MTTY2 % 2), {})
    assert CLAIMED not in {i.uuid for i in read_mdevs(dra.mdevs.host.fs).instances}
    assert store.get(CLAIMED) is None
    assert not any("re-made" in m for m in said), said


def test_a_parent_that_disappears_keeps_its_records(tmp_path: Path) -> None:
    t = tree(tmp_path / "root")
    Pass(t).reconcile_sync(cfg(MTTY2 % 1), {})
    (u,) = ours(t, "mtty", "mtty-2")
    remove_instance(t, u)
    (t.root / "sys/class/mdev_bus/mtty").unlink()  # the driver unloaded
    said = Pass(t).reconcile_sync(cfg(MTTY2 % 1), {})
    assert said == ["mdev mtty-2 on mtty: no parent mtty under /sys/class/mdev_bus (gone, or "
                    "its driver is not loaded); made when it is"]  # fmt: skip
    assert (t.root / f"var/lib/vfio_dp/mdev/{u}.json").exists()
    (t.root / "sys/class/mdev_bus/mtty").symlink_to("../../devices/virtual/mtty/mtty")
    Pass(t).reconcile_sync(cfg(MTTY2 % 1), {})
    assert ours(t, "mtty", "mtty-2") == [u]


def test_a_held_surplus_instance_stays(tmp_path: Path) -> None:
    t = tree(tmp_path / "root")
    Pass(t).reconcile_sync(cfg(MTTY2 % 1), {})
    (u,) = ours(t, "mtty", "mtty-2")
    said = Pass(t).reconcile_sync(cfg(MTTY2 % 0), {u: ["pod default/vm"]})
    assert said == [f"mdev {u} (surplus): not removed: mdev {u} is held: pod default/vm; "
                    "stop its user first"]  # fmt: skip
    assert ours(t, "mtty", "mtty-2") == [u]


def test_the_core_makes_them_before_its_front_ends_are_told(tmp_path: Path) -> None:
    """Wired into NodeCore: at start (before the first snapshot) and on reload."""
    t = tree(tmp_path / "root")
    path = tmp_path / "config.yaml"
    path.write_text(MTTY2 % 2)
    core = NodeCore(
        CoreOptions(root=str(t.root), config_path=str(path), metrics_port=0, uevents=False),
        Host(t.root, kernel=MdevKernel(t), runner="device-plugin"),
    )
    seen: list[int] = []

    class Front:
        async def inventory_changed(self, snapshot: object) -> None:
            seen.append(len(ours(t, "mtty", "mtty-2")))

    core.subscribe(Front())

    async def scenario() -> None:
        await core.start()
        try:
            assert seen == [2]
            await core.apply_config(cfg(MTTY2 % 1))
            assert len(ours(t, "mtty", "mtty-2")) == 1
        finally:
            await core.close()

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("mdev:\n- {parent: mtty, type: mtty-2}\n- {parent: mtty, type: mtty-1}\n",
         "mdev[1].parent: 'mtty': mdev[0] names this parent already (type mtty-2): one type "
         "per parent"),
        ("mdev:\n- {parent: mtty, type: a/b}\n", "mdev[0].type: 'a/b': must be a type id"),
        ("mdev:\n- {parent: mtty, type: mtty-2, create: onPrepare}\n",
         "onPrepare needs path: dra"),
        ("mdev:\n- {parent: mtty, type: mtty-2, count: some}\n",
         "mdev[0].count: 'some': must be a whole number, 0 or more, or all"),
        ("mdev:\n- {type: mtty-2}\n", "mdev[0].parent: None: missing"),
        ("mdev:\n- {parent: mtty, type: mtty-2, colour: red}\n", "mdev[0].colour: 'red': unknown key"),
    ],
)  # fmt: skip
def test_config_refusals(text: str, says: str) -> None:
    from vfio_dp.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        cfg(text)
    assert says in str(e.value)


def test_a_record_names_its_maker() -> None:
    assert MdevRecord("u", "mtty", "mtty-2", "device-plugin").by == "device-plugin"


def test_instances_of_types_the_parent_does_not_list_are_left_alone(tmp_path: Path) -> None:
    """Issue 35 item 7: someone's instance of a type its parent does not list (a dangling
    ``mdev_type``) is neither counted toward an entry's ``count`` nor ever removed, with the
    entry there or gone."""
    t = tree(tmp_path / "root")
    stray = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1005"
    add_instance(t, "mtty", "mtty-3", stray, group=75)
    Pass(t).reconcile_sync(cfg(MTTY2 % 2), {})
    assert len(ours(t, "mtty", "mtty-2")) == 2
    Pass(t).reconcile_sync(cfg('selectors: [{vendor: "8086"}]\n'), {})
    assert ours(t, "mtty", "mtty-2") == []
    assert {i.uuid for i in read_mdevs(Pass(t).mdevs.host.fs).instances} == {OTHER, stray}
