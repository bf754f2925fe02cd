"""The driver switch done ahead of the pod (issue 36 item 4, KEP-5007 binding conditions),
end to end in one process: the real DRA plugin (its claim watch, its claim path, its status
writer) on the kernel simulator, the API-server stand-in (the claims watched with
resourceVersions, strict decoding) and the scheduler stand-in's allocation and PreBind.

A claim allocated on a device with binding conditions is switched by the plugin as soon as
the watch sees it, ``<driver>/ready`` is written beside the Ready condition, the scheduler
binds, and Prepare does no driver work; a switch that cannot happen writes
``<driver>/failed`` with a reason, leaves the device as it was, and the scheduler
deallocates; a claim deleted before Prepare has its record dropped; a record a crash left
before the switch is settled at the next start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest

from tests.dra.apiserver_standin import CLAIMS, DEVICE_CLASSES, ApiServerStandin, Unschedulable
from tests.dra.conftest import NODE
from tests.dra.scheduler_standin import PreBind, SchedulerStandin
from tests.dra.test_dra_plugin import DRIVER, pool, until
from tests.dra.test_scheduler_standin import _claim
from tests.host.test_devnodes import NVME_NODES
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath.checkpoint import SWITCHED, ClaimRecord
from vfio_dp.dra.claimpath.claims import ClaimRef
from vfio_dp.dra.deviceclasses import native_device_class
from vfio_dp.dra.plugin import DraOptions, DraPlugin
from vfio_dp.host import Host

NVME, PAIR, SIBLING = "0000:01:00.0", "0000:05:00.0", "0000:05:00.1"
VM_ENTRY, CT_ENTRY = "pci-0000-01-00-0", "pci-0000-01-00-0-native"
PAIR_CT = "pci-0000-05-00-0-native"
READY, FAILED = f"{DRIVER}/ready", f"{DRIVER}/failed"

CONFIG = """
selectors:
  - class: "0108"
    path: dra
    bind: onPrepare
    resourceName: disk
    personalities: [vm, container]
  - vendor: "8086"
    path: dra
    bind: onPrepare
    resourceName: disk
    personalities: [vm, container]
