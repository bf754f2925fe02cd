"""The API-server stand-in itself: the real ``kubernetes`` client works against it, and it
refuses what kube-apiserver refuses (and accepts what it accepts, right at the limits).

Refusals are sent as raw HTTP where the client's own (pydantic) checks would stop the request
before it reaches any server — a plugin that builds bodies another way must still be caught.
"""

from __future__ import annotations

import copy
import json
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.error import HTTPError

import kubernetes.client as k8s
import pytest
from kubernetes import watch

from tests.dra.apiserver_standin import CLAIMS, MAX_BODY, ApiServerStandin
from tests.dra.conftest import DRIVER, NODE, a_slice

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"


def raw(
    api: ApiServerStandin,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
    token: str | None = None,
    data: bytes | None = None,
) -> tuple[int, dict[str, Any]]:
    if data is None and body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(
        api.url + path,
        method=method,
        data=data,
        headers={
            "Authorization": f"Bearer {token or api.token}",
            "Content-Type": content_type,
        },
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.load(r)
    except HTTPError as e:
        return e.code, json.load(e)


@pytest.fixture
def slices(apiserver: ApiServerStandin) -> k8s.ResourceV1Api:
    return k8s.ResourceV1Api(apiserver.client())


def status_of(e: pytest.ExceptionInfo[k8s.ApiException]) -> tuple[int, str]:
    return e.value.status, json.loads(e.value.body)["reason"]


# -- what it accepts, through the real client ---------------------------------------------------
def test_the_real_client_creates_gets_and_lists_slices_by_field_and_label(
    apiserver: ApiServerStandin, slices: k8s.ResourceV1Api
) -> None:
    created = slices.create_resource_slice(a_slice())
    assert created.metadata.uid and created.metadata.resource_version
    assert created.spec.devices[0].attributes[f"{DRIVER}/iommuGroup"].int == 40
    got = slices.read_resource_slice(created.metadata.name)
    assert got.spec.pool.name == NODE
    slices.create_resource_slice(a_slice("other-node", node="node-b"))
    slices.create_resource_slice(a_slice("other-driver", driver="gpu.example.com"))

    def names(**kw: str) -> list[str]:
        return sorted(s.metadata.name for s in slices.list_resource_slice(**kw).items)

    assert names(field_selector=f"spec.nodeName={NODE}") == [
        "node-a-vfio-example-com-0",
        "other-driver",
    ]
    assert names(field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}") == [
        "node-a-vfio-example-com-0"
    ]
    assert names(field_selector=f"spec.driver!={DRIVER}") == ["other-driver"]
    assert names(label_selector="app=vfio-dp") == sorted(
        ["node-a-vfio-example-com-0", "other-node", "other-driver"]
    )
    assert names(label_selector="app in (x, y)") == []
    assert names(label_selector="!app") == []


def test_generate_name_makes_a_name(slices: k8s.ResourceV1Api) -> None:
    body = a_slice()
    del body["metadata"]["name"]
    body["metadata"]["generateName"] = "node-a-vfio.example.com-"
    a = slices.create_resource_slice(body)
    b = slices.create_resource_slice(copy.deepcopy(body))
    assert a.metadata.name.startswith("node-a-vfio.example.com-")
    assert len(a.metadata.name) == len("node-a-vfio.example.com-") + 5
    assert a.metadata.name != b.metadata.name


def test_the_limits_themselves_are_accepted(slices: k8s.ResourceV1Api) -> None:
    body = a_slice(devices=128)
    dev = body["spec"]["devices"][0]
    dev["name"] = "d" * 63
    dev["attributes"] = {f"a{i}": {"int": i} for i in range(31)}
    dev["attributes"]["x" * 32] = {"string": "s" * 64}
    dev["attributes"]["resource.kubernetes.io/" + "y" * 32] = {"version": "1.2.3-rc.1+b5"}
    del dev["attributes"]["a0"]
    assert len(dev["attributes"]) == 32
    body["spec"]["driver"] = "d" * 54 + ".example"  # 62 characters
    created = slices.create_resource_slice(body)
    assert len(created.spec.devices) == 128
    first = created.spec.devices[0]  # stored whole, as sent
    assert first.name == "d" * 63 and set(first.attributes) == set(dev["attributes"])
    assert first.attributes["x" * 32].string == "s" * 64
    assert created.spec.driver == body["spec"]["driver"]


