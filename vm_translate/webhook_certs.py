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
thin shell over the ``kubernetes`` client's ``ApiClient``, with plain JSON requests
(:func:`vfio_dp.dra.apiserver.plain.send`: no typed API class, whose import builds the model of
every core type, ~0.9 s of CPU per run). Its calls (what the Job's RBAC must allow)::

    GET    /api/v1/namespaces/<namespace>/secrets/<secret>
    POST   /api/v1/namespaces/<namespace>/secrets                     (none yet)
    PUT    /api/v1/namespaces/<namespace>/secrets/<secret>            (replaced, resourceVersion read)
    GET    /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/<webhook_config>
    PATCH  /apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/<webhook_config>
           (a JSON Patch of the caBundles that differ)
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from vm_translate.errors import ApiUnreachableError, CertificateJobError
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


#: Every API call's overall deadline in seconds (connect, send and the WHOLE answer): a
#: server that trickles its answer a byte at a time never trips a read timeout.
CALL_DEADLINE = 30.0
#: How much of an API server's error body a message shows.
SHOWN_BODY = 300


class _Api:
    """The calls :func:`ensure` makes, each under :data:`CALL_DEADLINE` and each failure one
    :class:`CertificateJobError` naming the call, the server and the cause (never a
    traceback): refused (HTTP status and the server's message), unreachable
    (:class:`ApiUnreachableError`, exit 2), too slow, or an answer that is not the object."""

    def __init__(self, client: Any, deadline: float) -> None:
        self.client = client
        self.server = str(getattr(client.configuration, "host", "") or "?")
        self.deadline = deadline
        # connect and per-read timeouts inside the overall deadline
        self.timeout = (min(10.0, deadline), min(10.0, deadline))

    def send(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        absent_ok: bool = False,
    ) -> bytes | None:
        """``method path`` with a plain JSON ``body`` (:func:`vfio_dp.dra.apiserver.plain.send`:
        no typed API class, whose import would build every core model) and its answer's body,
        read whole, within the deadline (None: 404 and ``absent_ok``).

        The deadline is a ``SIGALRM`` timer in the main thread (where the command runs): it
        interrupts a read that a trickling server keeps alive, and leaves no thread behind
        blocked on the socket. Called from another thread, only the connect and per-read
        timeouts apply."""
        import signal
        import threading

        from vfio_dp.dra.apiserver.plain import send

        timer = threading.current_thread() is threading.main_thread()
        old: Any = None
        if timer:

            def expired(signum: int, frame: Any) -> None:
                raise _Expired

            old = signal.signal(signal.SIGALRM, expired)
            signal.setitimer(signal.ITIMER_REAL, self.deadline)
        try:
            data = send(
                self.client, method, path, body,
                content_type=content_type, request_timeout=self.timeout,
            )  # fmt: skip
        except _Expired:
            raise CertificateJobError(
                f"{what}: the API server {self.server} did not answer within "
                f"{self.deadline:g} s (it accepted the connection but answers too slowly); "
                "check the API server's health, or run the Job again"
            ) from None
        except Exception as e:
            if absent_ok and getattr(e, "status", None) == 404:
                return None
            raise self._failure(what, e) from None
        finally:
            if timer:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        return data

    def _failure(self, what: str, e: BaseException) -> CertificateJobError:
        from kubernetes.client.exceptions import ApiException

        if isinstance(e, ApiException) and e.status:
            return CertificateJobError(
                f"{what}: the API server {self.server} refused: HTTP {e.status} "
                f"{e.reason or ''}{_message_of(e.body)}{_HINTS.get(int(e.status), '')}".rstrip()
            )
        if _is_timeout(e):
            return CertificateJobError(
                f"{what}: the API server {self.server} did not answer within "
                f"{self.timeout[1]:g} s; check the API server's health, or run the Job again"
            )
        return ApiUnreachableError(
            f"{what}: cannot reach the API server {self.server}: {_cause(e)}; check the "
            "kubeconfig's server address (or the pod's network and service account)"
        )

    def json_object(self, what: str, body: bytes, kind: str) -> dict[str, Any]:
        """The answer as a JSON object of ``kind``, or a :class:`CertificateJobError`."""
        import json

        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if not isinstance(obj, dict) or obj.get("kind", kind) != kind:
            raise CertificateJobError(
                f"{what}: the API server {self.server} answered something that is not a {kind} "
                f"({_clip(body)!r}); is the kubeconfig's server a Kubernetes API server?"
            )
        return obj


class _Expired(BaseException):
    """The call's deadline passed (a BaseException: no client code catches it on the way)."""


_HINTS = {
    401: "; the credentials are not accepted: check the kubeconfig or the service account",
    403: "; the Job's service account lacks a permission: apply "
    "deploy/overlays/self-signed/certs-rbac.yaml (kubectl apply -k deploy/overlays/self-signed)",
    409: "; it was changed meanwhile (or already exists): run the Job again",
}


def _clip(body: bytes | str | None) -> str:
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
    return text if len(text) <= SHOWN_BODY else f"{text[:SHOWN_BODY]}...[{len(text)} chars]"


def _message_of(body: object) -> str:
    """``: <the Status object's message>`` (or the body's start), bounded; "" when empty."""
    import json

    if not body:
        return ""
    try:
        message = json.loads(body)["message"]  # type: ignore[arg-type]
    except (ValueError, TypeError, KeyError):
        message = body
    return f": {_clip(message if isinstance(message, (bytes, str)) else str(message))}"


def _is_timeout(e: BaseException) -> bool:
    import socket

    import urllib3.exceptions as u3

    if isinstance(e, u3.MaxRetryError) and e.reason is not None:
        e = e.reason
    # a connect that times out is "cannot reach" (urllib3 2 also makes every
    # NewConnectionError a ConnectTimeoutError); only an answer that stops is "too slow"
    return isinstance(e, (u3.ReadTimeoutError, socket.timeout))


def _cause(e: BaseException) -> str:
    """The last words of a connection error (``[Errno 111] Connection refused``), without
    urllib3's object reprs."""
    import re

    import urllib3.exceptions as u3

    if isinstance(e, u3.MaxRetryError) and e.reason is not None:
        e = e.reason
    text = str(e) or type(e).__name__
    text = re.sub(r"^\(?<[^>]*>[:,]?\s*", "", text).strip("()'\" ")
    return _clip(text)


def _secret_data(obj: Mapping[str, Any]) -> tuple[dict[str, str] | None, str | None]:
    """A Secret object's ``data`` (None: none) and ``metadata.resourceVersion``, or
    ``ValueError`` when either is not of its type."""
    data = obj.get("data")
    meta = obj.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    if data is not None and not (
        isinstance(data, dict) and all(isinstance(v, str) for v in data.values())
    ):
        raise ValueError("its data is not a map of strings")
    if not isinstance(version, str):
        raise ValueError("it has no metadata.resourceVersion")
    return data, version


def _webhooks_valid(obj: Mapping[str, Any]) -> bool:
    hooks = obj.get("webhooks")
    if hooks is None:
        return True
    if not isinstance(hooks, list):
        return False
    for hook in hooks:
        if not isinstance(hook, dict):
            return False
        cc = hook.get("clientConfig")
        if cc is not None and not (
            isinstance(cc, dict) and isinstance(cc.get("service") or {}, dict)
        ):
            return False
    return True


def ensure(
    client: Any,
    *,
    namespace: str,
    secret: str,
    service: str,
    webhook_config: str,
    days: int = 365,
    renew_days: int = 30,
    deadline: float = CALL_DEADLINE,
) -> Outcome:
    """Make the Secret good and the caBundle match it (idempotent). ``client``: an ApiClient.

    Each call to the API server must finish within ``deadline`` seconds; every failure is one
    :class:`CertificateJobError` (:class:`ApiUnreachableError` when the server cannot be
    reached) naming the call, the server and the cause."""
    api = _Api(client, deadline)
    names = service_names(service, namespace)
    secrets = f"/api/v1/namespaces/{quote(namespace, safe='')}/secrets"
    read = f"GET Secret {namespace}/{secret}"
    raw = api.send(read, "GET", f"{secrets}/{quote(secret, safe='')}", absent_ok=True)
    current: tuple[dict[str, str] | None, str | None] | None = None
    if raw is not None:
        try:
            current = _secret_data(api.json_object(read, raw, "Secret"))
        except ValueError as e:
            raise CertificateJobError(
                f"{read}: the API server {api.server} answered a malformed Secret ({e})"
            ) from None
    have = bundle_of(current[0] if current is not None else None)
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
            api.send(f"create Secret {namespace}/{secret}", "POST", secrets, body)
            done = "created"
        else:
            body["metadata"]["resourceVersion"] = current[1]
            what = f"replace Secret {namespace}/{secret}"
            api.send(what, "PUT", f"{secrets}/{quote(secret, safe='')}", body)
            done = f"replaced: {why}"
    configs = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
    config = f"{configs}/{quote(webhook_config, safe='')}"
    what = f"GET MutatingWebhookConfiguration {webhook_config}"
    raw = api.send(what, "GET", config, absent_ok=True)
    if raw is None:
        raise CertificateJobError(
            f"cannot read MutatingWebhookConfiguration {webhook_config}: 404 Not Found; "
            "apply the overlay first (kubectl apply -k deploy/overlays/self-signed)"
        )
    mwc = api.json_object(what, raw, "MutatingWebhookConfiguration")
    if not _webhooks_valid(mwc):
        raise CertificateJobError(
            f"{what}: the API server {api.server} answered a malformed "
            "MutatingWebhookConfiguration (webhooks is not a list of objects)"
        )
    ops = ca_bundle_patch(mwc, service, namespace, bundle.ca_bundle)
    if ops:
        api.send(
            f"PATCH MutatingWebhookConfiguration {webhook_config} (caBundle)", "PATCH", config,
            ops, content_type="application/json-patch+json",
        )  # fmt: skip
    return Outcome(secret=done, patched_webhooks=len(ops))
