"""Which path serves a vendor:device pair or a resource name, from the config alone."""

from __future__ import annotations

from vfio_dp.model.config import DEVICE_PLUGIN, DRA, Config, load_config_text
from vfio_dp.model.routes import ANY, paths_of, routes_for_ids, routes_for_name

CONFIG = """
selectors:
  - vendor: "10de"
    path: dra
  - class: "0108"
    drivers: [vfio-pci]
    path: dra
  - addresses: ["0000:65:00.0"]
    vendor: "8086"
    resourceName: nic-a
  - drivers: [vfio-pci]
    path: devicePlugin
"""


def test_ids_alone_decide_when_an_ids_only_selector_takes_them() -> None:
    c = load_config_text(CONFIG, "c")
    (route,) = routes_for_ids(c, "10DE", "1EB8")
    assert (route.path, route.resource, route.index, route.condition) == (
        DRA, "devices.kubevirt.io/10de_1eb8", 0, ""
    )  # fmt: skip


def test_every_first_match_the_unknowns_allow_is_a_route() -> None:
    c = load_config_text(CONFIG, "c")
    routes = routes_for_ids(c, "8086", "10d3")
    assert [(r.index, r.path, r.resource) for r in routes] == [
        (1, DRA, "devices.kubevirt.io/8086_10d3"),
        (2, DEVICE_PLUGIN, "devices.kubevirt.io/nic-a"),
        (3, DEVICE_PLUGIN, "devices.kubevirt.io/8086_10d3"),
    ]
    assert routes[1].condition == "address 0000:65:00.0"
    # a known class rules the class selector out
    assert paths_of(routes_for_ids(c, "8086", "10d3", "020000")) == {DEVICE_PLUGIN}
    assert paths_of(routes_for_ids(c, "144d", "a808", "010802")) == {DRA}
    # a device nobody selects (no driver condition met is still "not vfio-pci": no route)
    assert (
        routes_for_ids(load_config_text('selectors:\n- vendor: "1234"\n', "c"), "8086", "10d3")
        == []
    )


def test_names_explicit_and_default() -> None:
    c = load_config_text(CONFIG, "c")
    assert [(r.index, r.path) for r in routes_for_name(c, "devices.kubevirt.io/NIC-A")] == [
        (2, DEVICE_PLUGIN)
    ]
    assert paths_of(routes_for_name(c, "devices.kubevirt.io/10de_1eb8")) == {DRA}
    assert paths_of(
        routes_for_name(c, "devices.kubevirt.io/8086_10d3", {("8086", "10d3"): "020000"})
    ) == {DEVICE_PLUGIN}
    assert routes_for_name(c, "nvidia.com/t4") == []
    assert paths_of(routes_for_ids(Config(any_path=True), "8086", "10d3")) == {ANY}
