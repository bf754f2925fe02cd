"""The daemon over real unix sockets and real gRPC, against the kubelet stand-in, on temp trees."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import grpc
import pytest

from tests.deviceplugin.conftest import NIC, NIC_ID, StartDaemon
from tests.deviceplugin.kubelet_standin import KubeletStandin
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from tests.waiting import wait_until_async
from vfio_dp.errors import ConfigError
from vfio_dp.host import Host
from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress

GPU = "devices.kubevirt.io/10de_1eb8"
AUDIO = "devices.kubevirt.io/10de_10f8"


def listed(resource: str, devices: dict[str, str]) -> object:
    return lambda k: k.devices(resource) == devices


async def test_registers_and_lists_with_numa(
    kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    await start_daemon()
    await kubelet.wait_for("the NIC listed Healthy", listed(NIC, {NIC_ID: "Healthy"}))
    view = kubelet.plugins[NIC]
    assert view.endpoint == naming.socket_name(NIC)
    assert view.options.pre_start_required and view.options.get_preferred_allocation_available
    assert view.topology == {NIC_ID: [1]}
    assert set(kubelet.plugins) == {NIC}  # nothing else is on vfio-pci


async def test_waits_for_the_kubelet_socket(kdir: str, start_daemon: StartDaemon) -> None:
    daemon = await start_daemon()
    assert os.path.exists(daemon.endpoints[NIC].path)  # serving before registering
    # the scenario: the kubelet comes up a while after the plugin (nothing to wait for)
    await asyncio.sleep(0.3)
    k = KubeletStandin(kdir)
    await k.start()
    try:
        # how soon is bench/plugin_bench.py's (row "kubelet restart → listed again")
        await k.wait_for(
            "registration after kubelet.sock appeared", listed(NIC, {NIC_ID: "Healthy"})
        )
        assert k.registrations == [NIC]
    finally:
        await k.stop()


async def test_allocate_prestart_and_the_record(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    assert await kubelet.preferred(NIC, [NIC_ID], [], 1) == [NIC_ID]
    resp = await kubelet.allocate(NIC, [NIC_ID])
    assert dict(resp.envs) == {
        "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_8086_10D3": NIC_ID,
        "PCIDEVICE_DEVICES_KUBEVIRT_IO_8086_10D3": NIC_ID,
    }
    # HOST paths, never prefixed with --root
    assert [(d.host_path, d.container_path, d.permissions) for d in resp.devices] == [
        ("/dev/vfio/vfio", "/dev/vfio/vfio", "mrw"),
        ("/dev/vfio/50", "/dev/vfio/50", "mrw"),
    ]
    path = tree.root / "var/lib/vfio_dp/allocations.json"
    await wait_until_async(path.exists, what=f"{path} written behind Allocate")
    record = json.loads(path.read_text())
    assert record["allocations"][NIC_ID]["groupNode"] == "/dev/vfio/50"
    await kubelet.prestart(NIC, [NIC_ID])

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate(NIC, ["0000:99:00.0"])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert "0000:99:00.0" in (err.value.details() or "")


async def test_malformed_allocate_requests_get_clean_bounded_errors(
    kubelet: KubeletStandin, start_daemon: StartDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate(NIC, [])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "no device IDs" in (err.value.details() or "")
    huge = "x" * 1_000_000
    with caplog.at_level("INFO", logger="vfio_dp"), pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate(NIC, [huge])
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(err.value.details() or "") < 300 and "[1000000 chars]" in (err.value.details() or "")
    assert "[1000000 chars]" in caplog.text and len(caplog.text) < 10_000


async def test_an_odd_vfio_dev_entry_does_not_break_allocate(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    """An entry under ``<bdf>/vfio-dev/`` that is no ``vfioN`` (it once reached a path check
    inside Allocate: UNKNOWN with a traceback) is ignored; the real cdev is still handed out."""
    vdev = tree.dev_dir(NIC_ID) / "vfio-dev"
    vdev.mkdir()
    (vdev / "evil name").mkdir()
    await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    resp = await kubelet.allocate(NIC, [NIC_ID])
    assert [d.host_path for d in resp.devices] == ["/dev/vfio/vfio", "/dev/vfio/50"]


def renumber_group(tree: SysfsTree, address: str, old: int, new: int) -> None:
    """What a reboot can do: the same device comes back in another IOMMU group."""
    groups = tree.sys("kernel/iommu_groups")
    os.rename(groups / str(old), groups / str(new))
    link = tree.dev_dir(address) / "iommu_group"
    link.unlink()
    link.symlink_to(os.path.relpath(groups / str(new), link.parent))
    os.rename(tree.root / "dev/vfio" / str(old), tree.root / "dev/vfio" / str(new))
    tree.devs[address].group = new


async def test_prestart_fails_loudly_on_a_renumbered_group(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    daemon = await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    await kubelet.allocate(NIC, [NIC_ID])
    await daemon.stop()  # "reboot": the record on disk and the kubelet checkpoint survive
    renumber_group(tree, NIC_ID, 50, 51)
    await kubelet.restart()
    await start_daemon()
    await kubelet.wait_for("NIC after reboot", listed(NIC, {NIC_ID: "Healthy"}))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.prestart(NIC, [NIC_ID])  # the kubelet replays, no Allocate
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "now /dev/vfio/51 but Allocate handed out /dev/vfio/50" in (err.value.details() or "")


async def test_kubelet_restart_is_noticed(
    kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    daemon = await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    await kubelet.restart()
    assert kubelet.devices(NIC) == {}
    # how soon (the 2 s goal) is bench/plugin_bench.py's row "kubelet restart → listed again"
    await kubelet.wait_for(
        "re-registration after a kubelet restart", listed(NIC, {NIC_ID: "Healthy"})
    )
    # the plugin counts a registration when Register has returned; the kubelet may list the
    # devices (ListAndWatch, dialled on receiving Register) before that answer is back
    await wait_until_async(
        lambda: daemon.metrics.get("vfio_dp_kubelet_registrations_total", resource=NIC) == 2,
        what="the second registration counted",
    )


async def test_kubelet_restart_is_noticed_after_the_watch_settled(
    kdir: str, kubelet: KubeletStandin, start_daemon: StartDaemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the kubelet dir has shown no change for a while, the watch stats the dir alone
    (DirWatch); a kubelet restart (sockets wiped, a new kubelet.sock) changes the dir and is
    noticed all the same, and a socket of ours removed alone is served again."""
    from vfio_dp.core import sockets

    monkeypatch.setattr(sockets, "SETTLE_SECONDS", 0.1)  # instead of waiting a second
    daemon = await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    watch = daemon._kubelet_dir
    await wait_until_async(lambda: watch._seen is not None, what="the kubelet dir settled")
    await kubelet.restart()
    await kubelet.wait_for("re-registered after the restart", listed(NIC, {NIC_ID: "Healthy"}))
    # the plugin counts a registration when Register has returned; the kubelet may list the
    # devices (ListAndWatch, dialled on receiving Register) before that answer is back
    await wait_until_async(
        lambda: daemon.metrics.get("vfio_dp_kubelet_registrations_total", resource=NIC) == 2,
        what="the second registration counted",
    )
    await wait_until_async(lambda: watch._seen is not None, what="settled again")
    path = daemon.endpoints[NIC].path
    os.unlink(path)
    await wait_until_async(lambda: os.path.exists(path), what=f"{path} served again")


