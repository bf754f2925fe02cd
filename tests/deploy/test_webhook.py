"""The webhook's Deployment, Service, TLS and MutatingWebhookConfiguration agree with the
`vfioctl webhook` command and with what vm_translate actually translates."""

from __future__ import annotations

import posixpath
from typing import Any

import click
import pytest

from tests.deploy.conftest import INSTALLABLE, TARGETS, Obj, all_of, find
from tests.deploy.helpers import (
    check_envvars,
    command,
    container,
    container_port,
    parse_cli_args,
    volume_for_path,
)
from vm_translate.webhook_certs import CALL_DEADLINE

NAMESPACE = "vfio-dp"
#: Resource plural and API group of each kind vm_translate handles.
PLURALS = {
    "VirtualMachineInstance": ("kubevirt.io", "virtualmachineinstances"),
    "VirtualMachine": ("kubevirt.io", "virtualmachines"),
    "Pod": ("", "pods"),
}


@pytest.fixture(scope="module")
def webhook_cmd() -> click.Command:
    return command("cli.webhook_cmd", "webhook")


def _webhook(objs: list[Obj]) -> tuple[Obj, Obj, Obj]:
    dep = find(objs, "Deployment", "vfio-dp-webhook")
    spec = dep["spec"]["template"]["spec"]
    return dep, spec, container(spec, "webhook")


def _args(ctr: Obj, cmd: click.Command) -> dict[str, Any]:
    assert ctr["command"] == ["vfioctl"] and ctr["args"][0] == "webhook"
    check_envvars(cmd, ctr.get("env", []))
    return parse_cli_args(cmd, ctr["args"][1:])


@pytest.mark.parametrize("target", TARGETS)
def test_flags_exist_and_the_pod_serves_https(
    rendered: dict[str, list[Obj]], target: str, webhook_cmd: click.Command
) -> None:
    objs = rendered[target]
    dep, spec, ctr = _webhook(objs)
    given = _args(ctr, webhook_cmd)
    assert not given.get("self_signed"), "--self-signed is for development, not the cluster"
    port = given.get("port", 8443)
    assert port in [p["containerPort"] for p in ctr["ports"]]
    for probe in ("livenessProbe", "readinessProbe"):
        get = ctr[probe]["httpGet"]
        assert get["path"] == "/healthz" and get["scheme"] == "HTTPS"
        assert container_port(ctr, get["port"]) == port
    # TLS files come from one Secret volume, mounted as a directory (rotation reaches the pod).
    cert, key = given["tls_cert"], given["tls_key"]
    assert posixpath.dirname(cert) == posixpath.dirname(key)
    mount, volume = volume_for_path(spec, ctr, posixpath.dirname(cert))
    assert "secret" in volume and not mount.get("subPath")
    # The same ConfigMap as the daemon, so names agree.
    mount, volume = volume_for_path(spec, ctr, posixpath.dirname(given["config_path"]))
    ds_spec = find(objs, "DaemonSet", "vfio-dp-daemon")["spec"]["template"]["spec"]
    ds_cms = {v["configMap"]["name"] for v in ds_spec["volumes"] if "configMap" in v}
    assert volume["configMap"]["name"] in ds_cms
    # Non-root, no privileges.
    sc = {**spec.get("securityContext", {}), **ctr.get("securityContext", {})}
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"] and not sc.get("privileged")
    # Availability: 2 replicas, and a PDB that keeps one.
    assert dep["spec"]["replicas"] == 2
    pdb = find(objs, "PodDisruptionBudget")
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1
    # The Service reaches that port.
    svc = find(objs, "Service", "vfio-dp-webhook")
    assert svc["spec"]["selector"].items() <= labels.items()
    (sp,) = svc["spec"]["ports"]
    assert container_port(ctr, sp["targetPort"]) == port