def test_update_with_a_stale_resource_version_is_a_conflict(slices: k8s.ResourceV1Api) -> None:
    first = slices.create_resource_slice(a_slice())
    first.spec.pool.generation = 2
    second = slices.replace_resource_slice(first.metadata.name, first)
    assert second.spec.pool.generation == 2
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    assert second.metadata.generation == 2
    first.spec.pool.generation = 3  # still carries the old resourceVersion
    with pytest.raises(k8s.ApiException) as e:
        slices.replace_resource_slice(first.metadata.name, first)
    assert status_of(e) == (409, "Conflict")
    assert "the object has been modified" in json.loads(e.value.body)["message"]


def test_patches_merge_strategic_and_json(slices: k8s.ResourceV1Api) -> None:
    name = slices.create_resource_slice(a_slice()).metadata.name
    # the client's default for a dict body: strategic merge (treated as merge)
    p = slices.patch_resource_slice(name, {"spec": {"pool": {"generation": 5}}})
    assert p.spec.pool.generation == 5 and p.spec.driver == DRIVER
    p = slices.patch_resource_slice(
        name,
        {"metadata": {"labels": {"app": None, "x": "y"}}},
        _content_type="application/merge-patch+json",
    )
    assert p.metadata.labels == {"x": "y"}
    p = slices.patch_resource_slice(
        name, [{"op": "replace", "path": "/spec/pool/generation", "value": 6}]
    )
    assert p.spec.pool.generation == 6
    with pytest.raises(k8s.ApiException) as e:  # a patch that makes the object invalid
        slices.patch_resource_slice(name, {"spec": {"pool": {"resourceSliceCount": 0}}})
    assert status_of(e) == (422, "Invalid")
    with pytest.raises(k8s.ApiException) as e:  # a patch with a stale resourceVersion
        slices.patch_resource_slice(
            name, {"metadata": {"resourceVersion": "1"}, "spec": {"pool": {"generation": 7}}}
        )
    assert status_of(e) == (409, "Conflict")


def test_delete_and_delete_collection_by_field_selector(
    apiserver: ApiServerStandin, slices: k8s.ResourceV1Api
) -> None:
    slices.create_resource_slice(a_slice("mine-0"))
    slices.create_resource_slice(a_slice("mine-1"))
    slices.create_resource_slice(a_slice("theirs", driver="gpu.example.com"))
    slices.create_resource_slice(a_slice("elsewhere", node="node-b"))
    gone = slices.delete_resource_slice("mine-1")
    assert gone.metadata.name == "mine-1"
    with pytest.raises(k8s.ApiException) as e:
        slices.delete_resource_slice("mine-1")
    assert status_of(e) == (404, "NotFound")
    slices.delete_collection_resource_slice(
        field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}"
    )
    left = sorted(s["metadata"]["name"] for s in apiserver.objects_of_plural("resourceslices"))
    assert left == ["elsewhere", "theirs"]


def test_watch_sends_existing_then_changes(slices: k8s.ResourceV1Api) -> None:
    slices.create_resource_slice(a_slice("before"))

    def later() -> None:
        slices.create_resource_slice(a_slice("during"))
        slices.patch_resource_slice("during", {"spec": {"pool": {"generation": 2}}})
        slices.create_resource_slice(a_slice("not-matching", node="node-b"))
        slices.delete_resource_slice("during")

    timer = threading.Timer(0.3, later)
    timer.start()
    seen = []
    w = watch.Watch()
    for ev in w.stream(
        slices.list_resource_slice, field_selector=f"spec.nodeName={NODE}", timeout_seconds=5
    ):
        seen.append((ev["type"], ev["object"].metadata.name))
        if ev["type"] == "DELETED":
            w.stop()
    timer.join()
    assert seen == [
        ("ADDED", "before"),
        ("ADDED", "during"),
        ("MODIFIED", "during"),
        ("DELETED", "during"),
    ]


