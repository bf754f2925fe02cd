"""The bind record says who bound each device: operator, a front-end (device-plugin,
dra-plugin; ``daemon`` from older versions) or a claim (kernel simulator)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import SysfsTree
from vfio_dp.host import Host
from vfio_dp.host.bound_by import (
    BOUND_BY_DAEMON,
    BOUND_BY_DEVICE_PLUGIN,
    BOUND_BY_DRA_PLUGIN,
    BOUND_BY_OPERATOR,
    bound_by_claim,
    claim_of,
    recovers,
)
from vfio_dp.host.state import OriginalDriver
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


# -- each front-end its own runner and holder; what older versions wrote still reads -------
def _journal(tree: SysfsTree, runner: str, addr: PciAddress) -> Path:
    """An interrupted bind's journal as a killed process of ``runner`` left it (the journal
    names its runner in the field ``owner``, as every release wrote it)."""
    d = Path(tree.root) / "var/lib/vfio_dp/ops"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"1-{runner}.json"
    p.write_text(json.dumps({
        "id": f"1-{runner}", "kind": "bind", "owner": runner, "pid": 999999, "started": 1.0,
        "devices": [{"address": str(addr), "target": "vfio-pci", "override": None,
                     "writes_done": 1, "next": None}],
    }))  # fmt: skip
    return p


def test_an_old_daemon_record_still_reads_as_a_front_end_binding(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """A record an older version wrote (``bound_by: daemon``, for either front-end) is read
    and is no claim's: a DRA claim never takes it over nor gives it back."""
    h = Host(tree.root, kernel=kernel)
    h.bind([NIC], group=True, probe=False, bound_by=BOUND_BY_DAEMON)
    assert _record(tree, NIC)["bound_by"] == "daemon"  # exactly what the old version wrote
    assert h.record_holders() == {NIC: "daemon", NIC2: "daemon"}
    assert h.holdings("daemon") == [NIC, NIC2] and h.holdings(bound_by_claim("u")) == []
    assert claim_of(BOUND_BY_DAEMON) is None
    taken = h.adopt([NIC, NIC2], bound_by_claim("u"), replacing=lambda o: claim_of(o) is not None)
    assert taken == [] and _record(tree, NIC)["bound_by"] == "daemon"
    assert h.release(bound_by_claim("u")).restored == []
    assert tree.driver_of(str(NIC)) == "vfio-pci" and tree.driver_of(str(NIC2)) == "vfio-pci"
    # a claim's binding over it is adopted, the old record is not: the check can fail
    h.state.put(OriginalDriver(str(NIC2), "e1000", None, "8086", "100e", bound_by_claim("old")))
    taken = h.adopt([NIC, NIC2], bound_by_claim("u"), replacing=lambda o: claim_of(o) is not None)
    assert taken == [(NIC2, "claim:old")] and _record(tree, NIC)["bound_by"] == "daemon"


def test_an_old_daemon_journal_is_finished_by_either_front_end(
    tree: SysfsTree, kernel: SimulatedKernel
) -> None:
    """An older version's bind, killed after its first write (the override), journaled as
    run by ``daemon``: the CLI's recovery leaves it (not its own), a front-end finishes it."""
    h = Host(tree.root, kernel=kernel)
    h.state.put(OriginalDriver(str(NIC), "e1000", None, "8086", "100e", BOUND_BY_DAEMON))
    tree.set_override(str(NIC), "vfio-pci")
    journal = _journal(tree, "daemon", NIC)
    out = Host(tree.root, kernel=kernel).recover(runner="vfioctl")
    assert out.recovered == [] and journal.exists()
    assert any("not started by vfioctl" in s for s in out.skipped)
    out = Host(tree.root, kernel=kernel, runner=BOUND_BY_DRA_PLUGIN).recover(
        runner=BOUND_BY_DRA_PLUGIN
    )
    assert len(out.recovered) == 1 and out.problems == []
    assert not journal.exists() and tree.override_of(str(NIC)) is None
    assert (
        tree.driver_of(str(NIC)) == "e1000"
        and not (Path(tree.root) / "var/lib/vfio_dp/original" / f"{NIC}.json").exists()
    )


def test_each_front_end_recovers_its_own_journals_and_old_daemon_ones() -> None:
    assert recovers(BOUND_BY_DEVICE_PLUGIN, BOUND_BY_DEVICE_PLUGIN)
    assert recovers(BOUND_BY_DRA_PLUGIN, BOUND_BY_DRA_PLUGIN)
    assert recovers(BOUND_BY_DEVICE_PLUGIN, BOUND_BY_DAEMON)
    assert recovers(BOUND_BY_DRA_PLUGIN, BOUND_BY_DAEMON)
    assert not recovers(BOUND_BY_DRA_PLUGIN, BOUND_BY_DEVICE_PLUGIN)
    assert not recovers(BOUND_BY_DEVICE_PLUGIN, BOUND_BY_DRA_PLUGIN)
    assert not recovers("vfioctl", BOUND_BY_DAEMON)  # the CLI names what to undo itself


def test_the_front_ends_name_themselves() -> None:
    from vfio_dp.deviceplugin.app import Options
    from vfio_dp.dra.plugin import DraOptions

    assert Options().core().front_end == BOUND_BY_DEVICE_PLUGIN == "device-plugin"
    dra = DraOptions(node_name="n", driver_name="vfio.example.com").core()
    assert dra.front_end == BOUND_BY_DRA_PLUGIN == "dra-plugin"
