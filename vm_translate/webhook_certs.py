"""In-cluster certificates for the webhook: ``vfioctl webhook-certs`` (the self-signed overlay's Job).

The overlay renders from a fresh clone (no certificate files in the checkout): a Job in the
``vfio-dp`` namespace runs this once per apply and keeps the webhook's TLS where the API
server and the webhook pods find it:

- the Secret ``<namespace>/<secret>`` (type ``kubernetes.io/tls``)::

      data:
        tls.crt: <serving certificate + CA, PEM, base64>
        tls.key: <its private key, PEM, base64>
        ca.crt:  <the CA, PEM, base64>

  is created, or replaced when what it holds is not good for at least ``renew_days`` more days,
  does not name the Service (``<service>.<namespace>.svc``), or its key does not match it;
- every webhook entry of the MutatingWebhookConfiguration ``<webhook_config>`` whose
  ``clientConfig.service`` is that Service gets ``clientConfig.caBundle`` = the Secret's CA
  (a JSON Patch, only where it differs).

The webhook pods mount the Secret (they wait for it in ``ContainerCreating`` until the Job made
it) and reload the files when it changes. Running it again is harmless: a good Secret is kept.

:func:`problem_with` is pure (certificate PEM in, a reason or None out); :func:`ensure` is the
thin shell over the ``kubernetes`` client.
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vm_translate.errors import CertificateJobError
from vm_translate.tls import CertBundle, self_signed

log = logging.getLogger(__name__)

SECRET_KEYS = ("tls.crt", "tls.key", "ca.crt")


def service_names(service: str, namespace: str) -> list[str]:
    """The names the API server uses to reach the webhook Service (its SANs)."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def problem_with(
    bundle: CertBundle, names: list[str], now: datetime.datetime, renew_days: int
) -> str | None:
    """Why ``bundle`` must be replaced (expiring, wrong names, key mismatch), or None."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(bundle.cert)
        ca = x509.load_pem_x509_certificate(bundle.ca)
        key = serialization.load_pem_private_key(bundle.key, password=None)
    except ValueError as e:
        return f"it does not hold a PEM certificate, CA and key ({e})"
    left = cert.not_valid_after_utc - now
    if left < datetime.timedelta(days=renew_days):
        return (
            f"its certificate expires in {max(left.days, 0)} days (renewed {renew_days} days early)"
        )
    if ca.not_valid_after_utc - now < datetime.timedelta(days=renew_days):
        return "its CA expires within the renewal window"
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have = set(san.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        have = set()
    missing = [n for n in names if n not in have]
    if missing:
        return f"its certificate does not name {', '.join(missing)}"
    if cert.issuer != ca.subject:
        return "its certificate was not issued by its ca.crt"
    pub = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*pub) != cert.public_key().public_bytes(*pub):
        return "its tls.key does not match its tls.crt"
    return None


def bundle_of(secret_data: Mapping[str, str] | None) -> CertBundle | None:
    """The Secret's ``data`` (base64 values) → a bundle, or None when a key is missing."""
    if not secret_data or any(k not in secret_data for k in SECRET_KEYS):
        return None
    try:
        raw = {k: base64.b64decode(secret_data[k], validate=True) for k in SECRET_KEYS}
    except ValueError:
        return None
    # tls.crt holds the serving certificate followed by the CA (the chain the webhook serves)
    leaf = raw["tls.crt"].split(b"-----END CERTIFICATE-----", 1)[0] + b"-----END CERTIFICATE-----\n"
    return CertBundle(ca=raw["ca.crt"], cert=leaf, key=raw["tls.key"])


def secret_data(bundle: CertBundle) -> dict[str, str]:
    """A bundle → the Secret's ``data`` (what :meth:`CertBundle.write` would put in files)."""
    files = {"tls.crt": bundle.cert + bundle.ca, "tls.key": bundle.key, "ca.crt": bundle.ca}
    return {k: base64.b64encode(v).decode("ascii") for k, v in files.items()}


def ca_bundle_patch(
    webhook_config: Mapping[str, Any], service: str, namespace: str, ca_bundle: str
) -> list[dict[str, Any]]:
    """JSON Patch ops setting ``caBundle`` on each entry that calls ``service`` (only where it differs)."""
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(webhook_config.get("webhooks") or []):
        cc = hook.get("clientConfig") or {}
        svc = cc.get("service") or {}
        if svc.get("name") != service or svc.get("namespace") != namespace:
            continue
        if cc.get("caBundle") != ca_bundle:
            ops.append(
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": ca_bundle}
            )
    return ops


@dataclass(frozen=True)
class Outcome:
    """What :func:`ensure` did, for one log line per change."""

    secret: str  # "created", "replaced: <why>" or "kept"
    patched_webhooks: int


def ensure(
    client: Any,
    *,
    namespace: str,
    secret: str,
    service: str,
    webhook_config: str,
    days: int = 365,
    renew_days: int = 30,
) -> Outcome:
    """Make the Secret good and the caBundle match it (idempotent). ``client``: an ApiClient."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    core: Any = k8s.CoreV1Api(client)
    names = service_names(service, namespace)
    try:
        current = core.read_namespaced_secret(secret, namespace, _request_timeout=10)
    except ApiException as e:
        if e.status != 404:
            raise CertificateJobError(
                f"cannot read Secret {namespace}/{secret}: {e.status} {e.reason}"
            ) from e
        current = None
    have = bundle_of(current.data if current is not None else None)
    why = (
        "it does not exist or lacks tls.crt/tls.key/ca.crt"
        if have is None
        else problem_with(have, names, datetime.datetime.now(datetime.UTC), renew_days)
    )
    if why is None and have is not None:
        bundle, done = have, "kept"
    else:
        bundle = self_signed(names, days=days)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": secret,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/part-of": "vfio-dp"},
            },
            "data": secret_data(bundle),
        }
        if current is None:
            core.create_namespaced_secret(namespace, body, _request_timeout=10)
            done = "created"
        else:
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            core.replace_namespaced_secret(secret, namespace, body, _request_timeout=10)
            done = f"replaced: {why}"
    adm: Any = k8s.AdmissionregistrationV1Api(client)
    try:
        resp = adm.read_mutating_webhook_configuration(
            webhook_config, _preload_content=False, _request_timeout=10
        )
    except ApiException as e:
        raise CertificateJobError(
            f"cannot read MutatingWebhookConfiguration {webhook_config}: {e.status} {e.reason}; "
            "apply the overlay first (kubectl apply -k deploy/overlays/self-signed)"
        ) from e
    import json

    ops = ca_bundle_patch(json.loads(resp.data), service, namespace, bundle.ca_bundle)
    if ops:
        adm.patch_mutating_webhook_configuration(webhook_config, ops, _request_timeout=10)
    return Outcome(secret=done, patched_webhooks=len(ops))