@pytest.mark.parametrize("target", TARGETS)
def test_rbac_is_nodes_read_only_and_only_with_check_nodes(
    rendered: dict[str, list[Obj]], target: str, webhook_cmd: click.Command
) -> None:
    objs = rendered[target]
    _, spec, ctr = _webhook(objs)
    check_nodes = bool(_args(ctr, webhook_cmd).get("check_nodes"))
    sa = spec["serviceAccountName"]
    grants = [
        b
        for b in (*all_of(objs, "RoleBinding"), *all_of(objs, "ClusterRoleBinding"))
        if any(s["name"] == sa and s.get("namespace") == NAMESPACE for s in b["subjects"])
    ]
    if not check_nodes:
        assert not grants and spec["automountServiceAccountToken"] is False
        return
    assert spec["automountServiceAccountToken"] is True
    assert len(grants) == 1 and grants[0]["kind"] == "ClusterRoleBinding"
    role = find(objs, "ClusterRole", grants[0]["roleRef"]["name"])
    # nodes, and for names DRA serves (KEP-5004) its classes and slices: read only
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["deviceclasses", "resourceslices"],
            "verbs": ["list"],
        },
    ]


def _handled() -> tuple[set[str], str, tuple[str, ...]]:
    try:
        from vm_translate import spec
    except ImportError as e:
        pytest.fail(f"vm_translate.spec is not importable ({e})")
    kinds = {spec.VMI_KIND, spec.VM_KIND, spec.POD_KIND}
    lists = tuple(key for key, _ in spec.DEVICE_LISTS)
    return kinds, spec.PASSTHROUGH_ANNOTATION, lists


