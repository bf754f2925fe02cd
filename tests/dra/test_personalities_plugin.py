"""The DRA plugin publishes a group offered to VMs and containers as two entries sharing its
counter (issue 36 item 2), end to end: the slice feed's offers (filled by the config's
``personalities`` and the host's device-node discovery) through the real publisher to the
API-server stand-in; the scheduler stand-in never allocates both. A server that drops the
counter fields gets the first personality only."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest

from tests.dra.apiserver_standin import (
    BINDING_FIELDS,
    CLAIMS,
    DEVICE_CLASSES,
    PARTITIONABLE_FIELDS,
    ApiServerStandin,
    Unschedulable,
)
from tests.dra.conftest import NODE
from tests.dra.scheduler_standin import SchedulerStandin
from tests.dra.test_dra_plugin import DRIVER, pool, until
from tests.dra.test_scheduler_standin import _claim
from tests.dra.topologies import DRA_CONFIG, dra_host
from vfio_dp.core.node import Snapshot
from vfio_dp.dra.deviceclasses import native_device_class
from vfio_dp.dra.personalities import Offer
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host
from vfio_dp.host.kernel import KernelIO
from vfio_dp.model.personality import Personality

NVME = "pci-0000-07-00-0"  # IOMMU group 9 of tests/dra/topologies.py
BOTH = Offer((Personality.VM, Personality.CONTAINER), "nvme")


def _offers(snapshot: Snapshot) -> Mapping[str, Offer]:
    return {NVME: BOTH}


def _new_plugin(
    apiserver: ApiServerStandin,
    kdirs: tuple[str, str],
    tmp_path: Path,
    root: Path,
    *,
    kernel: KernelIO | None = None,
    binding_conditions: bool = False,
) -> DraPlugin:
    """A DRA plugin (not started) over the tree at ``root`` (``kernel``: its simulator), its
    config ``<tmp_path>/config.yaml``."""
    registry, plugins = kdirs
    return DraPlugin(
        DraOptions(
            node_name=NODE,
            driver_name=DRIVER,
            registry_dir=registry,
            plugins_dir=plugins,
            config_path=str(tmp_path / "config.yaml"),
            root=str(root),
            resync=0.2,
            metrics_port=0,
            uevents=False,
            binding_conditions=binding_conditions,
        ),
        apiserver.client(),
        host=Host(root, kernel=kernel),
    )


@pytest.fixture
async def plugin(
    apiserver: ApiServerStandin, kdirs: tuple[str, str], tmp_path: Path
) -> AsyncIterator[DraPlugin]:
    """The DRA plugin on the DRA test topology, its feed offering group 9 in both
    personalities (what the config's ``personalities`` will fill in)."""
    tree = dra_host(tmp_path / "host")
    (tmp_path / "config.yaml").write_text(DRA_CONFIG)
    # binding conditions are off by default until the claim watch writes them
    p = _new_plugin(apiserver, kdirs, tmp_path, tree.root, binding_conditions=True)
    p.feed.offers = _offers
    await p.start()
    yield p
    await p.stop()


async def test_both_entries_published_and_never_both_allocated(
    apiserver: ApiServerStandin, plugin: DraPlugin
) -> None:
    await until(
        "the native entry and the group's counter",
        lambda: f"{NVME}-native" in pool(apiserver)[1]
        and "groups-0" in [cs["name"] for s in pool(apiserver)[2]
                           for cs in s["spec"].get("sharedCounters") or []],
    )  # fmt: skip
    slices = pool(apiserver)[2]
    devices = {d["name"]: d for s in slices for d in s["spec"].get("devices") or []}
    counter = [{"counterSet": "groups-0", "counters": {"g9": {"value": "1"}}}]
    assert (
        devices[NVME]["consumesCounters"]
        == devices[f"{NVME}-native"]["consumesCounters"]
        == counter
    )
    assert devices[NVME]["bindingConditions"] == [f"{DRIVER}/ready"]
    sets = [cs["name"] for s in slices for cs in s["spec"].get("sharedCounters") or []]
    assert "groups-0" in sets
    apiserver.seed(DEVICE_CLASSES, native_device_class(DRIVER))
    apiserver.seed(DEVICE_CLASSES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": "nvme-vm"},
        "spec": {"selectors": [{"cel": {"expression":
            f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].kind == "vfio" && '
            f'device.attributes["resource.kubernetes.io"].pciBusID == "0000:07:00.0"'}}]},
    })  # fmt: skip
    sched = SchedulerStandin(apiserver)
    _claim(apiserver, "ctr", f"native.{DRIVER}")
    _claim(apiserver, "vm", "nvme-vm")
    assert sched.allocate("default", "ctr", NODE)
    try:
        sched.allocate("default", "vm", NODE)
        raise AssertionError("both entries of group 9 allocated")
    except Unschedulable:
        pass
    assert len(apiserver.objects(CLAIMS, "default")) == 2


