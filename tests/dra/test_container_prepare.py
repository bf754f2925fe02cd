"""One pool for containers and VMs, the node side (issue 36, item 3), on the kernel simulator:
a container claim (``pci-…-native``) gets the group on its native driver and its own device
nodes; a VFIO claim afterwards binds it; every switch goes through bind's and unbind's locks,
journal, records and refusals; a switch that cannot happen leaves the device as it was."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.dra.test_prepare import DRIVER, NODE, Claims, _boot, result, run
from tests.host.test_devnodes import NVME_NODES
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.claimpath import cdi
from vfio_dp.dra.claimpath import metadata as mdfile
from vfio_dp.dra.claimpath.prepare import ClaimPreparer
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text

NVME = "0000:01:00.0"
NVME_VM = "pci-0000-01-00-0"
NVME_CT = "pci-0000-01-00-0-native"
PAIR, SIBLING = "0000:05:00.0", "0000:05:00.1"  # one group: an NVMe and a NIC the host uses
NIC = "0000:02:00.0"
NODES = {"/dev/nvme0", "/dev/nvme0n1", "/dev/ng0n1"}

CONFIG = """
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


@pytest.fixture
def tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path / "root")
    t.add(Dev(NVME, "1b36", "0010", "010802", driver="nvme", group=3))
    t.add(Dev(NIC, "8086", "10d3", "020000", driver="e1000e", group=4))
    t.add(Dev(PAIR, "1b36", "0010", "010802", driver="nvme", group=6))
    t.add(Dev(SIBLING, "8086", "10d3", "020000", driver="e1000e", group=6))
    t.add_net(SIBLING, "eth1", up=True)
    t.add_net(NIC, "eth0", up=True)
    _boot(t, "boot-1")
    return t


@pytest.fixture
def kernel(tree: SysfsTree) -> SimulatedKernel:
    k = SimulatedKernel(tree)
    k.native_nodes[NVME] = list(NVME_NODES)
    k.make_nodes(NVME)
    k.native_nodes[PAIR] = [("nvme/nvme1", "char", "242:1", "nvme1")]
    k.make_nodes(PAIR)
    return k


@pytest.fixture
def preparer(tree: SysfsTree, kernel: SimulatedKernel, tmp_path: Path) -> ClaimPreparer:
    return _preparer(tree, kernel, tmp_path)


def _preparer(tree: SysfsTree, kernel: SimulatedKernel, tmp_path: Path) -> ClaimPreparer:
    config = load_config_text(CONFIG, "test")
    return ClaimPreparer(
        host=Host(tree.root, kernel=kernel, runner="dra-plugin"),
        driver=DRIVER,
        node=NODE,
        cdi_dir=str(tmp_path / "cdi"),
        plugins_dir=str(tmp_path / "plugins"),
        read_claim=CLAIMS.read,
        config=lambda: config,
        node_timeout=10,
    )


CLAIMS = Claims()


@pytest.fixture(autouse=True)
def _fresh_claims() -> None:
    CLAIMS.objects.clear()
    CLAIMS.fail = None


def _spec_nodes(tmp_path: Path, uid: str) -> list[str]:
    spec = cdi.read_spec(str(tmp_path / "cdi"), DRIVER, uid)
    assert spec is not None
    devices: list[dict[str, Any]] = spec["devices"]  # type: ignore[assignment]
    return [n["path"] for d in devices for n in d["containerEdits"].get("deviceNodes", [])]


def _metadata(tmp_path: Path, uid: str, request: str) -> dict[str, Any]:
    base = Path(mdfile.claims_dir(str(tmp_path / "plugins"), DRIVER)) / uid / request
    (path,) = base.glob("*-metadata.json")
    first, _ = json.JSONDecoder().raw_decode(path.read_text())  # a stream: newest first
    return first  # type: ignore[no-any-return]


def _records(tree: SysfsTree) -> list[str]:
    return sorted(p.name for p in (tree.root / "var/lib/vfio_dp/original").glob("*.json"))


