"""A pool hold (issue 36 item 4): a claim switched to VFIO ahead of its pod that goes away
before its pod leaves the device on its VFIO driver, held by the DRA driver's pool on this
node (bind record ``bound_by: pool:<driver>``), never unowned and never given back behind
the next claim's back.

The pool's next claim takes it over (a VFIO claim with no driver work, a container claim
switching it back: tests/dra/test_claim_watch.py); everyone else is refused naming the hold
and the fix (``vfioctl bind``, a front-end's ``bind: true``, another driver's claim);
``vfioctl unbind`` and ``unbind --all`` give it back; a restart keeps it; the previous
release reads the record and leaves it alone. On the kernel simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import kubernetes.client as k8s
import pytest

from tests.dra import test_claim_watch
from tests.dra.apiserver_standin import ApiServerStandin
from tests.dra.conftest import NODE
from tests.dra.scheduler_standin import SchedulerStandin
from tests.dra.test_claim_watch import (
    CONFIG,
    NVME,
    PCI,
    VM_ENTRY,
    _bind_writes,
    _classes,
    _plugin,
    _prebind,
    _ref,
)
from tests.dra.test_dra_plugin import DRIVER, pool, until
from tests.dra.test_scheduler_standin import _claim
from tests.kernel_sim import SimulatedKernel
from tests.releases import PREVIOUS_MAIN, archive
from tests.sysfs_tree import SysfsTree
from vfio_dp.dra.claimpath.claims import AllocationResult
from vfio_dp.dra.claimpath.steps import DeviceSteps
from vfio_dp.dra.plugin import DraPlugin
from vfio_dp.errors import ClaimError, RefusedError
from vfio_dp.host import Host, devnodes
from vfio_dp.host.bound_by import (
    BOUND_BY_DEVICE_PLUGIN,
    BOUND_BY_DRA_PLUGIN,
    BOUND_BY_OPERATOR,
    bound_by_claim,
    bound_by_pool,
    claim_takes,
    pool_refusal,
)
from vfio_dp.model.config import load_config_text

POOL = bound_by_pool(DRIVER)
# the claim watch tests' fixtures: its tree (two NVMe groups), kernel and started plugin
tree = test_claim_watch.tree
kernel = test_claim_watch.kernel
plugin = test_claim_watch.plugin


def _pool_held(tree: SysfsTree, kernel: SimulatedKernel, driver: str = DRIVER) -> Host:
    """NVME on vfio-pci, as a claim's switch ahead bound it, then held by ``driver``'s pool."""
    host = Host(tree.root, kernel=kernel)
    devnodes.native_nodes(host.fs, host.scan_groups([PCI(NVME)]), [PCI(NVME)])  # as a scan does
    host.bind([PCI(NVME)], group=True, probe=False, bound_by=bound_by_claim("u1"))
    host.adopt([PCI(NVME)], bound_by_pool(driver), replacing=lambda h: h == "claim:u1")
    assert tree.driver_of(NVME) == "vfio-pci"
    assert host.record_holders() == {PCI(NVME): bound_by_pool(driver)}
    return host


def test_the_rule_of_a_pool_hold() -> None:
    a = PCI(NVME)
    assert claim_takes(POOL, DRIVER) and claim_takes("claim:u0", DRIVER)
    assert not claim_takes(bound_by_pool("other.example.com"), DRIVER)
    assert not claim_takes(BOUND_BY_OPERATOR, DRIVER)
    assert pool_refusal(a, POOL, "claim:u2", DRIVER) is None  # its pool's claim
    assert pool_refusal(a, POOL, "claim:u2") is None  # a claim's bind (driver unknown)
    assert pool_refusal(a, POOL, POOL) is None
    assert pool_refusal(a, BOUND_BY_OPERATOR, BOUND_BY_DEVICE_PLUGIN) is None  # not a pool
    for holder, driver in (
        (BOUND_BY_OPERATOR, None),
        (BOUND_BY_DEVICE_PLUGIN, None),
        (BOUND_BY_DRA_PLUGIN, None),
        ("claim:u2", "other.example.com"),  # another driver's claim
    ):
        why = pool_refusal(a, POOL, holder, driver)
        assert why is not None and f"held by the DRA pool of {DRIVER}" in why, holder
        assert f"vfioctl unbind {NVME}" in why


@pytest.mark.parametrize("holder", [BOUND_BY_OPERATOR, BOUND_BY_DEVICE_PLUGIN, BOUND_BY_DRA_PLUGIN])
def test_a_bind_by_anyone_else_is_refused_naming_the_pool_hold(
    tree: SysfsTree, kernel: SimulatedKernel, holder: str
) -> None:
    host = _pool_held(tree, kernel)
    for dry_run in (True, False):
        with pytest.raises(RefusedError) as e:
            host.bind([PCI(NVME)], group=True, probe=False, bound_by=holder, dry_run=dry_run)
        assert f"held by the DRA pool of {DRIVER}" in str(e.value)
        assert f"vfioctl unbind {NVME}" in str(e.value)
    assert host.record_holders() == {PCI(NVME): POOL}  # nothing changed
    # a claim's bind (the pool's next claim) goes through: already on vfio-pci
    out = host.bind([PCI(NVME)], group=True, probe=False, bound_by="claim:u2")
    assert out.already == [PCI(NVME)]


def test_another_drivers_claim_is_refused_before_anything_is_touched(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    host = _pool_held(tree, kernel, "other.example.com")
    config = load_config_text(CONFIG, "test")
    steps = DeviceSteps(
        host=host, driver=DRIVER, config=lambda: config, published=None, node_timeout=1.0
    )
    for device in (VM_ENTRY, f"{VM_ENTRY}-native"):
        wanted = [AllocationResult("r", DRIVER, NODE, device, binding_conditions=("x",))]
        inv, chosen = steps.resolve("claim default/c", "u2", wanted)
        with pytest.raises(ClaimError, match=r"held by the DRA pool of other\.example\.com"):
            steps.check({}, "claim default/c", "u2", chosen, inv)
    # its own pool's hold: taken over, by either personality
    host.adopt([PCI(NVME)], POOL, replacing=lambda h: True)
    for device in (VM_ENTRY, f"{VM_ENTRY}-native"):
        wanted = [AllocationResult("r", DRIVER, NODE, device, binding_conditions=("x",))]
        inv, chosen = steps.resolve("claim default/c", "u2", wanted)
        steps.check({}, "claim default/c", "u2", chosen, inv)


def test_vfioctl_unbind_and_unbind_all_give_a_pool_hold_back(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    host = _pool_held(tree, kernel)
    out = host.unbind([PCI(NVME)])
    assert out.restored == [(PCI(NVME), "nvme")]
    assert tree.driver_of(NVME) == "nvme" and host.record_holders() == {}
    host = _pool_held(tree, kernel)
    out = host.unbind_all()  # the uninstall path: every device given back
    assert out.restored == [(PCI(NVME), "nvme")]
    assert tree.driver_of(NVME) == "nvme" and host.record_holders() == {}


async def test_a_vm_claim_takes_a_pool_hold_over_with_no_driver_work(
    apiserver: ApiServerStandin, plugin: DraPlugin, tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
    _claim(apiserver, "vm", "nvme-vm")
    sched.allocate("default", "vm", NODE)
    assert await _prebind(sched, "vm") == "bound"
    k8s.ResourceV1Api(apiserver.client()).delete_namespaced_resource_claim("vm", "default")
    await until("the pool hold", lambda: plugin.ahead.dropped == 1)
    assert plugin.core.host.record_holders() == {PCI(NVME): POOL}
    before = len(_bind_writes(kernel))
    _claim(apiserver, "again", "nvme-vm")
    sched.allocate("default", "again", NODE)
    assert await _prebind(sched, "again") == "bound"
    ref = _ref(apiserver, "again")
    assert plugin.core.host.record_holders() == {PCI(NVME): f"claim:{ref.uid}"}
    out = (await plugin.prepare([ref]))[ref.uid]
    assert out.error == "", out.error
    assert _bind_writes(kernel)[before:] == []  # already on vfio-pci: no driver work
    assert (await plugin.unprepare([ref]))[ref.uid] == ""  # given back as any VFIO claim
    assert tree.driver_of(NVME) == "nvme" and plugin.core.host.record_holders() == {}


async def test_a_claim_gone_while_the_plugin_was_down_is_held_by_the_pool_at_start(
    apiserver: ApiServerStandin,
    kdirs: tuple[str, str],
    tmp_path: Path,
    tree: SysfsTree,
    kernel: SimulatedKernel,
) -> None:
    """Reconcile at the next start finds the ``switched`` record of a claim that is gone:
    the device stays on vfio-pci, held by the pool (nothing unowned, nothing forgotten);
    the pool's next claim takes it over."""
    _classes(apiserver)
    first = _plugin(apiserver, kdirs, tmp_path, tree, kernel)
    await first.start()
    try:
        await until("the pool", lambda: VM_ENTRY in pool(apiserver)[1])
        sched = SchedulerStandin(apiserver, binding_timeout=60, interval=0.5)
        _claim(apiserver, "vm", "nvme-vm")
        sched.allocate("default", "vm", NODE)
        assert await _prebind(sched, "vm") == "bound"
    finally:
        await first.stop()
    uid = _ref(apiserver, "vm").uid
    k8s.ResourceV1Api(apiserver.client()).delete_namespaced_resource_claim("vm", "default")
    second = _plugin(apiserver, kdirs, tmp_path, tree, kernel)
    await second.start()
    try:
        assert second.claims.checkpoint.get(uid) is None
        assert tree.driver_of(NVME) == "vfio-pci"
        assert second.core.host.record_holders() == {PCI(NVME): POOL}
        _claim(apiserver, "again", "nvme-vm")
        sched.allocate("default", "again", NODE)
        assert await _prebind(sched, "again") == "bound"
        again = _ref(apiserver, "again").uid
        assert second.core.host.record_holders() == {PCI(NVME): f"claim:{again}"}
    finally:
        await second.stop()


