"""Mediated devices on the device-plugin path: the daemon over its real unix sockets, the
kubelet stand-in (and its PodResources stand-in), and a fake tree whose ``create``/``remove``
react as the kernel's (tests/mdev_tree.py). The config's ``mdev:`` entries are made by the
node core's mdev pass, then listed one kubelet device per instance (ID = UUID)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import grpc
import pytest

from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.deviceplugin.podresources_standin import Pod, PodResourcesStandin
from tests.mdev_tree import MdevKernel, add_instance, add_parent, remove_instance
from tests.sysfs_tree import SysfsTree
from tests.waiting import wait_until_async
from vfio_dp.deviceplugin.app import Daemon, Options
from vfio_dp.deviceplugin.mdevs import allocate_mdev, mdev_changes, mdev_units
from vfio_dp.errors import UnhealthyDeviceError
from vfio_dp.host import Host
from vfio_dp.host.mdev import read_mdevs
from vfio_dp.model.config import load_config_text
from vfio_dp.model.mdev import MdevRecord

GPU = "0000:3b:00.0"
OTHER = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"  # made by the operator, by hand
SERIAL = "example.com/serial"
#: the default name of "GRID T4-2Q/B (8 slices)": spaces and the slash made "_"
GRID = "devices.kubevirt.io/GRID_T4-2Q_B__8_slices"
CONFIG = (
    "mdev:\n"
    "- {parent: mtty, type: mtty-2, count: %d, resourceName: example.com/serial}\n"
    '- {parent: "0000:3b:00.0", type: nvidia-223, count: 1}\n'
)


def mdev_tree(t: SysfsTree) -> None:
    add_parent(t, "mtty", {"mtty-1": ("Single port serial", 24, "vfio-pci"),
                           "mtty-2": ("Dual port serial", 4, "vfio-pci")}, driver="mtty")  # fmt: skip
    add_instance(t, "mtty", "mtty-2", OTHER, group=70)
    add_parent(t, GPU, {"nvidia-222": ("GRID T4-1Q", 0, "vfio-pci"),
                        "nvidia-223": ("GRID T4-2Q/B (8 slices)", 2, "vfio-pci")})  # fmt: skip


def made(t: SysfsTree) -> list[str]:
    """The mtty-2 instances the daemon made (its records), sorted."""
    inv = read_mdevs(Host(t.root).fs)
    return sorted(i.uuid for i in inv.instances if i.type_id == "mtty-2" and i.uuid != OTHER)


def group_of(t: SysfsTree, uuid: str) -> int:
    return int(os.path.basename(os.readlink(t.sys("bus/mdev/devices", uuid, "iommu_group"))))


async def daemon(
    t: SysfsTree,
    kdir: str,
    config: Path,
    pod_resources: str | None = None,
    cdi_dir: Path | None = None,
) -> Daemon:
    extra: dict[str, str] = {"pod_resources_socket": pod_resources} if pod_resources else {}
    if cdi_dir is not None:
        extra["cdi_dir"] = str(cdi_dir)
    d = Daemon(
        Options(root=str(t.root), kubelet_dir=kdir, config_path=str(config), resync=0.1,
                metrics_port=0, uevents=False, **extra),  # type: ignore[arg-type]
        host=Host(t.root, kernel=MdevKernel(t), runner="device-plugin"),
    )  # fmt: skip
    await d.start()
    return d


async def test_listed_allocated_and_verified(
    tree: SysfsTree, kubelet: KubeletStandin, kdir: str, tmp_path: Path
) -> None:
    mdev_tree(tree)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG % 2)
    d = await daemon(tree, kdir, cfg)
    try:
        mine = made(tree)
        assert len(mine) == 2
        every = sorted([*mine, OTHER])  # the operator's instance of the type is listed too
        await kubelet.wait_for("3 serial instances", lambda k: len(k.devices(SERIAL)) == 3)
        assert kubelet.devices(SERIAL) == dict.fromkeys(every, "Healthy")
        await kubelet.wait_for("the GRID instance", lambda k: len(k.devices(GRID)) == 1)

        ids = [mine[1], mine[0]]  # the kubelet's order is kept in the env
        assert await kubelet.preferred(SERIAL, every, [mine[1]], 2) == [mine[1], every[0]]
        resp = await kubelet.allocate(SERIAL, ids)
        assert dict(resp.envs) == {"MDEV_PCI_RESOURCE_EXAMPLE_COM_SERIAL": ",".join(ids)}
        nodes = ["/dev/vfio/vfio", *(f"/dev/vfio/{group_of(tree, u)}" for u in ids)]
        assert [(x.host_path, x.container_path, x.permissions) for x in resp.devices] == [
            (n, n, "mrw") for n in nodes
        ]
        await kubelet.prestart(SERIAL, ids)
        (grid,) = kubelet.devices(GRID)
        resp = await kubelet.allocate(GRID, [grid])
        assert dict(resp.envs) == {
            "MDEV_PCI_RESOURCE_DEVICES_KUBEVIRT_IO_GRID_T4-2Q_B__8_SLICES": grid
        }
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kubelet.allocate(SERIAL, ["83b8f4f2-509f-382f-3c1e-e6bfe0fa9999"])
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await d.stop()


async def test_list_and_watch_follows_the_instances(
    tree: SysfsTree, kubelet: KubeletStandin, kdir: str, tmp_path: Path
) -> None:
    mdev_tree(tree)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG % 1)
    d = await daemon(tree, kdir, cfg)
    try:
        (mine,) = made(tree)
        await kubelet.wait_for("2 listed", lambda k: len(k.devices(SERIAL)) == 2)
        node = tree.root / "dev/vfio" / str(group_of(tree, mine))
        node.unlink()  # its group's node is gone: Unhealthy, and Allocate refuses it
        await kubelet.wait_for("Unhealthy", lambda k: k.devices(SERIAL).get(mine) == "Unhealthy")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await kubelet.allocate(SERIAL, [mine])
        assert "is missing" in (e.value.details() or "")
        node.write_text("")
        await kubelet.wait_for("Healthy again", lambda k: k.devices(SERIAL).get(mine) == "Healthy")

        remove_instance(tree, OTHER)  # the operator's instance disappears: withdrawn
        await kubelet.wait_for("withdrawn", lambda k: k.devices(SERIAL) == {mine: "Healthy"})

        before = group_of(tree, mine)
        await kubelet.allocate(SERIAL, [mine])
        remove_instance(tree, mine)  # ours vanishes (a reboot): made again, same UUID
        await wait_until_async(lambda: made(tree) == [mine], what="re-made with its UUID")
        await kubelet.wait_for("listed again", lambda k: k.devices(SERIAL) == {mine: "Healthy"})
        assert group_of(tree, mine) != before
        with pytest.raises(grpc.aio.AioRpcError) as e:  # the replayed answer names the old node
            await kubelet.prestart(SERIAL, [mine])
        assert f"Allocate handed out /dev/vfio/{before}" in (e.value.details() or "")
        await kubelet.allocate(SERIAL, [mine])  # a new Allocate: verified again
        await kubelet.prestart(SERIAL, [mine])

        cfg.write_text("selectors: []\n")  # the entry is gone: instance removed, resource too
        await kubelet.wait_for("withdrawn", lambda k: k.devices(SERIAL) == {}, timeout=10)
        await wait_until_async(lambda: made(tree) == [], what="our instance removed")
    finally:
        await d.stop()


async def test_an_instance_a_pod_holds_is_never_removed(
    tree: SysfsTree, kubelet: KubeletStandin, kdir: str, tmp_path: Path
) -> None:
    """PodResources names the UUID: the core's mdev pass keeps the instance although the
    config asks for none (and removes it once the pod is gone)."""
    mdev_tree(tree)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG % 1)
    pr = PodResourcesStandin(os.path.join(kdir, "pr.sock"))
    await pr.start()
    d = await daemon(tree, kdir, cfg, pr.socket)
    try:
        (mine,) = made(tree)
        await kubelet.wait_for("listed", lambda k: mine in k.devices(SERIAL))
        await kubelet.allocate(SERIAL, [mine])
        pr.pods = [Pod("default", "vm-a", "compute", SERIAL, [mine])]
        calls = pr.calls
        cfg.write_text(CONFIG % 0)
        await wait_until_async(lambda: pr.calls >= calls + 3, what="passes that asked the kubelet")
        assert made(tree) == [mine]
        pr.pods = []
        await wait_until_async(lambda: made(tree) == [], what="removed once the pod is gone")
    finally:
        await d.stop()
        await pr.stop()


def test_a_recorded_instance_that_is_gone_is_listed_unhealthy(tmp_path: Path) -> None:
    """Pure: a gone instance this process recorded stays listed Unhealthy (the pass makes it
    again; the kubelet's replayed env names it); one nobody recorded is withdrawn."""
    from tests.sysfs_tree import gpu_host

    t = gpu_host(tmp_path / "root")
    mdev_tree(t)
    inv = read_mdevs(Host(t.root).fs)
    (entry,) = load_config_text(CONFIG % 1, "t").mdev[:1]
    gone = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
    records = [MdevRecord(gone, "mtty", "mtty-2", "device-plugin"),
               MdevRecord("83b8f4f2-509f-382f-3c1e-e6bfe0fa1003", "mtty", "mtty-2", "operator")]  # fmt: skip
    units = mdev_units(inv, [("mtty", entry)], records, "device-plugin", "devices.kubevirt.io")
    assert [(u.id, u.health) for u in units[SERIAL]] == [(OTHER, "Healthy"), (gone, "Unhealthy")]
    assert "gone from /sys/bus/mdev/devices" in units[SERIAL][1].reasons[0]
    with pytest.raises(UnhealthyDeviceError):
        allocate_mdev(units[SERIAL], SERIAL, [gone])

    assert mdev_changes({}, units) == [
        f"{SERIAL}: mdev {OTHER} (mtty-2 on mtty) listed Healthy",
        f"{SERIAL}: mdev {gone} (mtty-2 on mtty) listed Unhealthy: {units[SERIAL][1].reasons[0]}",
    ]
    assert mdev_changes(units, {}) == [
        f"{SERIAL}: mdev {u} withdrawn: gone from /sys/bus/mdev/devices, or its entry from the config"
        for u in (OTHER, gone)
    ]


async def test_allocate_names_cdi_devices_that_resolve_to_the_instances_group(
    tree: SysfsTree, kubelet: KubeletStandin, kdir: str, tmp_path: Path
) -> None:
    """Issue 35 item 3 with ``--cdi-dir``: one spec per Healthy instance, naming
    ``/dev/vfio/vfio`` and its ``/dev/vfio/<N>``; Allocate answers ``cdi_devices`` that resolve
    to it (as a runtime resolves them), besides the unchanged env and device specs; a removed
    instance's spec goes with it; the PCI specs and other vendors' files are left alone."""
    from tests.deviceplugin.test_cdi import check_cdi_spec, read_specs, resolve

    mdev_tree(tree)
    cdi_dir = tmp_path / "cdi"
    cdi_dir.mkdir()
    (cdi_dir / "vfio.dra.vfio-dp.io-1234.json").write_text("{}")  # the DRA plugin's
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG % 2)
    d = await daemon(tree, kdir, cfg, cdi_dir=cdi_dir)
    try:
        mine = made(tree)
        await kubelet.wait_for("3 serial instances", lambda k: len(k.devices(SERIAL)) == 3)
        ids = [mine[1], mine[0]]
        resp = await kubelet.allocate(SERIAL, ids)
        want = [f"deviceplugin.vfio-dp.io/vfio=mdev-{u}" for u in ids]
        assert [c.name for c in resp.cdi_devices] == want
        assert dict(resp.envs) == {"MDEV_PCI_RESOURCE_EXAMPLE_COM_SERIAL": ",".join(ids)}
        for u, name in zip(ids, want, strict=True):
            assert resolve(cdi_dir, name) == ["/dev/vfio/vfio", f"/dev/vfio/{group_of(tree, u)}"]
        specs = read_specs(cdi_dir)
        for u in [*mine, OTHER]:  # every listed instance has its spec
            spec = specs[f"deviceplugin.vfio-dp.io_mdev-{u}.json"]
            assert check_cdi_spec(spec) == [("deviceplugin.vfio-dp.io/vfio", f"mdev-{u}")]
        assert [d.host_path for d in resp.devices] == [
            "/dev/vfio/vfio",
            *(resolve(cdi_dir, n)[1] for n in want),
        ]
        # the operator's instance goes: its spec is removed at the next snapshot
        remove_instance(tree, OTHER)
        gone = cdi_dir / f"deviceplugin.vfio-dp.io_mdev-{OTHER}.json"
        await wait_until_async(lambda: not gone.exists(), what="the gone instance's spec removed")
        assert (cdi_dir / "vfio.dra.vfio-dp.io-1234.json").read_text() == "{}"
        # a spec deleted behind the daemon's back is written again before Allocate answers
        spec1 = cdi_dir / f"deviceplugin.vfio-dp.io_mdev-{mine[0]}.json"
        spec1.unlink()
        resp = await kubelet.allocate(SERIAL, [mine[0]])
        assert [c.name for c in resp.cdi_devices] == [
            f"deviceplugin.vfio-dp.io/vfio=mdev-{mine[0]}"
        ]
        assert spec1.exists()
    finally:
        await d.stop()


