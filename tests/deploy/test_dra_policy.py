"""The DRA plugin's least privilege and the DRA examples.

- RBAC: the verbs granted are exactly the ones the real :class:`SlicePublisher` sends (its
  requests to the API-server stand-in, mapped to RBAC verbs the way the API server maps them),
  plus ``get`` on ResourceClaims for Prepare.
- The ValidatingAdmissionPolicy: its CEL (variables, match condition, validations and message
  expressions) is compiled and evaluated with cel-python, the way the API server evaluates a
  policy, against AdmissionRequests from the plugin on the slice's own node (allowed) and on
  another node (denied), for slices built by the real slice builder.
- The example VMI on DRA is accepted by ``vm_translate.translate`` and its claim entries resolve
  to the example ResourceClaimTemplate, which validates against the client's models.
"""

from __future__ import annotations

import asyncio
import copy
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
import yaml

from tests.deploy.conftest import DEPLOY, Obj, find, kubectl
from tests.deploy.helpers import command, container, parse_cli_args
from tests.deploy.k8s_schema import check_object, deserialize_errors
from tests.dra.apiserver_standin import CLAIMS, DEVICE_CLASSES, NODES, SLICES, ApiServerStandin
from vfio_dp.dra.apiserver.claim_status import ClaimStatusWriter, DeviceStatus
from vfio_dp.dra.apiserver.claim_watch import ClaimWatch
from vfio_dp.dra.apiserver.publisher import SlicePublisher, claim_reader, class_reader
from vfio_dp.dra.apiserver.watch import SliceWatch
from vfio_dp.dra.slices import Device, NodeRef, build_slices
from vfio_dp.model.config import parse_config
from vfio_dp.model.dra_metadata import Attribute
from vm_translate.entries import ClaimEntry, DeviceEntry
from vm_translate.spec import entries_of
from vm_translate.translate import translate

TARGET = "overlays/dra"
NODE_KEY = "authentication.kubernetes.io/node-name"


def _dra(objs: list[Obj]) -> tuple[Obj, str, str]:
    """The DRA DaemonSet, its ServiceAccount's username and its --driver-name."""
    ds = find(objs, "DaemonSet", "vfio-dp-dra")
    spec = ds["spec"]["template"]["spec"]
    ctr = container(spec, "dra-plugin")
    driver = parse_cli_args(command("cli.dra_cmd", "dra_plugin"), ctr["args"][1:])["driver_name"]
    user = f"system:serviceaccount:{ds['metadata']['namespace']}:{spec['serviceAccountName']}"
    return ds, user, driver


# --------------------------------------------------------------------------- RBAC


def _rbac_verb(method: str, path: str, query: dict[str, str]) -> tuple[str, str]:
    """(resource, verb) as the API server's RBAC sees a request (k8s.io/apiserver's
    RequestInfoFactory: a collection GET is list or watch, an object GET get, POST create,
    PUT update, PATCH patch, DELETE on an object delete, on a collection deletecollection)."""
    parts = [p for p in path.split("/") if p]
    # /api/v1/<plural>[/<name>] or /apis/<group>/<version>/<plural>[/<name>]
    rest = parts[2:] if parts[0] == "api" else parts[3:]
    if rest[0] == "namespaces" and len(rest) > 2:  # .../namespaces/<ns>/<plural>[/<name>]
        rest = rest[2:]
    resource, named = rest[0], len(rest) > 1
    if len(rest) > 2:  # .../<plural>/<name>/<subresource>
        resource = f"{resource}/{rest[2]}"
    if method == "GET":
        verb = "get" if named else ("watch" if query.get("watch") in ("1", "true") else "list")
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}[method]
    return resource, verb


def _device(i: int) -> Device:
    return Device(
        f"pci-0000-{i // 256:02x}-{i % 256 // 8:02x}-{i % 8:x}",
        {"resource.kubernetes.io/pciBusID": Attribute("string", f"0000:{i // 256:02x}:00.0")},
    )


