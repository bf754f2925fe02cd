"""One resource name goes through one path on a node, and the path may differ per node.

Both node processes compose :class:`NodeCore`; it refuses to start (before binding anything)
when a resource name would be served by the device plugin AND by DRA on this node, naming
the selectors on each side, and keeps its config when a reload would cause it. Selectors
limited to nodes (``nodes:``) let one ConfigMap move a cluster node by node.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.dra.topologies import dra_host
from vfio_dp.core.node import CoreOptions, NodeCore
from vfio_dp.deviceplugin.listing import compute_listing
from vfio_dp.errors import ConfigError, PathConflictError
from vfio_dp.host import Host
from vfio_dp.model.config import DEVICE_PLUGIN, DRA, load_config_text
from vfio_dp.model.serving import dra_units, resource_path_conflicts

BOTH = """
selectors:
  - vendor: "15b3"
    device: "101c"
    resourceName: nics
    path: dra
  - vendor: "8086"
    device: "10d3"
    resourceName: nics
    path: devicePlugin
"""

NODE_BY_NODE = """
selectors:
  - vendor: "8086"
    device: "10d3"
    path: dra
    nodes: ["node-a", "gpu-*"]
  - vendor: "8086"
    device: "10d3"
    path: devicePlugin
"""

FINE = 'selectors:\n  - {vendor: "8086", device: "10d3", path: devicePlugin}\n'


def core(root: Path, config: Path, path: str, node: str | None = None) -> NodeCore:
    opts = CoreOptions(
        root=str(root), config_path=str(config), metrics_port=0, uevents=False, path=path,
        node_name=node,
    )  # fmt: skip
    return NodeCore(opts, Host(root))


@pytest.mark.parametrize(
    ("path", "process"),
    [(DEVICE_PLUGIN, "the device-plugin daemon"), (DRA, "the DRA plugin")],
)
async def test_both_processes_refuse_a_name_served_both_ways(
    tmp_path: Path, path: str, process: str
) -> None:
    tree = dra_host(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(BOTH)
    c = core(tree.root, cfg, path, "node-a")
    with pytest.raises(PathConflictError) as err:
        await c.start()
    await c.close()
    text = str(err.value)
    assert text.startswith(f"{process} refuses to start: on node node-a")
    assert "devices.kubevirt.io/nics: selectors[1] (path: devicePlugin) takes 0000:65:00.0" in text
    assert "selectors[0] (path: dra) takes 0000:af:00.1" in text
    assert "another resourceName or the same path" in text


async def test_a_reload_that_would_serve_a_name_both_ways_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = dra_host(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(FINE)
    c = core(tree.root, cfg, DEVICE_PLUGIN)
    await c.start()
    try:
        before = c.config
        cfg.write_text(BOTH + "# changed\n")
        with caplog.at_level(logging.ERROR, logger="vfio_dp.core"):
            await c.check_config()
        assert c.config is before
        assert "keeping the previous configuration" in caplog.text
        assert "devices.kubevirt.io/nics" in caplog.text
    finally:
        await c.close()


def test_the_path_may_differ_per_node(tmp_path: Path) -> None:
    tree = dra_host(tmp_path / "host")
    inv = Host(tree.root).scan()
    cfg = load_config_text(NODE_BY_NODE, "c")
    nic = "devices.kubevirt.io/8086_10d3"
    for node, dra in (("node-a", True), ("gpu-7", True), ("node-b", False), (None, False)):
        on = cfg.for_node(node)
        listed = nic in compute_listing(inv, on).resources
        published = [u.resource_name for u in dra_units(inv, on) if u.published]
        assert (nic in published, listed) == (dra, not dra), node
        assert resource_path_conflicts(inv, on) == [], node


async def test_a_process_without_its_node_name_skips_node_limited_selectors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tree = dra_host(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(NODE_BY_NODE)
    c = core(tree.root, cfg, DEVICE_PLUGIN)
    with caplog.at_level(logging.WARNING, logger="vfio_dp.core"):
        await c.start()
    await c.close()
    assert "set --node-name (NODE_NAME)" in caplog.text


def test_nodes_must_be_node_name_patterns() -> None:
    with pytest.raises(ConfigError, match=r"selectors\[0\]\.nodes: 'Node_A'"):
        load_config_text('selectors:\n- {vendor: "8086", nodes: [Node_A]}\n', "c")
    with pytest.raises(ConfigError, match="selects nothing"):
        load_config_text("selectors:\n- {nodes: [node-a], path: dra}\n", "c")