def test_claims_status_only_through_the_status_subresource(
    apiserver: ApiServerStandin,
) -> None:
    claims = k8s.ResourceV1Api(apiserver.client())
    body = {
        "metadata": {"name": "vm-gpu", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 1}}]
            }
        },
        "status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u1"}]},
    }
    created = claims.create_namespaced_resource_claim("default", body)
    assert created.status is None  # status on create is dropped, as upstream
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "gpu",
                        "driver": DRIVER,
                        "pool": NODE,
                        "device": "pci-0000-3b-00-0",
                    }
                ]
            }
        }
    }
    created_dict = apiserver.objects(CLAIMS, "default")[0]
    created_dict["status"] = status
    updated = claims.replace_namespaced_resource_claim_status("vm-gpu", "default", created_dict)
    assert updated.status.allocation.devices.results[0].device == "pci-0000-3b-00-0"
    got = claims.read_namespaced_resource_claim("vm-gpu", "default")
    assert got.status.allocation.devices.results[0].pool == NODE
    assert [c.metadata.name for c in claims.list_resource_claim_for_all_namespaces().items] == [
        "vm-gpu"
    ]
    claims.delete_namespaced_resource_claim("vm-gpu", "default")
    with pytest.raises(k8s.ApiException) as e:
        claims.read_namespaced_resource_claim("vm-gpu", "default")
    assert status_of(e) == (404, "NotFound")


def test_a_seeded_claim_keeps_its_status(apiserver: ApiServerStandin) -> None:
    apiserver.seed(
        CLAIMS,
        {
            "metadata": {"name": "c", "namespace": "ns1"},
            "spec": {"devices": {"requests": []}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {"request": "r", "driver": DRIVER, "pool": NODE, "device": "pci-x"}
                        ]
                    }
                }
            },
        },
    )
    got = k8s.ResourceV1Api(apiserver.client()).read_namespaced_resource_claim("c", "ns1")
    assert got.status.allocation.devices.results[0].device == "pci-x"
    assert got.metadata.uid


def test_nodes_get_and_list(apiserver: ApiServerStandin) -> None:
    core = k8s.CoreV1Api(apiserver.client())
    node = core.read_node(NODE)
    assert node.metadata.uid and node.kind == "Node"
    assert [n.metadata.name for n in core.list_node().items] == [NODE]
    with pytest.raises(k8s.ApiException) as e:
        core.read_node("nope")
    assert status_of(e) == (404, "NotFound")


def test_a_wrong_token_is_unauthorized(apiserver: ApiServerStandin) -> None:
    code, body = raw(apiserver, "GET", SLICES_PATH, token="wrong")
    assert (code, body["reason"]) == (401, "Unauthorized")


# -- what it refuses ----------------------------------------------------------------------------
Mutation = Callable[[dict[str, Any]], None]


def _dev(s: dict[str, Any]) -> dict[str, Any]:
    d: dict[str, Any] = s["spec"]["devices"][0]
    return d


def _set(path: str, value: Any) -> Mutation:
    def mutate(s: dict[str, Any]) -> None:
        cur = s
        parts = path.split(".")
        for p in parts[:-1]:
            cur = cur[int(p)] if isinstance(cur, list) else cur[p]
        cur[parts[-1]] = value

    return mutate


TAINT = {
    "key": f"{DRIVER}/unhealthy",
    "value": "unbound",
    "effect": "NoSchedule",
    "timeAdded": "2026-11-24T18:41:14Z",
}


def _taints(taints: list[dict[str, Any]]) -> Mutation:
    return lambda s: _dev(s).__setitem__("taints", taints)


def test_accepts_a_tainted_slice_of_64(apiserver: ApiServerStandin) -> None:
    body = a_slice(devices=64)
    for d in body["spec"]["devices"]:
        d["taints"] = [dict(TAINT, key=f"{DRIVER}/t{i}") for i in range(16)]
    assert raw(apiserver, "POST", SLICES_PATH, body)[0] == 201


