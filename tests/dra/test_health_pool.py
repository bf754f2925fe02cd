"""The pool by group state (pure): who is published, tainted, withdrawn; taint values."""

from __future__ import annotations

from vfio_dp.core.health import HEALTHY, UNHEALTHY, DeviceHealth, Fault
from vfio_dp.dra.claimpath.checkpoint import PREPARED, PREPARING, ClaimRecord, DeviceRecord
from vfio_dp.dra.observers.health import claim_holds, pool_devices, reports, taint_value
from vfio_dp.dra.slices import Device
from vfio_dp.model.dra_metadata import Attribute

DRIVER = "vfio.example.com"


def _h(name: str, health: str, held: bool, *codes: str) -> DeviceHealth:
    faults = tuple(Fault(c, f"{c} on {name}") for c in codes)
    return DeviceHealth(name, health, faults, since=1763998874.0, checked=1763998900.0, held=held)


def test_published_tainted_withdrawn() -> None:
    states = {
        "a": _h("a", HEALTHY, False),
        "b": _h("b", UNHEALTHY, False, "not-ready"),  # unprepared, bad: withdrawn
        "c": _h("c", UNHEALTHY, True, "unbound"),  # prepared, bad: tainted
        "d": _h("d", UNHEALTHY, True, "function-gone"),  # gone from sysfs: last form
    }
    built = {n: Device(n, {}) for n in ("a", "b", "c")}
    last = {"d": Device("d", {"x": Attribute("int", 1)}, ({"key": "old"},))}
    out = pool_devices(states, built, last, {"c": "NoExecute"}, DRIVER)
    assert [d.name for d in out] == ["a", "c", "d"]
    assert "taints" not in out[0].to_json()
    assert out[1].to_json()["taints"] == [
        {
            "key": f"{DRIVER}/unhealthy",
            "value": "unbound",
            "effect": "NoExecute",  # a selector's taintEffect
            "timeAdded": "2025-11-24T15:41:14Z",
        }
    ]
    assert out[2].to_json()["attributes"] == {"x": {"int": 1}}
    assert out[2].taints[0]["effect"] == "NoSchedule"  # the default
    assert len(out[2].taints) == 1  # the old one replaced
    lines = reports(states, [d.name for d in out])
    assert [(r.device, r.health, r.checked) for r in lines] == [
        ("a", HEALTHY, 1763998900),
        ("c", UNHEALTHY, 1763998900),
        ("d", UNHEALTHY, 1763998900),
    ]
    assert lines[1].message == "unbound on c"


def test_an_unchanged_held_device_is_the_same_object() -> None:
    """Issue 39 row 1: every scan made each held device anew (``replace``), so 1,024 prepared
    devices compared deep and were encoded again by the publisher (its cache is by identity)
    at every change: now an unchanged one is the object it was."""
    states = {
        "a": _h("a", HEALTHY, True),  # prepared, healthy
        "c": _h("c", UNHEALTHY, True, "unbound"),  # prepared, tainted
    }
    built = {n: Device(n, {"x": Attribute("int", 1)}) for n in ("a", "c")}
    first = pool_devices(states, built, {}, {}, DRIVER)
    assert first[0] is built["a"]  # healthy: the built device itself
    again = pool_devices(
        states, dict(built), {}, {}, DRIVER,
        previous={d.name: d.taints for d in first}, kept={d.name: d for d in first},
    )  # fmt: skip
    assert again[0] is built["a"] and again[1] is first[1]  # the tainted one kept
    states["c"] = _h("c", UNHEALTHY, True, "host-driver")  # a new fault: a new taint
    changed = pool_devices(states, built, {}, {}, DRIVER, kept={d.name: d for d in first})
    assert changed[1] is not first[1] and changed[1].taints[0]["value"] == "host-driver"


def test_taint_value_fits_a_label_value() -> None:
    codes = ("unbound", "host-driver", "not-viable", "devnode-missing", "host-use", "function-gone")
    v = taint_value(_h("x", UNHEALTHY, True, *codes))
    assert v == "unbound.host-driver.not-viable.devnode-missing.host-use"  # the rest cut
    assert len(v) <= 63


def test_claim_holds_from_the_checkpoint() -> None:
    dev = DeviceRecord(("nic",), "node-a", "pci-0000-01-00-0", 5, ("0000:01:00.0",), ("8086:10d3",))
    admin = DeviceRecord(
        ("m",), "node-a", "pci-0000-02-00-0", None, ("0000:02:00.0",), ("8086:10d3",), True
    )
    holds = claim_holds([
        ClaimRecord("vms", "a", "u1", PREPARED, "", None, (dev, admin)),
        ClaimRecord("vms", "b", "u2", PREPARING, "", None, (dev,)),
    ])  # fmt: skip
    assert set(holds.held) == {"pci-0000-01-00-0"}  # adminAccess holds no group
    assert holds.held["pci-0000-01-00-0"].claims == ("vms/a (uid u1)",)
    assert holds.in_flight == {"pci-0000-01-00-0"}  # a prepare of ours under way


def test_the_same_taint_keeps_its_time_added() -> None:
    states = {"c": _h("c", UNHEALTHY, True, "unbound")}
    built = {"c": Device("c", {})}
    old = {"key": f"{DRIVER}/unhealthy", "value": "unbound", "effect": "NoSchedule",
           "timeAdded": "2025-01-01T00:00:00Z"}  # fmt: skip
    (kept,) = pool_devices(states, built, {}, {}, DRIVER, previous={"c": [old]})
    assert kept.taints[0]["timeAdded"] == "2025-01-01T00:00:00Z"
    other = {**old, "value": "host-driver"}  # another fault: a new taint, added now
    (new,) = pool_devices(states, built, {}, {}, DRIVER, previous={"c": [other]})
    assert new.taints[0]["timeAdded"] == "2025-11-24T15:41:14Z"