def plugin_requests(tmp_path: Path, driver: str) -> set[tuple[str, str]]:
    """Every (resource, verb) the DRA plugin's two API doors use: the real publisher over
    its life -- first publish (two slices), a device change (written over its own), a smaller
    pool (a slice deleted), slices deleted by kubelet (republished), and a restart (listed and
    adopted) -- and the real claim reader of Prepare (a claim, and one that does not exist)."""
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    try:
        api.seed(NODES, {"metadata": {"name": "node-a"}})
        client = api.client()
        pub = SlicePublisher(client, driver, "node-a")
        big = [_device(i) for i in range(200)]
        assert pub.reconcile(big)
        assert pub.reconcile(big[:199])
        assert pub.reconcile(big[:10])
        ours = list(api.requests)
        # what kubelet does at its start (its requests, not the publisher's)
        k8s.ResourceV1Api(client).delete_collection_resource_slice(
            field_selector="spec.nodeName=node-a"
        )
        assert api.objects(SLICES) == []
        wiped = len(api.requests)
        assert pub.reconcile(big[:10])
        assert not SlicePublisher(client, driver, "node-a").reconcile(big[:10])
        # the slice watch: its list, then one watch request (ended by the server after 1 s)
        watch = SliceWatch(client, driver, "node-a", seconds=1)
        watch.relist()
        watch.watch_once()
        ours += api.requests[wiped:]
        api.seed(
            CLAIMS,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "vm-gpu", "namespace": "vms"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "t4", "exactly": {"deviceClassName": driver}}]
                    }
                },
            },
        )
        read = claim_reader(client)
        before = len(api.requests)
        got = asyncio.run(read("vms", "vm-gpu"))
        assert got is not None and got["metadata"]["name"] == "vm-gpu"
        assert asyncio.run(read("vms", "gone")) is None
        ours += api.requests[before:]
        assert {r.code for r in api.requests[before:]} == {200, 404}
        # the claim watch (binding conditions): its list, then one watch request
        before = len(api.requests)
        seen: list[str] = []
        claims = ClaimWatch(client, driver, "node-a", lambda uid, c: seen.append(uid), seconds=1)
        claims.relist()
        claims.watch_once()
        ours += api.requests[before:]
        # the claim's device status: written after Prepare, removed at Unprepare
        before = len(api.requests)
        assert _write_status(client, driver, got["metadata"]["uid"], [STATUS])
        assert _write_status(client, driver, got["metadata"]["uid"], [])
        ours += api.requests[before:]
        # an extended-resource claim's request → its DeviceClass's resource (KEP-5004)
        api.seed(
            DEVICE_CLASSES,
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "nic"},
                "spec": {
                    "extendedResourceName": "devices.kubevirt.io/8086_10d3",
                    "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}],
                },
            },
        )
        classes = class_reader(client)
        before = len(api.requests)
        assert asyncio.run(classes("nic")) == "devices.kubevirt.io/8086_10d3"
        ours += api.requests[before:]
        assert {r.code for r in ours} <= {200, 201, 404}, ours
        return {_rbac_verb(r.method, r.path, r.query) for r in ours}
    finally:
        api.stop()


STATUS = DeviceStatus(
    pool="node-a",
    device="pci-0000-3b-00-0",
    health="HEALTHY",
    message="ready",
    since="2026-11-24T19:00:00Z",
    addresses=("0000:3b:00.0",),
    iommu_group=45,
    devnodes=("/dev/vfio/vfio", "/dev/vfio/45"),
    bound_by="claim:x",
)


def _write_status(client: Any, driver: str, uid: str, ours: list[DeviceStatus]) -> bool:
    return ClaimStatusWriter(client, driver).write("vms", "vm-gpu", uid, ours)