def _attrs(attrs: dict[str, Any]) -> Mutation:
    return lambda s: _dev(s).__setitem__("attributes", attrs)


REFUSED: list[tuple[str, Mutation, int, str]] = [
    ("unknown spec field", _set("spec.foo", 1), 400, 'unknown field "spec.foo"'),
    (
        "unknown field in an attribute",
        _attrs({"vendorID": {"strin": "10de"}}),
        400,
        'unknown field "spec.devices[0].attributes[vendorID].strin"',
    ),
    ("unknown metadata field", _set("metadata.nmae", "x"), 400, 'unknown field "metadata.nmae"'),
    ("generation as a string", _set("spec.pool.generation", "1"), 400, "spec.pool.generation"),
    ("attribute int as a string", _attrs({"n": {"int": "1"}}), 400, "expected int"),
    ("device name with _", _set("spec.devices.0.name", "pci_0000"), 422, "spec.devices[0].name"),
    ("device name 64 long", _set("spec.devices.0.name", "d" * 64), 422, "spec.devices[0].name"),
    ("device name empty", _set("spec.devices.0.name", ""), 422, "spec.devices[0].name"),
    ("attribute name with -", _attrs({f"{DRIVER}/numa-node": {"int": 0}}), 422, "C identifier"),
    ("attribute id 33 long", _attrs({"x" * 33: {"int": 0}}), 422, "more than 32"),
    ("attribute domain 64 long", _attrs({"d" * 64 + "/x": {"int": 0}}), 422, "domain"),
    ("attribute domain uppercase", _attrs({"Vfio.Example.com/x": {"int": 0}}), 422, "domain"),
    ("attribute empty domain", _attrs({"/x": {"int": 0}}), 422, "domain must not be empty"),
    ("string value 65 long", _attrs({"s": {"string": "s" * 65}}), 422, "Too long"),
    ("two values", _attrs({"v": {"int": 1, "string": "1"}}), 422, "exactly one value"),
    ("no value", _attrs({"v": {}}), 422, "exactly one value"),
    ("version not semver", _attrs({"v": {"version": "1.0"}}), 422, "semver"),
    ("33 attributes", _attrs({f"a{i}": {"int": i} for i in range(33)}), 422, "must not exceed 32"),
    (
        "attributes + capacity 33",
        lambda s: (
            _attrs({f"a{i}": {"int": i} for i in range(32)})(s),
            _dev(s).__setitem__("capacity", {"mem": {"value": "1Gi"}}),
        ),
        422,
        "must not exceed 32",
    ),
    (
        "capacity not a quantity",
        lambda s: _dev(s).__setitem__("capacity", {"m": {"value": "lots"}}),
        422,
        "quantity",
    ),
    (
        "129 devices",
        lambda s: s["spec"].__setitem__("devices", a_slice(devices=129)["spec"]["devices"]),
        422,
        "at most 128",
    ),
    (
        "duplicate device names",
        lambda s: s["spec"]["devices"].append(copy.deepcopy(_dev(s))),
        422,
        "Duplicate",
    ),
    ("no driver", _set("spec.driver", ""), 422, "spec.driver"),
    ("driver 64 long", _set("spec.driver", "d" * 64), 422, "spec.driver"),
    ("driver uppercase", _set("spec.driver", "Vfio.example.com"), 422, "spec.driver"),
    ("no pool name", _set("spec.pool.name", ""), 422, "spec.pool.name"),
    ("pool name with _", _set("spec.pool.name", "node_a"), 422, "spec.pool.name"),
    ("resourceSliceCount 0", _set("spec.pool.resourceSliceCount", 0), 422, "resourceSliceCount"),
    ("negative generation", _set("spec.pool.generation", -1), 422, "spec.pool.generation"),
    ("no node at all", lambda s: s["spec"].pop("nodeName"), 422, "exactly one of"),
    ("nodeName and allNodes", _set("spec.allNodes", True), 422, "exactly one of"),
    ("nodeName not a name", _set("spec.nodeName", "Node A"), 422, "spec.nodeName"),
    ("no metadata name", lambda s: s["metadata"].pop("name"), 422, "metadata.name"),
    (
        "namespace on a cluster object",
        _set("metadata.namespace", "default"),
        422,
        "metadata.namespace",
    ),
    (
        "resourceVersion on create",
        _set("metadata.resourceVersion", "5"),
        400,
        "resourceVersion should not be set",
    ),
    ("wrong kind", _set("kind", "ResourceClaim"), 400, "kind"),
    ("unknown taint field", _taints([{**TAINT, "reason": "x"}]), 400, "taints[0].reason"),
    ("taint without key", _taints([{**TAINT, "key": ""}]), 422, "taints[0].key: Required"),
    ("taint key with space", _taints([{**TAINT, "key": f"{DRIVER}/un healthy"}]), 422, "key"),
    ("taint key prefix upper", _taints([{**TAINT, "key": "Vfio.x/unhealthy"}]), 422, "prefix"),
    ("taint value with :", _taints([{**TAINT, "value": "0000:3b:00.0"}]), 422, "taints[0].value"),
    ("taint value 64 long", _taints([{**TAINT, "value": "v" * 64}]), 422, "taints[0].value"),
    ("taint without effect", _taints([{**TAINT, "effect": ""}]), 422, "effect: Required"),
    ("taint effect unknown", _taints([{**TAINT, "effect": "Evict"}]), 422, "Unsupported"),
    ("taint timeAdded not a time", _taints([{**TAINT, "timeAdded": "now"}]), 422, "RFC 3339"),
    (
        "17 taints",
        _taints([{**TAINT, "key": f"{DRIVER}/t{i}"} for i in range(17)]),
        422,
        "at most 16",
    ),
    (
        "65 devices with a taint",
        lambda s: (
            s["spec"].__setitem__("devices", a_slice(devices=65)["spec"]["devices"]),
            _taints([TAINT])(s),
        ),
        422,
        "at most 64",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "code", "text"),
    [pytest.param(m, c, t, id=n) for n, m, c, t in REFUSED],
)
def test_refuses_what_the_real_server_refuses(
    apiserver: ApiServerStandin, mutate: Mutation, code: int, text: str
) -> None:
    body = a_slice()
    mutate(body)
    got, status = raw(apiserver, "POST", SLICES_PATH, body)
    assert got == code, status
    assert status["kind"] == "Status" and status["code"] == code
    assert text in status["message"], status["message"]
    assert apiserver.objects_of_plural("resourceslices") == []  # nothing stored
    # and the unmutated slice is accepted: the refusal came from the mutation alone
    assert raw(apiserver, "POST", SLICES_PATH, a_slice())[0] == 201


