"""The DRA plugin end to end: the kubelet DRA stand-in registers it over real unix sockets,
the real ``kubernetes`` client publishes to the API-server stand-in, on temp sysfs trees.

In-process tests drive rescans the way the kernel's uevents do (``core.on_uevent``); the
process tests run ``vfioctl dra-plugin`` itself (SIGTERM, SIGKILL + restart).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from tests.dra.apiserver_standin import NODES, SLICES, ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.kubelet_dra_standin import KubeletDraStandin
from tests.dra.topologies import DRA_CONFIG, PUBLISHED, dra_host
from tests.sysfs_tree import Dev, SysfsTree
from tests.waiting import DEFAULT_TIMEOUT, wait_until_async
from vfio_dp.core.node import Snapshot
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host

DRIVER = "vfio.dra.vfio-dp.io"


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    return dra_host(tmp_path / "host")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    p = tmp_path / "config.yaml"
    p.write_text(DRA_CONFIG)
    return p


def pool(api: ApiServerStandin) -> tuple[int, set[str], list[dict[str, Any]]]:
    """(highest generation, device names at it, the slices) of this node's pool. The names
    only once the pool is complete at that generation (as many slices as its
    ``resourceSliceCount``, as the scheduler counts them): while a write is under way the
    slices written first may already name every device, and the rest are still to come."""
    slices = [
        s
        for s in api.objects(SLICES)
        if s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRIVER
    ]
    if not slices:
        return 0, set(), []
    gen = max(s["spec"]["pool"]["generation"] for s in slices)
    current = [s for s in slices if s["spec"]["pool"]["generation"] == gen]
    if any(s["spec"]["pool"]["resourceSliceCount"] != len(current) for s in current):
        return gen, set(), slices  # being written
    names = {d["name"] for s in current for d in s["spec"].get("devices") or []}
    return gen, names, slices


async def until(what: str, check: Callable[[], bool], timeout: float = DEFAULT_TIMEOUT) -> None:
    """Wait until ``check()`` holds (tests/waiting.py); the failure names ``what``."""
    await wait_until_async(check, what=what, timeout=timeout)


StartPlugin = Callable[..., Awaitable[DraPlugin]]


@pytest.fixture
async def start_plugin(
    tree: SysfsTree, config: Path, kdirs: tuple[str, str], apiserver: ApiServerStandin
) -> AsyncIterator[StartPlugin]:
    started: list[DraPlugin] = []

    async def start(*, resync: float = 0.2) -> DraPlugin:
        registry, plugins = kdirs
        p = DraPlugin(
            DraOptions(
                node_name=NODE,
                driver_name=DRIVER,
                registry_dir=registry,
                plugins_dir=plugins,
                config_path=str(config),
                root=str(tree.root),
                resync=resync,
                metrics_port=0,
                uevents=False,
            ),
            apiserver.client(),
            host=Host(tree.root),
        )
        started.append(p)
        await p.start()
        return p

    yield start
    for p in started:
        await p.stop()


async def test_registers_publishes_exactly_and_refuses_a_missing_claim(
    apiserver: ApiServerStandin, kdirs: tuple[str, str], start_plugin: StartPlugin
) -> None:
    registry, plugins = kdirs
    kubelet = KubeletDraStandin(registry, NODE, api_client=apiserver.client())
    await kubelet.start()
    try:
        plugin = await start_plugin()
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
        view = kubelet.plugins[DRIVER]
        assert view.version == "v1.DRAPlugin"
        assert view.socket == f"{registry}/{DRIVER}-reg.sock"
        assert view.endpoint == f"{plugins}/{DRIVER}/dra.sock"
        assert plugin.kubelet.registered
        await until(
            "the slices",
            lambda: pool(apiserver)[1] == set(PUBLISHED) and len(pool(apiserver)[2]) == 2,
        )
        gen, _, slices = pool(apiserver)
        # the devices, then the counter set of the VFs' PF in a slice of its own (KEP-4815)
        s, counters = sorted(slices, key=lambda x: x["metadata"]["name"])
        assert [c["name"] for c in counters["spec"]["sharedCounters"]] == ["pf-0000-af-00-0"]
        node_uid = apiserver.objects(NODES)[0]["metadata"]["uid"]
        assert s["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid, "controller": True}
        ]
        assert s["spec"]["pool"] == {"name": NODE, "generation": gen, "resourceSliceCount": 2}
        by_name = {d["name"]: d["attributes"] for d in s["spec"]["devices"]}
        for name, (bus_id, group, functions) in PUBLISHED.items():
            assert by_name[name]["resource.kubernetes.io/pciBusID"] == {"string": bus_id}
            assert by_name[name]["iommuGroup"] == {"int": group}
            assert by_name[name]["functions"] == {"int": functions}
        # nothing to change: resyncs neither write nor bump
        await until("the publisher's record", lambda: plugin.publisher.writes == 1)
        writes, checks = plugin.publisher.writes, plugin.publisher.checks
        # three more checks of the pool: at least two resyncs went all the way through
        await until("two more resyncs", lambda: plugin.publisher.checks >= checks + 3)
        assert plugin.publisher.writes == writes and pool(apiserver)[0] == gen
        answer = await kubelet.prepare(DRIVER, [("vms", "uid-1", "gpu-claim")])
        assert (
            "claim vms/gpu-claim (uid uid-1): the ResourceClaim vms/gpu-claim does not exist"
            in (answer["uid-1"].error)
        )
        assert not answer["uid-1"].devices
        assert await kubelet.unprepare(DRIVER, [("vms", "uid-1", "gpu-claim")]) == {"uid-1": ""}
        # each call and each write of the pool timed (vfio_dp.core.metrics histograms)
        m = plugin.metrics
        assert m.get("vfio_dp_dra_prepare_seconds_count", version="v1") == 1
        assert m.get("vfio_dp_dra_unprepare_seconds_count", version="v1") == 1
        assert m.get("vfio_dp_dra_publish_seconds_count") == plugin.publisher.writes >= 1
        await plugin.stop()
        assert not os.path.exists(view.socket) and not os.path.exists(view.endpoint)
        assert pool(apiserver)[0] == gen  # the slices stay (kubelet removes them later)
    finally:
        await kubelet.stop()


async def _published_and_watched(plugin: DraPlugin, apiserver: ApiServerStandin) -> None:
    """Until the pool is written and the publisher's slice watch shows exactly what it wrote."""
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    await until("the publisher's record", lambda: plugin.publisher.writes == 1)
    watch = plugin.publisher.watch
    assert watch is not None
    await until(
        "the watch",
        lambda: bool(plugin.publisher.written) and watch.snapshot() == plugin.publisher.written,
    )