async def test_health_flips_hotplug_and_stickiness(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    tree.set_driver(NIC_ID, "e1000e")  # left vfio-pci: stays listed, Unhealthy
    await kubelet.wait_for("NIC Unhealthy", listed(NIC, {NIC_ID: "Unhealthy"}))
    tree.set_driver(NIC_ID, "vfio-pci")
    await kubelet.wait_for("NIC Healthy again", listed(NIC, {NIC_ID: "Healthy"}))
    # hotplug: a second NIC appears already on vfio-pci — advertised without a restart
    tree.add(
        Dev(
            "0000:66:00.0",
            "8086",
            "10d3",
            "020000",
            driver="vfio-pci",
            group=66,
            parent="0000:00:1d.0",
            numa=1,
        )
    )
    await kubelet.wait_for(
        "the new NIC", listed(NIC, {NIC_ID: "Healthy", "0000:66:00.0": "Healthy"})
    )
    tree.remove("0000:66:00.0")
    await kubelet.wait_for("the NIC removed", listed(NIC, {NIC_ID: "Healthy"}))
    # unbound then removed: withdrawn
    tree.set_driver(NIC_ID, "e1000e")
    await kubelet.wait_for("NIC Unhealthy", listed(NIC, {NIC_ID: "Unhealthy"}))
    tree.remove(NIC_ID)
    await kubelet.wait_for("an empty list", listed(NIC, {}))
    assert kubelet.plugins[NIC].stream_open


async def test_group_invariants_on_a_gpu_with_its_audio_function(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    daemon = await start_daemon()
    tree.set_driver("0000:3b:00.0", "vfio-pci")  # audio still on snd_hda_intel: not viable
    await kubelet.wait_for("GPU Unhealthy", listed(GPU, {"0000:3b:00.0": "Unhealthy"}))
    tree.set_driver("0000:3b:00.1", "vfio-pci")  # both default-named: a conflict
    await kubelet.wait_for("audio listed", listed(AUDIO, {"0000:3b:00.1": "Unhealthy"}))
    assert kubelet.devices(GPU) == {"0000:3b:00.0": "Unhealthy"}
    assert daemon.listing is not None and daemon.listing.conflicts == {45: (AUDIO, GPU)}
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await kubelet.allocate(GPU, ["0000:3b:00.0"])
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "several resources" in (err.value.details() or "")


async def test_companion_function_is_covered_by_the_group_node(
    tree: SysfsTree, tmp_path: Path, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("selectors:\n- vendor: '10de'\n  device: '1eb8'\n  resourceName: gpu\n")
    tree.set_driver("0000:3b:00.0", "vfio-pci")
    tree.set_driver("0000:3b:00.1", "vfio-pci")
    await start_daemon(config=cfg)
    name = "devices.kubevirt.io/gpu"
    await kubelet.wait_for("GPU", listed(name, {"0000:3b:00.0": "Healthy"}))
    resp = await kubelet.allocate(name, ["0000:3b:00.0"])
    assert resp.envs["PCI_RESOURCE_DEVICES_KUBEVIRT_IO_GPU"] == "0000:3b:00.0"
    assert [d.host_path for d in resp.devices] == ["/dev/vfio/vfio", "/dev/vfio/45"]


async def test_bad_config_lists_every_problem(tmp_path: Path, start_daemon: StartDaemon) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text("selectors:\n- vendor: '10dex'\n  colour: red\n- addresses: ['zz']\n")
    with pytest.raises(ConfigError) as err:
        await start_daemon(config=cfg)
    text = str(err.value)
    assert "selectors[0].vendor" in text and "selectors[0].colour" in text
    assert "selectors[1].addresses" in text


def write_configmap(directory: Path, version: str, text: str) -> Path:
    """A ConfigMap volume: config.yaml -> ..data/config.yaml, ..data -> ..<version> (swapped
    atomically by renaming a new symlink over ..data, as the kubelet does)."""
    target = directory / f"..{version}"
    target.mkdir(parents=True)
    (target / "config.yaml").write_text(text)
    tmp = directory / "..data_tmp"
    tmp.symlink_to(target.name)
    os.replace(tmp, directory / "..data")
    link = directory / "config.yaml"
    if not link.is_symlink():
        link.symlink_to("..data/config.yaml")
    return link


async def test_config_reload_on_configmap_swap_keeps_healthy_resources(
    tree: SysfsTree, tmp_path: Path, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    cm = tmp_path / "cm"
    cfg = write_configmap(cm, "v1", "selectors:\n- drivers: [vfio-pci]\n")
    tree.set_driver("0000:af:00.1", "vfio-pci")  # a VF on vfio-pci: 15b3_101c
    vf = "devices.kubevirt.io/15b3_101c"
    daemon = await start_daemon(config=cfg)
    await kubelet.wait_for(
        "NIC and VF",
        lambda k: (
            k.devices(NIC) == {NIC_ID: "Healthy"} and k.devices(vf) == {"0000:af:00.1": "Healthy"}
        ),
    )
    nic_updates = kubelet.plugins[NIC].updates
    # a bad config is rejected and changes nothing
    write_configmap(cm, "v2", "selectors: 7\n")
    await wait_until_async(
        lambda: daemon.metrics.get("vfio_dp_config_reloads_total", result="rejected") == 1,
        what="the bad config rejected",
    )
    assert kubelet.devices(vf) == {"0000:af:00.1": "Healthy"}  # the old config still serves
    # the VF moves to a named resource; the NIC keeps its stream and registration
    write_configmap(
        cm,
        "v3",
        "selectors:\n- addresses: ['0000:af:00.1']\n  resourceName: vf-a\n- drivers: [vfio-pci]\n",
    )
    await kubelet.wait_for(
        "the VF under its new name", listed("devices.kubevirt.io/vf-a", {"0000:af:00.1": "Healthy"})
    )
    await kubelet.wait_for(
        "the old VF resource emptied and closed", lambda k: not k.plugins[vf].stream_open
    )
    assert not os.path.exists(os.path.join(kubelet.dir, naming.socket_name(vf)))
    assert kubelet.registrations.count(NIC) == 1
    assert kubelet.plugins[NIC].stream_open and kubelet.plugins[NIC].updates == nic_updates
    assert kubelet.devices(NIC) == {NIC_ID: "Healthy"}


async def test_bind_true_binds_at_start_and_refuses_host_devices(
    tree: SysfsTree, tmp_path: Path, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "selectors:\n"
        "- vendor: '10de'\n  device: '1eb8'\n  resourceName: gpu\n  bind: true\n"
        "- vendor: '1af4'\n  device: '1001'\n  resourceName: disk\n  bind: true\n"
    )
    host = Host(tree.root, kernel=SimulatedKernel(tree))
    daemon = await start_daemon(config=cfg, host=host)
    await kubelet.wait_for(
        "the GPU bound and Healthy", listed("devices.kubevirt.io/gpu", {"0000:3b:00.0": "Healthy"})
    )
    assert tree.driver_of("0000:3b:00.0") == "vfio-pci"
    assert tree.driver_of("0000:3b:00.1") == "vfio-pci"  # the group sibling too
    rec = host.state.get(PciAddress.parse("0000:3b:00.0"))
    assert rec is not None and rec.bound_by == "device-plugin"  # never undone by a DRA claim
    # the host's own root disk is refused, listed Unhealthy, and nothing touched it
    assert tree.driver_of("0000:00:02.0") == "virtio-pci"
    assert daemon.metrics.get("vfio_dp_bind_failures_total") == 1
    await kubelet.wait_for(
        "the disk Unhealthy", listed("devices.kubevirt.io/disk", {"0000:00:02.0": "Unhealthy"})
    )
    await daemon.stop()  # never unbinds on stop
    assert tree.driver_of("0000:3b:00.0") == "vfio-pci"


async def test_bind_true_never_binds_a_parent_the_configs_mdev_entries_want(
    tree: SysfsTree, tmp_path: Path, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    """Issue 35 item 1: ``bind: true`` takes the GPU, an ``mdev:`` entry wants instances of
    it: the bind is refused (counted, logged naming the entry), the GPU keeps its driver."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "selectors:\n- vendor: '10de'\n  device: '1eb8'\n  resourceName: gpu\n  bind: true\n"
        "mdev:\n- {parent: '0000:3b:00.0', type: nvidia-222}\n"
    )
    host = Host(tree.root, kernel=SimulatedKernel(tree))
    daemon = await start_daemon(config=cfg, host=host)
    await kubelet.wait_for(
        "the GPU listed Unhealthy", listed("devices.kubevirt.io/gpu", {"0000:3b:00.0": "Unhealthy"})
    )
    assert daemon.metrics.get("vfio_dp_bind_failures_total") == 1
    assert tree.driver_of("0000:3b:00.0") == "nvidia"
    assert tree.driver_of("0000:3b:00.1") == "snd_hda_intel"
    assert host.state.get(PciAddress.parse("0000:3b:00.0")) is None
    await daemon.stop()


async def test_a_uevent_triggers_a_rescan(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    """The kernel's unbind message, received the way the core receives it (its reader on the
    event loop, the monitor's poll), rescans; other subsystems do not count. With a 60 s resync
    only the event can do it; how soon (the 1 s goal) is bench/plugin_bench.py's."""
    from tests.deviceplugin.uevent_standin import KernelUeventStandin

    daemon = await start_daemon(resync=60)  # no resync help: only the event can do it
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    source = KernelUeventStandin()
    try:
        assert daemon.core.uevents.start(asyncio.get_running_loop(), source)
        source.emit("add", "/devices/virtual/net/veth0", subsystem="net")  # filtered out
        tree.set_driver(NIC_ID, "e1000e")
        devpath = "/" + str(tree.dev_dir(NIC_ID).relative_to(tree.root / "sys"))
        source.emit("unbind", devpath)
        await kubelet.wait_for("NIC Unhealthy", listed(NIC, {NIC_ID: "Unhealthy"}))
        assert daemon.metrics.get("vfio_dp_uevents_total") == 1
        assert daemon.metrics.get("vfio_dp_scans_total", trigger="uevent") >= 1
    finally:
        await daemon.stop()
        source.close()


def test_kernel_uevent_socket_opens_here() -> None:
    """The netlink kernel source can be opened where the tests run (events themselves cannot
    be provoked safely here: that would mean rebinding this machine's own devices): it is a
    NETLINK_KOBJECT_UEVENT socket the event loop watches, and stop() lets go of it."""
    import socket

    from vfio_dp.core.uevents import UeventSource

    loop = asyncio.new_event_loop()
    try:
        src = UeventSource(lambda what: None)
        if not src.start(loop):
            pytest.skip("no netlink uevent socket in this environment")
        fd = src.fd
        assert fd is not None
        sock = socket.socket(fileno=os.dup(fd))
        try:
            assert sock.family == socket.AF_NETLINK
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_PROTOCOL) == 15  # KOBJECT_UEVENT
        finally:
            sock.close()
        src.stop(loop)
        assert src.fd is None and not loop.remove_reader(fd)  # its reader went with it
    finally:
        loop.close()


async def test_a_directory_replacing_our_socket_is_logged_then_served_again(
    kdir: str, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    """Someone replaces the socket with a directory while serving: an error naming the path
    (no traceback, the daemon keeps running); once it is gone, the socket is back."""
    import logging

    daemon = await start_daemon()
    await kubelet.wait_for("NIC", listed(NIC, {NIC_ID: "Healthy"}))
    path = daemon.endpoints[NIC].path
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logging.getLogger("vfio_dp").addHandler(handler)
    try:
        os.unlink(path)
        os.mkdir(path)
        await wait_until_async(
            lambda: any("is a directory" in r.getMessage() for r in records),
            what="the directory noticed and logged",
        )
        msgs = [r.getMessage() for r in records if r.levelname == "ERROR"]
        assert any(f"cannot serve a socket at {path}: it is a directory" in m for m in msgs), msgs
        assert not any(r.exc_info for r in records)
        os.rmdir(path)
        await wait_until_async(
            lambda: os.path.exists(path) and not os.path.isdir(path),
            what=f"{path} served again once the directory is gone",
        )
    finally:
        logging.getLogger("vfio_dp").removeHandler(handler)


async def test_the_daemon_serves_only_device_plugin_devices_and_binds_only_its_own(
    tree: SysfsTree, tmp_path: Path, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    """`path: dra` devices are the DRA plugin's: never advertised here, and its `bind: true`
    selectors are not bound by this process."""
    from tests.kernel_sim import SimulatedKernel

    cfg = tmp_path / "paths.yaml"
    cfg.write_text(
        "selectors:\n"
        '- {vendor: "8086", device: "10d3", path: dra}\n'
        '- {vendor: "15b3", device: "101c", path: dra, bind: true}\n'
        '- {vendor: "8086", device: "100e", resourceName: pair, path: devicePlugin}\n'
    )
    host = Host(tree.root, kernel=SimulatedKernel(tree))
    daemon = await start_daemon(config=cfg, host=host)
    pair = "devices.kubevirt.io/pair"
    await kubelet.wait_for("the e1000 pair listed", lambda k: pair in k.plugins)
    assert NIC not in kubelet.plugins and set(daemon.endpoints) == {pair}
    assert tree.driver_of("0000:af:00.1") == "mlx5_core"  # a DRA bind: true VF: not ours
    assert daemon.metrics.get("vfio_dp_binds_total") == 0


async def test_a_device_a_dra_pool_holds_is_listed_unhealthy_naming_the_hold(
    tree: SysfsTree, kubelet: KubeletStandin, start_daemon: StartDaemon
) -> None:
    """A claim switched the NIC to vfio-pci ahead of its pod and went away (bind record
    ``bound_by: pool:<driver>``): the device plugin never hands it to a pod; ``vfioctl
    unbind`` (the record gone) would give it back, and then it is served again."""
    from vfio_dp.host.state import OriginalDriver, StateStore

    host = Host(tree.root)
    store = StateStore(host.fs)
    store.put(OriginalDriver(NIC_ID, "e1000e", None, "8086", "10d3", "pool:vfio.dp.io"))
    daemon = await start_daemon()
    await kubelet.wait_for("the NIC listed Unhealthy", listed(NIC, {NIC_ID: "Unhealthy"}))
    (unit,) = daemon.listing.units(NIC)
    assert any(
        "held by the DRA pool of vfio.dp.io" in r and f"vfioctl unbind {NIC_ID}" in r
        for r in unit.reasons
    ), unit.reasons
    store.remove(PciAddress.parse(NIC_ID))  # the hold taken over (or given back)
    await daemon.core.rescan("test")
    await kubelet.wait_for("the NIC Healthy again", listed(NIC, {NIC_ID: "Healthy"}))
