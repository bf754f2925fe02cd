"""VFs vfio_dp made are published like any VF: one DRA device each, with their PF's address
(``pfPciBusID``) and ``resource.kubernetes.io/pcieRoot``, each consuming one ``vfs`` counter
of its PF's counter set (KEP-4815), the sets in a slice of their own; the PF itself is not
published (kernel simulator on a temp tree; slices checked by the API-server stand-in's copy
of upstream validation and its allocator's pool check)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from tests.dra.apiserver_standin import pool_counter_problems, validate_slice
from tests.kernel_sim import SimulatedKernel
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.slices import (
    MAX_COUNTER_SETS,
    MAX_DEVICES_WITH_TAINTS,
    Device,
    NodeRef,
    build_slices,
    published_devices,
)
from vfio_dp.host import Host
from vfio_dp.host.sriov import Sriov
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import load_config_text

PFS = ("0000:01:00.0", "0000:02:00.0")
CONFIG = f"""selectors:
- addresses: ["{PFS[0]}", "{PFS[1]}"]
  numVfs: 2
  path: dra
"""


def test_made_vfs_are_published_with_their_pf(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    for i, pf in enumerate(PFS):
        port = f"0000:00:{0x1B + i:02x}.0"
        tree.add(Dev(port, "8086", "a113", "060400", driver="pcieport", group=10 + i))
        tree.add(Dev(pf, "1b36", "0010", "010802", driver="nvme", group=20 + i, parent=port,
                     sriov_totalvfs=2, sriov_numvfs=0))  # fmt: skip
    host = Host(tree.root, kernel=SimulatedKernel(tree))
    config = load_config_text(CONFIG, "c.yaml")
    for pf, (n, _) in config.wanted_vfs().items():
        assert Sriov(host).set(pf, n).bound  # made and on vfio-pci
    inv = host.scan()
    devices = published_devices(inv, config, pcie_roots(host.fs, inv.devices))
    by_pf: dict[str, list[str]] = {}
    for d in devices:
        a = d.to_json()["attributes"]
        assert a["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
        by_pf.setdefault(a["pfPciBusID"]["string"], []).append(
            a["resource.kubernetes.io/pciBusID"]["string"]
        )
    assert by_pf == {
        PFS[0]: ["0000:01:00.1", "0000:01:00.2"],
        PFS[1]: ["0000:02:00.1", "0000:02:00.2"],
    }
    assert all(PciAddress.parse(pf) in inv.devices for pf in PFS)  # the PFs exist, unpublished
    slices = build_slices(devices, driver="vfio.dra.vfio-dp.io", node=NodeRef("n"), generation=1)
    assert [validate_slice(s, None) for s in slices] == [[], []]
    assert pool_counter_problems(slices) == []
    devs, counters = (s["spec"] for s in slices)
    assert "sharedCounters" not in devs and "devices" not in counters  # one or the other
    assert devs["pool"]["resourceSliceCount"] == counters["pool"]["resourceSliceCount"] == 2
    assert counters["sharedCounters"] == [
        {"name": "pf-0000-01-00-0", "counters": {"vfs": {"value": "2"}}},
        {"name": "pf-0000-02-00-0", "counters": {"vfs": {"value": "2"}}},
    ]
    by_name = {d["name"]: d for d in devs["devices"]}
    assert by_name["pci-0000-02-00-1"]["consumesCounters"] == [
        {"counterSet": "pf-0000-02-00-0", "counters": {"vfs": {"value": "1"}}}
    ]


def _made_vfs(tmp_path: Path, pfs: int, vfs: int) -> list[Device]:
    """The published devices after ``numVfs: vfs`` made on ``pfs`` QEMU NVMe PFs."""
    tree = SysfsTree(tmp_path)
    addrs = [f"0000:{0x10 + i:02x}:00.0" for i in range(pfs)]
    for i, pf in enumerate(addrs):
        tree.add(Dev(pf, "1b36", "0010", "010802", driver="nvme", group=100 + i,
                     sriov_totalvfs=vfs, sriov_numvfs=0))  # fmt: skip
    host = Host(tree.root, kernel=SimulatedKernel(tree))
    text = f"selectors:\n- addresses: {addrs}\n  numVfs: {vfs}\n  path: dra\n"
    config = load_config_text(text, "c.yaml")
    for pf, (n, _) in config.wanted_vfs().items():
        assert Sriov(host).set(pf, n).bound
    inv = host.scan()
    return published_devices(inv, config, pcie_roots(host.fs, inv.devices))


def test_many_pfs_and_vfs_stay_within_every_slice_limit(tmp_path: Path) -> None:
    """11 PFs × 7 VFs: 77 counter-consuming devices (64 per slice at most) and 11 counter
    sets (8 per slice at most) — four slices, each valid, the pool consistent."""
    devices = _made_vfs(tmp_path, 11, 7)
    assert len(devices) == 77
    slices = build_slices(devices, driver="vfio.dra.vfio-dp.io", node=NodeRef("n"), generation=3)
    shape = [
        (len(s["spec"].get("devices") or []), len(s["spec"].get("sharedCounters") or []))
        for s in slices
    ]
    assert shape == [(MAX_DEVICES_WITH_TAINTS, 0), (13, 0), (0, MAX_COUNTER_SETS), (0, 3)]
    assert all(validate_slice(s, None) == [] for s in slices)
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {4}
    assert len({s["metadata"]["name"] for s in slices}) == 4
    assert pool_counter_problems(slices) == []


@pytest.mark.parametrize(
    ("break_it", "cause"),
    [
        (lambda s: s["spec"]["sharedCounters"][0].__setitem__("name", "PF_0"), "sharedCounters[0].name"),
        (lambda s: s["spec"]["sharedCounters"][0]["counters"]["vfs"].__setitem__("value", "two"), "value"),
        (lambda s: s["spec"]["sharedCounters"].extend(copy.deepcopy(s["spec"]["sharedCounters"][:1])), "Duplicate"),
        (lambda s: s["spec"].__setitem__("devices", []), "only one of"),
        (lambda s: s["spec"]["sharedCounters"][0].__setitem__("counters", {}), "counters"),
    ],
)  # fmt: skip
def test_standin_refuses_a_broken_counter_slice(
    tmp_path: Path, break_it: object, cause: str
) -> None:
    """The stand-in's validation of counter sets can fail (so the checks above mean something)."""
    devices = _made_vfs(tmp_path, 1, 2)
    _, counters = build_slices(devices, driver="d.example.com", node=NodeRef("n"), generation=1)
    assert validate_slice(counters, None) == []
    break_it(counters)  # type: ignore[operator]
    assert any(cause in f"{p} {m}" for p, m in validate_slice(counters, None))


def test_pool_check_sees_a_vf_without_its_counter_set(tmp_path: Path) -> None:
    devices = _made_vfs(tmp_path, 1, 2)
    devs, counters = build_slices(devices, driver="d.example.com", node=NodeRef("n"), generation=1)
    assert pool_counter_problems([devs]) == [
        "device pci-0000-10-00-1 consumes pf-0000-10-00-0/vfs, not defined",
        "device pci-0000-10-00-2 consumes pf-0000-10-00-0/vfs, not defined",
    ]
    counters["spec"]["sharedCounters"][0]["counters"]["vfs"]["value"] = "1"
    both = {"pci-0000-10-00-1", "pci-0000-10-00-2"}
    assert pool_counter_problems([devs, counters], allocated=both) == [
        "pf-0000-10-00-0/vfs: 2 consumed, 1 available"
    ]
    # upstream's rule: what is published may exceed a counter, what is allocated may not
    assert pool_counter_problems([devs, counters]) == []
    assert pool_counter_problems([devs, counters], allocated={"pci-0000-10-00-1"}) == []
