"""The bind record says who bound each device: operator, daemon, or a claim (kernel simulator)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.host import Host
from vfio_dp.host.state import (
    BOUND_BY_DAEMON,
    BOUND_BY_OPERATOR,
    bound_by_claim,
    claim_of,
)
from vfio_dp.model.address import PciAddress

NIC = PciAddress.parse("0000:03:01.0")
NIC2 = PciAddress.parse("0000:03:02.0")


def _record(tree: SysfsTree, addr: PciAddress) -> dict[str, object]:
    path = Path(tree.root) / "var/lib/vfio_dp/original" / f"{addr}.json"
    data: dict[str, object] = json.loads(path.read_text())
    return data


def test_default_is_operator_and_claim_binding_is_recorded(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    h = Host(tree.root, kernel=kernel)
    h.bind([NIC], group=True, probe=False, bound_by=bound_by_claim("uid-1"))
    assert _record(tree, NIC)["bound_by"] == "claim:uid-1"
    assert _record(tree, NIC2)["bound_by"] == "claim:uid-1"
    assert claim_of(str(_record(tree, NIC)["bound_by"])) == "uid-1"
    h.unbind([NIC, NIC2])
    h.bind([NIC], group=True, probe=False)
    assert _record(tree, NIC)["bound_by"] == BOUND_BY_OPERATOR
    assert claim_of(BOUND_BY_OPERATOR) is None and claim_of(BOUND_BY_DAEMON) is None


def test_old_record_without_the_field_reads_as_operator(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    h = Host(tree.root, kernel=kernel)
    h.bind([NIC], group=True, probe=False)
    p = Path(tree.root) / "var/lib/vfio_dp/original" / f"{NIC}.json"
    old = {k: v for k, v in json.loads(p.read_text()).items() if k != "bound_by"}
    p.write_text(json.dumps(old))
    rec = h.state.get(NIC)
    assert rec is not None and rec.bound_by == BOUND_BY_OPERATOR and rec.driver == "e1000"


def test_already_bound_device_keeps_its_owner(tree: SysfsTree, kernel: SimulatedKernel) -> None:
    """A claim preparing a group an operator bound does not take the binding over."""
    h = Host(tree.root, kernel=kernel)
    h.bind([NIC], group=True, probe=False)
    res = h.bind([NIC], group=True, probe=False, bound_by=bound_by_claim("uid-1"))
    assert sorted(res.already) == [NIC, NIC2] and res.bound == []
    assert _record(tree, NIC)["bound_by"] == BOUND_BY_OPERATOR


def test_stale_record_from_an_earlier_boot_is_taken_over(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """After a reboot the device is back on e1000 but the operator's record is still there: a
    claim binding it now owns the binding (else its Unprepare would strand it on vfio-pci)."""
    h = Host(tree.root, kernel=kernel)
    h.bind([NIC], group=True, probe=False)
    tree.set_override(str(NIC), None)
    tree.set_override(str(NIC2), None)
    tree.set_driver(str(NIC), "e1000")  # "reboot": host drivers again, records remain
    tree.set_driver(str(NIC2), "e1000")
    h.bind([NIC], group=True, probe=False, bound_by=bound_by_claim("uid-2"))
    assert _record(tree, NIC) == {
        "address": str(NIC),
        "driver": "e1000",
        "driver_override": None,
        "vendor": "8086",
        "device": "100e",
        "bound_by": "claim:uid-2",
    }