@pytest.fixture
def old_cluster(apiserver: ApiServerStandin) -> ApiServerStandin:
    """Both feature gates off: the counter and binding fields dropped on write."""
    apiserver.disabled_fields = set(PARTITIONABLE_FIELDS | BINDING_FIELDS)
    return apiserver


async def test_a_server_dropping_the_fields_gets_the_first_personality(
    old_cluster: ApiServerStandin, plugin: DraPlugin
) -> None:
    apiserver = old_cluster
    await until("the counters found dropped", lambda: not plugin.publisher.counters_kept)
    await until(
        "the pool without the second entry",
        lambda: plugin.publisher.problem is None and NVME in pool(apiserver)[1]
        and f"{NVME}-native" not in pool(apiserver)[1]
        and not any("sharedCounters" in s["spec"] for s in pool(apiserver)[2]),
    )  # fmt: skip
    # recorded for vfioctl list (which never asks the API server)
    from vfio_dp.dra.observers.api_fields import ApiFields

    await until(
        "the record of what the server keeps",
        lambda: plugin.api_fields.get() == ApiFields(counters=False, binding=False),
    )


CONFIG_BOTH = """
selectors:
  - class: "0108"
    path: dra
    bind: onPrepare
    personalities: [vm, container]
  - vendor: "8086"
    path: dra
    bind: onPrepare
    personalities: [vm, container]
"""


async def test_the_configs_personalities_and_the_device_nodes_decide(
    apiserver: ApiServerStandin, kdirs: tuple[str, str], tmp_path: Path
) -> None:
    """No offers given: the feed reads them from the units' ``personalities`` and the
    functions' device nodes -- the NVMe (nodes of its own on ``nvme``) is offered twice, the
    NIC (none) as ``vm`` only, as ``vfioctl list`` says."""
    from tests.host.test_devnodes import NIC, NVME_NODES
    from tests.host.test_devnodes import NVME as NVME_BDF
    from tests.kernel_sim import SimulatedKernel
    from tests.sysfs_tree import Dev, SysfsTree

    t = SysfsTree(tmp_path / "root")
    t.add(Dev(NVME_BDF, "1b36", "0010", "010802", driver="nvme", group=3))
    t.add(Dev(NIC, "8086", "10d3", "020000", driver="e1000e", group=4))
    t.add_net(NIC, "eth0", up=False)
    k = SimulatedKernel(t)
    k.native_nodes[NVME_BDF] = list(NVME_NODES)
    k.make_nodes(NVME_BDF)
    (tmp_path / "config.yaml").write_text(CONFIG_BOTH)
    p = _new_plugin(apiserver, kdirs, tmp_path, t.root, kernel=k)
    await p.start()
    try:
        want = {"pci-0000-01-00-0", "pci-0000-01-00-0-native", "pci-0000-02-00-0"}
        await until("both NVMe entries and the NIC's", lambda: pool(apiserver)[1] == want)
        await until("the pool whole", lambda: p.publisher.writes >= 1)
        devices = {d["name"]: d for s in pool(apiserver)[2] for d in s["spec"].get("devices") or []}
        native = devices["pci-0000-01-00-0-native"]
        assert native["attributes"]["nativeDriver"] == {"string": "nvme"}
        assert native["attributes"]["kind"] == {"string": "native"}
        assert native["consumesCounters"] == devices["pci-0000-01-00-0"]["consumesCounters"]
        assert "consumesCounters" not in devices["pci-0000-02-00-0"]  # offered once: no counter
    finally:
        await p.stop()