def test_a_container_claim_gets_the_nvme_nodes_and_unprepare_leaves_the_driver(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, tmp_path: Path
) -> None:
    ref = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    out = run(preparer.prepare([ref]))["uid-ct"]
    assert out.error == ""
    assert set(_spec_nodes(tmp_path, "uid-ct")) == NODES  # no /dev/vfio
    (dev,) = out.devices
    assert dev.device_name == NVME_CT
    assert dev.cdi_device_ids[0] == f"{DRIVER}/vfio=uid-ct-{NVME_CT}"
    meta = _metadata(tmp_path, "uid-ct", "disk")
    attrs = meta["requests"][0]["devices"][0]["attributes"]
    assert attrs["resource.kubernetes.io/pciBusID"] == {"string": NVME}
    assert set(attrs["deviceNodes"]["string"].split(",")) == NODES
    assert attrs["nativeDriver"] == {"string": "nvme"} and attrs["kind"] == {"string": "native"}
    assert tree.driver_of(NVME) == "nvme" and _records(tree) == []
    assert run(preparer.unprepare([ref])) == {"uid-ct": ""}
    assert tree.driver_of(NVME) == "nvme"  # Unprepare of a container claim leaves the driver


def test_a_vfio_claim_after_it_binds_and_its_unprepare_gives_the_group_back(
    tree: SysfsTree, preparer: ClaimPreparer, tmp_path: Path
) -> None:
    ct = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    assert run(preparer.prepare([ct]))["uid-ct"].error == ""
    assert run(preparer.unprepare([ct])) == {"uid-ct": ""}
    vm = CLAIMS.add("vm", "uid-vm", [result(NVME_VM, request="disk")])
    out = run(preparer.prepare([vm]))["uid-vm"]
    assert out.error == ""
    assert tree.driver_of(NVME) == "vfio-pci"
    assert _spec_nodes(tmp_path, "uid-vm") == ["/dev/vfio/vfio", "/dev/vfio/3"]
    assert run(preparer.unprepare([vm])) == {"uid-vm": ""}
    assert tree.driver_of(NVME) == "nvme" and _records(tree) == []
    assert (tree.root / "dev/nvme0n1").exists()


def test_a_container_claim_switches_a_group_from_vfio_and_waits_for_its_nodes(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, tmp_path: Path
) -> None:
    vm = CLAIMS.add("vm", "uid-vm", [result(NVME_VM, request="disk")])
    assert run(preparer.prepare([vm]))["uid-vm"].error == ""  # records its nodes first
    assert tree.driver_of(NVME) == "vfio-pci"
    preparer.checkpoint.remove("uid-vm")  # a stale claim, its binding not yet given back
    kernel.node_delay = 0.3  # the namespace appears a moment after the probe
    ct = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    out = run(preparer.prepare([ct]))["uid-ct"]
    assert out.error == ""
    assert tree.driver_of(NVME) == "nvme" and tree.override_of(NVME) is None
    assert set(_spec_nodes(tmp_path, "uid-ct")) == NODES
    assert _records(tree) == []  # the stale claim's record went with the switch


def test_a_sibling_the_host_uses_blocks_both_personalities_named(
    tree: SysfsTree, preparer: ClaimPreparer
) -> None:
    for uid, device in (("uid-ct", "pci-0000-05-00-0-native"), ("uid-vm", "pci-0000-05-00-0")):
        ref = CLAIMS.add(uid, uid, [result(device, request="disk")])
        err = run(preparer.prepare([ref]))[uid].error
        assert SIBLING in err and "used by the host" in err and "eth1" in err, err
    assert tree.driver_of(PAIR) == "nvme" and tree.driver_of(SIBLING) == "e1000e"


