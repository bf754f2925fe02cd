"""``vfioctl list`` and ``check`` say whether a device can be offered as a container
(issue 36, item 1): its own device nodes on its native driver, or why not (a NIC has none);
never a config-load failure. Real processes on a temp sysfs tree."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_host_commands import run
from tests.host.test_devnodes import NIC, NVME, nvme_tree

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


def test_list_names_the_container_entry_and_why_a_nic_has_none(tmp_path: Path) -> None:
    tree, _ = nvme_tree(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    p = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert rows[NVME]["dra_device"] == "pci-0000-01-00-0"
    assert rows[NVME]["dra_native_device"] == "pci-0000-01-00-0-native"
    assert rows[NVME]["not_offered_as_container"] is None
    assert rows[NIC]["dra_device"] == "pci-0000-02-00-0"  # still offered as vm
    assert rows[NIC]["dra_native_device"] is None
    assert "has no device nodes of its own on e1000e" in rows[NIC]["not_offered_as_container"]
    p = run("list", "--root", str(tree.root), "--config", str(cfg))
    line = next(x for x in p.stdout.splitlines() if x.startswith(NIC))
    assert "not offered as container" in line
    line = next(x for x in p.stdout.splitlines() if x.startswith(NVME))
    assert "pci-0000-01-00-0-native" in line


def test_list_says_when_the_cluster_drops_counters_first_personality_only(
    tmp_path: Path,
) -> None:
    """What the DRA plugin recorded of the API server (counters dropped: the record of
    :mod:`vfio_dp.dra.observers.api_fields`) is what ``list`` says: the NVMe offered as vm
    only, and why."""
    from vfio_dp.dra.observers.api_fields import ApiFields, ApiFieldsStore
    from vfio_dp.host.root import Root
    from vfio_dp.model.naming import DEFAULT_DRA_DRIVER

    tree, _ = nvme_tree(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    store = ApiFieldsStore(Root(str(tree.root)), DEFAULT_DRA_DRIVER)
    store.put(ApiFields(counters=False, binding=False))
    p = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert rows[NVME]["dra_device"] == "pci-0000-01-00-0"
    assert rows[NVME]["dra_native_device"] is None
    why = rows[NVME]["not_offered_as_container"]
    assert "drops ResourceSlice counters" in why and "first personality only (vm)" in why
    store.put(ApiFields())  # the gate on again: the plugin rewrites the record
    p = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert rows[NVME]["dra_native_device"] == "pci-0000-01-00-0-native"


def test_list_names_the_vfio_entry_left_out_when_container_comes_first(
    tmp_path: Path,
) -> None:
    """``personalities: [container, vm]`` on a cluster that drops counters: the container
    entry alone is published, and ``list`` says the VFIO entry (vm) is left out, and why."""
    from vfio_dp.dra.observers.api_fields import ApiFields, ApiFieldsStore
    from vfio_dp.host.root import Root
    from vfio_dp.model.naming import DEFAULT_DRA_DRIVER

    tree, _ = nvme_tree(tmp_path / "host")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.replace("[vm, container]", "[container, vm]"))
    ApiFieldsStore(Root(str(tree.root)), DEFAULT_DRA_DRIVER).put(ApiFields(counters=False))
    p = run("list", "--root", str(tree.root), "--config", str(cfg), "-o", "json")
    assert p.returncode == 0, p.stderr
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert rows[NVME]["dra_native_device"] == "pci-0000-01-00-0-native"
    assert rows[NVME]["not_offered_as_container"] is None
    why = rows[NVME]["not_offered_as_vm"]
    assert why is not None and "drops ResourceSlice counters" in why
    assert "first personality only (container); vm left out" in why
    p = run("list", "--root", str(tree.root), "--config", str(cfg))
    line = next(x for x in p.stdout.splitlines() if x.startswith(NVME))
    assert "not offered as vm: the API server drops ResourceSlice counters" in line
    assert " pci-0000-01-00-0 " not in line and "pci-0000-01-00-0-native" in line


def test_check_shows_the_nodes_a_container_would_get(tmp_path: Path) -> None:
    tree, _ = nvme_tree(tmp_path / "host")
    p = run("check", "--root", str(tree.root), NVME, NIC, "-o", "json")
    rows = {r["address"]: r for r in json.loads(p.stdout)}
    assert set(rows[NVME]["native_nodes"]) == {"/dev/nvme0", "/dev/nvme0n1", "/dev/ng0n1"}
    assert rows[NVME]["not_offered_as_container"] is None
    assert rows[NIC]["native_nodes"] == []
    assert "no device nodes of its own" in rows[NIC]["not_offered_as_container"]
    p = run("check", "--root", str(tree.root), NVME)
    assert (
        "its own device nodes (for a container): /dev/nvme0, /dev/ng0n1, /dev/nvme0n1" in p.stdout
    ), p.stdout
