"""The webhook's TLS: a server context that follows its files, and dev-mode certificates.

cert-manager (or any rotation) replaces ``tls.crt``/``tls.key`` in place; the webhook checks
both files' (mtime, size, inode) every few seconds and, when they change, loads them again
into the SAME ``ssl.SSLContext`` — OpenSSL copies the certificate into each new connection,
so new handshakes get the new certificate and open connections keep theirs. A half-written
pair (cert and key not matching yet) keeps the old certificate and is retried next time.

``--self-signed`` (development): :func:`self_signed` makes a throw-away CA and a serving
certificate for the given names; the CA's PEM, base64-encoded, is the ``caBundle`` of the
MutatingWebhookConfiguration.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
import os
import re
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from vm_translate.errors import TlsError

log = logging.getLogger(__name__)


def server_context(cert_file: str, key_file: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(ctx, cert_file, key_file)
    return ctx


def _load(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(
            f"cannot load the TLS certificate: {diagnose(cert_file, key_file) or e}; give a "
            "PEM certificate chain (--tls-cert) and its private key (--tls-key), or --self-signed"
        ) from e


_PEM_BEGIN = re.compile(rb"-----BEGIN ([A-Z ]+)-----")


def _pem_kinds(data: bytes) -> set[str]:
    return {m.decode() for m in _PEM_BEGIN.findall(data)}


def _is_key(kinds: set[str]) -> bool:
    return any(k.endswith("PRIVATE KEY") for k in kinds)


def diagnose(cert_file: str, key_file: str) -> str | None:
    """What is wrong with a certificate/key pair, naming the file: missing, unreadable, not
    PEM, swapped, or a key that is not the certificate's. None when nothing is found."""
    files = {"--tls-cert": cert_file, "--tls-key": key_file}
    data: dict[str, bytes] = {}
    for flag, path in files.items():
        try:
            with open(path, "rb") as f:
                data[flag] = f.read(1 << 20)
        except FileNotFoundError:
            return f"{flag} {path}: no such file"
        except OSError as e:
            return f"{flag} {path}: cannot be read ({e.strerror or e})"
    cert_kinds, key_kinds = _pem_kinds(data["--tls-cert"]), _pem_kinds(data["--tls-key"])
    if "CERTIFICATE" not in cert_kinds and _is_key(cert_kinds) and "CERTIFICATE" in key_kinds:
        return f"--tls-cert {cert_file} holds a private key and --tls-key {key_file} a certificate: the two files are swapped"
    if "CERTIFICATE" not in cert_kinds:
        return f"--tls-cert {cert_file} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    if not _is_key(key_kinds):
        return f"--tls-key {key_file} holds no PEM private key (-----BEGIN PRIVATE KEY-----)"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    try:
        cert = x509.load_pem_x509_certificate(data["--tls-cert"])
    except ValueError as e:
        return f"--tls-cert {cert_file}: the first certificate does not parse ({e})"
    try:
        key = serialization.load_pem_private_key(data["--tls-key"], password=None)
    except TypeError:
        return f"--tls-key {key_file} is encrypted: give an unencrypted key"
    except ValueError as e:
        return f"--tls-key {key_file}: the key does not parse ({e})"
    pub = serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(*pub) != cert.public_key().public_bytes(*pub):
        return (
            f"--tls-key {key_file} is not the private key of --tls-cert {cert_file} (the first "
            "certificate in it must be the serving certificate, then its chain)"
        )
    return None


def _stamp(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return (st.st_mtime_ns, st.st_size, st.st_ino)


class ReloadingContext:
    """A server ``SSLContext`` plus :meth:`reload_if_changed` (call it periodically)."""

    def __init__(self, cert_file: str, key_file: str) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.context = server_context(cert_file, key_file)
        self._stamps = self._read_stamps()

    def _read_stamps(self) -> tuple[tuple[int, int, int], ...] | None:
        try:
            return (_stamp(self.cert_file), _stamp(self.key_file))
        except OSError:
            return None

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed; True when a new certificate is in use."""
        stamps = self._read_stamps()
        if stamps is None or stamps == self._stamps:
            return False
        try:
            _load(self.context, self.cert_file, self.key_file)
        except TlsError as e:
            log.warning("keeping the previous certificate: %s", e)
            return False
        self._stamps = stamps
        log.info("reloaded TLS certificate %s", self.cert_file)
        return True


@dataclass(frozen=True, slots=True)
class CertBundle:
    """PEM bytes: ``ca`` signs ``cert``; ``key`` is ``cert``'s private key."""

    ca: bytes
    cert: bytes
    key: bytes

    @property
    def ca_bundle(self) -> str:
        """The MutatingWebhookConfiguration's ``clientConfig.caBundle`` value."""
        return base64.b64encode(self.ca).decode("ascii")

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Write ``tls.crt`` (cert + CA chain), ``tls.key`` (mode 0600) and ``ca.crt``."""
        directory.mkdir(parents=True, exist_ok=True)
        cert, key = directory / "tls.crt", directory / "tls.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self.key)
        cert.write_bytes(self.cert + self.ca)
        (directory / "ca.crt").write_bytes(self.ca)
        return cert, key


def self_signed(names: Sequence[str], days: int = 365) -> CertBundle:
    """A new CA and a serving certificate for ``names`` (DNS names or IP addresses)."""
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise TlsError(
            "--self-signed needs the 'cryptography' package: pip install cryptography"
        ) from e
    if not names:
        raise TlsError("a self-signed certificate needs at least one name (--san)")
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vfio_dp webhook dev CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return CertBundle(
        ca=ca.public_bytes(pem),
        cert=cert.public_bytes(pem),
        key=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
