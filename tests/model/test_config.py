import pytest

from vfio_dp.errors import ConfigError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEFAULT_CONFIG, load_config_text, parse_config
from vfio_dp.model.device import PciDevice


def dev(
    addr: str = "0000:3b:00.0",
    vendor: str = "10de",
    device: str = "1eb8",
    cls: str = "030200",
    driver: str | None = "vfio-pci",
    **kw: object,
) -> PciDevice:
    return PciDevice(PciAddress.parse(addr), vendor, device, cls, driver=driver, **kw)  # type: ignore[arg-type]


def test_default_config_takes_devices_on_vfio_only() -> None:
    assert DEFAULT_CONFIG.resource_for(dev()) == "devices.kubevirt.io/10de_1eb8"
    assert DEFAULT_CONFIG.resource_for(dev(driver="nvidia")) is None


def test_first_match_wins_and_address_split() -> None:
    cfg = load_config_text(
        """
resourceDomain: gpu.example.com
selectors:
  - addresses: ["3b:00.0"]
    vendor: "10de"
    resourceName: gpu-a
  - vendor: "10DE"
    device: ["1eb8"]
    resourceName: example.org/t4
  - class: "02"
""",
        "cfg.yaml",
    )
    assert cfg.resource_for(dev()) == "gpu.example.com/gpu-a"
    assert cfg.resource_for(dev("0000:3c:00.0")) == "example.org/t4"
    assert cfg.resource_for(dev("0000:01:00.0", "8086", "10d3", "020000")) == (
        "gpu.example.com/8086_10d3"
    )
    assert cfg.resource_for(dev("0000:02:00.0", "8086", "1234", "010802")) is None
    # the webhook's view of a vendor:device pair: both address- and ID-selectors
    assert cfg.resources_for_ids("10de", "1eb8") == ["gpu.example.com/gpu-a", "example.org/t4"]
    assert cfg.resources_for_ids("8086", "10d3") == ["gpu.example.com/8086_10d3"]


def test_bind_selectors_match_recorded_original_driver() -> None:
    cfg = parse_config({"selectors": [{"drivers": ["e1000e"], "bind": True}]})
    moved = dev(
        "0000:01:00.0", "8086", "10d3", "020000", driver="vfio-pci", original_driver="e1000e"
    )
    assert cfg.resource_for(moved) == "devices.kubevirt.io/8086_10d3"
    not_bind = parse_config({"selectors": [{"drivers": ["e1000e"]}]})
    assert not_bind.resource_for(moved) is None


def test_subsystem_selector() -> None:
    cfg = parse_config({"selectors": [{"subsystemVendor": "10de", "subsystemDevice": "12a2"}]})
    assert cfg.resource_for(dev(subsystem_vendor="10de", subsystem_device="12a2"))
    assert cfg.resource_for(dev(subsystem_vendor="10de", subsystem_device="0000")) is None


def test_every_error_is_listed() -> None:
    with pytest.raises(ConfigError) as e:
        parse_config(
            {
                "resourceDomain": "Bad_Domain",
                "colour": "blue",
                "selectors": [
                    {"vendor": "10dex", "addresses": ["../etc"], "bind": "yes"},
                    {"resourceName": "kubernetes.io/gpu", "class": "03"},
                    {"resourceName": "x"},
                    "not-a-mapping",
                    {"drivers": ["e1000e; rm -rf /"], "bogus": 1},
                ],
            },
            "cm.yaml",
        )
    keys = [k for k, _, _ in e.value.problems]
    for want in [
        "resourceDomain",
        "colour",
        "selectors[0].vendor",
        "selectors[0].addresses",
        "selectors[0].bind",
        "selectors[1].resourceName",
        "selectors[2]",
        "selectors[3]",
        "selectors[4].drivers",
        "selectors[4].bogus",
    ]:
        assert want in keys, (want, keys)
    assert "cm.yaml" in str(e.value)
    assert "'../etc'" in str(e.value)


def test_bad_yaml() -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config_text("selectors: [", "x.yaml")


def test_empty_file_is_default() -> None:
    assert load_config_text("", "x.yaml") == DEFAULT_CONFIG