@pytest.mark.parametrize(
    ("path", "value"),
    [("spec.driver", "gpu.example.com"), ("spec.pool.name", "node-b"), ("spec.nodeName", "node-b")],
)
def test_immutable_fields_cannot_change(
    apiserver: ApiServerStandin, slices: k8s.ResourceV1Api, path: str, value: str
) -> None:
    created = raw(apiserver, "POST", SLICES_PATH, a_slice())[1]
    _set(path, value)(created)
    code, status = raw(apiserver, "PUT", f"{SLICES_PATH}/{created['metadata']['name']}", created)
    assert code == 422 and "field is immutable" in status["message"] and path in status["message"]


def test_a_json_patch_content_type_with_an_object_body_is_refused(
    apiserver: ApiServerStandin,
) -> None:
    raw(apiserver, "POST", SLICES_PATH, a_slice("s"))
    code, status = raw(
        apiserver,
        "PATCH",
        f"{SLICES_PATH}/s",
        {"spec": {"pool": {"generation": 2}}},
        content_type="application/json-patch+json",
    )
    assert code == 400 and "jsonpatch.Patch" in status["message"]
    code, status = raw(
        apiserver,
        "PATCH",
        f"{SLICES_PATH}/s",
        {"x": 1},
        content_type="application/apply-patch+yaml",
    )
    assert code == 415


