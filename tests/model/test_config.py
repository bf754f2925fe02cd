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


def test_vfio_pci_in_drivers_stands_for_every_vfio_driver() -> None:
    # one notion of "on VFIO" (issue 34): a variant's device, or a vendor provider's VFIO VF,
    # is served without a config like a device on vfio-pci; the same vendor driver's host
    # GPU (not registered with VFIO) is not
    variant = dev(driver="mlx5_vfio_pci", vfio_registered=True)
    provider_vf = dev(driver="nvidia", vfio_registered=True)
    assert DEFAULT_CONFIG.resource_for(variant) == "devices.kubevirt.io/10de_1eb8"
    assert DEFAULT_CONFIG.resource_for(provider_vf) == "devices.kubevirt.io/10de_1eb8"
    assert DEFAULT_CONFIG.resource_for(dev(driver="nvidia")) is None
    assert DEFAULT_CONFIG.resource_for(dev(driver="mlx5_vfio_pci", mdev_parent=True)) is None
    cfg = load_config_text("selectors: [{drivers: [vfio-pci]}]\n", "t.yaml")
    assert cfg.resource_for(variant) == "devices.kubevirt.io/10de_1eb8"
    # a bind selector still judges the driver recorded before its bind
    cfg = load_config_text("selectors: [{drivers: [e1000e], bind: true}]\n", "t.yaml")
    moved = dev(driver="mlx5_vfio_pci", vfio_registered=True, original_driver="e1000e")
    assert cfg.resource_for(moved) == "devices.kubevirt.io/10de_1eb8"
    other = dev(driver="mlx5_vfio_pci", vfio_registered=True, original_driver="ixgbe")
    assert cfg.resource_for(other) is None


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


@pytest.mark.parametrize(
    "text",
    [
        "selectors: [",
        "a: \x00",  # a control character: refused by the reader itself
        "!!python/object/apply:os.system ['true']",  # no unsafe constructors
        "selectors: !!binary aGk=\n---\nb: 2\n",  # two documents
    ],
)
def test_bad_yaml(text: str) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config_text(text, "x.yaml")


def test_an_empty_file_is_an_error_not_the_default() -> None:
    for text in ("", "# only a comment\n"):
        with pytest.raises(ConfigError, match=r"the file is empty .* run without --config"):
            load_config_text(text, "x.yaml")


def test_mistakes_get_the_fix_that_applies() -> None:
    with pytest.raises(ConfigError) as e:
        load_config_text(
            "resourceDomain: Example.COM\nselectors:\n"
            "  - vendorID: '10de'\n  - addresses: [0000]\n    sriov: pf\n",
            "x.yaml",
        )
    text = str(e.value)
    assert 'unknown key; did you mean "vendor"?' in text
    assert "must be lowercase" in text and "resourceDomain: example.com" in text
    assert 'quote it: addresses: ["0000"]' in text


# --- hostile and mistaken files: refused fast, with a bounded message that says the fix ---------

#: the classic 372-byte "billion laughs": 9 levels of 9 aliases = 10**9 strings when expanded
BILLION_LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{','.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi", strict=True)
)