def test_the_previous_release_reads_a_pool_hold_and_leaves_it_alone(
    tree: SysfsTree, kernel: SimulatedKernel, tmp_path: Path
) -> None:
    """A rollback: the previous release's reader parses the record (same fields), takes the
    holder for no claim's (so its reconcile never gives it back; its claims
    have no personalities), and its ``vfioctl unbind`` plans the restore."""
    _pool_held(tree, kernel)
    (tmp_path / "previous").mkdir()
    old = archive(PREVIOUS_MAIN, tmp_path / "previous")
    code = (
        "import json, sys\n"
        "from vfio_dp.host import Host\n"
        "from vfio_dp.host.state import claim_of\n"
        "host = Host(sys.argv[1])\n"
        "held = {str(a): r.bound_by for a, r in host.state.all().items()}\n"
        "plan = host.unbind(sorted(host.state.all()), dry_run=True)\n"
        "print(json.dumps({'held': held, 'claims': [claim_of(h) for h in held.values()],\n"
        "                  'restores': [[str(a), d] for a, d in plan.restored]}))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(tree.root), str(old)],
        env={"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120, check=False,
        cwd=old,  # ``-c`` puts the working directory first on sys.path: never this checkout
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout)
    assert seen == {"held": {NVME: POOL}, "claims": [None], "restores": [[NVME, "nvme"]]}


def test_vfioctl_list_shows_the_pool_hold_and_how_to_give_it_back(
    tree: SysfsTree, kernel: SimulatedKernel, tmp_path: Path
) -> None:
    from tests.cli.test_host_commands import run

    _pool_held(tree, kernel)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(CONFIG)
    p = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert rows[NVME]["held_by"] == POOL and rows[NVME]["driver"] == "vfio-pci"
    p = run("list", "--root", str(tree.root), "--config", str(cfg))
    line = next(x for x in p.stdout.splitlines() if x.startswith(NVME))
    assert f"held by {POOL}" in line and "vfioctl unbind gives it back" in line, p.stdout