def test_the_api_server_enforces_the_plugins_rbac_on_claim_status(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    """With the deploy's ClusterRole loaded into the stand-in, the status write passes; without
    the synthetic resourceclaims/driver rule (or for another driver name) it is a 403."""
    objs = rendered[TARGET]
    _, _, driver = _dra(objs)
    binding = find(objs, "ClusterRoleBinding", "vfio-dp-dra")
    rules = find(objs, "ClusterRole", binding["roleRef"]["name"])["rules"]
    api = ApiServerStandin(str(tmp_path / "api"))
    api.start()
    try:
        claim = api.seed(
            CLAIMS,
            {
                "metadata": {"name": "vm-gpu", "namespace": "vms"},
                "spec": {
                    "devices": {
                        "requests": [{"name": "t4", "exactly": {"deviceClassName": driver}}]
                    }
                },
            },
        )
        uid = claim["metadata"]["uid"]
        client = api.client()
        api.rules = rules
        assert _write_status(client, driver, uid, [STATUS])
        (entry,) = api.objects(CLAIMS, "vms")[0]["status"]["devices"]
        assert entry["driver"] == driver and entry["conditions"][0]["status"] == "True"
        api.rules = [r for r in rules if "resourceclaims/driver" not in r["resources"]]
        with pytest.raises(Exception, match=r"HTTP 403.*associated-node:update"):
            _write_status(client, driver, uid, [])
        api.rules = rules
        with pytest.raises(Exception, match="403"):  # another driver's name is not ours
            _write_status(client, "gpu.example.com", uid, [STATUS])
        assert _write_status(client, driver, uid, [])  # removed: only our entry went
        assert "devices" not in (api.objects(CLAIMS, "vms")[0].get("status") or {})
    finally:
        api.stop()


def test_rbac_verbs_equal_what_the_publisher_sends(
    rendered: dict[str, list[Obj]], tmp_path: Path
) -> None:
    objs = rendered[TARGET]
    ds, _, driver = _dra(objs)
    binding = find(objs, "ClusterRoleBinding", "vfio-dp-dra")
    sa = ds["spec"]["template"]["spec"]["serviceAccountName"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa, "namespace": ds["metadata"]["namespace"]}
    ]
    rules = find(objs, "ClusterRole", binding["roleRef"]["name"])["rules"]
    granted: dict[str, set[str]] = {}
    for rule in rules:
        for r in rule["resources"]:
            granted.setdefault(r, set()).update(rule["verbs"])
    # the synthetic subresource is never requested, only checked: for our driver name only
    (synthetic,) = [r for r in rules if r["resources"] == ["resourceclaims/driver"]]
    assert synthetic["resourceNames"] == [driver]
    assert synthetic["verbs"] == ["associated-node:update"]
    del granted["resourceclaims/driver"]
    sent = plugin_requests(tmp_path, driver)
    used: dict[str, set[str]] = {}
    for resource, verb in sent:
        used.setdefault(resource, set()).add(verb)
    assert used == {
        "nodes": {"get"},
        "resourceslices": {"list", "watch", "create", "update", "delete"},
        # Prepare reads the one claim kubelet names; the claim watch lists and watches
        "resourceclaims": {"get", "list", "watch"},
        "deviceclasses": {"get"},  # and an extended-resource request's class
        "resourceclaims/status": {"update"},  # our entries of status.devices
    }
    assert granted == used
    groups = {g for rule in rules for g in rule["apiGroups"]}
    assert groups == {"", "resource.k8s.io"}
    assert not any(rule.get("resourceNames") == [] for rule in rules)


# --------------------------------------------------------------------------- the policy


def _celpy() -> Any:
    return pytest.importorskip(
        "celpy", reason="cel-python is not installed: the policy's CEL is not evaluated"
    )


def _evaluate(expression: str, activation: dict[str, Any]) -> Any:
    celpy = _celpy()
    env = celpy.Environment()
    return env.program(env.compile(expression)).evaluate(activation)


