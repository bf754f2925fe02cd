"""The pure translation: VMI, VM template, annotated Pod, and every error it must name."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from vfio_dp.model.config import DEFAULT_CONFIG, Config
from vm_translate.entries import resolve_device_name
from vm_translate.errors import SpecError
from vm_translate.patch import apply_patch, pointer, split_pointer
from vm_translate.spec import APPLIED_ANNOTATION
from vm_translate.translate import translate

GPU = "devices.kubevirt.io/10de_1eb8"


def vmi(gpus: list[Any] | None = None, host_devices: list[Any] | None = None) -> dict[str, Any]:
    devices: dict[str, Any] = {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
    if gpus is not None:
        devices["gpus"] = gpus
    if host_devices is not None:
        devices["hostDevices"] = host_devices
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1", "namespace": "default"},
        "spec": {"domain": {"devices": devices, "resources": {"requests": {"memory": "1Gi"}}}},
    }


def pod(
    annotation: object = None,
    containers: list[Any] | None = None,
    extra: dict[str, str] | None = None,
) -> dict[str, Any]:
    annotations: dict[str, object] = dict(extra or {})
    if annotation is not None:
        annotations["devices.kubevirt.io/passthrough"] = annotation
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "launcher", "namespace": "vms", "annotations": annotations},
        "spec": {
            "containers": containers
            if containers is not None
            else [{"name": "compute", "image": "qemu"}, {"name": "sidecar", "image": "x"}]
        },
    }


def problems_of(exc: pytest.ExceptionInfo[SpecError]) -> list[str]:
    return [str(p) for p in exc.value.problems]


# --------------------------------------------------------------------------- pointers


def test_pointer_escapes_slash_and_tilde_and_round_trips() -> None:
    path = pointer("a", 0, "devices.kubevirt.io/10de_1eb8", "x~y")
    assert path == "/a/0/devices.kubevirt.io~110de_1eb8/x~0y"
    assert split_pointer(path) == ["a", "0", "devices.kubevirt.io/10de_1eb8", "x~y"]
    # "~01" must decode to "~1", not "/" (RFC 6901 order of unescaping)
    assert split_pointer("/~01") == ["~1"]


# --------------------------------------------------------------------------- device names


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("10de:1eb8", GPU),
        ("10DE:1EB8", GPU),
        (GPU, GPU),
        ("devices.kubevirt.io/10DE_1EB8", GPU),  # case slip corrected
        ("10de_1eb8", GPU),  # bare name gets the configured domain
        ("nvme-b", "devices.kubevirt.io/nvme-b"),
        ("15b3:1017", "example.com/mlx"),
        ("nvidia.com/TU104GL_Tesla_T4", "nvidia.com/TU104GL_Tesla_T4"),  # other domain untouched
    ],
)
def test_resolve_device_name(config: Config, written: str, resolved: str) -> None:
    assert resolve_device_name(written, config) == resolved


def test_default_config_names_any_pair_by_default_rule() -> None:
    assert resolve_device_name("1AF4:1000", DEFAULT_CONFIG) == "devices.kubevirt.io/1af4_1000"


# --------------------------------------------------------------------------- VMI / VM


def test_vmi_pairs_rewritten_only_device_name(config: Config) -> None:
    obj = vmi(
        gpus=[{"name": "gpu1", "deviceName": "10DE:1EB8"}, {"name": "gpu2", "deviceName": GPU}],
        host_devices=[{"name": "nic", "deviceName": "15b3:1017", "tag": "keep"}],
    )
    original = copy.deepcopy(obj)
    t = translate(obj, config)
    assert list(t.patch) == [
        {
            "op": "replace",
            "path": "/spec/domain/devices/hostDevices/0/deviceName",
            "value": "example.com/mlx",
        },
        {"op": "replace", "path": "/spec/domain/devices/gpus/0/deviceName", "value": GPU},
    ]
    assert obj == original  # input untouched
    expected = copy.deepcopy(original)
    expected["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] = GPU
    expected["spec"]["domain"]["devices"]["hostDevices"][0]["deviceName"] = "example.com/mlx"
    assert t.obj == expected
    assert dict(t.requests) == {GPU: 2, "example.com/mlx": 1}


def test_vmi_already_canonical_gives_no_patch(config: Config) -> None:
    t = translate(vmi(gpus=[{"name": "g", "deviceName": GPU}]), config)
    assert not t.changed
    assert dict(t.requests) == {GPU: 1}


def test_vm_template_is_translated(config: Config) -> None:
    vm = {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "vm1"},
        "spec": {
            "running": True,
            "template": {"spec": vmi(gpus=[{"name": "g", "deviceName": "10de:1eb8"}])["spec"]},
        },
    }
    t = translate(vm, config)
    assert [op["path"] for op in t.patch] == [
        "/spec/template/spec/domain/devices/gpus/0/deviceName"
    ]
    assert t.obj["spec"]["template"]["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] == GPU
    assert t.obj["spec"]["running"] is True


def test_other_kinds_pass_untouched(config: Config) -> None:
    obj = {"kind": "ConfigMap", "metadata": {"name": "x"}, "data": {"a": "10de:1eb8"}}
    t = translate(obj, config)
    assert not t.changed and t.obj is obj


@pytest.mark.parametrize(
    ("device_name", "needle"),
    [
        ("10de:1eb", "each ID is exactly 4 hex digits"),
        ("10de:1eb8:00", "each ID is exactly 4 hex digits"),
        (
            "8086:0a54",
            "ambiguous: it may be advertised as any of "
            "devices.kubevirt.io/nvme-a, devices.kubevirt.io/nvme-b",
        ),
        ("1af4:1000", "no selector of the vfio_dp configuration takes 1af4:1000"),
        ("devices.kubevirt.io/nope", "unknown resource"),
        ("devices.kubevirt.io/1af4_1000", "unknown resource"),
        ("Bad.Domain/x", "not a valid resource name"),
        ("gpu", "resource names carry a domain"),
        ("", "must be a resource name like"),
        (7, "must be a resource name like"),
    ],
)
def test_vmi_bad_device_names_are_rejected_naming_entry(
    config: Config, device_name: object, needle: str
) -> None:
    obj = vmi(
        gpus=[{"name": "gpu1", "deviceName": GPU}, {"name": "gpu2", "deviceName": device_name}]
    )
    with pytest.raises(SpecError) as exc:
        translate(obj, config)
    (problem,) = problems_of(exc)
    assert problem.startswith("spec.domain.devices.gpus[1] (name 'gpu2').deviceName: ")
    assert needle in problem
    assert "VirtualMachineInstance default/vm1" in str(exc.value)


def test_vmi_every_problem_is_listed_and_names_required(config: Config) -> None:
    obj = vmi(
        gpus=[
            {"deviceName": GPU},
            {"name": "a.b", "deviceName": GPU},
            {"name": "a-b", "deviceName": GPU},
        ],
        host_devices=[{"name": "x", "deviceName": "zz:zz"}, "oops"],
    )
    with pytest.raises(SpecError) as exc:
        translate(obj, config)
    text = "\n".join(problems_of(exc))
    assert "gpus[0].name: None: every entry needs a name" in text
    assert "hostDevices[0] (name 'x').deviceName" in text
    assert "hostDevices[1]: 'oops': must be a mapping" in text
    assert "alias 'ua-gpu-a-b', already used by entry 'a.b'" in text
    assert len(exc.value.problems) == 4
    assert exc.value.exit_code == 1


# --------------------------------------------------------------------------- Pods


def test_pod_annotation_json_adds_requests_and_limits(config: Config) -> None:
    ann = json.dumps(
        [
            {"name": "gpu", "vendor": "10de", "device": "1eb8", "count": 2},
            {"name": "nic", "resource": "example.com/mlx"},
        ]
    )
    t = translate(pod(ann), config)
    assert list(t.patch) == [
        {
            "op": "add",
            "path": "/spec/containers/0/resources",
            "value": {
                "requests": {GPU: "2", "example.com/mlx": "1"},
                "limits": {GPU: "2", "example.com/mlx": "1"},
            },
        },
        {
            "op": "add",
            "path": "/metadata/annotations/devices.kubevirt.io~1passthrough-applied",
            "value": '{"container":"compute","resources":'
            '{"devices.kubevirt.io/10de_1eb8":2,"example.com/mlx":1}}',
        },
    ]
    assert t.obj["spec"]["containers"][1] == {"name": "sidecar", "image": "x"}
    assert dict(t.requests) == {GPU: 2, "example.com/mlx": 1}


def test_pod_yaml_annotation_named_container_adds_to_existing_values(config: Config) -> None:
    ann = "- name: gpu\n  vendor: '10DE'\n  device: '1EB8'\n"
    containers = [
        {"name": "sidecar"},
        {
            "name": "vm",
            "resources": {
                "requests": {"memory": "1Gi", GPU: "1"},
                "limits": {GPU: 1},
            },
        },
    ]
    obj = pod(ann, containers, extra={"devices.kubevirt.io/passthrough-container": "vm"})
    t = translate(obj, config)
    assert list(t.patch)[:2] == [
        {
            "op": "add",
            "path": "/spec/containers/1/resources/requests/devices.kubevirt.io~110de_1eb8",
            "value": "2",
        },
        {
            "op": "add",
            "path": "/spec/containers/1/resources/limits/devices.kubevirt.io~110de_1eb8",
            "value": "2",
        },
    ]
    res = t.obj["spec"]["containers"][1]["resources"]
    assert res == {"requests": {"memory": "1Gi", GPU: "2"}, "limits": {GPU: "2"}}
    assert t.obj["spec"]["containers"][0] == {"name": "sidecar"}


def test_pod_translation_is_idempotent(config: Config) -> None:
    ann = '[{"name": "gpu", "vendor": "10de", "device": "1eb8", "count": 2}]'
    first = translate(pod(ann), config)
    assert first.changed
    second = translate(first.obj, config)
    assert not second.changed
    assert second.obj == first.obj
    assert dict(second.requests) == {GPU: 2}


def test_pod_changed_annotation_moves_amounts_exactly(config: Config) -> None:
    first = translate(
        pod('[{"name": "gpu", "vendor": "10de", "device": "1eb8", "count": 2}]'), config
    )
    edited: dict[str, Any] = copy.deepcopy(dict(first.obj))
    edited["metadata"]["annotations"]["devices.kubevirt.io/passthrough"] = (
        '[{"name": "gpu", "vendor": "10de", "device": "1eb8"}]'
    )
    edited["metadata"]["annotations"]["devices.kubevirt.io/passthrough-container"] = "sidecar"
    t = translate(edited, config)
    compute, sidecar = t.obj["spec"]["containers"]
    assert GPU not in compute["resources"]["requests"] and GPU not in compute["resources"]["limits"]
    assert sidecar["resources"] == {"requests": {GPU: "1"}, "limits": {GPU: "1"}}
    assert json.loads(t.obj["metadata"]["annotations"][APPLIED_ANNOTATION]) == {
        "container": "sidecar",
        "resources": {GPU: 1},
    }
    assert not translate(t.obj, config).changed


def test_pod_patch_applies_to_original_to_give_object(config: Config) -> None:
    obj = pod('[{"name": "gpu", "resource": "10de:1eb8"}]')
    t = translate(obj, config)
    assert apply_patch(obj, list(t.patch)) == t.obj


def test_pod_without_annotation_passes(config: Config) -> None:
    t = translate(pod(), config)
    assert not t.changed


@pytest.mark.parametrize(
    ("annotation", "needle"),
    [
        ("{not json: [", "neither JSON nor YAML"),
        ('{"name": "gpu"}', "must be a non-empty list"),
        ("[]", "must be a non-empty list"),
        (
            '[{"name": "gpu", "vendor": "10de", "device": "1eb8", "count": 0}]',
            "count must be a whole number >= 1",
        ),
        (
            '[{"name": "gpu", "vendor": "10de", "device": "1eb8", "count": true}]',
            "count must be a whole number >= 1",
        ),
        ('[{"name": "gpu", "vendor": "10de", "device": "1eb"}]', "device must be 4 hex digits"),
        ('[{"name": "gpu", "vendor": 4318, "device": "1eb8"}]', "vendor must be 4 hex digits"),
        ('[{"name": "gpu", "vendor": "8086", "device": "0a54"}]', "ambiguous"),
        ('[{"name": "gpu", "vendor": "1af4", "device": "1000"}]', "no selector"),
        ('[{"name": "gpu", "resource": "devices.kubevirt.io/zzz"}]', "unknown resource"),
        ('[{"name": "gpu"}]', "needs vendor and device, or resource"),
        ('[{"vendor": "10de", "device": "1eb8"}]', "every entry needs a non-empty name"),
        ('[{"name": "g", "vendor": "10de", "device": "1eb8", "resource": "x/y"}]', "not both"),
        ('[{"name": "g", "resource": "10de:1eb8", "size": 3}]', "unknown key"),
        (
            '[{"name": "g", "resource": "10de:1eb8", "count": 2},'
            ' {"name": "g-0", "resource": "10de:1eb8"}]',
            "alias 'ua-hostdevice-g-0'",
        ),
    ],
)
def test_pod_bad_annotations_rejected(config: Config, annotation: str, needle: str) -> None:
    with pytest.raises(SpecError) as exc:
        translate(pod(annotation), config)
    text = str(exc.value)
    assert needle in text
    assert "metadata.annotations[devices.kubevirt.io/passthrough]" in text
    assert "Pod vms/launcher" in text


def test_pod_missing_container_is_named(config: Config) -> None:
    obj = pod(
        '[{"name": "g", "resource": "10de:1eb8"}]',
        extra={"devices.kubevirt.io/passthrough-container": "qemu"},
    )
    with pytest.raises(
        SpecError, match=r"'qemu': no such container; the pod has 'compute', 'sidecar'"
    ):
        translate(obj, config)


def test_pod_without_containers_rejected(config: Config) -> None:
    with pytest.raises(SpecError, match="a pod needs at least one container"):
        translate(pod('[{"name": "g", "resource": "10de:1eb8"}]', containers=[]), config)


@pytest.mark.parametrize(
    ("resources", "needle"),
    [
        ({"requests": {GPU: "1"}, "limits": {GPU: "2"}}, "requires requests == limits"),
        ({"limits": {GPU: "500m"}}, "whole number of devices"),
    ],
)
def test_pod_invalid_existing_values_rejected(
    config: Config, resources: dict[str, Any], needle: str
) -> None:
    obj = pod(
        '[{"name": "g", "resource": "10de:1eb8"}]',
        containers=[{"name": "c", "resources": resources}],
    )
    with pytest.raises(SpecError, match=needle):
        translate(obj, config)


def test_pod_tampered_applied_annotation_rejected(config: Config) -> None:
    obj = pod('[{"name": "g", "resource": "10de:1eb8"}]', extra={APPLIED_ANNOTATION: "{bad"})
    with pytest.raises(SpecError, match="written by the vfio_dp webhook; delete it"):
        translate(obj, config)


def test_pointer_escapes_only_what_rfc6901_escapes() -> None:
    from vm_translate.patch import pointer, split_pointer

    assert pointer("spec", "hostDevices", 0, "deviceName") == "/spec/hostDevices/0/deviceName"
    assert pointer("a/b", "c~d", "~1") == "/a~1b/c~0d/~01"
    assert split_pointer(pointer("a/b", "c~d", "~1")) == ["a/b", "c~d", "~1"]
    assert pointer() == ""
