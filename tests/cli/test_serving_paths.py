"""``vfioctl list`` / ``groups`` say which path serves each resource, read as a given node
reads the config (``--node-name`` / ``NODE_NAME``): real processes on a temp sysfs tree."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_host_commands import run
from tests.dra.topologies import dra_host

CONFIG = """
selectors:
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "10d3"
    path: dra
    nodes: ["node-a"]
  - drivers: [vfio-pci]
    path: devicePlugin
"""


def test_list_and_groups_show_the_path_of_each_resource_per_node(tmp_path: Path) -> None:
    tree = dra_host(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    nic, gpu = "devices.kubevirt.io/8086_10d3", "devices.kubevirt.io/10de_1eb8"
    for node, nic_path in (("node-a", "dra"), ("node-b", "devicePlugin")):
        p = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json",
                env={"NODE_NAME": node})  # fmt: skip
        assert p.returncode == 0, p.stderr
        rows = {r["address"]: r for r in json.loads(p.stdout)}
        assert rows["0000:3b:00.0"]["served_by"] == "dra"
        assert rows["0000:3b:00.0"]["dra_resource"] == gpu
        assert rows["0000:65:00.0"]["served_by"] == nic_path, node
        p = run("groups", "--root", str(tree.root), "--config", str(cfg), "--node-name", node,
                "--no-probe", "-o", "json")  # fmt: skip
        assert p.returncode == 0, p.stderr
        groups = {g["group"]: g for g in json.loads(p.stdout)}
        assert groups[45]["resources"] == {gpu: "dra"}
        assert groups[50]["resources"] == {nic: nic_path}, node
    p = run("groups", "--root", str(tree.root), "--config", str(cfg), "--node-name", "node-a",
            "--no-probe")  # fmt: skip
    assert p.returncode == 0, p.stderr
    line = next(x for x in p.stdout.splitlines() if x.startswith("50 "))
    assert f"{nic} (dra)" in line
    p = run("list", "--root", str(tree.root), "--config", str(cfg))
    header, *lines = p.stdout.splitlines()
    assert "SERVED BY" in header
    line = next(x for x in lines if x.startswith("0000:65:00.0"))
    assert nic in line and "devicePlugin" in line  # no node name: node-limited is skipped
