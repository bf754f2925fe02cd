"""``vfioctl webhook-certs`` (the self-signed overlay's Job) against the API-server stand-in.

The real CLI in a subprocess, the real ``kubernetes`` client, the stand-in over HTTPS; the
certificate it stores is then served by a real TLS server and verified with the CA the
MutatingWebhookConfiguration now carries, under the Service's DNS name — what the API server
does when it calls the webhook.
"""

from __future__ import annotations

import base64
import datetime
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.dra.apiserver_standin import SECRETS, WEBHOOK_CONFIGS, ApiServerStandin
from vm_translate.tls import self_signed
from vm_translate.webhook_certs import (
    bundle_of,
    ca_bundle_patch,
    problem_with,
    secret_data,
    service_names,
)

REPO = Path(__file__).resolve().parents[2]
NAMES = service_names("vfio-dp-webhook", "vfio-dp")


def _mwc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (REPO / "deploy/base/mutatingwebhookconfiguration.yaml").read_text()
    )
    return doc


@pytest.fixture
def api(tmp_path: Path) -> Iterator[ApiServerStandin]:
    server = ApiServerStandin(str(tmp_path / "api"), tls=True)
    server.start()
    server.seed(WEBHOOK_CONFIGS, _mwc())
    yield server
    server.stop()


def _run(api: ApiServerStandin, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "webhook-certs", "--kubeconfig", api.kubeconfig, *args],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False,
    )  # fmt: skip


def _serve_and_verify(secret: dict[str, Any], ca_bundle: str, name: str) -> str:
    """Serve the Secret's tls.crt/tls.key; connect trusting only ``ca_bundle`` as ``name``."""
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    d = Path(os.environ.get("TMPDIR", "/tmp")) / f"wc-{os.getpid()}-{threading.get_ident()}"
    d.mkdir(exist_ok=True)
    (d / "tls.crt").write_bytes(data["tls.crt"])
    (d / "tls.key").write_bytes(data["tls.key"])
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(str(d / "tls.crt"), str(d / "tls.key"))
    client_ctx = ssl.create_default_context(cadata=base64.b64decode(ca_bundle).decode())
    lsock = socket.create_server(("127.0.0.1", 0))
    port = lsock.getsockname()[1]

    def accept() -> None:
        conn, _ = lsock.accept()
        with server_ctx.wrap_socket(conn, server_side=True) as tls:
            tls.recv(1)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    with (
        socket.create_connection(("127.0.0.1", port)) as raw,
        client_ctx.wrap_socket(raw, server_hostname=name) as tls,
    ):
        subject = str(tls.getpeercert()["subjectAltName"])
        tls.send(b"x")
    t.join(5)
    lsock.close()
    return subject


def test_fresh_bundle_has_no_problem_and_a_wrong_one_says_why() -> None:
    now = datetime.datetime.now(datetime.UTC)
    good = self_signed(NAMES, days=365)
    assert problem_with(good, NAMES, now, 30) is None
    assert "expires in" in str(problem_with(self_signed(NAMES, days=10), NAMES, now, 30))
    other = self_signed(["someone-else.default.svc"], days=365)
    assert "does not name vfio-dp-webhook.vfio-dp.svc" in str(problem_with(other, NAMES, now, 30))
    swapped = type(good)(ca=good.ca, cert=good.cert, key=other.key)
    assert problem_with(swapped, NAMES, now, 30) == "its tls.key does not match its tls.crt"
    # the Secret's data round-trips (tls.crt holds the leaf followed by the CA)
    back = bundle_of(secret_data(good))
    assert back == good


def test_ca_bundle_patch_touches_only_entries_calling_our_service() -> None:
    mwc = _mwc()
    mwc["webhooks"].append(
        {**mwc["webhooks"][0], "name": "other.example.com",
         "clientConfig": {"service": {"name": "other", "namespace": "x"}}}
    )  # fmt: skip
    ops = ca_bundle_patch(mwc, "vfio-dp-webhook", "vfio-dp", "QUJD")
    assert [o["path"] for o in ops] == [
        "/webhooks/0/clientConfig/caBundle",
        "/webhooks/1/clientConfig/caBundle",
    ]
    for i in (0, 1):
        mwc["webhooks"][i]["clientConfig"]["caBundle"] = "QUJD"
    assert ca_bundle_patch(mwc, "vfio-dp-webhook", "vfio-dp", "QUJD") == []