def admit(policy: Obj, binding: Obj, request: dict[str, Any]) -> list[str]:
    """What the API server does with ``request`` under ``policy`` bound with ``binding``
    (``validationActions: [Deny]``): the denial messages; [] when admitted or not matched.
    Order as in the API server: match constraints, match conditions, then each validation
    with the variables (evaluated in order, each seeing the earlier ones)."""
    celpy = _celpy()
    spec = policy["spec"]
    group, version = request["resource"]["group"], request["resource"]["version"]
    if not any(
        group in r["apiGroups"]
        and (version in r["apiVersions"] or "*" in r["apiVersions"])
        and request["operation"] in r["operations"]
        and request["resource"]["resource"] in r["resources"]
        for r in spec["matchConstraints"]["resourceRules"]
    ):
        return []
    act: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(request.get("object")),
        "oldObject": celpy.json_to_cel(request.get("oldObject")),
    }
    if not all(bool(_evaluate(c["expression"], act)) for c in spec["matchConditions"]):
        return []
    variables: dict[Any, Any] = {}
    for var in spec.get("variables", []):
        act["variables"] = celpy.celtypes.MapType(variables)
        variables[celpy.celtypes.StringType(var["name"])] = _evaluate(var["expression"], act)
    act["variables"] = celpy.celtypes.MapType(variables)
    assert binding["spec"]["validationActions"] == ["Deny"]
    denied = []
    for v in spec["validations"]:
        if not bool(_evaluate(v["expression"], act)):
            if "messageExpression" in v:
                denied.append(str(_evaluate(v["messageExpression"], act)))
            else:
                denied.append(v["message"])
    return denied


def _request(
    operation: str,
    *,
    user: str,
    node: str | None,
    obj: dict[str, Any] | None = None,
    old: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """An AdmissionRequest (admission.k8s.io/v1) for a ResourceSlice, as the API server
    builds it for a pod's node-bound ServiceAccount token."""
    extra: dict[str, list[str]] = {
        "authentication.kubernetes.io/pod-name": ["vfio-dp-dra-x2x9z"],
        "authentication.kubernetes.io/pod-uid": ["8f1e64c4-1f34-4c0e-a9ad-1f1a0d2c0a11"],
    }
    if node is not None:
        extra[NODE_KEY] = [node]
        extra["authentication.kubernetes.io/node-uid"] = ["0c6b0b55-4b06-4d3f-9a43-6c4a2e7f0e61"]
    name = (obj or old or {}).get("metadata", {}).get("name", "")
    return {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceSlice"},
        "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceslices"},
        "name": name,
        "operation": operation,
        "userInfo": {
            "username": user,
            "uid": "1d9e4a35-2f36-4d8a-9e0f-6a0f53b0b4a1",
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:vfio-dp",
                "system:authenticated",
            ],
            "extra": extra,
        },
        "object": obj,
        "oldObject": old,
        "dryRun": False,
    }


def _slice(node: str, driver: str) -> dict[str, Any]:
    (s,) = build_slices([_device(1)], driver=driver, node=NodeRef(node, "0c6b0b55"), generation=1)
    return s