@pytest.mark.parametrize("target", TARGETS)
def test_webhook_configuration_matches_what_is_translated(
    rendered: dict[str, list[Obj]], target: str
) -> None:
    objs = rendered[target]
    kinds, annotation, lists = _handled()
    mwc = find(objs, "MutatingWebhookConfiguration")
    svc = find(objs, "Service", "vfio-dp-webhook")
    seen: set[tuple[str, str]] = set()
    for wh in mwc["webhooks"]:
        ref = wh["clientConfig"]["service"]
        assert (ref["name"], ref["namespace"]) == (svc["metadata"]["name"], NAMESPACE)
        assert ref["path"] == "/mutate"
        assert ref["port"] in [p["port"] for p in svc["spec"]["ports"]]
        assert wh["sideEffects"] == "None" and wh["admissionReviewVersions"] == ["v1"]
        assert 1 <= wh["timeoutSeconds"] <= 10
        assert wh["failurePolicy"] in ("Fail", "Ignore")
        excluded = {
            v
            for e in wh["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
            for v in e["values"]
        }
        assert {NAMESPACE, "kube-system"} <= excluded, "never block our own or system pods"
        for rule in wh["rules"]:
            assert set(rule["operations"]) <= {"CREATE", "UPDATE"}
            for group in rule["apiGroups"]:
                for res in rule["resources"]:
                    seen.add((group, res))
        exprs = " ".join(c["expression"] for c in wh.get("matchConditions", []))
        if any(r == "pods" for rule in wh["rules"] for r in rule["resources"]):
            assert f"'{annotation}'" in exprs, "pods must be filtered by the annotation"
            assert wh["rules"][0]["operations"] == ["CREATE"]
        else:
            for key in lists:
                assert key in exprs, f"VM condition ignores {key}"
    assert seen == {PLURALS[k] for k in kinds}, "rules must cover exactly the translated kinds"


# --------------------------------------------------------------- CEL match conditions, run


def _program(expression: str) -> Any:
    celpy = pytest.importorskip(
        "celpy", reason="cel-python is not installed: the match conditions are not evaluated"
    )
    env = celpy.Environment()
    return env.program(env.compile(expression)), celpy


def _matches(wh: Obj, request: Obj) -> bool:
    result = True
    for cond in wh.get("matchConditions", []):
        prg, celpy = _program(cond["expression"])
        result = result and bool(prg.evaluate(celpy.json_to_cel(request)))
    return result


def _review(op: str, resource: str, obj: Obj, old: Obj | None = None) -> Obj:
    return {
        "request": {"operation": op, "resource": {"resource": resource}},
        "object": obj,
        "oldObject": old,
    }


def test_match_conditions_select_exactly_the_objects_with_devices(
    rendered: dict[str, list[Obj]],
) -> None:
    _, annotation, _ = _handled()
    mwc = find(rendered["base"], "MutatingWebhookConfiguration")
    vms = next(w for w in mwc["webhooks"] if "pods" not in w["rules"][0]["resources"])
    pods = next(w for w in mwc["webhooks"] if "pods" in w["rules"][0]["resources"])
    dev = {"hostDevices": [{"name": "n", "deviceName": "8086:10d3"}]}
    gpu = {"gpus": [{"name": "g", "deviceName": "10de:1eb8"}]}
    vmi = {"spec": {"domain": {"devices": dev}}}
    vm = {"spec": {"template": {"spec": {"domain": {"devices": gpu}}}}}
    plain_vmi = {"spec": {"domain": {"devices": {"disks": []}}}}
    plain_vm = {"spec": {"running": True}}
    assert _matches(vms, _review("CREATE", "virtualmachineinstances", vmi))
    assert _matches(vms, _review("CREATE", "virtualmachines", vm))
    assert not _matches(vms, _review("CREATE", "virtualmachineinstances", plain_vmi))
    assert not _matches(vms, _review("CREATE", "virtualmachines", plain_vm))
    # A controller's update that leaves the spec alone never calls the webhook.
    assert not _matches(vms, _review("UPDATE", "virtualmachines", vm, vm))
    edited = {"spec": {"template": {"spec": {"domain": {"devices": {**gpu, **dev}}}}}}
    assert _matches(vms, _review("UPDATE", "virtualmachines", edited, vm))
    annotated = {"metadata": {"annotations": {annotation: "[]"}}}
    assert _matches(pods, _review("CREATE", "pods", annotated))
    assert not _matches(pods, _review("CREATE", "pods", {"metadata": {"name": "p"}}))
    assert not _matches(pods, _review("CREATE", "pods", {"metadata": {"annotations": {"x": "y"}}}))


# --------------------------------------------------------------------------------- TLS


def _secret_name(objs: list[Obj]) -> str:
    _, spec, _ = _webhook(objs)
    tls = next(v for v in spec["volumes"] if "secret" in v)
    return str(tls["secret"]["secretName"])


def _service_dns(objs: list[Obj]) -> set[str]:
    name = find(objs, "Service", "vfio-dp-webhook")["metadata"]["name"]
    return {f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"}


@pytest.mark.parametrize(
    "target", [t for t in INSTALLABLE if not t.startswith("overlays/cert-manager")]
)
def test_self_signed_job_keeps_the_secret_the_webhook_mounts(
    rendered: dict[str, list[Obj]], target: str
) -> None:
    """The in-cluster CA's Job and CronJob run `vfioctl webhook-certs` for exactly the Secret
    the webhook pods mount, the Service the MutatingWebhookConfiguration calls, and that
    configuration (tests/vm_translate/test_webhook_certs.py runs the command against the
    API-server stand-in and verifies the served certificate with the caBundle it sets)."""
    objs = rendered[target]
    assert not list(all_of(objs, "Secret")), "no key material in the manifests"
    cmd = command("cli.certs_cmd", "webhook_certs")
    mwc = find(objs, "MutatingWebhookConfiguration")
    services = {wh["clientConfig"]["service"]["name"] for wh in mwc["webhooks"]}
    job = find(objs, "Job")  # named after the release (tests/test_version.py)
    cron = find(objs, "CronJob", "vfio-dp-webhook-certs")
    for pod in (
        job["spec"]["template"]["spec"],
        cron["spec"]["jobTemplate"]["spec"]["template"]["spec"],
    ):
        (ctr,) = pod["containers"]
        assert ctr["command"] == ["vfioctl"] and ctr["args"][0] == "webhook-certs"
        given = parse_cli_args(cmd, ctr["args"][1:])
        assert given["secret"] == _secret_name(objs)
        assert given["namespace"] == job["metadata"]["namespace"] == NAMESPACE
        assert {given["service"]} == services
        assert given["webhook_config"] == mwc["metadata"]["name"]
        assert pod["serviceAccountName"] == "vfio-dp-webhook-certs"
        assert ctr["securityContext"]["runAsNonRoot"] is True
    # issue 37.15: a Job never runs forever; one run's four calls fit in it many times over
    for spec in (job["spec"], cron["spec"]["jobTemplate"]["spec"]):
        per_call = given.get("timeout", CALL_DEADLINE)
        assert 4 * per_call * 2 <= spec["activeDeadlineSeconds"] <= 3600, spec


def test_cert_manager_certificate_feeds_the_pod_and_the_ca_injection(
    rendered: dict[str, list[Obj]],
) -> None:
    objs = rendered["overlays/cert-manager"]
    mwc = find(objs, "MutatingWebhookConfiguration")
    ns, _, name = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].partition("/")
    cert = find(objs, "Certificate", name)
    assert ns == cert["metadata"]["namespace"] == NAMESPACE
    assert cert["spec"]["secretName"] == _secret_name(objs)
    assert _service_dns(objs) <= set(cert["spec"]["dnsNames"])
    assert "server auth" in cert["spec"]["usages"]
    issuer = find(objs, "Issuer", cert["spec"]["issuerRef"]["name"])
    ca_cert = next(c for c in all_of(objs, "Certificate") if c["spec"].get("isCA"))
    assert issuer["spec"]["ca"]["secretName"] == ca_cert["spec"]["secretName"]
    find(objs, "Issuer", ca_cert["spec"]["issuerRef"]["name"])["spec"]["selfSigned"]
    assert not any("caBundle" in w["clientConfig"] for w in mwc["webhooks"])


def _bytes(quantity: str) -> int:
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "K": 1000, "M": 1000**2, "G": 1000**3}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * factor
    return int(quantity)