def test_an_unsupported_field_selector_is_refused(slices: k8s.ResourceV1Api) -> None:
    with pytest.raises(k8s.ApiException) as e:
        slices.list_resource_slice(field_selector="spec.pool.name=node-a")
    assert status_of(e) == (400, "BadRequest")
    assert "field label not supported: spec.pool.name" in json.loads(e.value.body)["message"]


def test_an_existing_name_is_already_exists(slices: k8s.ResourceV1Api) -> None:
    slices.create_resource_slice(a_slice("s"))
    with pytest.raises(k8s.ApiException) as e:
        slices.create_resource_slice(a_slice("s"))
    assert status_of(e) == (409, "AlreadyExists")


def test_a_body_over_3_mib_is_too_large(apiserver: ApiServerStandin) -> None:
    code, _ = raw(apiserver, "POST", SLICES_PATH, data=b" " * (MAX_BODY + 1))
    assert code == 413


def test_a_watch_resumes_after_a_resource_version_and_checks_its_selector(
    apiserver: ApiServerStandin, slices: k8s.ResourceV1Api
) -> None:
    first = slices.create_resource_slice(a_slice("first"))
    slices.create_resource_slice(a_slice("second"))
    code, status = raw(apiserver, "GET", f"{SLICES_PATH}?watch=true&fieldSelector=spec.pool.name=x")
    assert code == 400 and "field label not supported" in status["message"]
    seen = []
    w = watch.Watch()
    for ev in w.stream(
        slices.list_resource_slice,
        resource_version=first.metadata.resource_version,
        timeout_seconds=1,
    ):
        seen.append((ev["type"], ev["object"].metadata.name))
    assert seen == [("ADDED", "second")]  # not "first": it is not after that version


def test_claims_are_validated_too(apiserver: ApiServerStandin) -> None:
    path = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
    bad_request = {
        "metadata": {"name": "c"},
        "spec": {"devices": {"requests": [{"name": "Not_A_Label"}]}},
    }
    code, status = raw(apiserver, "POST", path, bad_request)
    assert code == 422 and "spec.devices.requests[0].name" in status["message"]
    good = {"metadata": {"name": "c"}, "spec": {"devices": {"requests": [{"name": "gpu"}]}}}
    code, created = raw(apiserver, "POST", path, good)
    assert code == 201 and created["metadata"]["namespace"] == "default"
    created["status"] = {
        "allocation": {
            "devices": {
                "results": [{"request": "gpu", "driver": DRIVER, "pool": NODE, "device": "A_B"}]
            }
        }
    }
    code, status = raw(apiserver, "PUT", f"{path}/c/status", created)
    assert code == 422 and "results[0].device" in status["message"]
    created["status"]["allocation"]["devices"]["results"][0]["devic"] = "x"
    code, status = raw(apiserver, "PUT", f"{path}/c/status", created)
    assert code == 400 and "unknown field" in status["message"]
    code, status = raw(
        apiserver, "POST", "/apis/resource.k8s.io/v1/namespaces/Bad_NS/resourceclaims", good
    )
    assert code == 422 and "metadata.namespace" in status["message"]


def test_unknown_fields_in_nodes_too(apiserver: ApiServerStandin) -> None:
    code, status = raw(
        apiserver, "POST", "/api/v1/nodes", {"metadata": {"name": "n2"}, "spec": {"podCIDRz": "x"}}
    )
    assert code == 400 and 'unknown field "spec.podCIDRz"' in status["message"]
    assert raw(apiserver, "POST", "/api/v1/nodes", {"metadata": {"name": "n2"}})[0] == 201