def test_job_creates_secret_sets_ca_bundle_and_the_webhook_name_verifies(
    api: ApiServerStandin,
) -> None:
    out = _run(api)
    assert out.returncode == 0, out.stderr
    assert "Secret vfio-dp/vfio-dp-webhook-tls: created; caBundle set on 2 webhook(s)" in out.stdout
    (secret,) = api.objects(SECRETS, "vfio-dp")
    assert secret["type"] == "kubernetes.io/tls"
    (mwc,) = api.objects(WEBHOOK_CONFIGS)
    bundles = {h["clientConfig"].get("caBundle") for h in mwc["webhooks"]}
    assert bundles == {secret["data"]["ca.crt"]}
    san = _serve_and_verify(secret, secret["data"]["ca.crt"], "vfio-dp-webhook.vfio-dp.svc")
    assert "vfio-dp-webhook.vfio-dp.svc" in san

    # again: nothing to do (a Job re-run or a re-apply never rotates a good certificate)
    again = _run(api)
    assert again.returncode == 0, again.stderr
    assert "kept; caBundle set on 0 webhook(s)" in again.stdout
    assert api.objects(SECRETS, "vfio-dp")[0]["data"] == secret["data"]


def test_job_replaces_a_secret_whose_key_does_not_match(api: ApiServerStandin) -> None:
    assert _run(api).returncode == 0
    (secret,) = api.objects(SECRETS, "vfio-dp")
    stranger = self_signed(["x.default.svc"])
    broken = {
        **secret,
        "data": {**secret["data"], "tls.key": base64.b64encode(stranger.key).decode()},
    }
    from kubernetes import client as k8s

    # someone swaps the key (through the API, as kubectl edit would)
    k8s.CoreV1Api(api.client()).replace_namespaced_secret("vfio-dp-webhook-tls", "vfio-dp", broken)
    out = _run(api)
    assert out.returncode == 0, out.stderr
    assert "replaced: its tls.key does not match its tls.crt" in out.stdout
    (fixed,) = api.objects(SECRETS, "vfio-dp")
    (mwc,) = api.objects(WEBHOOK_CONFIGS)
    assert mwc["webhooks"][0]["clientConfig"]["caBundle"] == fixed["data"]["ca.crt"]
    _serve_and_verify(fixed, fixed["data"]["ca.crt"], "vfio-dp-webhook.vfio-dp.svc")


def test_missing_webhook_configuration_is_one_clear_line(tmp_path: Path) -> None:
    server = ApiServerStandin(str(tmp_path / "api"), tls=True)
    server.start()
    try:
        out = _run(server)
    finally:
        server.stop()
    assert out.returncode == 1
    assert "cannot read MutatingWebhookConfiguration vfio-dp-webhook: 404" in out.stderr
    assert "kubectl apply -k deploy/overlays/self-signed" in out.stderr
    assert "Traceback" not in out.stderr


def test_unreadable_kubeconfig_names_the_source(tmp_path: Path) -> None:
    bad = tmp_path / "kc"
    bad.write_text("not: [a kubeconfig")
    out = subprocess.run(
        [sys.executable, "-c", "from cli.main import main; main()", "webhook-certs", "--kubeconfig", str(bad)],
        capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"cannot load the Kubernetes client config from --kubeconfig {bad}" in out.stderr


def test_the_command_loads_no_typed_api_class(api: ApiServerStandin, tmp_path: Path) -> None:
    """Its calls are plain requests through the ``ApiClient`` (issue 33 item 10): importing
    ``CoreV1Api`` builds the model of every core type (~0.9 s of CPU per run of the Job, and
    of every test that runs it), ``AdmissionregistrationV1Api`` another ~0.15 s."""
    listing = tmp_path / "modules"
    code = (
        "import atexit, sys\n"
        f"atexit.register(lambda: open({str(listing)!r}, 'w').write('\\n'.join(sys.modules)))\n"
        "from cli.main import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    out = subprocess.run(
        [sys.executable, "-c", code, "webhook-certs", "--kubeconfig", api.kubeconfig],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "created; caBundle set on 2 webhook(s)" in out.stdout
    loaded = set(listing.read_text().split())
    assert "vm_translate.webhook_certs" in loaded
    assert "kubernetes.client.api.core_v1_api" not in loaded
    assert "kubernetes.client.api.admissionregistration_v1_api" not in loaded
    assert "kubernetes.client.models.v1_secret" not in loaded
