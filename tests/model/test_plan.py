"""The pure planners (vfio_dp.model.plan) on scanned states: no I/O, no kernel."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sysfs_tree import SysfsTree
from vfio_dp.errors import DeviceNotFoundError
from vfio_dp.host import Host
from vfio_dp.host.state import OriginalDriver
from vfio_dp.model.address import PciAddress
from vfio_dp.model.device import GroupStatus, Inventory
from vfio_dp.model.plan import plan_check, plan_unbind


def A(s: str) -> PciAddress:
    return PciAddress.parse(s)


@pytest.fixture
def inv(tree: SysfsTree) -> Inventory:
    return Host(tree.root).scan()


NIC = A("0000:65:00.0")  # on vfio-pci, group 50
REC = {NIC: OriginalDriver(str(NIC), "e1000e", None, "8086", "10d3")}


def test_unbind_busy_group_refused_unless_forced(inv: Inventory) -> None:
    plan = plan_unbind(inv, REC, [NIC], groups_in_use={50: True})
    assert len(plan.refusals) == 1  # refusals: the host does nothing at all
    assert "IOMMU group 50 is in use: /dev/vfio/50 is held open" in plan.refusals[0]
    assert "--force" in plan.refusals[0]
    plan = plan_unbind(inv, REC, [NIC], groups_in_use={50: True}, force=True)
    assert plan.refusals == () and [r.driver for r in plan.restores] == ["e1000e"]
    # a busy group that is not the device's does not matter
    assert plan_unbind(inv, REC, [NIC], groups_in_use={45: True}).refusals == ()


def test_unbind_targets_record_driver_or_probe(inv: Inventory) -> None:
    (r,) = plan_unbind(inv, REC, [NIC]).restores
    assert (r.address, r.driver, r.override) == (NIC, "e1000e", None)
    (r,) = plan_unbind(inv, {}, [NIC]).restores  # no record: let the kernel probe
    assert r.driver is None
    (r,) = plan_unbind(inv, REC, [NIC], driver="igb").restores
    assert r.driver == "igb"


def test_unbind_hardware_changed_refused(inv: Inventory) -> None:
    rec = {NIC: OriginalDriver(str(NIC), "e1000e", None, "8086", "1533")}
    plan = plan_unbind(inv, rec, [NIC])
    assert plan.restores == ()
    assert "record says 8086:1533 (hardware changed?)" in plan.refusals[0]


def test_unbind_already_off_vfio_forgets_a_fulfilled_record(inv: Inventory) -> None:
    gpu = A("0000:3b:00.0")  # on nvidia
    rec = {gpu: OriginalDriver(str(gpu), "nvidia", None, "10de", "1eb8")}
    plan = plan_unbind(inv, rec, [gpu])
    assert plan.already == (gpu,) and plan.forget == (gpu,) and plan.restores == ()


def test_unbind_unknown_address_raises_or_is_missing(inv: Inventory) -> None:
    gone = A("0000:99:00.0")
    with pytest.raises(DeviceNotFoundError):
        plan_unbind(inv, REC, [gone, NIC])
    plan = plan_unbind(inv, REC, [gone, NIC], skip_missing=True)
    assert plan.missing == (gone,) and [r.address for r in plan.restores] == [NIC]


def test_check_kernel_verdicts(inv: Inventory, tmp_path: Path) -> None:
    (ok,) = plan_check(inv, [NIC], {50: GroupStatus(viable=True, in_use=False)})
    assert ok.ready and ok.reasons == ()
    (busy,) = plan_check(inv, [NIC], {50: GroupStatus(viable=None, in_use=True)})
    assert "IOMMU group 50 is in use" in busy.reasons[0]
    (bad,) = plan_check(inv, [NIC], {50: GroupStatus(viable=False, in_use=False)})
    assert "not viable (VFIO_GROUP_GET_STATUS)" in bad.reasons[0]
    (none,) = plan_check(inv, [NIC], {})
    assert "/dev/vfio/50 does not exist" in none.reasons[0]


def test_a_host_use_is_its_text_and_carries_its_fix() -> None:
    """Listed, joined and JSON-encoded as the plain text it always was; ``fix`` rides along."""
    import json
    import pickle

    from vfio_dp.model.device import HostUse

    u = HostUse("network interface eth0 is up", "bring it down first: ip link set eth0 down")
    assert u == "network interface eth0 is up" and str(u) == u
    assert "; ".join([u, u]) == "network interface eth0 is up; network interface eth0 is up"
    assert json.loads(json.dumps([u])) == ["network interface eth0 is up"]
    again = pickle.loads(pickle.dumps(u))
    assert again == u and again.fix == u.fix