def test_it_serves_https_that_the_real_client_verifies(tmp_path: Path) -> None:
    import urllib3

    api = ApiServerStandin(str(tmp_path / "tls"), tls=True)
    api.start()
    try:
        assert api.url.startswith("https://127.0.0.1:")
        client = api.client()
        slices = k8s.ResourceV1Api(client)
        assert slices.create_resource_slice(a_slice()).metadata.uid
        assert [s.metadata.name for s in slices.list_resource_slice().items] == [
            "node-a-vfio-example-com-0"
        ]
        # a client that does not trust this CA is refused by TLS, not served
        other = ApiServerStandin(str(tmp_path / "other"), tls=True)
        other.start()
        other.stop()
        cfg = json.loads(Path(api.kubeconfig).read_text())
        cfg["clusters"][0]["cluster"]["certificate-authority-data"] = json.loads(
            Path(other.kubeconfig).read_text()
        )["clusters"][0]["cluster"]["certificate-authority-data"]
        wrong = tmp_path / "wrong-ca"
        wrong.write_text(json.dumps(cfg))
        import kubernetes.config

        conf = k8s.Configuration()
        kubernetes.config.load_kube_config(str(wrong), client_configuration=conf)
        conf.retries = 0
        untrusting = k8s.ResourceV1Api(k8s.ApiClient(conf))
        with pytest.raises(urllib3.exceptions.MaxRetryError) as e:
            untrusting.list_resource_slice(_request_timeout=5)
        assert "CERTIFICATE_VERIFY_FAILED" in str(e.value)
    finally:
        api.stop()


def test_a_compacted_history_expires_old_resource_versions(
    apiserver: ApiServerStandin, slices: k8s.ResourceV1Api
) -> None:
    """After :meth:`compact` a watch from an older resourceVersion is answered as
    kube-apiserver answers it (200, then an ERROR event: Status 410 Expired), which the real
    client's ``Watch`` raises as ``ApiException(status=410)``; an Exact list there is a 410;
    a watch from the compacted version itself (or later) still works."""
    first = slices.create_resource_slice(a_slice("first"))
    old = first.metadata.resource_version
    slices.create_resource_slice(a_slice("second"))
    oldest = apiserver.compact()
    assert oldest > int(old)
    w = watch.Watch()
    with pytest.raises(k8s.ApiException) as e:
        for _ in w.stream(slices.list_resource_slice, resource_version=old, timeout_seconds=5):
            pass
    assert e.value.status == 410 and "too old resource version" in str(e.value.reason)
    code, status = raw(
        apiserver, "GET", f"{SLICES_PATH}?resourceVersion={old}&resourceVersionMatch=Exact"
    )
    assert (code, status["reason"], status["code"]) == (410, "Expired", 410)
    code, lines = _raw_watch(apiserver, f"{SLICES_PATH}?watch=true&resourceVersion={old}")
    assert code == 200 and [ev["type"] for ev in lines] == ["ERROR"]
    assert lines[0]["object"]["code"] == 410 and lines[0]["object"]["reason"] == "Expired"
    seen = []
    for ev in watch.Watch().stream(
        slices.list_resource_slice, resource_version=str(oldest), timeout_seconds=1
    ):
        seen.append(ev["type"])
    assert seen == []  # nothing after the compacted version, and no error


def test_end_watches_ends_open_streams_and_a_timeout_sends_a_bookmark(
    apiserver: ApiServerStandin, slices: k8s.ResourceV1Api
) -> None:
    slices.create_resource_slice(a_slice("first"))
    code, lines = _raw_watch(
        apiserver, f"{SLICES_PATH}?watch=true&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    assert code == 200 and [ev["type"] for ev in lines] == ["ADDED", "BOOKMARK"]
    assert lines[1]["object"]["metadata"]["resourceVersion"] == str(apiserver.store.rv)
    done = threading.Event()
    got: list[Any] = []

    def watcher() -> None:
        got.append(_raw_watch(apiserver, f"{SLICES_PATH}?watch=true&timeoutSeconds=60"))
        done.set()

    threading.Thread(target=watcher, daemon=True).start()
    apiserver.wait_for("a watch open", lambda a: a.open_watches == 1)
    apiserver.end_watches()
    assert done.wait(10), "end_watches did not end the open watch"
    assert got[0][0] == 200 and [ev["type"] for ev in got[0][1]] == ["ADDED"]


def _raw_watch(api: ApiServerStandin, path: str) -> tuple[int, list[dict[str, Any]]]:
    req = urllib.request.Request(api.url + path, headers={"Authorization": f"Bearer {api.token}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, [json.loads(line) for line in r.read().splitlines() if line.strip()]