async def test_an_idle_resync_rebuilds_nothing_and_lists_nothing(
    apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    """Issue 25, issue 33 item 2: an idle resync (the same inventory: the core's cheap look
    saw nothing) reuses the devices it built and sends no request at all -- the slice watch
    knows the server's names and resourceVersions; a slice deleted meanwhile is put back at
    once, by the watch's event, not at a resync (there is none here)."""
    plugin = await start_plugin()
    await _published_and_watched(plugin, apiserver)
    devices = list(plugin.devices)
    checks, n = plugin.publisher.checks, len(apiserver.requests)
    await until("three more resyncs", lambda: plugin.publisher.checks >= checks + 3)
    assert all(a is b for a, b in zip(plugin.devices, devices, strict=True))  # not rebuilt
    assert [
        (r.method, r.path) for r in apiserver.requests[n:] if r.query.get("watch") != "true"
    ] == []
    assert plugin.publisher.writes == 1
    plugin.core.begin_stop()  # no more resyncs: only the watch can notice what follows
    gen = pool(apiserver)[0]
    (victim,) = [s for s in pool(apiserver)[2] if "sharedCounters" in s["spec"]]
    api = k8s.ResourceV1Api(apiserver.client())  # someone deletes the counter slice
    await asyncio.to_thread(api.delete_resource_slice, victim["metadata"]["name"])
    await until("republished", lambda: len(pool(apiserver)[2]) == 2 and pool(apiserver)[0] > gen)
    assert pool(apiserver)[1] == set(PUBLISHED)


async def test_the_slice_feed_is_keyed_by_the_cores_scan_generation(
    apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    """Issue 33 item 4: the core numbers its scans (``Snapshot.generation``); idle resyncs
    hand the same generation and the feed rebuilds nothing, a rescan hands a new one and the
    feed builds again -- reusing every device that is equal to the one it built before."""
    plugin = await start_plugin()
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    seen: list[Snapshot] = []

    class Recorder:
        async def inventory_changed(self, snapshot: Snapshot) -> None:
            seen.append(snapshot)

    plugin.core.subscribe(Recorder())
    await until("three idle resyncs", lambda: len(seen) >= 3)
    idle = {s.generation for s in seen}
    assert idle == {plugin.core.generation}, idle
    devices = list(plugin.devices)
    plugin.core.on_uevent("change 0000:65:00.0")  # a rescan, as a kernel uevent makes one
    await until("a rescan", lambda: any(s.generation > max(idle) for s in seen))
    rescanned = next(s for s in seen if s.generation > max(idle))
    assert rescanned.trigger.startswith("uevent") and rescanned.inventory is not seen[0].inventory
    await until("the feed's next update", lambda: plugin.feed._idle_key is not None
                and plugin.feed._idle_key[0] == rescanned.generation)  # fmt: skip
    # nothing changed on the host: every device is the one built before (equal, not rebuilt)
    assert all(a is b for a, b in zip(plugin.devices, devices, strict=True))


async def test_a_watch_whose_resource_version_expired_lists_again(
    apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    """The API server goes away (its watches end), a slice is deleted meanwhile and the
    history compacted: the watch's next start from its old resourceVersion is answered 410
    Gone, so it lists again, sees the slice missing, and the pool is republished -- with no
    resync to help (none runs here)."""
    plugin = await start_plugin(resync=60)
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    watch = plugin.publisher.watch
    assert watch is not None
    await until(
        "the watch",
        lambda: bool(plugin.publisher.written) and watch.snapshot() == plugin.publisher.written,
    )
    lists, gen = watch.lists, pool(apiserver)[0]
    apiserver.end_watches(pause=True)  # away: open watches end, new ones wait
    (victim,) = [s for s in pool(apiserver)[2] if "sharedCounters" in s["spec"]]
    api = k8s.ResourceV1Api(apiserver.client())
    await asyncio.to_thread(api.delete_resource_slice, victim["metadata"]["name"])
    apiserver.compact()
    apiserver.resume_watches()
    # the watch starts again after its backoff: bounded generously for a loaded machine
    await until("the 410", lambda: watch.expired >= 1 and watch.lists > lists, timeout=30)
    await until(
        "republished",
        lambda: len(pool(apiserver)[2]) == 2 and pool(apiserver)[0] > gen
        and bool(pool(apiserver)[1]),  # complete: not while its slices are being written
        timeout=30,
    )
    assert pool(apiserver)[1] == set(PUBLISHED)
    assert plugin.publisher.problem is None


async def test_a_watch_the_server_ends_resumes_where_it_was_without_a_list(
    apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    """The server ends the open watches (a restart, or its own timeout) and its next answer is
    a hang-up (the kept-alive connection it had closed: "Remote end closed connection without
    response"): the watch starts again from the last resourceVersion seen, with no list, and
    sees what changed meanwhile."""
    plugin = await start_plugin(resync=60)
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    watch = plugin.publisher.watch
    assert watch is not None
    await until(
        "the watch",
        lambda: bool(plugin.publisher.written) and watch.snapshot() == plugin.publisher.written,
    )

    def slice_watches() -> int:
        return sum(
            1 for r in list(apiserver.requests)
            if r.path.endswith("/resourceslices") and r.query.get("watch") == "true"
        )  # fmt: skip

    await until("a watch open", lambda: slice_watches() >= 1)
    for _ in range(3):
        lists, expired, started = watch.lists, watch.expired, slice_watches()
        apiserver.hang_up_on("resourceslices")
        apiserver.end_watches()
        await until("the watch started again", lambda n=started: slice_watches() > n)
        assert (watch.lists, watch.expired) == (lists, expired)
    (victim,) = [s for s in pool(apiserver)[2] if "sharedCounters" in s["spec"]]
    api = k8s.ResourceV1Api(apiserver.client())
    await asyncio.to_thread(api.delete_resource_slice, victim["metadata"]["name"])
    await until("republished", lambda: len(pool(apiserver)[2]) == 2, timeout=30)
    assert watch.lists == lists


async def test_a_server_refusing_watches_gets_full_lists(
    apiserver: ApiServerStandin, start_plugin: StartPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that refuses the watch (an RBAC without the ``watch`` verb: 403) leaves the
    watch unsynced and retrying with backoff; the publisher lists in full at each check
    instead, and publishes as before."""
    import tests.dra.apiserver_standin as standin

    def refused(self: Any, kind: Any, ns: str, query: dict[str, str]) -> Any:
        raise standin.ApiError(403, "Forbidden", "resourceslices is forbidden: watch")

    monkeypatch.setattr(standin.ApiServerStandin, "watch", refused)
    plugin = await start_plugin()
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    assert plugin.publisher.watch is not None
    assert plugin.publisher.watch.snapshot() is None
    lists = plugin.publisher.lists
    await until("two more full lists", lambda: plugin.publisher.lists >= lists + 2)
    assert plugin.publisher.writes == 1 and plugin.publisher.problem is None


async def test_withdrawn_after_a_change_and_a_hotplug_published(
    tree: SysfsTree, apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    plugin = await start_plugin(resync=60)  # no resync help: only the event can do it
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    gen = pool(apiserver)[0]
    tree.set_driver("0000:af:00.2", "mlx5_core")  # a VF given back to its host driver
    plugin.core.on_uevent("unbind 0000:af:00.2")
    # resync is 60 s: only the event can have done it (the time itself is bench/dra_bench.py's)
    await until(
        "the VF withdrawn", lambda: pool(apiserver)[1] == set(PUBLISHED) - {"pci-0000-af-00-2"}
    )
    assert pool(apiserver)[0] == gen + 1
    tree.add(Dev("0000:af:00.3", "15b3", "101c", "020000", driver="vfio-pci", group=63,
                 parent="0000:00:1e.0", numa=1, physfn="0000:af:00.0"))  # fmt: skip
    plugin.core.on_uevent("add 0000:af:00.3")
    await until("the hotplugged VF", lambda: "pci-0000-af-00-3" in pool(apiserver)[1])
    assert pool(apiserver)[0] == gen + 2
    # the other NVMe of the switch group leaves vfio-pci: the group is no longer viable
    tree.set_driver("0000:08:00.0", "nvme")
    plugin.core.on_uevent("bind 0000:08:00.0")
    await until("the NVMe group withdrawn", lambda: "pci-0000-07-00-0" not in pool(apiserver)[1])


async def test_republished_within_one_resync_after_kubelet_wipes_the_slices(
    apiserver: ApiServerStandin, kdirs: tuple[str, str], start_plugin: StartPlugin
) -> None:
    plugin = await start_plugin(resync=0.5)
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    gen = pool(apiserver)[0]
    kubelet = KubeletDraStandin(kdirs[0], NODE, api_client=apiserver.client())
    await kubelet.start()  # a starting kubelet deletes all of the node's slices
    try:
        assert kubelet.wipes == [f"spec.nodeName={NODE}"]
        # nothing changed on the node: only the resync's check of the pool can republish
        await until("republished", lambda: pool(apiserver)[1] == set(PUBLISHED))
        assert pool(apiserver)[0] > gen  # continued, never restarted at 1
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins)
    finally:
        await kubelet.stop()
    del plugin


async def test_config_reload_moves_devices_between_paths(
    config: Path, apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    plugin = await start_plugin()
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    await until("the pool written", lambda: plugin.publisher.writes >= 1)
    gen, mark = pool(apiserver)[0], len(apiserver.requests)
    new = config.with_suffix(".new")
    text = DRA_CONFIG.replace('class: "0108"\n    path: dra', 'class: "0108"')
    assert text != DRA_CONFIG  # the NVMe selector really loses its `path: dra`
    new.write_text(text)
    os.replace(new, config)  # as a ConfigMap update swaps the file
    await until(
        "the NVMe group handed to the device plugin",
        lambda: pool(apiserver)[1] == set(PUBLISHED) - {"pci-0000-07-00-0"},
    )
    assert plugin.metrics.get("vfio_dp_config_reloads_total", result="applied") == 1
    # one write for the change: the one slice that held the NVMe group, at the same
    # generation (one atomic write: upstream's ResourceSlice controller keeps it too)
    assert len(apiserver.slice_writes(mark)) == 1
    assert pool(apiserver)[0] == gen
    assert {d.name for d in plugin.devices} == set(PUBLISHED) - {"pci-0000-07-00-0"}


# -- the real command --------------------------------------------------------------------
async def whole_pool(api: ApiServerStandin, what: str, names: set[str]) -> None:
    """Wait until this node's pool, every slice of it at its newest generation, lists
    ``names``. The stand-in wakes the wait on each write (no polling: the plugin processes
    are what this machine's CPU is for), and the slices are written one by one, so a pool
    whose newest generation already lists ``names`` may still have a slice at the previous
    one for a moment."""

    def whole(a: ApiServerStandin) -> bool:
        gen, found, slices = pool(a)
        return found == names and all(s["spec"]["pool"]["generation"] == gen for s in slices)

    await asyncio.to_thread(api.wait_for, what, whole, 30)


def spawn(
    tree: SysfsTree, config: Path, api: ApiServerStandin, kdirs: tuple[str, str]
) -> subprocess.Popen[str]:
    registry, plugins = kdirs
    env = dict(os.environ, NODE_NAME=NODE, VFIOCTL_RESYNC="0.3")  # options from env vars too
    return subprocess.Popen(
        [sys.executable, "-c", "from cli.main import main; main()", "dra-plugin",
         "--driver-name", DRIVER, "--kubeconfig", api.kubeconfig,
         "--kubelet-registry-dir", registry, "--kubelet-plugins-dir", plugins,
         "--cdi-dir", f"{plugins}/cdi", "--config", str(config), "--root", str(tree.root), "--metrics-port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


async def test_generation_continues_across_sigkill_and_sigterm_removes_both_sockets(
    tree: SysfsTree, config: Path, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    registry, plugins = kdirs
    reg_sock = f"{registry}/{DRIVER}-reg.sock"
    dra_sock = f"{plugins}/{DRIVER}/dra.sock"
    kubelet = KubeletDraStandin(registry, NODE, api_client=apiserver.client(), wipe_grace=60)
    await kubelet.start()
    proc = spawn(tree, config, apiserver, kdirs)
    try:
        await whole_pool(apiserver, "published", set(PUBLISHED))
        await kubelet.wait_for("registration", lambda k: DRIVER in k.plugins, 30)
        first = pool(apiserver)[0]
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=10)  # reaps it and closes its pipes
        assert os.path.exists(reg_sock)  # a stale socket, as a crash leaves it
        tree.set_driver("0000:af:00.1", "mlx5_core")  # changed while the plugin was down
        proc = spawn(tree, config, apiserver, kdirs)
        await whole_pool(
            apiserver, "republished after restart", set(PUBLISHED) - {"pci-0000-af-00-1"}
        )
        gen, _, slices = pool(apiserver)
        assert gen == first + 1  # continued from what the killed process published
        assert all(s["spec"]["pool"]["generation"] == gen for s in slices)
        await kubelet.wait_for(
            "registration of the restarted plugin",
            lambda k: DRIVER in k.plugins and len(k.attempts) >= 2,
            30,
        )
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.to_thread(proc.communicate, timeout=20)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        assert not os.path.exists(reg_sock) and not os.path.exists(dra_sock)
        assert pool(apiserver)[0] == gen  # slices stay after SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)
        await kubelet.stop()


def test_missing_node_name_and_bad_driver_name_exit_2(
    tree: SysfsTree, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME" and not k.startswith("VFIOCTL_")}
    base = [sys.executable, "-c", "from cli.main import main; main()", "dra-plugin",
            "--kubeconfig", apiserver.kubeconfig, "--root", str(tree.root),
            "--kubelet-registry-dir", kdirs[0], "--kubelet-plugins-dir", kdirs[1],
            "--metrics-port", "0"]  # fmt: skip
    p = subprocess.run(base, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--node-name is required" in p.stderr, p.stderr
    p = subprocess.run([*base, "--node-name", NODE, "--driver-name", "Not_A.Domain"],
                       env=env, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert p.returncode == 2 and "Not_A.Domain" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


async def test_someone_elses_change_to_our_slice_is_undone_at_once(
    tree: SysfsTree, apiserver: ApiServerStandin, start_plugin: StartPlugin
) -> None:
    """A slice changed behind our back (its resourceVersion moves) is rewritten as soon as
    the watch sees it (no resync runs here); and a device change written over a stale record
    of ours (a publisher without a watch) gets 409 Conflict, lists the pool and rewrites."""
    import kubernetes.client as k8s

    from vfio_dp.dra.apiserver.publisher import SlicePublisher

    plugin = await start_plugin(resync=60)
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    await until("the publisher's record", lambda: plugin.publisher.writes == 1)
    api = k8s.ResourceV1Api(apiserver.client())
    (s,) = [x for x in pool(apiserver)[2] if "devices" in x["spec"]]
    name, gen = s["metadata"]["name"], s["spec"]["pool"]["generation"]
    s["spec"]["devices"] = s["spec"]["devices"][:1]  # someone drops three devices
    await asyncio.to_thread(api.replace_resource_slice, name, s)
    await until("restored", lambda: pool(apiserver)[1] == set(PUBLISHED))
    assert pool(apiserver)[0] == gen + 1
    # now tamper again where no watch sees it, and change a device: 409 → list → rewrite
    devices = list(plugin.devices)
    await plugin.stop()
    pub = SlicePublisher(apiserver.client(), DRIVER, NODE, watch=False)
    # the plugin stopped (its threads with it), nothing else runs on this loop: block on it
    pub.reconcile(devices)  # adopted, or rewritten if the stop cut a republish short
    (s,) = [x for x in pool(apiserver)[2] if "devices" in x["spec"]]
    s["metadata"]["labels"] = {"touched": "yes"}
    api.replace_resource_slice(name, s)
    assert pub.reconcile(devices[1:])
    assert pool(apiserver)[1] == {d.name for d in devices[1:]}
    conflicts = [r for r in apiserver.requests if r.method == "PUT" and r.code == 409]
    assert conflicts, "the stale write was refused by the stand-in and then redone"


async def test_an_idle_check_of_the_pool_stays_on_the_event_loop(
    apiserver: ApiServerStandin, start_plugin: StartPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39 row 6: while the slice watch is synced, an idle resync's check of the pool
    is answered on the event loop (what we wrote is what is wanted, and the watch shows the
    server holds exactly it): no hop to the slice lane's thread and its deadline watchdog;
    a slice deleted meanwhile is still put back (the watch's event wakes the lane)."""
    plugin = await start_plugin()
    await _published_and_watched(plugin, apiserver)
    runs: list[str] = []
    real = plugin.publisher.lane.run

    async def counted(what: str, *args: Any, **kwargs: Any) -> Any:
        runs.append(what)
        return await real(what, *args, **kwargs)

    monkeypatch.setattr(plugin.publisher.lane, "run", counted)
    checks = plugin.publisher.checks
    await until("three more checks", lambda: plugin.publisher.checks >= checks + 3)
    assert runs == []
    gen = pool(apiserver)[0]
    (victim,) = [s for s in pool(apiserver)[2] if "sharedCounters" in s["spec"]]
    api = k8s.ResourceV1Api(apiserver.client())
    await asyncio.to_thread(api.delete_resource_slice, victim["metadata"]["name"])
    await until("republished", lambda: pool(apiserver)[0] > gen and bool(pool(apiserver)[1]))
    assert pool(apiserver)[1] == set(PUBLISHED) and len(pool(apiserver)[2]) == 2
    assert runs  # on the lane, as every write


async def test_without_a_synced_watch_a_deleted_slice_is_put_back_at_a_resync(
    apiserver: ApiServerStandin, start_plugin: StartPlugin, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The idle check on the event loop answers only from a synced watch: a server that
    refuses the watch (403) still gets a full list at each resync, and a slice deleted
    behind our back is rewritten at the next one."""
    import tests.dra.apiserver_standin as standin

    def refused(self: Any, kind: Any, ns: str, query: dict[str, str]) -> Any:
        raise standin.ApiError(403, "Forbidden", "resourceslices is forbidden: watch")

    monkeypatch.setattr(standin.ApiServerStandin, "watch", refused)
    plugin = await start_plugin()
    await until("the slices", lambda: pool(apiserver)[1] == set(PUBLISHED))
    await until("the publisher's record", lambda: plugin.publisher.writes == 1)
    gen = pool(apiserver)[0]
    (victim,) = [s for s in pool(apiserver)[2] if "sharedCounters" in s["spec"]]
    api = k8s.ResourceV1Api(apiserver.client())
    await asyncio.to_thread(api.delete_resource_slice, victim["metadata"]["name"])
    await until("republished", lambda: pool(apiserver)[0] > gen and bool(pool(apiserver)[1]))
    assert pool(apiserver)[1] == set(PUBLISHED) and len(pool(apiserver)[2]) == 2
    await until("the write recorded", lambda: plugin.publisher.writes == 2)
