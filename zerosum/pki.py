"""A small certificate authority for a federation's mutual TLS.

The coordinator and every node talk gRPC over TLS 1.2+ with client
certificates (docs/design.md §5). This module makes what that needs: a self-signed
CA, one server certificate for the coordinator and one client certificate per
node, all ECDSA P-256 with SHA-256 signatures (the curve BoringSSL, inside
gRPC, handles best), following the RFC 5280 profile:

* CA: basicConstraints CA:TRUE, pathlen 0 (it signs leaves only), keyUsage
  keyCertSign + cRLSign, valid :data:`CA_VALID_DAYS` days;
* coordinator: keyUsage digitalSignature, extendedKeyUsage serverAuth,
  subjectAltName DNS:localhost, IP:127.0.0.1, IP:::1 and the configured host;
* node: keyUsage digitalSignature, extendedKeyUsage clientAuth, subject CN =
  node id and subjectAltName URI ``zerosum:node/<node id>``,

leaves valid :data:`LEAF_VALID_DAYS` days (the 397-day ceiling browsers apply
to public certificates). Validity starts five minutes in the past so clocks
that disagree by a little do not reject a fresh certificate.

Private keys are written unencrypted in PKCS#8 PEM, created with mode 0600 in
one ``os.open`` call (never widened and narrowed afterwards). Mutual TLS
proves *which certificate* a peer holds; ``proto.tls.node_id_from_certificate``
turns that into the node id, so the coordinator can refuse a message whose
claimed ``node_id`` differs from the authenticated one.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from bounded.files import KIB, read_limited
from proto.federation.checks import validate_identifier
from proto.tls import NODE_URI_PREFIX, CertificateError
from zerosum.errors import KeyFileError

__all__ = [
    "CA_VALID_DAYS",
    "LEAF_VALID_DAYS",
    "IssuedCertificate",
    "create_ca",
    "ed25519_public_pem",
    "issue_client_certificate",
    "issue_server_certificate",
    "load_issued",
    "read_ed25519_public_key",
    "write_private_file",
    "write_public_file",
]

CA_VALID_DAYS: Final = 1826
LEAF_VALID_DAYS: Final = 397
_CLOCK_SKEW: Final = dt.timedelta(minutes=5)
_ORGANISATION: Final = "zerosum"


@dataclass(frozen=True)
class IssuedCertificate:
    """A certificate with its private key."""

    certificate: x509.Certificate
    private_key: ec.EllipticCurvePrivateKey

    def certificate_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def private_key_pem(self) -> bytes:
        """Unencrypted PKCS#8 PEM: write it with :func:`write_private_file` only."""
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _name(common_name: str, federation_id: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, _ORGANISATION),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, federation_id),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_usage(*, sign_certificates: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not sign_certificates,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=sign_certificates,
        crl_sign=sign_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def create_ca(
    federation_id: str, *, valid_days: int = CA_VALID_DAYS, now: dt.datetime | None = None
) -> IssuedCertificate:
    """A fresh self-signed CA for ``federation_id`` (new P-256 key from the OS CSPRNG)."""
    validate_identifier("federation_id", federation_id)
    start = (now or _now()) - _CLOCK_SKEW
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(f"zerosum federation {federation_id} CA", federation_id)
    public = key.public_key()
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(sign_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    return IssuedCertificate(certificate, key)


def _federation_of(ca: IssuedCertificate) -> str:
    units = ca.certificate.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return str(units[0].value) if units else "federation"


def _issue(
    ca: IssuedCertificate,
    common_name: str,
    alternative_names: Sequence[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    *,
    valid_days: int,
    now: dt.datetime | None,
) -> IssuedCertificate:
    start = (now or _now()) - _CLOCK_SKEW
    key = ec.generate_private_key(ec.SECP256R1())
    public = key.public_key()
    ca_key_id = ca.certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, _federation_of(ca)))
        .issuer_name(ca.certificate.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=valid_days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(sign_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_key_id.value),
            critical=False,
        )
        .sign(ca.private_key, hashes.SHA256())
    )
    return IssuedCertificate(certificate, key)


