"""The certificate Job's RBAC is exactly what `vfioctl webhook-certs` sends.

The real command logic runs against the API-server stand-in three ways (first run: create;
second: keep; a Secret gone bad: replace); every request is mapped to the RBAC (resource,
verb, name) the API server would authorize, and compared with the self-signed overlay's Role
and ClusterRole: nothing missing (it would fail in a cluster with 403), nothing extra.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.conftest import REPO, Obj, all_of
from tests.deploy.test_dra_policy import _rbac_verb
from tests.dra.apiserver_standin import SECRETS, WEBHOOK_CONFIGS, ApiServerStandin
from vm_translate.tls import self_signed
from vm_translate.webhook_certs import ensure

ARGS: dict[str, Any] = dict(
    namespace="vfio-dp", secret="vfio-dp-webhook-tls", service="vfio-dp-webhook",
    webhook_config="vfio-dp-webhook",
)  # fmt: skip


def _sent(tmp_path: Path) -> set[tuple[str, str, str]]:
    from kubernetes import client as k8s

    api = ApiServerStandin(str(tmp_path / "api"), tls=True)
    api.start()
    try:
        mwc = yaml.safe_load((REPO / "deploy/base/mutatingwebhookconfiguration.yaml").read_text())
        api.seed(WEBHOOK_CONFIGS, mwc)
        client = api.client()
        assert ensure(client, **ARGS).secret == "created"
        assert ensure(client, **ARGS).secret == "kept"
        (secret,) = api.objects(SECRETS, "vfio-dp")
        other = self_signed(["x.default.svc"])
        secret["data"]["tls.key"] = base64.b64encode(other.key).decode()
        k8s.CoreV1Api(client).replace_namespaced_secret(ARGS["secret"], "vfio-dp", secret)
        before = len(api.requests)
        assert ensure(client, **ARGS).secret.startswith("replaced")
        ours = api.requests[: before - 1] + api.requests[before:]  # not the test's own PUT
    finally:
        api.stop()
    out = set()
    for r in ours:
        resource, verb = _rbac_verb(r.method, r.path, r.query)
        parts = [p for p in r.path.split("/") if p]
        name = parts[-1] if verb not in ("create", "list", "watch") else ""
        out.add((resource, verb, name))
    return out


def test_rbac_is_exactly_what_the_job_sends(rendered: dict[str, list[Obj]], tmp_path: Path) -> None:
    objs = rendered["overlays/self-signed"]
    granted: set[tuple[str, str, str]] = set()
    for kind in ("Role", "ClusterRole"):
        for role in all_of(objs, kind):
            if role["metadata"]["name"] != "vfio-dp-webhook-certs":
                continue
            for rule in role["rules"]:
                for res in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            granted.add((res, verb, name))
    sent = _sent(tmp_path)
    assert sent == granted, f"missing: {sent - granted}; unused: {granted - sent}"
