"""The DRA plugin's way to its first slices (issue 39 row 3: the first publication of 4,096
devices < 2 s): nothing on it that can wait for them.

- No typed ``ResourceV1Api`` before the first slices: its module loads ~100 pydantic models
  (~0.15 s of CPU per start) for calls whose JSON is read as it is; the publisher's list, the
  slice and claim watches and the claim readers are plain requests (:mod:`.plain`), the
  claim-status writer builds its typed API at its first write.
- The first pool's per-device gauges (a series per device: ~0.13 s of CPU at 4,096 devices)
  are set once the publisher's first reconcile has ended -- written, adopted or failed --
  not before the slices are written.
- The cyclic collector is off while ``vfioctl dra-plugin`` starts (start-up makes ~250,000
  long-lived objects and no garbage cycles: each full collection walked them again); the
  plugin's start then freezes what start-up made out of it and turns it back on.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import kubernetes.watch
import pytest

from tests.dra.apiserver_standin import ApiServerStandin
from tests.dra.conftest import NODE, a_slice
from tests.dra.topologies import DRA_CONFIG, PUBLISHED, dra_host
from tests.waiting import wait_until_async
from vfio_dp.dra.apiserver.plain import lister
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host

DRIVER = "vfio.example.com"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
TYPED = "kubernetes.client.api.resource_v1_api"
REPO = Path(__file__).resolve().parents[2]


def _options(tmp_path: Path, kdirs: tuple[str, str], root: Path) -> DraOptions:
    config = tmp_path / "config.yaml"
    config.write_text(DRA_CONFIG)
    return DraOptions(
        node_name=NODE, driver_name=DRIVER, registry_dir=kdirs[0], plugins_dir=kdirs[1],
        cdi_dir=str(tmp_path / "cdi"), config_path=str(config), root=str(root), resync=60.0,
        metrics_port=0, uevents=False,
    )  # fmt: skip


def _published(api: ApiServerStandin) -> set[str]:
    return {
        d["name"]
        for s in api.objects_of_plural("resourceslices")
        for d in s["spec"].get("devices") or []
    }


# -- no typed API on the way ---------------------------------------------------------------------
def test_the_first_slices_are_written_with_no_typed_api_loaded(
    tmp_path: Path, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    """The plugin in a process of its own (the stand-in, which models every type, is not
    in it): started, its pool written, its slice and claim watches synced -- and the typed
    ``ResourceV1Api`` never loaded."""
    tree = dra_host(tmp_path / "host")
    o = _options(tmp_path, kdirs, tree.root)
    options = {f.name: getattr(o, f.name) for f in dataclasses.fields(o)}
    code = textwrap.dedent(f"""
        import asyncio, sys
        from vfio_dp.dra.apiserver.client import api_client
        from vfio_dp.dra.options import DraOptions
        from vfio_dp.dra.plugin import DraPlugin

        async def main():
            client = api_client({apiserver.kubeconfig!r})
            plugin = DraPlugin(DraOptions(**{options!r}), client)
            await plugin.start()
            watches = [plugin.publisher.watch, plugin.claim_watch]
            while plugin.publisher.writes == 0 or not all(w.synced for w in watches):
                await asyncio.sleep(0.02)
            loaded = sorted(sys.modules)
            await plugin.stop()
            print("\\n".join(loaded))

        asyncio.run(main())
    """)  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(out.stdout.split())
    assert "vfio_dp.dra.plugin" in loaded and "kubernetes.client" in loaded
    assert TYPED not in loaded
    assert not {m for m in loaded if m.startswith("kubernetes.client.models.v1_resource")}
    assert _published(apiserver) == set(PUBLISHED)


def test_the_typed_api_check_can_fail() -> None:
    """The same check sees the typed API once it is touched (the test is not blind)."""
    code = "import sys, kubernetes.client as k; k.ResourceV1Api; print(*sorted(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert TYPED in out.stdout.split()


def test_a_plain_list_answers_as_the_typed_one(apiserver: ApiServerStandin) -> None:
    """:func:`.plain.lister`: the field selector sent, the list's JSON read as it is, a
    refusal raised as the typed method raises it (the server's status)."""
    typed = k8s.ResourceV1Api(apiserver.client())
    typed.create_resource_slice(a_slice("mine"))
    typed.create_resource_slice(a_slice("other", node="node-b"))
    list_ = lister(apiserver.client(), SLICES_PATH)
    got = json.loads(list_(field_selector=f"spec.nodeName={NODE}").data)
    assert [s["metadata"]["name"] for s in got["items"]] == ["mine"]
    assert got["metadata"]["resourceVersion"]
    with pytest.raises(k8s.ApiException) as e:
        list_(field_selector="spec.bogus=x")
    assert e.value.status == 400


def test_a_plain_list_watches_as_the_typed_one(apiserver: ApiServerStandin) -> None:
    """``kubernetes.watch.Watch`` streams the plain list's watch: events as the server's
    JSON (no model), from a resourceVersion, with bookmarks asked for."""
    typed = k8s.ResourceV1Api(apiserver.client())
    rv = typed.create_resource_slice(a_slice("before")).metadata.resource_version
    list_ = lister(apiserver.client(), SLICES_PATH)

    def later() -> None:
        typed.create_resource_slice(a_slice("during"))
        typed.delete_resource_slice("during")

    timer = threading.Timer(0.3, later)
    timer.start()
    seen: list[tuple[str, str]] = []
    w: Any = kubernetes.watch.Watch()  # type: ignore[no-untyped-call]

    def list_them(**kwargs: Any) -> Any:
        return list_(**kwargs)

    for ev in w.stream(list_them, field_selector=f"spec.nodeName={NODE}", resource_version=rv,
                       allow_watch_bookmarks=True, timeout_seconds=10):  # fmt: skip
        assert isinstance(ev["object"], dict)
        seen.append((ev["type"], ev["object"]["metadata"]["name"]))
        if ev["type"] == "DELETED":
            w.stop()
    timer.join()
    assert seen == [("ADDED", "during"), ("DELETED", "during")]


# -- the gauges after the first slices -----------------------------------------------------------
@pytest.fixture
async def plugin(
    tmp_path: Path, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> AsyncIterator[DraPlugin]:
    tree = dra_host(tmp_path / "host")
    p = DraPlugin(_options(tmp_path, kdirs, tree.root), apiserver.client(), host=Host(tree.root))
    yield p
    await p.stop()


def _health_gauges(p: DraPlugin) -> int:
    return sum(
        int(p.metrics.get("vfio_dp_dra_device_health", device=d, health="HEALTHY"))
        for d in PUBLISHED
    )


async def test_the_first_pools_gauges_come_after_its_slices(
    plugin: DraPlugin, apiserver: ApiServerStandin
) -> None:
    at_write: list[int] = []
    plugin.publisher.on_published.append(lambda _g, _s: at_write.append(_health_gauges(plugin)))
    await plugin.start()
    await wait_until_async(lambda: bool(at_write), what="the first pool written", timeout=30)
    assert at_write[0] == 0  # not one series made before the slices were written
    await wait_until_async(
        lambda: _health_gauges(plugin) == len(PUBLISHED), what="the gauges", timeout=30
    )
    assert _published(apiserver) == set(PUBLISHED)


async def test_the_gauges_come_when_the_first_write_fails(
    plugin: DraPlugin, apiserver: ApiServerStandin
) -> None:
    """An API server that refuses the writes keeps no gauge from being set."""
    apiserver.fail_next("POST", "resourceslices", 1000)
    await plugin.start()
    await wait_until_async(
        lambda: _health_gauges(plugin) == len(PUBLISHED), what="the gauges", timeout=30
    )
    assert plugin.publisher.writes == 0 and _published(apiserver) == set()


# -- the collector during start-up ---------------------------------------------------------------
async def test_start_up_without_the_collector_then_its_objects_frozen(plugin: DraPlugin) -> None:
    gc.disable()  # as vfioctl dra-plugin does before its imports
    try:
        frozen = gc.get_freeze_count()
        await plugin.start()
        assert gc.isenabled()
        assert gc.get_freeze_count() > frozen + 10_000  # the plugin's objects and more
    finally:
        gc.unfreeze()  # the test process's heap is collected again
        gc.enable()


async def test_a_collector_left_on_is_not_touched(plugin: DraPlugin) -> None:
    """An embedding process (a test, a bench) that did not turn the collector off keeps
    its heap collected as it was."""
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    await plugin.start()
    assert gc.isenabled() and gc.get_freeze_count() == frozen


def test_vfioctl_dra_plugin_starts_the_plugin_with_the_collector_off(
    tmp_path: Path, apiserver: ApiServerStandin, kdirs: tuple[str, str]
) -> None:
    """The command turns the collector off before it imports and runs the plugin (whose
    start turns it back on): ``run`` replaced, to say what it was called with."""
    tree = dra_host(tmp_path / "host")
    code = textwrap.dedent("""
        import gc, sys
        import vfio_dp.dra.plugin as plugin
        plugin.run = lambda options, client: print("collector", gc.isenabled()) or 0
        from cli.main import main
        sys.argv[0] = "vfioctl"
        main()
    """)
    args = [
        "dra-plugin", "--driver-name", DRIVER, "--node-name", NODE,
        "--kubeconfig", apiserver.kubeconfig, "--root", str(tree.root),
        "--kubelet-registry-dir", kdirs[0], "--kubelet-plugins-dir", kdirs[1],
        "--cdi-dir", str(tmp_path / "cdi"), "--metrics-port", "0",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("VFIOCTL_")}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["collector", "False"]
