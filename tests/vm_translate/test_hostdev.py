"""hostdev XML: positional assignment, aliases, golden files, and libvirt's own parser.

Every domain these tests produce goes through libvirt-python's real ``test:///default``
driver (``defineXML``) and, when installed, ``virt-xml-validate`` (libvirt's RelaxNG schema).
libvirt-python (the optional extra ``vfio-dp[libvirt]``, part of the test extra) is imported only
by the tests that talk to libvirt:
the pure alias, assignment and XML tests run (and must pass) without it
(test_pure_tests_need_no_libvirt).
Regenerate golden files with ``UPDATE_GOLDEN=1 python3 -m pytest tests/vm_translate``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vfio_dp.model import naming
from vfio_dp.model.address import PciAddress
from vfio_dp.model.config import Config
from vm_translate import hostdev
from vm_translate.alias import alias_for, is_user_alias, sanitize
from vm_translate.allocation import Hostdev, Layout, assign, place_multifunction
from vm_translate.entries import DeviceEntry
from vm_translate.errors import DomainXmlError, HostdevError, LibvirtError
from vm_translate.spec import entries_of

DATA = Path(__file__).parent / "data"
GPU = "devices.kubevirt.io/10de_1eb8"
AUDIO = "devices.kubevirt.io/10de_10f8"
MLX = "example.com/mlx"


def golden(name: str, actual: str) -> None:
    path = DATA / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(actual)
    assert actual == path.read_text(), f"differs from golden file {path}"


@pytest.fixture()
def conn() -> Iterator[Any]:
    import libvirt

    libvirt.registerErrorHandler(lambda _c, _e: None, None)
    c = libvirt.open("test:///default")
    yield c
    c.close()


def accepted_by_libvirt(conn: Any, xml: str) -> str:
    """Define ``xml`` with libvirt's real parser; return libvirt's own rendering of it."""
    import libvirt

    dom = conn.defineXML(xml)
    try:
        return str(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE))
    finally:
        dom.undefine()


DOMAIN_RNG = Path("/usr/share/libvirt/schemas/domain.rng")


def schema_valid(tmp_path: Path, xml: str) -> None:
    """libvirt's RelaxNG schema (the one ``virt-xml-validate`` uses) accepts ``xml``.

    ``virt-xml-validate`` needs ``xmllint``; where that is missing, lxml applies the same
    installed schema file.
    """
    f = tmp_path / "domain.xml"
    f.write_text(xml)
    tool = shutil.which("virt-xml-validate")
    if tool and shutil.which("xmllint"):
        run = subprocess.run([tool, str(f), "domain"], capture_output=True, text=True, check=False)
        assert run.returncode == 0, run.stderr + run.stdout
    if not DOMAIN_RNG.exists():
        pytest.skip("libvirt's RelaxNG schemas are not installed")
    from lxml import etree

    rng = etree.RelaxNG(etree.parse(str(DOMAIN_RNG)))
    assert rng.validate(etree.parse(str(f))), str(rng.error_log)


def test_schema_check_can_fail(tmp_path: Path) -> None:
    bad = (DATA / "domain_base.xml").read_text().replace("managed='no'", "managed='maybe'")
    with pytest.raises(AssertionError, match=r"fail(s|ed) to validate"):
        schema_valid(tmp_path, bad)


def vmi_object() -> dict[str, Any]:
    return {
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1"},
        "spec": {
            "domain": {
                "devices": {
                    "gpus": [
                        {"name": "gpu.main", "deviceName": GPU},
                        {"name": "gpu2", "deviceName": "10de:1eb8"},
                    ],
                    "hostDevices": [
                        {"name": "audio", "deviceName": AUDIO},
                        {"name": "nic", "deviceName": MLX},
                    ],
                }
            }
        },
    }


ENV = {
    naming.kubevirt_env_var(GPU): "0000:65:00.0,0000:b3:00.0",
    naming.kubevirt_env_var(AUDIO): "0000:65:00.1",
    naming.kubevirt_env_var(MLX): "0000:3b:00.2, 0000:3b:00.3",  # spaces tolerated; extra unused
}


# --------------------------------------------------------------------------- aliases


@pytest.mark.parametrize(
    ("name", "sanitized"),
    [("nic1", "nic1"), ("a.b", "a-b"), ("gpu 0/1", "gpu-0-1"), ("ü", "-"), ("x_y-Z9", "x_y-Z9")],
)
def test_sanitize(name: str, sanitized: str) -> None:
    assert sanitize(name) == sanitized


@pytest.mark.parametrize("name", ["a.b", "..", "日本", "a:b", "x'\"<>&", "tab\there", "ok-1_2"])
def test_every_alias_matches_qemu_rule(name: str) -> None:
    for kind in ("hostdevice", "gpu"):
        assert is_user_alias(alias_for(kind, name))
        assert is_user_alias(alias_for(kind, name, 3))
    assert not is_user_alias("ua-a.b") and not is_user_alias("hostdevice-x")


# --------------------------------------------------------------------------- assignment


def test_vmi_entries_assigned_in_launcher_order(config: Config) -> None:
    entries, problems = entries_of(vmi_object(), config, "vm1")
    assert problems == []
    got = [(h.alias, str(h.source)) for h in assign(entries, ENV)]
    assert got == [
        ("ua-hostdevice-audio", "0000:65:00.1"),
        ("ua-hostdevice-nic", "0000:3b:00.2"),
        ("ua-gpu-gpu-main", "0000:65:00.0"),
        ("ua-gpu-gpu2", "0000:b3:00.0"),
    ]


def test_count_entries_get_indexed_aliases() -> None:
    entries = [DeviceEntry("nvme", MLX, count=2)]
    got = [(h.alias, str(h.source)) for h in assign(entries, ENV)]
    assert got == [
        ("ua-hostdevice-nvme-0", "0000:3b:00.2"),
        ("ua-hostdevice-nvme-1", "0000:3b:00.3"),
    ]


def test_missing_env_var_names_resource_and_variable() -> None:
    with pytest.raises(HostdevError) as exc:
        assign([DeviceEntry("x", "devices.kubevirt.io/1af4_1000")], ENV)
    assert "devices.kubevirt.io/1af4_1000" in str(exc.value)
    assert "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_1AF4_1000 is not set" in str(exc.value)


def test_too_few_addresses_is_an_error_naming_the_variable() -> None:
    entries = [DeviceEntry("a", AUDIO), DeviceEntry("b", AUDIO)]
    with pytest.raises(HostdevError) as exc:
        assign(entries, ENV)
    text = str(exc.value)
    assert "2 devices wanted (ua-hostdevice-a, ua-hostdevice-b)" in text
    assert "PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_10F8 lists only 1 (0000:65:00.1)" in text


@pytest.mark.parametrize(
    "value", ["0000:65:00.8", "65:00", "../0000:65:00.0", "0000:65:00.0,0000:65:00.0"]
)
def test_bad_env_values_rejected(value: str) -> None:
    with pytest.raises(HostdevError, match="PCI_RESOURCE_DEVICES_KUBEVIRT_IO_10DE_10F8="):
        assign([DeviceEntry("a", AUDIO)], {naming.kubevirt_env_var(AUDIO): value})


def test_multifunction_keeps_host_functions_and_renumbers_without_function_0() -> None:
    devs = [
        Hostdev("ua-a", GPU, PciAddress.parse("0000:65:00.1")),
        Hostdev("ua-b", GPU, PciAddress.parse("0000:65:00.0")),
        Hostdev("ua-c", GPU, PciAddress.parse("0000:b3:00.3")),
        Hostdev("ua-d", GPU, PciAddress.parse("0000:b3:00.2")),
        Hostdev("ua-e", GPU, PciAddress.parse("0000:17:00.0")),
    ]
    placed = place_multifunction(devs, Layout(bus=2, first_slot=0x1D, used_slots=frozenset({0x1D})))
    got = {
        h.alias: None
        if h.guest is None
        else (h.guest.bus, h.guest.slot, h.guest.function, h.guest.multifunction)
        for h in placed
    }
    assert got == {
        "ua-a": (2, 0x1E, 1, False),  # host 65:00.1 keeps function 1
        "ua-b": (2, 0x1E, 0, True),  # host 65:00.0 is function 0: multifunction='on'
        "ua-c": (2, 0x1F, 1, False),  # 0000:b3:00 has no function 0: renumbered .2 → 0, .3 → 1
        "ua-d": (2, 0x1F, 0, True),
        "ua-e": None,  # a single function: libvirt picks its slot
    }
    with pytest.raises(HostdevError, match="no free guest slot on bus 0x00 from 0x1f"):
        place_multifunction(devs, Layout(bus=0, first_slot=0x1F))


# --------------------------------------------------------------------------- XML + libvirt


def test_fragments_golden_and_accepted_by_libvirt(
    config: Config, conn: Any, tmp_path: Path
) -> None:
    entries, _ = entries_of(vmi_object(), config, "vm1")
    _, xml = hostdev.build(entries, ENV)
    golden("hostdevs_vmi.xml", xml)
    base = (DATA / "domain_base.xml").read_text()
    wrapped = base.replace("</devices>", xml + "</devices>")
    out = accepted_by_libvirt(conn, wrapped)
    for alias in ("ua-hostdevice-audio", "ua-hostdevice-nic", "ua-gpu-gpu-main", "ua-gpu-gpu2"):
        assert f"<alias name='{alias}'/>" in out
    assert "<address domain='0x0000' bus='0xb3' slot='0x00' function='0x0'/>" in out
    schema_valid(tmp_path, wrapped)


def test_merge_is_golden_idempotent_and_accepted(config: Config, conn: Any, tmp_path: Path) -> None:
    entries, _ = entries_of(vmi_object(), config, "vm1")
    base = (DATA / "domain_base.xml").read_text()
    _, merged = hostdev.build(entries, ENV, domain_xml=base)
    golden("domain_merged.xml", merged)
    _, again = hostdev.build(entries, ENV, domain_xml=merged)
    assert again == merged
    out = accepted_by_libvirt(conn, merged)
    assert out.count("<hostdev ") == 5  # the kept one + four new
    schema_valid(tmp_path, merged)


def test_multifunction_merge_golden_and_accepted(conn: Any, tmp_path: Path) -> None:
    entries = [DeviceEntry("gpu", GPU, kind="gpu"), DeviceEntry("gpu-audio", AUDIO, kind="gpu")]
    base = (DATA / "domain_base.xml").read_text()
    hostdevs, merged = hostdev.build(entries, ENV, domain_xml=base, layout=Layout())
    golden("domain_multifunction.xml", merged)
    # the interface sits on guest 00:10.0, so the GPU's two functions share slot 0x11
    assert [h.guest for h in hostdevs if h.guest and h.guest.slot == 0x11] and len(hostdevs) == 2
    _, again = hostdev.build(entries, ENV, domain_xml=merged, layout=Layout())
    assert again == merged
    out = accepted_by_libvirt(conn, merged)
    assert "slot='0x11' function='0x0' multifunction='on'" in out
    assert "slot='0x11' function='0x1'/>" in out
    schema_valid(tmp_path, merged)


def test_libvirt_really_checks_what_we_emit(conn: Any) -> None:
    """The test driver is a real check: the same source twice is refused."""
    import libvirt

    base = (DATA / "domain_base.xml").read_text()
    dup = hostdev.render([Hostdev("ua-x", GPU, PciAddress.parse("0000:03:00.0"))])
    with pytest.raises(libvirt.libvirtError, match="Hostdev already exists"):
        conn.defineXML(base.replace("</devices>", dup + "</devices>"))


def test_merge_refuses_same_source_under_other_alias() -> None:
    base = (DATA / "domain_base.xml").read_text()
    with pytest.raises(
        DomainXmlError,
        match=re.escape(
            "already passes 0000:03:00.0 through as hostdev alias 'ua-hostdevice-keep'"
        ),
    ):
        hostdev.merge(base, [Hostdev("ua-x", GPU, PciAddress.parse("0000:03:00.0"))])


@pytest.mark.parametrize(
    ("xml", "needle"),
    [("<domain><devices>", "not well-formed"), ("<network/>", "expected a libvirt <domain>")],
)
def test_bad_domain_xml(xml: str, needle: str) -> None:
    with pytest.raises(DomainXmlError, match=needle):
        hostdev.merge(xml, [])


def test_entities_are_not_expanded(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("TOPSECRET")
    xml = f'<!DOCTYPE d [<!ENTITY x SYSTEM "file://{secret}">]><domain><name>&x;</name></domain>'
    assert "TOPSECRET" not in hostdev.merge(xml, [])


# --------------------------------------------------------------------------- libvirt adapter


def test_define_through_test_driver_is_idempotent() -> None:
    from vm_translate import libvirt_adapter

    base = (DATA / "domain_base.xml").read_text()
    hs = [Hostdev("ua-gpu-g", GPU, PciAddress.parse("0000:65:00.0"))]
    outcome, xml = libvirt_adapter.define("test:///default", hs, domain_xml=base)
    assert outcome.domain == "vm1" and outcome.action == "defined"
    assert "ua-gpu-g" in xml
    with pytest.raises(LibvirtError, match="no domain 'nope' at test:///default"):
        libvirt_adapter.define("test:///default", hs, domain_name="nope")


def test_define_by_name_and_attach_errors(conn: Any) -> None:
    from vm_translate import libvirt_adapter

    # each test:///default connection is its own fresh world, so exercise the by-name path
    # against the driver's built-in running domain "test"
    hs = [Hostdev("ua-gpu-g", GPU, PciAddress.parse("0000:65:00.0"))]
    outcome, xml = libvirt_adapter.define("test:///default", hs, domain_name="test")
    assert outcome.domain == "test"
    assert xml.count("ua-gpu-g") == 1
    # the test driver does not implement hot-plug: the error must say what failed
    with pytest.raises(
        LibvirtError, match=re.escape("attaching ua-gpu-g (0000:65:00.0) to test failed")
    ):
        libvirt_adapter.attach("test:///default", "test", hs)


def test_bad_uri_is_named() -> None:
    from vm_translate import libvirt_adapter

    with pytest.raises(LibvirtError, match="cannot connect to libvirt at bogus:///x"):
        libvirt_adapter.define("bogus:///x", [], domain_xml="<domain/>")


def test_define_or_attach_places_against_the_domain_it_will_change() -> None:
    """By name: the persistent XML is read first and handed to the placement; live: attach."""
    from vm_translate import libvirt_adapter
    from vm_translate.errors import TranslateUsageError

    seen: list[str | None] = []
    hs = [Hostdev("ua-gpu-g", GPU, PciAddress.parse("0000:65:00.0"))]

    def build(xml: str | None) -> list[Hostdev]:
        seen.append(xml)
        return hs

    out = libvirt_adapter.define_or_attach("test:///default", build, domain_name="test")
    assert (out.action, out.domain, out.aliases) == ("defined", "test", ("ua-gpu-g",))
    assert seen[0] is not None and "<name>test</name>" in seen[0]
    base = (DATA / "domain_base.xml").read_text()
    out = libvirt_adapter.define_or_attach("test:///default", build, domain_xml=base)
    assert out.domain == "vm1" and seen[1] == base
    with pytest.raises(LibvirtError, match="attaching ua-gpu-g"):
        libvirt_adapter.define_or_attach("test:///default", build, domain_name="test", live=True)
    with pytest.raises(TranslateUsageError, match="--domain-xml FILE or --domain NAME"):
        libvirt_adapter.define_or_attach("test:///default", build)
    with pytest.raises(TranslateUsageError, match="--live needs --domain"):
        libvirt_adapter.define_or_attach("test:///default", build, live=True)


def test_address_fields_are_declared_once_and_round_trip() -> None:
    """What :func:`hostdev.address_attrs` writes, :func:`hostdev.address_values` reads back."""
    from lxml import etree

    a = PciAddress.parse("0001:65:1f.7")
    attrs = hostdev.address_attrs(a)
    assert attrs == {"domain": "0x0001", "bus": "0x65", "slot": "0x1f", "function": "0x7"}
    assert hostdev.address_values(etree.Element("address", attrs)) == {
        "domain": 1, "bus": 0x65, "slot": 0x1F, "function": 7}  # fmt: skip
    assert hostdev.address_values(etree.Element("address", slot="zz")) is None
    # an absent attribute is 0, as libvirt reads it
    assert hostdev.address_values(etree.Element("address", bus="0x3")) == {
        "domain": 0, "bus": 3, "slot": 0, "function": 0}  # fmt: skip


# the tests that talk to libvirt (directly or through vm_translate.libvirt_adapter)
NEED_LIBVIRT = {
    "test_fragments_golden_and_accepted_by_libvirt",
    "test_merge_is_golden_idempotent_and_accepted",
    "test_multifunction_merge_golden_and_accepted",
    "test_libvirt_really_checks_what_we_emit",
    "test_define_through_test_driver_is_idempotent",
    "test_define_by_name_and_attach_errors",
    "test_bad_uri_is_named",
    "test_define_or_attach_places_against_the_domain_it_will_change",
}


def test_pure_tests_need_no_libvirt(tmp_path: Path) -> None:
    """With libvirt unimportable, exactly the libvirt tests fail; every other test of this
    file runs and passes (none is skipped). The inner session has a base temp dir of its own:
    in the shared one it would start by deleting the oldest session's dirs (pytest keeps
    three), trees of thousands of files, which took this test up to 51 s."""
    import sys

    code = (
        "import sys; sys.modules['libvirt'] = None; import pytest; "
        f"sys.exit(pytest.main([{__file__!r}, '-q', '-rfEs', '-p', 'no:cacheprovider', "
        f"'--basetemp', {str(tmp_path / 'inner')!r}, "
        "'-k', 'not test_pure_tests_need_no_libvirt']))"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    failed = set(re.findall(r"^(?:FAILED|ERROR) \S+::(\w+)", p.stdout, re.M))
    assert failed == NEED_LIBVIRT, p.stdout[-3000:]
    assert not re.search(r"\d+ skipped", p.stdout), p.stdout[-3000:]
    assert re.search(r"(\d+) passed", p.stdout), p.stdout[-3000:]