"""


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path / "root")
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    t.add(Dev(PAIR, "1b36", "0010", "010802", driver="nvme", group=6))
    t.add(Dev(SIBLING, "8086", "10d3", "020000", driver="e1000e", group=6))
    t.add_net(SIBLING, "eth1", up=False)
    return t


@pytest.fixture
def kernel(tree: SysfsTree) -> SimulatedKernel:
    k = SimulatedKernel(tree)
    k.native_nodes[NVME] = list(NVME_NODES)
    k.make_nodes(NVME)
    k.native_nodes[PAIR] = [("nvme/nvme1", "char", "242:1", "nvme1")]
    k.make_nodes(PAIR)
    return k


def _plugin(
    apiserver: ApiServerStandin,
    kdirs: tuple[str, str],
    tmp_path: Path,
    tree: SysfsTree,
    kernel: SimulatedKernel,
) -> DraPlugin:
    registry, plugins = kdirs
    (tmp_path / "config.yaml").write_text(CONFIG)
    return DraPlugin(
        DraOptions(  # binding conditions: the default
            node_name=NODE,
            driver_name=DRIVER,
            registry_dir=registry,
            plugins_dir=plugins,
            cdi_dir=str(tmp_path / "cdi"),
            config_path=str(tmp_path / "config.yaml"),
            root=str(tree.root),
            resync=3600,  # no rescan behind the test's back: it says when the host changes
            metrics_port=0,
            uevents=False,
        ),
        apiserver.client(),
        host=Host(tree.root, kernel=kernel),
    )


def _classes(apiserver: ApiServerStandin) -> None:
    """A class per entry the tests ask for: ``<group>-vm`` / ``<group>-ct``."""
    apiserver.seed(DEVICE_CLASSES, native_device_class(DRIVER))
    for group, bdf in (("nvme", NVME), ("pair", PAIR)):
        for suffix, kind in (("vm", "vfio"), ("ct", "native")):
            apiserver.seed(DEVICE_CLASSES, {
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": f"{group}-{suffix}"},
                "spec": {"selectors": [{"cel": {"expression":
                    f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].kind == '
                    f'"{kind}" && device.attributes["resource.kubernetes.io"].pciBusID == '
                    f'"{bdf}"'}}]},
            })  # fmt: skip


@pytest.fixture
async def plugin(
    apiserver: ApiServerStandin,
    kdirs: tuple[str, str],
    tmp_path: Path,
    tree: SysfsTree,
    kernel: SimulatedKernel,
) -> AsyncIterator[DraPlugin]:
    p = _plugin(apiserver, kdirs, tmp_path, tree, kernel)
    _classes(apiserver)
    await p.start()
    await until(
        "both entries of both NVMe groups, with binding conditions",
        lambda: {VM_ENTRY, CT_ENTRY, PAIR_CT} <= pool(apiserver)[1]
        and p.publisher.writes >= 1 and p.claim_watch is not None and p.claim_watch.synced,
    )  # fmt: skip
    yield p
    await p.stop()


def _stored(apiserver: ApiServerStandin, name: str) -> dict[str, Any]:
    (claim,) = [c for c in apiserver.objects(CLAIMS, "default") if c["metadata"]["name"] == name]
    return claim


def _ref(apiserver: ApiServerStandin, name: str) -> ClaimRef:
    return ClaimRef("default", _stored(apiserver, name)["metadata"]["uid"], name)


def _conditions(apiserver: ApiServerStandin, name: str, device: str) -> dict[str, Any]:
    for d in (_stored(apiserver, name).get("status") or {}).get("devices") or []:
        if d["driver"] == DRIVER and d["device"] == device:
            return {c["type"]: c for c in d.get("conditions") or []}
    return {}


def _bind_writes(kernel: SimulatedKernel) -> list[tuple[str, str]]:
    """The kernel writes that move a driver: bind, unbind, override, probe, new_id."""
    moving = ("/bind", "/unbind", "driver_override", "drivers_probe", "new_id", "remove_id")
    return [(p, d) for p, d in kernel.writes if p.endswith(moving)]


async def _prebind(sched: SchedulerStandin, name: str) -> str:
    return (await _decide(sched, name)).outcome


async def _decide(sched: SchedulerStandin, name: str) -> PreBind:
    return await asyncio.to_thread(sched.prebind, "default", name)


async def test_a_vm_claim_is_switched_ahead_and_prepare_binds_nothing(
    apiserver: ApiServerStandin, plugin: DraPlugin, tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    stored = sched.allocate("default", "vm", NODE)
    (result,) = stored["status"]["allocation"]["devices"]["results"]
    assert result["device"] == VM_ENTRY and result["bindingConditions"] == [READY]
    # the scheduler waits; the plugin sees the allocation, switches and says ready
    assert await _prebind(sched, "vm") == "bound"
    assert tree.driver_of(NVME) == "vfio-pci"
    ready = _conditions(apiserver, "vm", VM_ENTRY)[READY]
    assert ready["status"] == "True" and ready["reason"] == "Switched"
    assert f"{NVME} on vfio-pci" in ready["message"]
    ref = _ref(apiserver, "vm")
    assert plugin.claims.checkpoint.get(ref.uid).state == SWITCHED  # type: ignore[union-attr]
    # the one who may hold the group: the claim (bind record), known before the bind
    assert plugin.core.host.record_holders()[PCI(NVME)] == f"claim:{ref.uid}"
    # kubelet's Prepare: nothing left to bind
    before = len(_bind_writes(kernel))
    out = (await plugin.prepare([ref]))[ref.uid]
    assert out.error == "", out.error
    assert _bind_writes(kernel)[before:] == []
    assert plugin.claims.checkpoint.get(ref.uid).state == "prepared"  # type: ignore[union-attr]
    # the Ready condition of Prepare's status write lands BESIDE the binding condition
    await until(
        "Ready and ready in one entry",
        lambda: {"Ready", READY} <= set(_conditions(apiserver, "vm", VM_ENTRY)),
    )
    assert _conditions(apiserver, "vm", VM_ENTRY)[READY] == ready  # kept, never rewritten
    # while the VM entry is allocated the container entry never is
    _claim(apiserver, "ct", "nvme-ct")
    with pytest.raises(Unschedulable):
        sched.allocate("default", "ct", NODE)
    # the pod ends: Unprepare gives the group back; the claim is deallocated
    assert (await plugin.unprepare([ref]))[ref.uid] == ""
    assert tree.driver_of(NVME) == "nvme"
    sched.deallocate("default", "vm")
    # now a container claim: it needs no switch (nvme): ready at once, nothing bound
    before = len(_bind_writes(kernel))
    sched.allocate("default", "ct", NODE)
    assert await _prebind(sched, "ct") == "bound"
    assert _bind_writes(kernel)[before:] == []
    ct = _ref(apiserver, "ct")
    out = (await plugin.prepare([ct]))[ct.uid]
    assert out.error == "" and tree.driver_of(NVME) == "nvme"
    with pytest.raises(Unschedulable):  # and the VM entry is not allocated meanwhile
        sched.allocate("default", "vm", NODE)


def PCI(text: str) -> Any:
    from vfio_dp.model.address import PciAddress

    return PciAddress.parse(text)


async def test_a_switch_that_cannot_happen_says_failed_and_the_scheduler_gives_up(
    apiserver: ApiServerStandin, plugin: DraPlugin, tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """Group 6 was published while its NIC was down; the host brings eth1 up before the
    claim is allocated: the switch is refused, named, nothing is touched."""
    net = tree.dev_dir(SIBLING) / "net" / "eth1"
    (net / "flags").write_text("0x1003\n")
    (net / "operstate").write_text("up\n")
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "pair", "pair-vm")
    sched.allocate("default", "pair", NODE)
    before = len(kernel.writes)
    decision = await _decide(sched, "pair")
    assert decision.outcome == "deallocated"
    assert decision.why == f"pci-0000-05-00-0: {FAILED}: SwitchRefused"
    failed = decision.condition
    assert failed is not None and failed["status"] == "True"
    assert "eth1 is up" in failed["message"] and SIBLING in failed["message"]
    assert kernel.writes[before:] == []  # the device is left as it was
    assert tree.driver_of(PAIR) == "nvme" and tree.driver_of(SIBLING) == "e1000e"
    uid = _stored(apiserver, "pair")["metadata"]["uid"]
    assert plugin.claims.checkpoint.get(uid) is None
    assert plugin.core.host.record_holders() == {}
    assert "allocation" not in (_stored(apiserver, "pair").get("status") or {})


async def test_a_driver_that_refuses_the_device_says_failed_and_leaves_it_as_it_was(
    apiserver: ApiServerStandin, plugin: DraPlugin, tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """vfio-pci's probe does not take the NVMe: the bind is rolled back (nvme again), the
    claim says DriverSwitchFailed with the bind's error, and its record is dropped."""
    kernel.refuse_attach.add((NVME, "vfio-pci"))
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    sched.allocate("default", "vm", NODE)
    decision = await _decide(sched, "vm")
    assert decision.why == f"{VM_ENTRY}: {FAILED}: DriverSwitchFailed", decision
    failed = decision.condition
    assert failed is not None and NVME in failed["message"]
    assert "binding the IOMMU group to its VFIO driver failed" in failed["message"]
    assert tree.driver_of(NVME) == "nvme"
    assert plugin.core.host.record_holders() == {}
    assert plugin.claims.checkpoint.all() == {}
    # the scheduler tries again elsewhere; here the container entry is free meanwhile
    _claim(apiserver, "ct", "nvme-ct")
    sched.allocate("default", "ct", NODE)
    assert await _prebind(sched, "ct") == "bound"


