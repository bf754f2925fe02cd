"""The webhook's translation of ``gpus[]``/``hostDevices[]`` that name a mediated-device
resource (the config's ``mdev:`` entries with ``path: devicePlugin``), and its refusals:
by the config for a named entry, by the node check for a type's default name."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.vm_translate.test_review import body, review
from vfio_dp.model.config import Config, load_config_text
from vm_translate.errors import SpecError
from vm_translate.nodes import NodeResources
from vm_translate.review import decide, parse_review
from vm_translate.translate import translate

T4 = "devices.kubevirt.io/t4-1q"
NAMED = "mdev:\n- {parent: {vendor: '10de', device: '1eb8'}, type: nvidia-222, resourceName: t4-1q}\n"
DEFAULT = "mdev:\n- {parent: {vendor: '10de', device: '1eb8'}, type: nvidia-222}\n"


def cfg(text: str) -> Config:
    return load_config_text(text, "t")


def vmi(gpus: list[str], host_devices: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "ns"},
        "spec": {"domain": {"devices": {
            "gpus": [{"name": f"g{i}", "deviceName": n} for i, n in enumerate(gpus)],
            "hostDevices": [{"name": f"h{i}", "deviceName": n} for i, n in enumerate(host_devices)],
        }}},
    }  # fmt: skip


def test_a_named_mdev_resource_is_translated_and_requested() -> None:
    t = translate(vmi(["T4-1Q"], [T4]), cfg(NAMED))  # bare and a case slip: made canonical
    assert list(t.patch) == [
        {"op": "replace", "path": "/spec/domain/devices/gpus/0/deviceName", "value": T4}
    ]
    assert t.requests == {T4: 2}


def test_an_unknown_name_is_refused_naming_the_mdev_names() -> None:
    with pytest.raises(SpecError) as e:
        translate(vmi(["devices.kubevirt.io/t4-2q"]), cfg(NAMED))
    assert "unknown resource: the vfio_dp configuration advertises devices.kubevirt.io/t4-1q" in str(
        e.value
    )
    # a path: dra entry's name is not a device-plugin resource
    dra = NAMED.replace("resourceName", "path: dra, resourceName")
    with pytest.raises(SpecError):
        translate(vmi([T4]), cfg(dra))


def test_a_default_name_is_judged_by_the_nodes() -> None:
    """The type's name file is on the node: the webhook lets a well-formed name through
    (KubeVirt's spelling of the type name is made the resource name) and the node check
    refuses one no node advertises."""
    grid = "devices.kubevirt.io/GRID_T4-1Q"
    t = translate(vmi(["GRID T4-1Q"]), cfg(DEFAULT))
    assert t.requests == {grid: 1}
    assert [op["value"] for op in t.patch] == [grid]
    raw = vmi([grid])
    config = cfg(DEFAULT)
    none = decide(parse_review(body(review(raw))), config, [NodeResources("a", {"cpu": 8})])
    assert none["response"]["allowed"] is False
    assert f"{grid}: 1 requested but no schedulable node advertises" in json.dumps(none)
    ok = decide(parse_review(body(review(raw))), config, [NodeResources("a", {grid: 4})])
    assert ok["response"]["allowed"] is True
    with pytest.raises(SpecError):  # without a default-named entry, the config refuses it
        translate(raw, cfg(NAMED))


def test_the_docs_cr_and_config_agree() -> None:
    """docs/kubevirt.md "Mediated devices": each ``mediatedDevices`` entry of the CR names the
    resource our config gives the type whose name file is its ``mdevNameSelector``."""
    import re
    from pathlib import Path

    import yaml

    text = (Path(__file__).parents[2] / "docs/kubevirt.md").read_text()
    section = text.split("## Mediated devices", 1)[1].split("\n## ", 1)[0]
    cr_block, config_block = re.findall(r"```yaml\n(.*?)```", section, re.S)
    permitted = yaml.safe_load(cr_block)["permittedHostDevices"]["mediatedDevices"]
    assert all(e["externalResourceProvider"] is True for e in permitted)
    config = cfg(config_block)
    names = {"nvidia-222": "GRID T4-1Q", "mtty-2": "Dual port serial"}  # their name files
    given = {e.resource_for(names[e.type_id], config.resource_domain) for e in config.mdev}
    assert {e["resourceName"] for e in permitted} == given
    for e in permitted:  # and the webhook lets a VM name each
        translate(vmi([e["resourceName"]]), config)