def test_admission_policy_lets_a_node_write_only_its_own_slices(
    rendered: dict[str, list[Obj]],
) -> None:
    objs = rendered[TARGET]
    _, user, driver = _dra(objs)
    policy = find(objs, "ValidatingAdmissionPolicy")
    binding = find(objs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    for o in (policy, binding):
        assert check_object(o) == [] and deserialize_errors(o) == []
        assert "namespace" not in o["metadata"]  # cluster-scoped

    mine, theirs = _slice("node-a", driver), _slice("node-b", driver)
    moved = copy.deepcopy(mine)
    # the plugin on node-a: its own node's slices, every operation it uses
    for op, obj, old in (
        ("CREATE", mine, None),
        ("UPDATE", mine, mine),
        ("DELETE", None, mine),
    ):
        assert (
            admit(policy, binding, _request(op, user=user, node="node-a", obj=obj, old=old)) == []
        )
    # ... and nobody else's
    own = "the vfio-dp DRA plugin on node node-a may write only that node's ResourceSlices"
    for op, obj, old in (
        ("CREATE", theirs, None),
        ("UPDATE", theirs, theirs),
        ("UPDATE", moved, theirs),  # taking node-b's slice over
        ("DELETE", None, theirs),
    ):
        req = _request(op, user=user, node="node-a", obj=obj, old=old)
        assert admit(policy, binding, req) == [own], (op, obj, old)
    # the same ServiceAccount on node-b may not write node-a's
    req = _request("CREATE", user=user, node="node-b", obj=mine)
    assert admit(policy, binding, req) == [
        "the vfio-dp DRA plugin on node node-b may write only that node's ResourceSlices"
    ]
    # a token without a node (minted outside a pod) writes nothing
    (msg,) = admit(policy, binding, _request("CREATE", user=user, node=None, obj=mine))
    assert NODE_KEY in msg
    # a cluster-wide slice (no nodeName) or another driver's slice: denied
    all_nodes = copy.deepcopy(mine)
    del all_nodes["spec"]["nodeName"]
    all_nodes["spec"]["allNodes"] = True
    assert admit(policy, binding, _request("CREATE", user=user, node="node-a", obj=all_nodes))
    other = _slice("node-a", "gpu.nvidia.com")
    (msg,) = admit(policy, binding, _request("CREATE", user=user, node="node-a", obj=other))
    assert driver in msg
    # other users are not this policy's business (kubelet deletes a node's slices at start)
    kubelet = _request("DELETE", user="system:node:node-b", node=None, old=mine)
    assert admit(policy, binding, kubelet) == []
    # reads are not matched at all
    assert (
        admit(
            policy,
            binding,
            {**_request("CREATE", user=user, node="node-b", obj=mine), "operation": "CONNECT"},
        )
        == []
    )


def test_admission_policy_names_the_plugins_driver_and_account(
    rendered: dict[str, list[Obj]],
) -> None:
    """The policy's driver and username are the DaemonSet's (a renamed driver or account
    would silently deny every write)."""
    objs = rendered[TARGET]
    _, user, driver = _dra(objs)
    policy = find(objs, "ValidatingAdmissionPolicy")
    (cond,) = policy["spec"]["matchConditions"]
    assert f'"{user}"' in cond["expression"]
    assert any(f'"{driver}"' in v["expression"] for v in policy["spec"]["validations"])


# --------------------------------------------------------------------------- examples


def test_example_vmi_on_dra_is_accepted_and_resolves_to_the_example_template(
    rendered: dict[str, list[Obj]], examples: list[Obj]
) -> None:
    vmi = yaml.safe_load((DEPLOY / "examples/dra/vmi.yaml").read_text())
    cm = find(rendered[TARGET], "ConfigMap", "vfio-dp-config")
    config = parse_config(yaml.safe_load(cm["data"]["config.yaml"]), "overlays/dra")
    t = translate(vmi, config)
    assert t.requests == {"devices.kubevirt.io/8086_10d3": 1}  # the device-plugin NIC
    entries, problems = entries_of(vmi, config, "vm-t4")
    assert problems == []
    assert entries == [
        ClaimEntry("gpu1", "gpu", "t4"),
        DeviceEntry("nic1", "devices.kubevirt.io/8086_10d3"),
    ]
    # spec.resourceClaims -> the example ResourceClaimTemplate, in the VMI's namespace, with
    # the request the entry names, for a DeviceClass of the examples
    (claim,) = vmi["spec"]["resourceClaims"]
    tmpl = find(examples, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
    assert tmpl["metadata"]["namespace"] == vmi["metadata"]["namespace"]
    assert check_object(tmpl) == [] and deserialize_errors(tmpl) == []
    requests = {r["name"]: r for r in tmpl["spec"]["spec"]["devices"]["requests"]}
    assert "t4" in requests
    find(examples, "DeviceClass", requests["t4"]["exactly"]["deviceClassName"])


def test_example_maintenance_rule_is_a_valid_device_taint_rule(
    rendered: dict[str, list[Obj]],
) -> None:
    """deploy/examples/dra/maintenance.yaml (documented for admins): a valid DeviceTaintRule
    selecting one device of our driver, NoSchedule (never NoExecute by default)."""
    _, _, driver = _dra(rendered[TARGET])
    rule = yaml.safe_load((DEPLOY / "examples/dra/maintenance.yaml").read_text())
    assert check_object(rule) == [] and deserialize_errors(rule) == []
    selector = rule["spec"]["deviceSelector"]
    assert selector["driver"] == driver and selector["device"].startswith("pci-")
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"
    assert not rule["spec"]["taint"]["key"].startswith(driver)  # the admin's key, not ours


@pytest.fixture(scope="module")
def examples() -> list[Obj]:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(DEPLOY / "examples/dra")], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]