def _host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def issue_server_certificate(
    ca: IssuedCertificate,
    hosts: Iterable[str] = (),
    *,
    valid_days: int = LEAF_VALID_DAYS,
    now: dt.datetime | None = None,
) -> IssuedCertificate:
    """The coordinator's certificate, valid for loopback and every host in ``hosts``."""
    names: list[x509.GeneralName] = []
    for host in ("localhost", "127.0.0.1", "::1", *hosts):
        name = _host_name(host)
        if name not in names:
            names.append(name)
    return _issue(
        ca,
        "zerosum coordinator",
        names,
        ExtendedKeyUsageOID.SERVER_AUTH,
        valid_days=valid_days,
        now=now,
    )


def issue_client_certificate(
    ca: IssuedCertificate,
    node_id: str,
    *,
    valid_days: int = LEAF_VALID_DAYS,
    now: dt.datetime | None = None,
) -> IssuedCertificate:
    """A node's client certificate: CN = node id, SAN URI ``zerosum:node/<node id>``."""
    validate_identifier("node_id", node_id)
    return _issue(
        ca,
        node_id,
        [x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_id)],
        ExtendedKeyUsageOID.CLIENT_AUTH,
        valid_days=valid_days,
        now=now,
    )


def load_issued(certificate_pem: bytes, private_key_pem: bytes) -> IssuedCertificate:
    """Read back a certificate and its P-256 key (e.g. the CA, to issue more nodes).

    Raises CertificateError when either cannot be read or they do not belong together.
    """
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError:
        raise CertificateError("the certificate is not a PEM certificate.") from None
    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise CertificateError("the key is not an unencrypted PEM private key.") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"expected an ECDSA private key; got a {type(key).__name__}.")
    public = certificate.public_key()
    if (
        not isinstance(public, ec.EllipticCurvePublicKey)
        or key.public_key().public_numbers() != public.public_numbers()
    ):
        raise CertificateError("the private key does not belong to the certificate.")
    return IssuedCertificate(certificate, key)


def write_private_file(path: str | Path, data: bytes, *, overwrite: bool = False) -> Path:
    """Write a secret with mode 0600 from the moment it exists.

    The file is created by ``os.open(..., O_CREAT | O_EXCL, 0o600)`` so it is
    never readable by others, not even briefly. An existing file is an error
    (FileExistsError) unless ``overwrite``, in which case it is removed first
    so the new file is created afresh with the tight mode.
    """
    target = Path(path)
    if overwrite and (target.exists() or target.is_symlink()):
        target.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(target, flags, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    return target


def write_public_file(path: str | Path, data: bytes, *, overwrite: bool = False) -> Path:
    """Write a non-secret file (certificate, config); FileExistsError unless ``overwrite``."""
    target = Path(path)
    with target.open("wb" if overwrite else "xb") as handle:
        handle.write(data)
    return target


def ed25519_public_pem(public_key: bytes) -> bytes:
    """A raw 32-byte Ed25519 public key as SubjectPublicKeyInfo PEM (RFC 8410)."""
    key = Ed25519PublicKey.from_public_bytes(public_key)
    return key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def read_ed25519_public_key(path: str | Path) -> bytes:
    """The raw 32-byte Ed25519 public key in ``path``.

    The file holds either a SubjectPublicKeyInfo PEM (RFC 8410, as
    :func:`ed25519_public_pem` and ``openssl pkey -pubout`` write it) or the
    key as 64 hex digits. KeyFileError (a ValueError) names the file when it is neither.
    """
    target = Path(path)
    # A public key in PEM is about 110 bytes; read_limited refuses FIFOs and devices.
    data = read_limited(target, 16 * KIB, what="public key file")
    text = data.decode("ascii", errors="replace").strip()
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        return bytes.fromhex(text)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(
            f"{target} holds no Ed25519 public key (expected a PEM public key or 64 hex digits)"
        )
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
