"""``translate --dra`` converts exactly the entries whose devices the config sends to DRA.

Checked against the shipped DRA config (``deploy/components/dra/config.yaml``) and mixed and
all-DRA configs; each generated template is strictly valid ``resource.k8s.io/v1``, admits as a
DRA VMI, and its CEL (evaluated with cel-python) selects exactly the devices the DRA plugin
publishes for that resource on a real temp sysfs tree, while the entries left as
``deviceName`` are resources the device plugin lists there.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli.main import vfioctl
from tests.deploy.k8s_schema import check_object, deserialize_errors
from tests.dra.cel_view import published_view, selected
from tests.dra.topologies import dra_host
from vfio_dp.deviceplugin.listing import compute_listing
from vfio_dp.host import Host
from vfio_dp.model.config import DEVICE_PLUGIN, DRA, Config, load_config_text
from vm_translate.errors import SpecError
from vm_translate.to_dra import to_dra
from vm_translate.translate import translate

REPO = Path(__file__).resolve().parents[2]
SHIPPED_DRA = REPO / "deploy/components/dra/config.yaml"
DRIVER = "vfio.example.com"
#: the classes of dra_host's devices, as a user would pass them with --pci-class
CLASSES = {("8086", "10d3"): "020000", ("144d", "a808"): "010802", ("15b3", "101c"): "020000"}

MIXED = """
selectors:
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    device: "10d3"
    path: devicePlugin
  - drivers: [vfio-pci]
    path: devicePlugin
"""

ALL_DRA = """
selectors:
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "15b3"
    device: "101c"
    resourceName: mlx-vf
    path: dra
  - drivers: [vfio-pci]
    path: dra
