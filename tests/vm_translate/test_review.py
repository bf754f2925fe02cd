"""AdmissionReview parsing/answers and the node-capacity logic (pure, no server)."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest

from vfio_dp.model.config import Config
from vm_translate.errors import NodeCheckError, ReviewError
from vm_translate.nodes import NodeCache, NodeResources, capacity_problems, nodes_from_list
from vm_translate.review import decide, parse_review

GPU = "devices.kubevirt.io/10de_1eb8"


def review(obj: object, operation: str = "CREATE", uid: str = "u-1") -> dict[str, Any]:
    kind = obj.get("kind", "") if isinstance(obj, dict) else ""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "operation": operation,
            "kind": {"group": "kubevirt.io", "version": "v1", "kind": kind},
            "object": obj,
        },
    }


VMI = {
    "kind": "VirtualMachineInstance",
    "metadata": {"name": "vm1", "namespace": "ns"},
    "spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": "10de:1eb8"}]}}},
}


def body(data: object) -> bytes:
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"not json", "body is not JSON"),
        (b"\xff\xfe", "body is not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (body({"kind": "Pod"}), "kind is 'Pod'"),
        (
            body({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1beta1"}),
            "admissionReviewVersions",
        ),
        (
            body({"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1"}),
            "request is missing",
        ),
        (body({**review(VMI), "request": {"object": VMI}}), "request.uid is missing"),
        (body(review("str")), "request.object is not an object"),
        (body(review(None)), "request.object is missing for CREATE"),
    ],
)
def test_not_a_review(raw: bytes, reason: str) -> None:
    with pytest.raises(ReviewError, match=reason):
        parse_review(raw)


def test_allowed_with_base64_patch(config: Config) -> None:
    answer = decide(parse_review(body(review(VMI, uid="abc"))), config)
    response = answer["response"]
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert response["uid"] == "abc" and response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == [
        {"op": "replace", "path": "/spec/domain/devices/gpus/0/deviceName", "value": GPU}
    ]


def test_unchanged_has_no_patch_and_delete_passes(config: Config) -> None:
    obj = {"kind": "ConfigMap", "metadata": {"name": "x"}}
    assert decide(parse_review(body(review(obj))), config)["response"] == {
        "uid": "u-1",
        "allowed": True,
    }
    deleted = review(None, operation="DELETE")
    assert decide(parse_review(body(deleted)), config)["response"]["allowed"] is True


def test_pod_update_is_not_mutated(config: Config) -> None:
    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "annotations": {
                "devices.kubevirt.io/passthrough": '[{"name":"g","resource":"10de:1eb8"}]'
            },
        },
        "spec": {"containers": [{"name": "c"}]},
    }
    assert "patch" not in decide(parse_review(body(review(pod, "UPDATE"))), config)["response"]
    assert "patch" in decide(parse_review(body(review(pod, "CREATE"))), config)["response"]


def test_denied_names_entry_and_fix(config: Config) -> None:
    bad = json.loads(json.dumps(VMI))
    bad["spec"]["domain"]["devices"]["gpus"][0]["deviceName"] = "8086:0a54"
    response = decide(parse_review(body(review(bad))), config)["response"]
    assert response["allowed"] is False
    status = response["status"]
    assert status["code"] == 422
    assert "spec.domain.devices.gpus[0] (name 'g').deviceName" in status["message"]
    assert "name one of them instead of the pair" in status["message"]


# --------------------------------------------------------------------------- nodes

NODE_ITEMS = [
    {"metadata": {"name": "a"}, "status": {"allocatable": {"cpu": "8", GPU: "1", "memory": "3Gi"}}},
    {"metadata": {"name": "b"}, "status": {"allocatable": {GPU: "2", "example.com/mlx": "4"}}},
    {
        "metadata": {"name": "c"},
        "spec": {"unschedulable": True},
        "status": {"allocatable": {GPU: "8"}},
    },
]


def test_nodes_from_list_skips_unschedulable_and_non_counts() -> None:
    nodes = nodes_from_list(NODE_ITEMS)
    assert nodes == [
        NodeResources("a", {"cpu": 8, GPU: 1}),
        NodeResources("b", {GPU: 2, "example.com/mlx": 4}),
    ]


def test_capacity() -> None:
    nodes = nodes_from_list(NODE_ITEMS)
    assert capacity_problems({GPU: 2, "example.com/mlx": 1}, nodes) == []
    (p,) = capacity_problems({GPU: 3}, nodes)
    assert (
        "devices.kubevirt.io/10de_1eb8: 3 requested but no schedulable node advertises more than 2 (b)"
        in p
    )
    (p,) = capacity_problems({"devices.kubevirt.io/1af4_1000": 1}, nodes)
    assert "more than 0;" in p
    (p,) = capacity_problems({"cpu": 1, "example.com/mlx": 1}, nodes)
    assert "no single node advertises all of" in p


def test_denied_when_no_node_has_devices(config: Config) -> None:
    nodes = [NodeResources("a", {"example.com/mlx": 1})]
    response = decide(parse_review(body(review(VMI))), config, nodes)["response"]
    assert response["allowed"] is False
    assert (
        "VirtualMachineInstance ns/vm1: devices.kubevirt.io/10de_1eb8: 1 requested"
        in response["status"]["message"]
    )
    ok = decide(parse_review(body(review(VMI))), config, [NodeResources("b", {GPU: 1})])
    assert ok["response"]["allowed"] is True


async def test_node_cache_fetches_once_per_ttl() -> None:
    calls = 0
    now = [100.0]

    async def fetch() -> list[NodeResources]:
        nonlocal calls
        calls += 1
        return [NodeResources(str(calls))]

    cache = NodeCache(fetch, ttl=30, clock=lambda: now[0])
    assert (await cache.get())[0].name == "1"
    now[0] += 29
    assert (await cache.get())[0].name == "1"
    now[0] += 2
    # expired: the old list answers at once while one fetch runs (issue 39 row 4)
    assert (await cache.get())[0].name == "1"
    assert (await cache.get())[0].name == "1"  # the same fetch, not a second one
    await asyncio.sleep(0)
    assert (await cache.get())[0].name == "2"
    assert calls == 2


async def test_no_review_waits_for_a_refetch_and_a_failed_one_is_said() -> None:
    """Issue 39 row 4: once a list is known, an expired one answers while the API server is
    asked again (a review never waits for the 100 nodes' lists after the first); a refetch
    that fails drops the old list: the next callers get its error, as an unreachable API
    server's first fetch does."""
    gate = asyncio.Event()
    calls = 0
    now = [100.0]

    async def fetch() -> list[NodeResources]:
        nonlocal calls
        calls += 1
        if calls > 1:
            await gate.wait()  # the API server is slow
            raise NodeCheckError("cannot list nodes")
        return [NodeResources("a")]

    cache = NodeCache(fetch, ttl=30, clock=lambda: now[0])
    assert (await cache.get())[0].name == "a"
    now[0] += 31
    got = await asyncio.wait_for(cache.get(), 1.0)  # not held by the slow fetch
    assert got[0].name == "a" and calls == 2
    gate.set()
    for _ in range(3):
        await asyncio.sleep(0)
    with pytest.raises(NodeCheckError):
        await cache.get()
    assert calls == 2
