"""DeviceClasses with extendedResourceName (KEP-5004), made from the config by
``vfioctl deviceclasses``: the shipped file is what the command prints for the command line
in its header; every class is a strictly valid ``resource.k8s.io/v1`` object; each class's CEL
(evaluated with cel-python) selects exactly the devices the DRA plugin publishes under its
resource on a real temp sysfs tree — and none of another driver."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from cli.main import vfioctl
from tests.deploy.conftest import DEPLOY, REPO, Obj, all_of
from tests.deploy.k8s_schema import check_object, deserialize_errors
from tests.dra.cel_view import cel, published_view, selected
from tests.dra.topologies import DRA_CONFIG, dra_host
from vfio_dp.dra.deviceclasses import (
    IMPLICIT_PREFIX,
    class_name,
    device_classes,
    extended_resource_name,
)
from vfio_dp.errors import ConfigError
from vfio_dp.model import naming
from vfio_dp.model.config import load_config_text

SHIPPED = DEPLOY / "components/dra/deviceclasses.yaml"
DRIVER = naming.DEFAULT_DRA_DRIVER


def _header_command() -> list[str]:
    first = SHIPPED.read_text().splitlines()[0]
    assert first.startswith("# Generated: vfioctl deviceclasses "), first
    return shlex.split(first.removeprefix("# Generated: vfioctl "))


def _strictly_valid(objs: list[Obj]) -> None:
    problems = [f"{o['metadata']['name']}: {p}" for o in objs for p in check_object(o)]
    problems += [e for o in objs for e in deserialize_errors(o)]
    assert not problems, "\n".join(problems)


def test_the_shipped_classes_are_what_the_command_prints(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)  # the header's paths are relative to the checkout
    result = CliRunner().invoke(vfioctl, _header_command())
    assert result.exit_code == 0, result.stderr
    shipped = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    assert shipped == [d for d in yaml.safe_load_all(result.stdout) if d]
    _strictly_valid(shipped)
    assert [extended_resource_name(c) for c in shipped] == [
        "devices.kubevirt.io/10de_1eb8",
        "devices.kubevirt.io/144d_a808",
        f"{IMPLICIT_PREFIX}native.{DRIVER}",  # the container entries' class
    ]


def test_the_dra_overlays_ship_them_beside_the_driver_class(
    rendered: dict[str, list[Obj]],
) -> None:
    for target in ("overlays/dra", "overlays/cert-manager-dra"):
        classes = list(all_of(rendered[target], "DeviceClass"))
        names = {c["metadata"]["name"] for c in classes}
        assert {
            "10de-1eb8.devices.kubevirt.io",
            "144d-a808.devices.kubevirt.io",
            DRIVER,
            f"native.{DRIVER}",
        } == names
        assert all("namespace" not in c["metadata"] for c in classes)  # cluster-scoped
    # the other overlays send nothing to DRA: no class with an extended resource name
    for target in ("base", "overlays/self-signed", "overlays/vagrant", "overlays/cert-manager"):
        assert not list(all_of(rendered[target], "DeviceClass")), target


def _by_resource(
    classes: list[dict[str, Any]], devices: list[dict[str, Any]]
) -> dict[str, set[str]]:
    return {
        extended_resource_name(c): selected([s["cel"]["expression"] for s in c["spec"]["selectors"]], devices)
        for c in classes
    }  # fmt: skip


def test_shipped_classes_select_exactly_their_published_devices(tmp_path: Path) -> None:
    config = load_config_text((DEPLOY / "components/dra/config.yaml").read_text(), "dra")
    devices = published_view(dra_host(tmp_path).root, config, DRIVER)
    shipped = [d for d in yaml.safe_load_all(SHIPPED.read_text()) if d]
    assert _by_resource(shipped, devices) == {
        "devices.kubevirt.io/10de_1eb8": {"pci-0000-3b-00-0"},  # GPU + audio: one group
        "devices.kubevirt.io/144d_a808": {"pci-0000-07-00-0"},  # two NVMe: one group
        f"{IMPLICIT_PREFIX}native.{DRIVER}": set(),  # no group offered for containers here
    }
    other = {**devices[0], "driver": "gpu.nvidia.com"}  # another driver's device
    expr = shipped[0]["spec"]["selectors"][0]["cel"]["expression"]
    assert not cel(expr)(other)
    # a device of ours without the attribute (a name > 64 characters) is not selected
    bare = {**devices[0], "attributes": {DRIVER: {"vendorID": "10de"}}}
    assert not cel(expr)(bare)


def test_every_dra_resource_gets_one_class_and_classes_do_not_overlap(tmp_path: Path) -> None:
    config = load_config_text(DRA_CONFIG, "dra-topology")
    classes = device_classes(config, DRIVER, [("10de", "1eb8"), ("144d", "a808")])
    _strictly_valid(classes)
    devices = published_view(dra_host(tmp_path).root, config, DRIVER)
    by = _by_resource(classes, devices)
    assert by == {
        "devices.kubevirt.io/mlx-vf": {"pci-0000-af-00-1", "pci-0000-af-00-2"},
        "devices.kubevirt.io/144d_a808": {"pci-0000-07-00-0"},
        "devices.kubevirt.io/10de_1eb8": {"pci-0000-3b-00-0"},
        # the host-used virtio NIC is selected (bind: onPrepare) but never published
        "devices.kubevirt.io/1af4_1000": set(),
    }
    # every published device is reachable through exactly one class
    seen = [name for names in by.values() for name in names]
    assert sorted(seen) == sorted(d["name"] for d in devices)


def test_open_selectors_need_ids_and_names_must_fit_an_attribute() -> None:
    config = load_config_text('selectors:\n- vendor: "10de"\n  path: dra\n', "c")
    with pytest.raises(ConfigError, match=r"selectors\[0\]: 'vendor 10de': .*--device 10de:1eb8"):
        device_classes(config, DRIVER)
    # IDs a selector cannot reach (shadowed, or of another vendor) give it no class
    with pytest.raises(ConfigError, match="none of the IDs given"):
        device_classes(config, DRIVER, [("8086", "10d3")])
    long = load_config_text(
        f'selectors:\n- vendor: "10de"\n  resourceName: example.com/{"x" * 60}\n  path: dra\n', "c"
    )
    with pytest.raises(ConfigError, match="longer than the 64 characters"):
        device_classes(long, DRIVER)
    # device-plugin selectors get no class
    dp = load_config_text('selectors:\n- vendor: "10de"\n  device: "1eb8"\n', "c")
    assert device_classes(dp, DRIVER) == []


def test_class_names_are_dns_subdomains_and_distinct() -> None:
    names = [
        class_name("devices.kubevirt.io/10de_1eb8"),
        class_name("nvidia.com/TU104GL_Tesla_T4"),
        class_name("nvidia.com/tu104gl-tesla-t4"),
        class_name("example.com/a.b_c"),
        class_name("example.com/" + "x" * 63),
    ]
    assert names[0] == "10de-1eb8.devices.kubevirt.io"
    assert len(set(names)) == len(names)
    assert all(naming.is_dns_subdomain(n) for n in names), names
    implicit = {"metadata": {"name": "gpu"}, "spec": {"selectors": []}}
    assert extended_resource_name(implicit) == f"{IMPLICIT_PREFIX}gpu"


def test_command_errors_name_the_value() -> None:
    bad = CliRunner().invoke(vfioctl, ["deviceclasses", "--device", "10de-1eb8"])
    assert bad.exit_code == 2 and "10de-1eb8" in bad.stderr
    bad = CliRunner().invoke(vfioctl, ["deviceclasses", "--driver-name", "Not_DNS"])
    assert bad.exit_code == 2 and "Not_DNS" in bad.stderr
    ok = CliRunner().invoke(vfioctl, ["deviceclasses", "--device", "8086:10d3", "-o", "json"])
    assert ok.exit_code == 0, ok.stderr
    item, native = yaml.safe_load(ok.stdout)["items"]  # no config: the default selector
    assert item["spec"]["extendedResourceName"] == "devices.kubevirt.io/8086_10d3"
    assert native["metadata"]["name"] == f"native.{DRIVER}"


def test_the_command_prints_a_class_per_dra_mdev_type(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "mdev:\n"
        "  - {parent: mtty, type: mtty-2, create: onPrepare, count: all, path: dra}\n"
        "  - {parent: '0000:3b:00.0', type: nvidia-222, path: devicePlugin}\n"
    )
    args = ["deviceclasses", "--config", str(config), "--device", "8086:10d3", "-o", "json"]
    ok = CliRunner().invoke(vfioctl, args)
    assert ok.exit_code == 0, ok.stderr
    names = [c["metadata"]["name"] for c in yaml.safe_load(ok.stdout)["items"]]
    # the default selector's class, the container entries', then the DRA mdev type's only
    assert names[1:] == [f"native.{DRIVER}", f"mtty-2.mdev.{DRIVER}"]