"""


def vmi(*entries: tuple[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns"},
        "spec": {
            "domain": {
                "devices": {"hostDevices": [{"name": n, "deviceName": d} for n, d in entries]}
            }
        },
    }


def shipped() -> Config:
    return load_config_text(SHIPPED_DRA.read_text(), str(SHIPPED_DRA))


def requests_of(template: Any) -> dict[str, list[str]]:
    return {
        r["name"]: [s["cel"]["expression"] for s in r["exactly"]["selectors"]]
        for r in template["spec"]["spec"]["devices"]["requests"]
    }


def check_strictly(moved: Any, config: Config) -> None:
    template = dict(moved.template)
    assert check_object(template) == []
    assert deserialize_errors(template) == []
    # admits as it is: the webhook only canonicalises the deviceName entries left
    ops = translate(moved.obj, config).patch
    assert all(op["path"].endswith("/deviceName") for op in ops), ops


def test_shipped_dra_config_converts_the_gpu_and_nvme_and_leaves_the_nics(tmp_path: Path) -> None:
    config = shipped()
    obj = vmi(
        ("gpu", "10de:1eb8"),
        ("nvme", "devices.kubevirt.io/144d_a808"),
        ("nic", "8086:10d3"),
        ("vf", "15b3:101c"),
        ("t4", "nvidia.com/TU104GL_Tesla_T4"),
    )
    before = copy.deepcopy(obj)
    moved = to_dra(obj, config, DRIVER, CLASSES)
    assert obj == before  # the input is not mutated
    entries = moved.obj["spec"]["domain"]["devices"]["hostDevices"]
    assert entries == [
        {"name": "gpu", "claimName": "vfio", "requestName": "gpu"},
        {"name": "nvme", "claimName": "vfio", "requestName": "nvme"},
        {"name": "nic", "deviceName": "8086:10d3"},
        {"name": "vf", "deviceName": "15b3:101c"},
        {"name": "t4", "deviceName": "nvidia.com/TU104GL_Tesla_T4"},
    ]
    verdicts = {v.name: v for v in moved.verdicts}
    assert [(n, v.path, v.converted) for n, v in verdicts.items()] == [
        ("gpu", DRA, True),
        ("nvme", DRA, True),
        ("nic", DEVICE_PLUGIN, False),
        ("vf", DEVICE_PLUGIN, False),
        ("t4", None, False),
    ]
    assert "selectors[0] → dra as devices.kubevirt.io/10de_1eb8" in verdicts["gpu"].why
    assert "selectors[1] (class 0108, driver vfio-pci) → dra" in verdicts["nvme"].why
    assert "selectors[2] (driver vfio-pci) → devicePlugin" in verdicts["nic"].why
    assert "another provider's resource" in verdicts["t4"].why
    check_strictly(moved, config)

    # what the DRA plugin can satisfy: each request selects exactly the device published
    # under its resource on a node with these devices; the NICs left are device-plugin ones
    tree = dra_host(tmp_path)
    devices = published_view(tree.root, config, DRIVER)
    assert {d["name"] for d in devices} == {"pci-0000-3b-00-0", "pci-0000-07-00-0"}
    assert {n: selected(e, devices) for n, e in requests_of(moved.template).items()} == {
        "gpu": {"pci-0000-3b-00-0"},
        "nvme": {"pci-0000-07-00-0"},
    }
    listed = compute_listing(Host(tree.root).scan(), config).resources
    assert {"devices.kubevirt.io/8086_10d3", "devices.kubevirt.io/15b3_101c"} <= set(listed)


def test_without_the_class_an_entry_the_class_decides_is_left_with_both_routes() -> None:
    moved = to_dra(vmi(("gpu", "10de:1eb8"), ("nic", "8086:10d3")), shipped(), DRIVER)
    (gpu, nic) = moved.verdicts
    assert gpu.converted and not nic.converted and nic.path is None
    assert "selectors[1] (class 0108, driver vfio-pci) → dra" in nic.why
    assert "selectors[2] (driver vfio-pci) → devicePlugin" in nic.why
    assert "--pci-class" in nic.why


def test_mixed_config_gpu_on_dra_nic_on_the_device_plugin(tmp_path: Path) -> None:
    config = load_config_text(MIXED, "mixed.yaml")
    moved = to_dra(
        vmi(("nic", "8086:10d3"), ("gpu", "devices.kubevirt.io/10de_1eb8")), config, DRIVER
    )
    assert [(v.name, v.path, v.converted) for v in moved.verdicts] == [
        ("nic", DEVICE_PLUGIN, False),
        ("gpu", DRA, True),
    ]
    check_strictly(moved, config)
    devices = published_view(dra_host(tmp_path).root, config, DRIVER)
    assert {n: selected(e, devices) for n, e in requests_of(moved.template).items()} == {
        "gpu": {"pci-0000-3b-00-0"}
    }


def test_all_dra_config_converts_every_entry(tmp_path: Path) -> None:
    config = load_config_text(ALL_DRA, "all-dra.yaml")
    obj = vmi(
        ("gpu", "10de:1eb8"),
        ("nic", "8086:10d3"),
        ("vf", "mlx-vf"),
        ("nvme", "144d:a808"),
    )
    moved = to_dra(obj, config, DRIVER)  # no class needed: every route is DRA
    assert all(v.converted and v.path == DRA for v in moved.verdicts)
    assert all("claimName" in e for e in moved.obj["spec"]["domain"]["devices"]["hostDevices"])
    check_strictly(moved, config)
    devices = published_view(dra_host(tmp_path).root, config, DRIVER)
    # selected by driver in the config: a CEL on the published resourceName still says it
    assert {n: selected(e, devices) for n, e in requests_of(moved.template).items()} == {
        "gpu": {"pci-0000-3b-00-0"},
        "nic": {"pci-0000-65-00-0"},
        "vf": {"pci-0000-af-00-1", "pci-0000-af-00-2"},
        "nvme": {"pci-0000-07-00-0"},
    }


def test_a_config_without_selectors_serves_every_path_and_converts() -> None:
    moved = to_dra(vmi(("nic", "8086:10d3")), Config(any_path=True), DRIVER)
    assert [(v.path, v.converted) for v in moved.verdicts] == [(DRA, True)]


def test_a_resource_name_too_long_for_an_attribute_is_refused_with_the_fix() -> None:
    long_name = "example.com/" + "n" * 60
    config = load_config_text(
        f'selectors:\n  - vendor: "8086"\n    resourceName: {long_name}\n    path: dra\n', "c"
    )
    with pytest.raises(SpecError, match="longer than the 64 characters"):
        to_dra(vmi(("nic", long_name)), config, DRIVER)
    # a vendor:device entry still selects on its IDs
    moved = to_dra(vmi(("nic", "8086:10d3")), config, DRIVER)
    (exprs,) = requests_of(moved.template).values()
    assert "resourceName" not in exprs[0] and '.deviceID == "10d3"' in exprs[0]


@pytest.mark.parametrize(
    "driver",
    [
        "d" * 55 + ".example",
        "d" * 56 + ".example",
        "x" * 200 + ".com",
        "9vfio.example.com",
        "Not_DNS",
    ],
)
def test_to_dra_refuses_exactly_the_driver_names_the_plugin_refuses(driver: str) -> None:
    """One rule (vfio_dp.model.naming): a name the DRA plugin cannot run under (64+ characters
    for ResourceSlice spec.driver, no CDI vendor) is no --driver-name for translate either."""
    from vfio_dp.errors import DriverNameError
    from vfio_dp.model import naming

    try:
        naming.check_dra_driver_name(driver)
        plugin_refuses = False
    except DriverNameError:
        plugin_refuses = True
    obj = vmi(("nic", "8086:10d3"))
    if plugin_refuses:
        with pytest.raises(SpecError, match="--driver-name"):
            to_dra(obj, Config(any_path=True), driver)
    else:
        assert to_dra(obj, Config(any_path=True), driver).template is not None
    assert plugin_refuses == (len(driver) > 63 or not driver[0].islower() or "_" in driver)


def test_translate_dra_command_says_per_entry_which_path_and_why(tmp_path: Path) -> None:
    (tmp_path / "vmi.yaml").write_text(
        yaml.safe_dump(vmi(("gpu", "10de:1eb8"), ("nic", "8086:10d3")))
    )
    args = ["translate", "--dra", str(tmp_path / "vmi.yaml"), "--config", str(SHIPPED_DRA)]
    result = CliRunner().invoke(vfioctl, [*args, "--pci-class", "8086:10D3=0x020000"])
    assert result.exit_code == 0, result.stderr
    docs = list(yaml.safe_load_all(result.stdout))
    assert [d["kind"] for d in docs] == ["ResourceClaimTemplate", "VirtualMachineInstance"]
    expr = docs[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["selectors"][0]
    assert '"vfio.dra.vfio-dp.io"' in expr["cel"]["expression"]
    lines = result.stderr.splitlines()
    assert lines[0].startswith(
        "VirtualMachineInstance ns/vm1: spec.domain.devices.hostDevices[0] (name 'gpu') (10de:1eb8): "
        "converted to a claim request (DRA): the DRA plugin serves it"
    ), lines
    assert (
        "hostDevices[1] (name 'nic') (8086:10d3): left as deviceName: the device plugin serves it"
        in lines[1]
    )
    bad = CliRunner().invoke(vfioctl, [*args, "--pci-class", "8086:10d3"])
    assert bad.exit_code == 2 and "VENDOR:DEVICE=CLASS" in bad.stderr
    bad = CliRunner().invoke(vfioctl, ["translate", "--dra", "--patch", str(tmp_path / "vmi.yaml")])
    assert bad.exit_code == 2
    bad = CliRunner().invoke(
        vfioctl, ["translate", "--pci-class", "8086:10d3=020000", str(tmp_path / "vmi.yaml")]
    )
    assert bad.exit_code == 2
    bad = CliRunner().invoke(
        vfioctl, ["translate", "--dra", "--driver-name", "Not_DNS", str(tmp_path / "vmi.yaml")]
    )
    assert bad.exit_code == 1 and "Not_DNS" in bad.stderr


@pytest.mark.parametrize("count", [33, 40, 5_000])
def test_more_requests_than_one_claim_holds_are_refused(tmp_path: Path, count: int) -> None:
    """Issue 37.18c: every converted entry becomes a request of ONE claim, and the API server
    refuses a claim of more than 32 requests at creation: translate --dra says so instead of
    emitting a template that can never be created."""
    obj = vmi(*((f"gpu{i}", "10de:1eb8") for i in range(count)))
    with pytest.raises(SpecError) as caught:
        to_dra(obj, load_config_text(ALL_DRA, "all-dra.yaml"), DRIVER)
    message = str(caught.value)
    assert "spec.resourceClaims: 'vfio'" in message
    assert f"{count} DRA entries would each be a request of this one claim" in message
    assert "at most 32 requests" in message
    assert len(message) < 2000

    spec = tmp_path / "vmi.yaml"
    spec.write_text(yaml.safe_dump(obj))
    (tmp_path / "config.yaml").write_text(ALL_DRA)
    result = CliRunner().invoke(
        vfioctl, ["translate", "--dra", "--config", str(tmp_path / "config.yaml"), str(spec)]
    )
    assert result.exit_code == 1
    assert "at most 32 requests" in result.output
    assert "ResourceClaimTemplate" not in result.output


def test_thirty_two_requests_still_make_one_valid_template() -> None:
    config = load_config_text(ALL_DRA, "all-dra.yaml")
    moved = to_dra(vmi(*((f"gpu{i}", "10de:1eb8") for i in range(32))), config, DRIVER)
    assert moved.template is not None
    assert len(requests_of(moved.template)) == 32
    check_strictly(moved, config)