def test_a_native_driver_that_refuses_fails_the_claim_and_leaves_the_device_as_it_was(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer
) -> None:
    vm = CLAIMS.add("vm", "uid-vm", [result(NVME_VM, request="disk")])
    assert run(preparer.prepare([vm]))["uid-vm"].error == ""
    preparer.checkpoint.remove("uid-vm")
    before = (tree.root / f"var/lib/vfio_dp/original/{NVME}.json").read_text()
    kernel.refuse_attach.add((NVME, "nvme"))
    ct = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    err = run(preparer.prepare([ct]))["uid-ct"].error
    assert "native driver failed" in err and "put back as it was" in err, err
    assert "restore to nvme did not take" in err
    assert tree.driver_of(NVME) == "vfio-pci" and tree.override_of(NVME) == "vfio-pci"
    assert (tree.root / f"var/lib/vfio_dp/original/{NVME}.json").read_text() == before
    assert not list((tree.root / "var/lib/vfio_dp/ops").glob("*.json"))


def test_a_group_with_no_device_nodes_is_not_given_as_a_container(
    tree: SysfsTree, preparer: ClaimPreparer
) -> None:
    tree.add_net(NIC, "eth0", up=False)  # not used by the host: only its lack of nodes
    ref = CLAIMS.add("ct", "uid-ct", [result("pci-0000-02-00-0-native", request="nic")])
    err = run(preparer.prepare([ref]))["uid-ct"].error
    assert "has no device nodes of its own on e1000e" in err, err
    assert tree.driver_of(NIC) == "e1000e"


def test_one_personality_at_a_time(tree: SysfsTree, preparer: ClaimPreparer) -> None:
    ct = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    assert run(preparer.prepare([ct]))["uid-ct"].error == ""
    vm = CLAIMS.add("vm", "uid-vm", [result(NVME_VM, request="disk")])
    err = run(preparer.prepare([vm]))["uid-vm"].error
    assert "prepared for claim default/ct (uid uid-ct) as a container" in err, err
    assert tree.driver_of(NVME) == "nvme"


def test_an_operators_binding_is_never_taken_for_a_container(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer
) -> None:
    host = Host(tree.root, kernel=kernel)
    from vfio_dp.host.devnodes import native_nodes

    native_nodes(host.fs, host.scan(usage=False), [PciAddress.parse(NVME)])
    host.bind([PciAddress.parse(NVME)], group=True, probe=False)
    ref = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    err = run(preparer.prepare([ref]))["uid-ct"].error
    assert f"{NVME} is bound to VFIO by operator" in err and f"vfioctl unbind {NVME}" in err
    assert tree.driver_of(NVME) == "vfio-pci"


def test_a_selector_offering_vm_alone_refuses_the_container_entry(
    tree: SysfsTree, kernel: SimulatedKernel, tmp_path: Path
) -> None:
    config = load_config_text(CONFIG.replace("[vm, container]", "[vm]"), "test")
    p = ClaimPreparer(
        host=Host(tree.root, kernel=kernel),
        driver=DRIVER,
        node=NODE,
        cdi_dir=str(tmp_path / "cdi"),
        plugins_dir=str(tmp_path / "plugins"),
        read_claim=CLAIMS.read,
        config=lambda: config,
    )
    ref = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    err = run(p.prepare([ref]))["uid-ct"].error
    assert "not offered as container here (its selector's personalities: [vm])" in err, err


def test_a_prepared_container_claim_holds_no_vfio_group_for_health(
    tree: SysfsTree, preparer: ClaimPreparer
) -> None:
    from vfio_dp.dra.observers.health import claim_holds

    ct = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    assert run(preparer.prepare([ct]))["uid-ct"].error == ""
    # a group on its native driver is not a VFIO group "moved to a host driver": never tainted
    assert claim_holds(preparer.checkpoint.all().values()).held == {}


def test_after_a_reboot_a_container_claim_is_verified_by_its_hardware(
    tree: SysfsTree, kernel: SimulatedKernel, preparer: ClaimPreparer, tmp_path: Path
) -> None:
    ct = CLAIMS.add("ct", "uid-ct", [result(NVME_CT, request="disk")])
    assert run(preparer.prepare([ct]))["uid-ct"].error == ""
    _boot(tree, "boot-2")  # and the plugin starts again
    report = run(_preparer(tree, kernel, tmp_path).reconcile())
    assert report.reverified == ["default/ct (uid uid-ct)"], report
    assert report.invalidated == []
    assert set(_spec_nodes(tmp_path, "uid-ct")) == NODES