def refusal(text: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config_text(text, "cm.yaml")
    return str(err.value)


def test_billion_laughs_is_refused_before_anything_expands_it() -> None:
    assert len(BILLION_LAUGHS) < 400
    text = refusal(BILLION_LAUGHS)
    assert "cm.yaml" in text and "aliases" in text and "expanded" in text
    assert len(text) < 400  # the message names the problem, it does not print the structure


def test_aliases_that_stay_small_are_fine() -> None:
    cfg = load_config_text(
        "selectors:\n- vendor: '10de'\n  device: &d ['1eb8', '1db6']\n- vendor: '10df'\n"
        "  device: *d\n",
        "ok.yaml",
    )
    assert [s.devices for s in cfg.selectors] == [("1eb8", "1db6")] * 2


def test_a_recursive_alias_is_refused() -> None:
    assert "refers to itself" in refusal("selectors: &s [*s]\n")


def test_an_anchored_selector_list_cannot_flood_the_error_output() -> None:
    # 2,000 copies of one bad selector (4 problems each): the message lists 20 and a count
    hostile = (
        "x: &x {vendor: zz, device: yy, class: q, colour: red}\nselectors: ["
        + ",".join(["*x"] * 2000)
        + "]\n"
    )
    text = refusal(hostile)
    assert len(text) < 5000, len(text)
    assert "more problems" in text and "selectors[0].vendor" in text


def test_deep_nesting_is_a_clear_error_not_a_recursion_error() -> None:
    for doc in (
        "selectors: " + "[" * 2000 + "]" * 2000,
        "selectors: " + "{a: " * 2000 + "1" + "}" * 2000,
    ):
        text = refusal(doc)
        assert "nested deeper than" in text and "line 1" in text


def test_huge_values_are_cut_in_the_message() -> None:
    text = refusal("selectors:\n- drivers: ['" + "x" * 100_000 + "']\n")
    assert "[100000 chars]" in text and len(text) < 1000


def test_size_cap() -> None:
    from vfio_dp.model.config import MAX_CONFIG_BYTES, load_config_bytes

    with pytest.raises(ConfigError, match="larger than"):
        load_config_bytes(b"#" * (MAX_CONFIG_BYTES + 1), "big.yaml")


def test_not_utf8_names_the_file_and_the_byte() -> None:
    from vfio_dp.model.config import load_config_bytes

    with pytest.raises(ConfigError) as err:
        load_config_bytes(b"selectors:\n- vendor: '\xff10de'\n", "latin.yaml")
    assert "latin.yaml" in str(err.value) and "not UTF-8" in str(err.value)
    assert "0xff" in str(err.value)


@pytest.mark.parametrize(
    ("line", "shows"),
    [
        ("vendor: 8086", 'quote it: vendor: "8086"'),
        ("device: 1000", 'quote it: device: "1000"'),
        ("vendor: 0x10de", 'quote it: vendor: "0x10de"'),
        ("subsystemVendor: 0777", 'quote it: subsystemVendor: "0777"'),
        ("class: 02", 'quote it: class: "02"'),
        ("vendor: [8086, '10de']", 'quote it: vendor: "8086"'),
        ("vendor: true", 'write the hex ID quoted, e.g. vendor: "8086"'),
        ("device: no", 'write the hex ID quoted, e.g. device: "8086"'),
        ("addresses: [0000:05:00.0]", 'quote it: addresses: ["0000:05:00.0"]'),
    ],
)
def test_unquoted_ids_are_refused_with_the_fix_never_read_as_other_ids(
    line: str, shows: str
) -> None:
    text = refusal(f"selectors:\n- {line}\n")
    assert shows in text, text
    # the decimal reading never leaks in as a selected ID
    assert "1f96" not in text and "0001" not in text


def test_quoted_ids_still_work() -> None:
    cfg = load_config_text("selectors:\n- vendor: '8086'\n  device: \"1000\"\n", "q.yaml")
    assert cfg.selectors[0].vendors == ("8086",) and cfg.selectors[0].devices == ("1000",)


def test_too_many_values_are_refused_while_composing() -> None:
    from vfio_dp.model.config import MAX_CONFIG_NODES

    text = refusal("selectors: [" + "a," * (MAX_CONFIG_NODES + 10) + "]")
    assert f"more than {MAX_CONFIG_NODES} values" in text


def test_taint_effect_is_no_schedule_unless_a_dra_selector_says_no_execute() -> None:
    from vfio_dp.model.config import NO_EXECUTE, NO_SCHEDULE

    cfg = load_config_text(
        'selectors:\n  - {vendor: "8086", path: dra}\n'
        '  - {vendor: "10de", path: dra, taintEffect: NoExecute}\n',
        "x.yaml",
    )
    assert [s.taint_effect for s in cfg.selectors] == [NO_SCHEDULE, NO_EXECUTE]
    assert "taintEffect: 'Evict': must be NoSchedule or NoExecute" in refusal(
        'selectors:\n  - {vendor: "8086", path: dra, taintEffect: Evict}\n'
    )
    assert "only the DRA plugin taints devices: add path: dra" in refusal(
        'selectors:\n  - {vendor: "8086", taintEffect: NoSchedule}\n'
    )


def test_vfio_driver_per_selector_is_never_checked_against_a_node() -> None:
    """``vfioDriver`` (issue 34): auto by default, vfio-pci, or any kernel driver name -- one
    ConfigMap serves nodes with different kernels, so a name this machine lacks loads; only
    a value that can be no driver name is refused, with its place."""
    from vfio_dp.errors import ConfigError
    from vfio_dp.model.config import load_config_text

    cfg = load_config_text(
        'selectors:\n  - vendor: "15b3"\n    vfioDriver: mlx5_vfio_pci\n'
        '  - vendor: "10de"\n    vfioDriver: vfio-pci\n  - vendor: "8086"\n',
        "c.yaml",
    )
    assert [s.vfio_driver for s in cfg.selectors] == ["mlx5_vfio_pci", "vfio-pci", "auto"]
    with pytest.raises(ConfigError, match=r"selectors\[0\]\.vfioDriver"):
        load_config_text('selectors:\n  - vendor: "15b3"\n    vfioDriver: "a b"\n', "c.yaml")