async def test_a_claim_deleted_before_prepare_has_its_record_dropped(
    apiserver: ApiServerStandin, plugin: DraPlugin, tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """The device stays where the switch put it, held by the pool (nothing unowned); the
    pool's next claim, a container one, takes it over: back on nvme, the pool hold gone."""
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    sched.allocate("default", "vm", NODE)
    assert await _prebind(sched, "vm") == "bound"
    uid = _ref(apiserver, "vm").uid
    assert plugin.claims.checkpoint.get(uid) is not None
    before = len(_bind_writes(kernel))
    k8s.ResourceV1Api(apiserver.client()).delete_namespaced_resource_claim("vm", "default")
    await until("the record dropped", lambda: plugin.ahead.dropped == 1)
    assert plugin.claims.checkpoint.get(uid) is None
    assert tree.driver_of(NVME) == "vfio-pci" and _bind_writes(kernel)[before:] == []
    assert plugin.core.host.record_holders() == {PCI(NVME): f"pool:{DRIVER}"}  # not unowned
    # the pool's next claim: a container one switches it back and the pool hold drops
    _claim(apiserver, "ct", "nvme-ct")
    sched.allocate("default", "ct", NODE)
    assert await _prebind(sched, "ct") == "bound"
    assert tree.driver_of(NVME) == "nvme"
    assert plugin.core.host.record_holders() == {}
    ct = _ref(apiserver, "ct")
    out = (await plugin.prepare([ct]))[ct.uid]
    assert out.error == "", out.error


async def test_a_record_a_crash_left_before_the_switch_is_settled_at_start(
    apiserver: ApiServerStandin,
    kdirs: tuple[str, str],
    tmp_path: Path,
    tree: SysfsTree,
    kernel: SimulatedKernel,
) -> None:
    """The state a crash between the ``switched`` record and the switch leaves: the record
    durable, the device untouched. At the next start the watch lists the claim (still
    allocated, no condition) and the switch is done; a record of a claim that is gone is
    dropped by reconcile; nothing is left unowned."""
    _classes(apiserver)
    first = _plugin(apiserver, kdirs, tmp_path, tree, kernel)
    await first.start()
    await until("the pool", lambda: {VM_ENTRY, PAIR_CT} <= pool(apiserver)[1])
    await first.stop()
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    sched.allocate("default", "vm", NODE)
    uid = _ref(apiserver, "vm").uid
    checkpoint = first.claims.checkpoint
    checkpoint.commit(checkpoint.stage(ClaimRecord("default", "vm", uid, SWITCHED, "", None, ())))
    checkpoint.commit(
        checkpoint.stage(ClaimRecord("default", "gone", "uid-gone", SWITCHED, "", None, ()))
    )
    assert tree.driver_of(NVME) == "nvme"
    second = _plugin(apiserver, kdirs, tmp_path, tree, kernel)
    await second.start()
    try:
        assert await _prebind(sched, "vm") == "bound"
        assert tree.driver_of(NVME) == "vfio-pci"
        assert second.core.host.record_holders()[PCI(NVME)] == f"claim:{uid}"
        assert second.claims.checkpoint.get("uid-gone") is None
        assert set(second.claims.checkpoint.all()) == {uid}
    finally:
        await second.stop()


async def test_a_failed_condition_write_is_retried_with_a_bounded_backoff(
    apiserver: ApiServerStandin, plugin: DraPlugin, tree: SysfsTree
) -> None:
    """The status write fails 3 times (503): it is written again after 1, 2 and 4 s, not at
    the watch's next list (up to 300 s later); the scheduler binds."""
    assert plugin.binding is not None
    apiserver.fail_next("PUT", "resourceclaims", 3, status=True)
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    sched.allocate("default", "vm", NODE)
    assert await _prebind(sched, "vm") == "bound"
    assert plugin.binding.failures == 3
    assert _conditions(apiserver, "vm", VM_ENTRY)[READY]["status"] == "True"
    assert tree.driver_of(NVME) == "vfio-pci"


async def test_a_condition_write_still_retried_is_dropped_when_the_claim_goes(
    apiserver: ApiServerStandin, plugin: DraPlugin
) -> None:
    assert plugin.binding is not None
    apiserver.fail_next("PUT", "resourceclaims", 1000, status=True)
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    sched.allocate("default", "vm", NODE)
    uid = _ref(apiserver, "vm").uid
    await until("a failed write, retried", lambda: plugin.binding.failures >= 2)  # type: ignore[union-attr]
    assert plugin.binding.pending(uid)
    k8s.ResourceV1Api(apiserver.client()).delete_namespaced_resource_claim("vm", "default")
    await until("the retry given up", lambda: not plugin.binding.pending(uid))  # type: ignore[union-attr]
    failures = plugin.binding.failures
    await asyncio.sleep(2.5)  # past the next retry it would have made (2 s, then 4 s)
    assert plugin.binding.failures == failures
