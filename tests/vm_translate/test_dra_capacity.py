"""``--check-nodes`` counts what DRA serves for names a DeviceClass backs (KEP-5004): the
classes ``vfioctl deviceclasses`` makes, the slices the DRA plugin's real slice builder makes
on a temp sysfs tree; another driver's class makes its name unchecked, never denied."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.dra.topologies import dra_host
from vfio_dp.dra.deviceclasses import device_classes, ours
from vfio_dp.dra.slices import NodeRef, build_slices, published_devices
from vfio_dp.host import Host
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.config import load_config_text
from vm_translate.nodes import NodeResources, capacity_problems, dra_capacity, with_dra

REPO = Path(__file__).resolve().parents[2]
DRIVER = "vfio.dra.vfio-dp.io"
GPU = "devices.kubevirt.io/10de_1eb8"
NVME = "devices.kubevirt.io/144d_a808"


def _slices(tmp_path: Path, node: str, generation: int) -> list[dict[str, Any]]:
    config = load_config_text((REPO / "deploy/components/dra/config.yaml").read_text(), "dra")
    host = Host(dra_host(tmp_path / node).root)
    inv = host.scan()
    devices = published_devices(inv, config, pcie_roots(host.fs, inv.devices))
    return build_slices(devices, driver=DRIVER, node=NodeRef(node), generation=generation)


def test_dra_devices_count_for_the_names_our_classes_serve(tmp_path: Path) -> None:
    config = load_config_text((REPO / "deploy/components/dra/config.yaml").read_text(), "dra")
    classes = device_classes(config, DRIVER, [("10de", "1eb8"), ("144d", "a808")])
    assert [ours(c) for c in classes] == [(DRIVER, GPU), (DRIVER, NVME)]
    stale = _slices(tmp_path, "node-a", 1)
    for s in stale:  # an older generation of the same pool: ignored
        s["spec"]["devices"] = [*s["spec"]["devices"], *s["spec"]["devices"]]
    slices = [*stale, *_slices(tmp_path, "node-a", 2)]
    foreign = {
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "extendedResourceName": "nvidia.com/gpu",
            "selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}],
        },
    }
    counts, unchecked = dra_capacity([*classes, foreign], slices)
    assert counts == {"node-a": {GPU: 1, NVME: 1}}
    assert unchecked == {"nvidia.com/gpu"}
    nodes = with_dra(
        [NodeResources("node-a", {"cpu": 8}), NodeResources("node-b")], counts, unchecked
    )
    assert capacity_problems({GPU: 1, NVME: 1}, nodes) == []
    assert capacity_problems({"nvidia.com/gpu": 4}, nodes) == []  # another driver's: unchecked
    (p,) = capacity_problems({GPU: 2}, nodes)
    assert f"{GPU}: 2 requested but no schedulable node advertises more than 1 (node-a)" in p
    assert "kubectl get resourceslices" in p
    # without the classes, the same slices count for nothing (the name is not DRA-backed)
    assert dra_capacity([], slices) == ({}, frozenset())


def test_a_device_plugin_count_is_kept_where_it_is_larger() -> None:
    nodes = with_dra([NodeResources("a", {GPU: 3})], {"a": {GPU: 1}}, frozenset())
    assert nodes[0].allocatable[GPU] == 3


def test_a_class_whose_cel_is_edited_is_not_counted_as_ours() -> None:
    config = load_config_text('selectors:\n- {vendor: "10de", device: "1eb8", path: dra}\n', "c")
    (cls,) = device_classes(config, DRIVER)
    cls["spec"]["selectors"][0]["cel"]["expression"] += " && true"
    assert ours(cls) is None
