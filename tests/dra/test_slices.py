"""The pure ResourceSlice builder on hidden-like topologies, checked against the API-server
stand-in's copy of upstream validation (tests/dra/apiserver_standin.validate_slice)."""

from __future__ import annotations

from pathlib import Path

from tests.dra.apiserver_standin import validate_slice
from tests.dra.topologies import DRA_CONFIG, PUBLISHED, dra_host
from tests.sysfs_tree import Dev, SysfsTree
from vfio_dp.dra.slices import (
    MAX_DEVICES_PER_SLICE,
    Device,
    NodeRef,
    build_slices,
    published_devices,
)
from vfio_dp.host import Host
from vfio_dp.host.topology import pcie_roots
from vfio_dp.model.config import DEFAULT_CONFIG, Config, load_config_text
from vfio_dp.model.serving import dra_units

DRIVER = "vfio.dra.vfio-dp.io"


def devices_of(tree: SysfsTree, config: Config) -> list[Device]:
    host = Host(tree.root)
    inv = host.scan()
    return published_devices(inv, config, pcie_roots(host.fs, inv.devices))


def test_exactly_the_right_devices_with_exactly_the_attributes(tmp_path: Path) -> None:
    tree = dra_host(tmp_path)
    config = load_config_text(DRA_CONFIG, "c.yaml")
    devices = {d.name: d.to_json()["attributes"] for d in devices_of(tree, config)}
    assert set(devices) == set(PUBLISHED)
    for name, (bus_id, group, functions) in PUBLISHED.items():
        a = devices[name]
        assert a["resource.kubernetes.io/pciBusID"] == {"string": bus_id}
        assert a["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
        assert a["iommuGroup"] == {"int": group} and a["functions"] == {"int": functions}
    gpu = devices["pci-0000-3b-00-0"]
    assert gpu == {
        "classID": {"string": "030200"},
        "deviceID": {"string": "1eb8"},
        "functions": {"int": 2},
        "groupFunctions": {"string": "0000:3b:00.1"},
        "iommuGroup": {"int": 45},
        "kind": {"string": "vfio"},
        "numaNode": {"int": 0},
        "resource.kubernetes.io/numaNode": {"int": 0},
        "resource.kubernetes.io/pciBusID": {"string": "0000:3b:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        "resourceName": {"string": "devices.kubevirt.io/10de_1eb8"},
        "subsystemDeviceID": {"string": "12a2"},
        "subsystemVendorID": {"string": "10de"},
        "vendorID": {"string": "10de"},
    }
    nvme = devices["pci-0000-07-00-0"]
    assert nvme["groupFunctions"] == {"string": "0000:08:00.0"} and "numaNode" not in nvme
    assert "resource.kubernetes.io/numaNode" not in nvme  # the kernel does not know it
    assert devices["pci-0000-af-00-1"]["resourceName"] == {"string": "devices.kubevirt.io/mlx-vf"}
    assert "groupFunctions" not in devices["pci-0000-af-00-1"]
    assert devices["pci-0000-af-00-1"]["pfPciBusID"] == {"string": "0000:af:00.0"}
    assert "pfPciBusID" not in gpu  # only VFs have a PF


def test_why_the_others_are_not_published(tmp_path: Path) -> None:
    tree = dra_host(tmp_path)
    config = load_config_text(DRA_CONFIG, "c.yaml")
    inv = Host(tree.root).scan()
    why = {u.group: u.reasons for u in dra_units(inv, config) if not u.published}
    assert list(why) == [3]  # the host's NIC; the device-plugin NIC is not DRA's at all
    assert "used by the host" in why[3][0] and "eth0" in why[3][0]
    assert "; fix: pick another device: eth0 is" in why[3][0], why[3][0]  # what frees it too


def test_a_group_binding_cannot_make_viable_is_not_published(tmp_path: Path) -> None:
    tree = dra_host(tmp_path)
    # a bridge in the GPU's group on a DMA driver (binding never touches bridges), and a
    # USB companion on its host driver (binding the group would fix that one)
    tree.add(Dev("0000:3b:00.3", "10de", "1ad9", "060400", driver="shpchp", group=45,
                 parent="0000:00:1c.0"))  # fmt: skip
    tree.add(Dev("0000:3b:00.2", "10de", "1ad8", "0c0330", driver="xhci_hcd", group=45,
                 parent="0000:00:1c.0"))  # fmt: skip
    config = load_config_text(DRA_CONFIG, "c.yaml")
    inv = Host(tree.root).scan()
    (gpu,) = [u for u in dra_units(inv, config) if u.group == 45]
    assert not gpu.published
    (why,) = gpu.reasons
    assert "cannot become viable" in why and "0000:3b:00.3" in why and "shpchp" in why
    assert gpu.endpoints[-1].function == 2  # the xhci companion would have been bound: fine


def test_every_slice_passes_upstream_validation_and_big_pools_split(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    for i in range(300):  # 300 VFs on vfio-pci, each its own group
        bus, fn = divmod(i, 8)
        tree.add(Dev(f"0000:{0x40 + bus // 32:02x}:{bus % 32:02x}.{fn}", "15b3", "101c",
                     "020000", driver="vfio-pci", group=100 + i))  # fmt: skip
    devices = devices_of(tree, DEFAULT_CONFIG)
    assert len(devices) == 300
    long_node = "n" * 63 + "." + "x" * 63 + "." + "y" * 63 + "." + "z" * 61  # 253 chars
    for node in ("node-a", long_node):
        slices = build_slices(devices, driver=DRIVER, node=NodeRef(node, "u-1"), generation=3)
        assert [len(s["spec"]["devices"]) for s in slices] == [128, 128, 44]
        for s in slices:
            assert validate_slice(s, None) == []
            assert s["spec"]["pool"] == {"name": node, "generation": 3, "resourceSliceCount": 3}
            assert s["metadata"]["ownerReferences"][0]["uid"] == "u-1"
            assert len(s["spec"]["devices"]) <= MAX_DEVICES_PER_SLICE
        assert len({s["metadata"]["name"] for s in slices}) == 3
    (empty,) = build_slices([], driver=DRIVER, node=NodeRef("node-a"), generation=1)
    assert empty["spec"]["devices"] == [] and validate_slice(empty, None) == []
    assert "ownerReferences" not in empty["metadata"]


def test_a_long_group_leaves_group_functions_out_rather_than_cut(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    for fn in range(7):  # 7 functions in one group: 6 others need 77 characters
        tree.add(Dev(f"0000:3b:00.{fn}", "8086", "1572", "020000", driver="vfio-pci", group=7))
    (dev,) = devices_of(tree, DEFAULT_CONFIG)
    assert dev.to_json()["attributes"]["functions"] == {"int": 7}
    assert "groupFunctions" not in dev.to_json()["attributes"]
    (s,) = build_slices([dev], driver="d" * 51 + ".example.com", node=NodeRef("n"), generation=1)
    assert validate_slice(s, None) == []


def test_vfio_driver_attribute_says_the_vfio_driver(tmp_path: Path) -> None:
    """``vfioDriver`` (issue 34): the VFIO driver a published device is on -- vfio-pci or a
    variant bound by hand -- so a claim can select, say, only mlx5_vfio_pci VFs with CEL;
    for a ``bind: onPrepare`` group not bound yet, the one Prepare will bind (chosen by the
    host and handed in)."""
    from vfio_dp.dra.slices import device_for

    tree = dra_host(tmp_path)
    tree.set_modules_alias(
        ["alias vfio_pci:v*d*sv*sd*bc*sc*i* vfio_pci",
         "alias vfio_pci:v000015B3d0000101Csv*sd*bc*sc*i* mlx5_vfio_pci"]
    )  # fmt: skip
    tree.load_module("mlx5_vfio_pci", vfio=True)
    tree.set_driver("0000:af:00.2", "mlx5_vfio_pci")
    config = load_config_text(DRA_CONFIG, "c.yaml")
    devices = {d.name: d.to_json()["attributes"] for d in devices_of(tree, config)}
    assert set(devices) == set(PUBLISHED)  # the variant's VF is published like the others
    assert devices["pci-0000-af-00-1"]["vfioDriver"] == {"string": "vfio-pci"}
    assert devices["pci-0000-af-00-2"]["vfioDriver"] == {"string": "mlx5_vfio_pci"}
    assert "vfioDriver" not in devices["pci-0000-3b-00-0"]  # onPrepare: nothing handed in
    host = Host(tree.root)
    inv = host.scan()
    gpu = next(u for u in dra_units(inv, config) if u.name == "pci-0000-3b-00-0")
    choice = host.vfio_choices(inv, [gpu.primary], gpu.vfio_driver)[gpu.primary]
    attrs = device_for(gpu, inv, {}, choice.driver).to_json()["attributes"]
    assert attrs["vfioDriver"] == {"string": "vfio-pci"}
