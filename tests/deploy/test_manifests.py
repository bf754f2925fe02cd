"""Every kustomization builds, and every rendered object is valid against the API types."""

from __future__ import annotations

import copy

import pytest

from tests.deploy.conftest import INSTALLABLE, TARGETS, Obj, find
from tests.deploy.k8s_schema import check_object, deserialize_errors

# ------------------------------------------------------------------ the checker can fail


def _deployment() -> Obj:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "labels": {"a": "b"}},
        "spec": {
            "selector": {"matchLabels": {"a": "b"}},
            "template": {
                "metadata": {"labels": {"a": "b"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": "i",
                            "ports": [{"containerPort": 1}],
                            "livenessProbe": {"httpGet": {"path": "/", "port": "http"}},
                            "resources": {"limits": {"memory": "1Mi"}},
                        }
                    ]
                },
            },
        },
    }


def test_checker_accepts_a_valid_object() -> None:
    assert check_object(_deployment()) == []
    assert deserialize_errors(_deployment()) == []


@pytest.mark.parametrize(
    ("mutate", "path", "words"),
    [
        (lambda d: d["metadata"].update(bogus=1), "metadata.bogus", "unknown field"),
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0].update(volumeMount=[]),
            "spec.template.spec.containers[0].volumeMount",
            "unknown field",
        ),
        (
            lambda d: d["spec"]["template"]["spec"]["containers"][0]["livenessProbe"][
                "httpGet"
            ].update(scheme_="HTTPS"),
            "spec.template.spec.containers[0].livenessProbe.httpGet.scheme_",
            "unknown field",
        ),
        (lambda d: d["metadata"]["labels"].update(on=True), "metadata.labels.on", "got bool"),
        (lambda d: d["spec"].update(replicas="2"), "spec.replicas", "expected int"),
        (lambda d: d["spec"].update(selector=[]), "spec.selector", "expected an object"),
        (
            lambda d: d["spec"]["template"]["spec"].update(containers={}),
            "spec.template.spec.containers",
            "expected a list",
        ),
    ],
)
def test_checker_rejects(mutate: object, path: str, words: str) -> None:
    obj = _deployment()
    mutate(obj)  # type: ignore[operator]
    problems = check_object(obj)
    assert any(p.path == path and words in p.message for p in problems), problems


def test_checker_rejects_unknown_kinds_and_crd_fields() -> None:
    assert check_object({"apiVersion": "example.com/v1", "kind": "Thing", "metadata": {}})
    cert = {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {"name": "c"},
        "spec": {"secretName": "s", "issuerRef": {"name": "i"}, "dnsName": ["x"]},
    }
    assert [p.path for p in check_object(cert)] == ["spec.dnsName"]
    bad_enum = copy.deepcopy(cert)
    del bad_enum["spec"]["dnsName"]
    bad_enum["spec"]["privateKey"] = {"algorithm": "DSA"}
    assert [p.path for p in check_object(bad_enum)] == ["spec.privateKey.algorithm"]


def test_deserializer_catches_a_missing_required_field() -> None:
    obj = _deployment()
    del obj["spec"]["selector"]
    assert deserialize_errors(obj)


# ------------------------------------------------------------------ the real manifests


@pytest.mark.parametrize("target", TARGETS)
def test_every_rendered_object_is_valid(rendered: dict[str, list[Obj]], target: str) -> None:
    objs = rendered[target]
    assert objs, f"{target} rendered nothing"
    problems = [f"{o['kind']}/{o['metadata']['name']}: {p}" for o in objs for p in check_object(o)]
    problems += [e for o in objs for e in deserialize_errors(o)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("target", TARGETS)
def test_everything_namespaced_is_in_vfio_dp(rendered: dict[str, list[Obj]], target: str) -> None:
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for o in rendered[target]:
        if o["kind"] not in cluster_scoped:
            assert o["metadata"].get("namespace") == "vfio-dp", (
                f"{o['kind']}/{o['metadata']['name']}"
            )
    names = [(o["kind"], o["metadata"]["name"]) for o in rendered[target]]
    assert len(names) == len(set(names)), "duplicate objects"


@pytest.mark.parametrize("target", INSTALLABLE)
def test_installable_overlays_are_complete(rendered: dict[str, list[Obj]], target: str) -> None:
    objs = rendered[target]
    for kind in (
        "Namespace",
        "ConfigMap",
        "DaemonSet",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
    ):
        assert any(o["kind"] == kind for o in objs), f"{target} has no {kind}"
    find(objs, "DaemonSet", "vfio-dp-daemon")


def test_one_image_for_both_components(rendered: dict[str, list[Obj]]) -> None:
    objs = rendered["base"]
    images = {
        c["image"]
        for kind in ("DaemonSet", "Deployment")
        for c in find(objs, kind)["spec"]["template"]["spec"]["containers"]
    }
    assert len(images) == 1, images