@pytest.mark.parametrize("target", TARGETS)
def test_memory_limit_covers_the_webhooks_worst_case(
    rendered: dict[str, list[Obj]], target: str, webhook_cmd: click.Command
) -> None:
    """The container's memory limit holds the webhook at its connection and body limits (as
    given by its flags, else their defaults), so a flood of clients cannot get it OOM-killed."""
    from vm_translate.webhook_limits import WebhookSettings, worst_case_rss_bytes

    _, _, ctr = _webhook(rendered[target])
    given = _args(ctr, webhook_cmd)
    defaults = {p.name: p.default for p in webhook_cmd.params if p.name}

    def flag(name: str) -> Any:
        return given.get(name, defaults[name])

    settings = WebhookSettings(
        "tls.crt",
        "tls.key",
        max_connections=flag("max_connections"),
        max_body_bytes=flag("max_body_bytes"),
        body_budget_bytes=flag("body_budget_bytes"),
        check_nodes=bool(flag("check_nodes")),
        workers=int(flag("workers")),
    )
    limit = _bytes(ctr["resources"]["limits"]["memory"])
    worst = worst_case_rss_bytes(settings)
    assert worst <= limit, (
        f"worst-case RSS {worst / 2**20:.0f} MiB is over the memory limit {limit / 2**20:.0f} "
        "MiB: lower --max-connections / --body-budget-bytes or raise the limit"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_cpu_limit_lets_every_worker_run(
    rendered: dict[str, list[Obj]], target: str, webhook_cmd: click.Command
) -> None:
    """A worker is one core at most (vm_translate.workers): a CPU limit under ``--workers``
    cores would throttle the replica back to what fewer workers answer."""
    _, _, ctr = _webhook(rendered[target])
    workers = int(_args(ctr, webhook_cmd).get("workers", 1))
    cpu = str(ctr["resources"]["limits"]["cpu"])
    cores = int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    assert workers >= 2 and cores >= workers, (cpu, workers)
