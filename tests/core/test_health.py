"""The core's health model: faults of a held group, and the debounce."""

from __future__ import annotations

from pathlib import Path

from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.core.health import (
    HEALTHY,
    UNHEALTHY,
    Fault,
    HealthModel,
    Held,
    Verdict,
    held_faults,
)
from vfio_dp.host import Host
from vfio_dp.model.address import PciAddress

A, B = PciAddress.parse("0000:01:00.0"), PciAddress.parse("0000:01:00.1")
BAD = Verdict(UNHEALTHY, (Fault("unbound", "x"),))
GOOD = Verdict(HEALTHY)


def _tree(tmp_path: Path) -> SysfsTree:
    t = SysfsTree(tmp_path)
    t.add(Dev(str(A), "8086", "10d3", "020000", driver="vfio-pci", group=5))
    t.add(Dev(str(B), "8086", "10d3", "020000", driver="vfio-pci", group=5))
    return t


def test_a_held_group_on_vfio_has_no_fault(tmp_path: Path) -> None:
    inv = Host(_tree(tmp_path).root).scan(usage=False)
    assert held_faults(Held("pci-0000-01-00-0", 5, (A, B)), inv, True) == ()


def test_each_fault_names_what_and_the_fix(tmp_path: Path) -> None:
    t = _tree(tmp_path)
    t.set_driver(str(B), "e1000e")
    inv = Host(t.root).scan(usage=False)
    (f,) = held_faults(Held("pci-0000-01-00-0", 5, (A, B)), inv, True)
    assert f.code == "host-driver"
    assert f.message.startswith(f"{B} (8086:10d3, e1000e) left vfio-pci for host driver e1000e")
    assert f.message.endswith(f"vfioctl bind --group {A}")
    t.set_driver(str(B), None)
    inv = Host(t.root).scan(usage=False)
    faults = held_faults(Held("pci-0000-01-00-0", 5, (A, B)), inv, False)
    assert [f.code for f in faults] == ["unbound"]  # devnode only counts when all on vfio
    t.set_driver(str(B), "vfio-pci")
    inv = Host(t.root).scan(usage=False)
    faults = held_faults(Held("pci-0000-01-00-0", 5, (A, B)), inv, False)
    assert [f.code for f in faults] == ["devnode-missing"]
    assert "/dev/vfio/5 is missing" in faults[0].message
    t.remove(str(B))
    inv = Host(t.root).scan(usage=False)
    (f,) = held_faults(Held("pci-0000-01-00-0", 5, (A, B)), inv, True)
    assert f.code == "function-gone" and str(B) in f.message


def test_a_held_change_needs_a_confirming_scan() -> None:
    m = HealthModel()
    m.update({"d": GOOD}, held={"d"}, now=1.0)
    u = m.update({"d": BAD}, held={"d"}, now=2.0)
    assert u.pending == ("d",) and m.states["d"].health == HEALTHY
    u = m.update({"d": BAD}, held={"d"}, now=3.0)
    assert [c.health for c in u.changed] == [UNHEALTHY] and m.states["d"].since == 3.0
    # a flap (one bad scan) never reaches the state
    m.update({"d": GOOD}, held={"d"}, now=4.0)
    m.update({"d": GOOD}, held={"d"}, now=5.0)
    m.update({"d": BAD}, held={"d"}, now=6.0)
    m.update({"d": GOOD}, held={"d"}, now=7.0)
    assert m.states["d"].health == HEALTHY and m.states["d"].since == 5.0


def test_an_unchanged_scan_keeps_the_state_and_moves_its_checked_time() -> None:
    """An idle resync rebuilds nothing (4,096 states per resync cost the idle DRA plugin
    most of its CPU): the state object stays, its last check is the last scan; a verdict
    waiting for confirmation keeps the time of the scan before it."""
    m = HealthModel()
    m.update({"a": GOOD, "b": GOOD}, held={"b"}, now=1.0)
    first = dict(m.states)
    m.update({"a": GOOD, "b": GOOD}, held={"b"}, now=2.0)
    assert m.states["a"] is first["a"] and m.states["b"] is first["b"]
    assert (m.checked("a"), m.checked("b")) == (2.0, 2.0)
    u = m.update({"a": GOOD, "b": BAD}, held={"b"}, now=3.0)
    assert u.pending == ("b",) and (m.checked("a"), m.checked("b")) == (3.0, 2.0)
    m.update({"a": GOOD, "b": BAD}, held={"b"}, now=4.0)  # confirmed
    assert m.states["b"].health == UNHEALTHY and m.checked("b") == 4.0


def test_unheld_changes_at_once_and_in_flight_never_changes() -> None:
    m = HealthModel()
    m.update({"d": GOOD}, held=set(), now=1.0)
    assert m.update({"d": BAD}, held=set(), now=2.0).changed[0].health == UNHEALTHY
    m = HealthModel()
    m.update({"d": GOOD}, held={"d"}, now=1.0)
    for t in (2.0, 3.0, 4.0):  # our own bind/unbind: never a fault
        u = m.update({"d": BAD}, held={"d"}, in_flight={"d"}, now=t)
        assert u.changed == () and u.pending == ()
    assert m.states["d"].health == HEALTHY and m.checked("d") == 4.0
    assert m.update({}, held=set(), now=5.0).gone == ("d",)
