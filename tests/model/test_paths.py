"""Selector ``path`` and ``bind: onPrepare``: parsing, who serves which device, path splits."""

from __future__ import annotations

import pytest

from tests.model.test_config import dev
from vfio_dp.deviceplugin.listing import compute_listing
from vfio_dp.errors import ConfigError
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import DEFAULT_CONFIG, DEVICE_PLUGIN, DRA, load_config_text
from vfio_dp.model.device import Inventory, PciDevice, analyse_group
from vfio_dp.model.serving import device_serving, dra_device_name, dra_units, path_splits


def cfg(text: str):  # type: ignore[no-untyped-def]
    return load_config_text(text, "cfg.yaml")


def inventory(*devs: PciDevice) -> Inventory:
    groups: dict[int, list[PciDevice]] = {}
    for d in devs:
        if d.iommu_group is not None:
            groups.setdefault(d.iommu_group, []).append(d)
    return Inventory(
        devices={d.address: d for d in devs},
        groups={n: analyse_group(n, ms) for n, ms in groups.items()},
    )


def test_path_and_bind_values_parse() -> None:
    c = cfg(
        """
selectors:
  - vendor: "10de"
    path: dra
    bind: onPrepare
  - vendor: "8086"
    path: dra
    bind: true
  - vendor: "15b3"
"""
    )
    a, b, d = c.selectors
    assert (a.path, a.bind, a.bind_on_prepare, a.binds) == (DRA, False, True, True)
    assert (b.path, b.bind, b.bind_on_prepare) == (DRA, True, False)
    assert (d.path, d.bind, d.bind_on_prepare) == (DEVICE_PLUGIN, False, False)
    assert not c.any_path and DEFAULT_CONFIG.any_path


def test_wrong_mixes_are_all_listed() -> None:
    with pytest.raises(ConfigError) as e:
        cfg(
            """
selectors:
  - vendor: "10de"
    bind: onPrepare
  - vendor: "8086"
    path: devicePlugin
    bind: onPrepare
  - vendor: "15b3"
    path: DRA
  - vendor: "1af4"
    bind: "yes"
"""
        )
    keys = [k for k, _, _ in e.value.problems]
    assert keys == [
        "selectors[0].bind",
        "selectors[1].bind",
        "selectors[2].path",
        "selectors[3].bind",
    ]
    text = str(e.value)
    assert "onPrepare needs path: dra" in text and "must be devicePlugin or dra" in text
    assert "must be true, false or onPrepare" in text


def test_onprepare_keeps_its_selection_through_the_recorded_driver() -> None:
    c = cfg('selectors:\n- vendor: "10de"\n  drivers: [nvidia]\n  path: dra\n  bind: onPrepare\n')
    bound = dev(driver="vfio-pci", original_driver="nvidia")
    assert c.path_of(bound) == DRA
    assert c.select_for(bound, DEVICE_PLUGIN) is None


def test_webhook_maps_ids_through_the_selectors_of_both_paths() -> None:
    """A ``path: dra`` resource is asked for by the same name (its DeviceClass's
    extendedResourceName, KEP-5004), so the webhook maps vendor:device through it too."""
    c = cfg(
        """
selectors:
  - vendor: "10de"
    device: "1eb8"
    path: dra
  - vendor: "10de"
    resourceName: gpus
  - vendor: "8086"
    class: "02"
    path: dra
  - vendor: "8086"
"""
    )
    # an IDs-only selector shadows everything after it for those IDs, whatever its path
    assert c.resources_for_ids("10de", "1eb8") == ["devices.kubevirt.io/10de_1eb8"]
    assert c.resources_for_ids("10de", "2236") == ["devices.kubevirt.io/gpus"]
    # NICs of class 02 go to DRA, the rest to the device plugin: one name either way
    assert c.resources_for_ids("8086", "10d3") == ["devices.kubevirt.io/8086_10d3"]
    # without a config the default selector serves every path
    assert DEFAULT_CONFIG.resources_for_ids("10de", "1eb8") == ["devices.kubevirt.io/10de_1eb8"]


def test_device_plugin_lists_only_its_path_and_a_split_group_is_served_by_neither() -> None:
    gpu = dev("0000:3b:00.0", "10de", "1eb8", "030200", iommu_group=45)
    audio = dev("0000:3b:00.1", "10de", "10f8", "040300", iommu_group=45)
    nic = dev("0000:65:00.0", "8086", "10d3", "020000", iommu_group=50)
    inv = inventory(gpu, audio, nic)
    c = cfg(
        """
selectors:
  - device: "10f8"
    path: dra
  - vendor: "10de"
  - vendor: "8086"
    path: dra
"""
    )
    listing = compute_listing(inv, c)
    assert list(listing.resources) == ["devices.kubevirt.io/10de_1eb8"]
    (unit,) = listing.resources["devices.kubevirt.io/10de_1eb8"]
    assert not unit.healthy
    assert any("IOMMU group 45 is split between paths" in r for r in unit.reasons)
    assert set(path_splits(inv, c)) == {45}
    units = {u.group: u for u in dra_units(inv, c)}
    assert not units[45].published and "split between paths" in units[45].reasons[0]
    assert units[50].published and units[50].name == "pci-0000-65-00-0"
    serving = device_serving(inv, c, listing.membership, list(units.values()))
    assert serving[audio.address].dra_device is None
    assert "split between paths" in (serving[audio.address].not_served or "")
    assert serving[nic.address].dra_device == "pci-0000-65-00-0"
    assert serving[nic.address].resource is None


def test_without_a_config_both_paths_serve_vfio_devices() -> None:
    nic = dev("0000:65:00.0", "8086", "10d3", "020000", iommu_group=50)
    host = dev("0000:00:00.0", "8086", "29c0", "060000", driver=None, iommu_group=0)
    inv = inventory(nic, host)
    listing = compute_listing(inv, DEFAULT_CONFIG)
    units = dra_units(inv, DEFAULT_CONFIG)
    assert [u.name for u in units if u.published] == ["pci-0000-65-00-0"]
    s = device_serving(inv, DEFAULT_CONFIG, listing.membership, units)
    assert s[nic.address].resource == "devices.kubevirt.io/8086_10d3"
    assert s[host.address] == type(s[host.address])(None, None, None, None)


def test_dra_device_names_are_dns_labels() -> None:
    assert dra_device_name(PciAddress.parse("0000:3b:01.0")) == "pci-0000-3b-01-0"
    assert dra_device_name(PciAddress.parse("abcd:ff:1f.7")) == "pci-abcd-ff-1f-7"