def test_unknown_types_zero_room_and_a_gone_parent_in_the_listing(tmp_path: Path) -> None:
    """Issue 35 item 7, what mtty cannot show, on the device-plugin side (pure): an instance
    of a type its parent does not list is never served; a type with no room
    (``available_instances`` 0) gives an empty resource; while a parent is gone from
    ``/sys/class/mdev_bus`` (its driver unloaded) an entry with a ``resourceName`` keeps this
    process's recorded instances listed Unhealthy (the kubelet's replay finds them after the
    re-make), one without keeps nothing (its name comes from the parent's type)."""
    from tests.mdev_tree import parent_dir
    from tests.sysfs_tree import gpu_host
    from vfio_dp.core.mdev_reconcile import wanted
    from vfio_dp.deviceplugin.mdevs import with_gone_parents

    t = gpu_host(tmp_path / "root")
    mdev_tree(t)
    stray = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1005"  # of a type mtty no longer lists
    add_instance(t, "mtty", "mtty-3", stray, group=75)
    ours = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1006"
    add_instance(t, "mtty", "mtty-2", ours, group=76)
    records = [MdevRecord(ours, "mtty", "mtty-2", "device-plugin")]
    config = load_config_text(
        "mdev:\n- {parent: mtty, type: mtty-2, count: 2, resourceName: example.com/serial}\n"
        '- {parent: "0000:3b:00.0", type: nvidia-222, count: 1, resourceName: t4-1q}\n',
        "t",
    )
    host = Host(t.root)

    def listed() -> dict[str, list[tuple[str, str]]]:
        inv = read_mdevs(host.fs)
        wants, _ = wanted(host, config, inv, "devicePlugin")
        served = with_gone_parents([(w.parent, w.entry) for w in wants], config.mdev, inv)
        units = mdev_units(inv, served, records, "device-plugin", "devices.kubevirt.io")
        return {r: [(u.id, u.health) for u in us] for r, us in units.items()}

    assert listed() == {
        SERIAL: [(OTHER, "Healthy"), (ours, "Healthy")],  # never the stray mtty-3 one
        "devices.kubevirt.io/t4-1q": [],  # available_instances 0: no instance, no device
    }
    # the driver unloads: the parent and its instances go, the record stays
    remove_instance(t, ours)
    remove_instance(t, OTHER)
    shutil.rmtree(parent_dir(t, "mtty"))
    (t.root / "sys/class/mdev_bus/mtty").unlink()
    inv = read_mdevs(host.fs)
    wants, _ = wanted(host, config, inv, "devicePlugin")
    served = with_gone_parents([(w.parent, w.entry) for w in wants], config.mdev, inv)
    (unit,) = mdev_units(inv, served, records, "device-plugin", "devices.kubevirt.io")[SERIAL]
    assert (unit.id, unit.health) == (ours, "Unhealthy")
    assert unit.reasons == (
        f"mdev {ours} (mtty-2 on mtty) is gone from /sys/bus/mdev/devices; the node's mdev "
        "pass makes it again with this UUID when its parent is back (gone from "
        "/sys/class/mdev_bus/mtty: is its vendor driver loaded?)",
    )
    nameless = load_config_text("mdev:\n- {parent: mtty, type: mtty-2}\n", "t")
    assert (
        mdev_units(inv, with_gone_parents([], nameless.mdev, inv), records, "device-plugin", "d.io")
        == {}
    )
