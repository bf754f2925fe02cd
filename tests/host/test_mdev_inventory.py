"""Mediated devices read from a fake tree laid out as the kernel does (tests/mdev_tree.py), and
``vfioctl mdev``: what the sample ``mtty`` cannot show in the guest (vendor type names with
spaces and slashes, zero ``available_instances``, a parent gone mid-read, an instance of a type
its parent does not list)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mdev_tree import add_instance, add_parent, parent_dir
from tests.sysfs_tree import SysfsTree, gpu_host
from vfio_dp.host.mdev import read_mdevs
from vfio_dp.host.root import Root
from vfio_dp.model.address import PciAddress

GPU = "0000:3b:00.0"
U1 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1001"
U2 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1002"
U3 = "83b8f4f2-509f-382f-3c1e-e6bfe0fa1003"
BIN = Path(sys.executable).parent


@pytest.fixture
def host(tmp_path: Path) -> SysfsTree:
    t = gpu_host(tmp_path / "root")
    add_parent(t, "mtty", {"mtty-1": ("Single port serial", 24, "vfio-pci"),
                           "mtty-2": ("Dual port serial", 11, "vfio-pci")}, driver="mtty")  # fmt: skip
    add_instance(t, "mtty", "mtty-2", U1, group=70)
    add_parent(t, GPU, {"nvidia-222": ("GRID T4-1Q / 1 GB", 0, "vfio-pci"),
                        "nvidia-223": ("GRID T4-2Q", 8, "vfio-pci")})  # fmt: skip
    add_instance(t, GPU, "nvidia-222", U2, group=71)
    return t


def test_parents_types_and_instances_as_the_kernel_lays_them_out(host: SysfsTree) -> None:
    inv = read_mdevs(Root(str(host.root)))
    assert inv.problems == ()
    by = {p.name: p for p in inv.parents}
    assert set(by) == {"mtty", GPU}
    mtty, gpu = by["mtty"], by[GPU]
    assert mtty.address is None and mtty.driver == "mtty"
    assert gpu.address == PciAddress.parse(GPU) and gpu.driver == "nvidia"
    assert [(t.type_id, t.name, t.available, t.device_api) for t in mtty.types] == [
        ("mtty-1", "Single port serial", 24, "vfio-pci"),
        ("mtty-2", "Dual port serial", 11, "vfio-pci"),
    ]
    # the vendor's name keeps its spaces and slash; zero instances left is 0, not "none"
    assert gpu.type("nvidia-222") is not None
    assert gpu.type("nvidia-222").name == "GRID T4-1Q / 1 GB"  # type: ignore[union-attr]
    assert gpu.type("nvidia-222").available == 0  # type: ignore[union-attr]
    (i1,) = mtty.instances
    assert (i1.uuid, i1.type_id, i1.iommu_group, i1.vfio_node, i1.driver) == (
        U1,
        "mtty-2",
        70,
        "/dev/vfio/70",
        "vfio_mdev",
    )
    assert inv.parent_addresses() == frozenset({PciAddress.parse(GPU)})


def test_a_host_without_mdevs_reads_empty(tmp_path: Path) -> None:
    inv = read_mdevs(Root(str(gpu_host(tmp_path / "r").root)))
    assert inv.parents == () and inv.problems == ()


def test_an_instance_of_a_type_its_parent_does_not_list_is_shown_without_one(
    host: SysfsTree,
) -> None:
    inst = add_instance(host, "mtty", "mtty-1", U3, group=72)
    shutil.rmtree(parent_dir(host, "mtty") / "mdev_supported_types" / "mtty-1")
    inv = read_mdevs(Root(str(host.root)))
    mtty = next(p for p in inv.parents if p.name == "mtty")
    assert {i.uuid: i.type_id for i in mtty.instances} == {U1: "mtty-2", U3: None}
    assert any(U3 in p and "not one the parent lists" in p for p in inv.problems)
    assert inst.exists()


def test_a_parent_gone_while_read_leaves_its_instances_named_not_fatal(host: SysfsTree) -> None:
    (host.sys("class/mdev_bus") / "mtty").unlink()  # the driver went away under us
    inv = read_mdevs(Root(str(host.root)))
    assert [p.name for p in inv.parents] == [GPU]
    assert any(U1 in p and "parent mtty" in p for p in inv.problems)


def test_an_entry_that_is_not_a_uuid_is_left_out(host: SysfsTree) -> None:
    (host.sys("bus/mdev/devices") / "not-a-uuid").symlink_to("/nonexistent")
    inv = read_mdevs(Root(str(host.root)))
    assert {i.uuid for i in inv.instances} == {U1, U2}
    assert any("'not-a-uuid'" in p for p in inv.problems)


def test_links_out_of_the_root_are_not_followed(host: SysfsTree, tmp_path: Path) -> None:
    """A parent whose class link leads outside the root is left out, and said."""
    outside = tmp_path / "outside"
    (outside / "mdev_supported_types/evil-1").mkdir(parents=True)
    (outside / "mdev_supported_types/evil-1/name").write_text("evil\n")
    (host.sys("class/mdev_bus") / "evil").symlink_to(outside)
    inv = read_mdevs(Root(str(host.root)))
    assert "evil" not in {p.name for p in inv.parents}
    assert any("mdev parent evil" in p and "outside the root" in p for p in inv.problems)


def _vfioctl(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "vfioctl"), "mdev", "--root", str(root), *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_vfioctl_mdev_table_json_and_names(host: SysfsTree) -> None:
    table = _vfioctl(host.root)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["PARENT", "DRIVER", "TYPE", "NAME", "AVAILABLE", "API", "INSTANCES"]
    assert any(ln.startswith("mtty") and "mtty-2" in ln and U1 in ln for ln in lines)
    assert any("nvidia-222" in ln and "GRID T4-1Q / 1 GB" in ln and " 0 " in ln for ln in lines)
    wide = _vfioctl(host.root, "-o", "wide").stdout
    assert f"{U1}(group 70)" in wide
    doc = json.loads(_vfioctl(host.root, "-o", "json").stdout)
    gpu = next(p for p in doc if p["parent"] == GPU)
    assert gpu["address"] == GPU and gpu["instances"][0]["uuid"] == U2
    assert gpu["instances"][0]["vfioNode"] == "/dev/vfio/71"
    assert sorted(_vfioctl(host.root, "-o", "name").stdout.split()) == [f"mdev/{U1}", f"mdev/{U2}"]
