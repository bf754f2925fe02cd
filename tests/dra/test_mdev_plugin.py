"""Mediated devices through the real DRA plugin (issue 35 item 4), end to end: the kubelet
DRA stand-in over real unix sockets, the real publisher writing to the API-server stand-in
(validated as upstream does), the scheduler stand-in allocating from the published pool, on
the kernel simulator's mtty (tests/mdev_tree.py). 24 ports, ``mtty-2`` costs 2: at most 12
claims; a claim's Prepare makes its instance, Unprepare removes it; after a reboot the DRA
plugin's mdev pass makes a prepared claim's instance again with its checkpointed UUID."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dra.apiserver_standin import CLAIMS, DEVICE_CLASSES, ApiServerStandin, Unschedulable
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.scheduler_standin import SchedulerStandin
from tests.dra.test_dra_plugin import DRIVER, pool, until
from tests.dra.test_personalities_plugin import _new_plugin
from tests.dra.test_prepare import _boot
from tests.dra.test_scheduler_standin import _claim
from tests.mdev_tree import MdevKernel, add_parent, remove_instance
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.deviceclasses import mdev_class_name, mdev_device_classes
from vfio_dp.dra.mdev_slices import slot_name
from vfio_dp.model.config import load_config_text

CONFIG = """
mdev:
  - parent: mtty
    type: mtty-2
    count: all
    create: onPrepare
    path: dra
"""
SLOTS = {slot_name("mtty", "mtty-2", k) for k in range(12)}


def _tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path / "host")
    add_parent(
        t,
        "mtty",
        {"mtty-1": ("Single port serial", 24, "vfio-pci"), "mtty-2": ("Dual port serial", 12, "vfio-pci")},
        driver="mtty",
    )  # fmt: skip
    (t.root / "dev/vfio").mkdir(parents=True, exist_ok=True)
    _boot(t, "boot-1")
    return t


def _instances(tree: SysfsTree) -> set[str]:
    d = tree.root / "sys/bus/mdev/devices"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def _uid(api: ApiServerStandin, name: str) -> str:
    (c,) = [c for c in api.objects(CLAIMS, "default") if c["metadata"]["name"] == name]
    return str(c["metadata"]["uid"])


async def test_slots_allocated_prepared_unprepared_and_remade_after_a_reboot(
    apiserver: ApiServerStandin, kdirs: tuple[str, str], tmp_path: Path
) -> None:
    tree = _tree(tmp_path)
    (tmp_path / "config.yaml").write_text(CONFIG)
    kubelet = KubeletDraStandin(kdirs[0], NODE, api_client=apiserver.client())
    await kubelet.start()
    plugin = _new_plugin(apiserver, kdirs, tmp_path, tree.root, kernel=MdevKernel(tree))
    await plugin.start()
    try:
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
        await until("the 12 slots", lambda: pool(apiserver)[1] == SLOTS)
        slices = pool(apiserver)[2]
        sets = [cs for s in slices for cs in s["spec"].get("sharedCounters") or []]
        assert sets == [{"name": "mdev-mtty", "counters": {"units": {"value": "24"}}}]
        for c in mdev_device_classes(load_config_text(CONFIG, "c"), DRIVER):
            apiserver.seed(DEVICE_CLASSES, c)
        sched = SchedulerStandin(apiserver)
        cls = mdev_class_name(DRIVER, "mtty-2")
        for i in range(13):
            _claim(apiserver, f"c{i}", cls)
        for i in range(12):
            sched.allocate("default", f"c{i}", NODE)
        with pytest.raises(Unschedulable):
            sched.allocate("default", "c12", NODE)  # 12 x 2 ports: the parent is full

        uid0, uid1 = _uid(apiserver, "c0"), _uid(apiserver, "c1")
        answer = await kubelet.prepare(DRIVER, [("default", uid0, "c0"), ("default", uid1, "c1")])
        assert answer[uid0].error == "" and answer[uid1].error == ""
        rec0 = plugin.claims.checkpoint.get(uid0)
        rec1 = plugin.claims.checkpoint.get(uid1)
        assert rec0 is not None and rec1 is not None
        u0, u1 = rec0.devices[0].mdev_uuid, rec1.devices[0].mdev_uuid
        assert u0 and u1 and _instances(tree) == {u0, u1}
        ids: list[Any] = list(answer[uid0].devices[0].cdi_device_ids)
        assert ids[0] == f"{DRIVER}/vfio={uid0}-{answer[uid0].devices[0].device_name}"
        # the slots and their names stay: 10 available + the 2 claims made
        # (a republish may be under way: pool() names the devices once it is complete)
        await until("republished", lambda: plugin.publisher.writes >= 1 and bool(pool(apiserver)[1]))
        assert pool(apiserver)[1] == SLOTS
        assert await kubelet.unprepare(DRIVER, [("default", uid0, "c0")]) == {uid0: ""}
        assert _instances(tree) == {u1}
    finally:
        await plugin.stop()
    # a reboot: instances do not survive it, the boot ID changes
    remove_instance(tree, u1)
    _boot(tree, "boot-2")
    plugin = _new_plugin(apiserver, kdirs, tmp_path, tree.root, kernel=MdevKernel(tree))
    await plugin.start()  # the mdev pass runs before kubelet is answered
    try:
        assert _instances(tree) == {u1}
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
        answer = await kubelet.prepare(DRIVER, [("default", uid1, "c1")])  # kubelet re-prepares
        assert answer[uid1].error == "" and _instances(tree) == {u1}
        assert await kubelet.unprepare(DRIVER, [("default", uid1, "c1")]) == {uid1: ""}
        assert _instances(tree) == set()
    finally:
        await plugin.stop()
        await kubelet.stop()
