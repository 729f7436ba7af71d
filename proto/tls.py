"""Who is on the other end of a TLS connection: node ids from federation certificates.

Mutual TLS proves which certificate a peer holds, once the TLS layer has
verified it against the federation CA. A node's client certificate names its
node in a single subjectAltName URI ``zerosum:node/<id>`` (and its subject CN,
when present, says the same); :func:`node_id_from_certificate` reads it, so
the coordinator can refuse any message whose claimed ``node_id`` differs from
the authenticated one. Both sides use this module: the coordinator on every
call, the certificate tools when they issue and check certificates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from cryptography import x509
from cryptography.x509.oid import NameOID

from proto.federation.checks import ConfigError, validate_identifier

__all__ = [
    "NODE_URI_PREFIX",
    "CertificateError",
    "check_node_credentials",
    "node_id_from_auth_context",
    "node_id_from_certificate",
]

NODE_URI_PREFIX: Final = "zerosum:node/"


class CertificateError(ValueError):
    """A certificate does not identify a federation node, and why."""


def node_id_from_certificate(certificate: x509.Certificate | bytes) -> str:
    """The node id a client certificate was issued to.

    Reads the single SAN URI ``zerosum:node/<id>``; the subject CN, when
    present, must say the same. ``certificate`` may be PEM bytes. Raises
    :class:`CertificateError` for a certificate that names no node, names
    several, or contradicts itself. Call it only on a certificate the TLS
    layer has already verified against the federation CA.
    """
    if isinstance(certificate, bytes):
        certificate = x509.load_pem_x509_certificate(certificate)
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName)
        uris = san.value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    ids = [uri[len(NODE_URI_PREFIX) :] for uri in uris if uri.startswith(NODE_URI_PREFIX)]
    subject = certificate.subject.rfc4514_string()
    if len(ids) != 1:
        found = "no" if not ids else f"{len(ids)}"
        raise CertificateError(
            f"certificate {subject!r} carries {found} {NODE_URI_PREFIX}<id> names; expected one."
        )
    node_id = ids[0]
    try:
        validate_identifier("node_id", node_id)
    except ConfigError as error:
        raise CertificateError(f"certificate {subject!r}: {error}") from None
    common_names = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if any(attribute.value != node_id for attribute in common_names):
        raise CertificateError(
            f"certificate {subject!r} names node {node_id!r} in its SAN but not in its CN."
        )
    return node_id


def node_id_from_auth_context(auth_context: Mapping[str, Any]) -> str:
    """The authenticated node id of a gRPC peer, from ``ServicerContext.auth_context()``.

    gRPC exposes the verified peer certificate as ``x509_pem_cert``; an
    unauthenticated peer (no TLS, no client certificate) has none and is
    refused with :class:`CertificateError`. Each value of the mapping is a
    list of byte strings (typed loosely: the stubs for grpc disagree).
    """
    pems = list(auth_context.get("x509_pem_cert") or ())
    if len(pems) != 1 or not isinstance(pems[0], bytes):
        raise CertificateError("the peer presented no client certificate.")
    return node_id_from_certificate(bytes(pems[0]))


def check_node_credentials(
    ca_pem: bytes, certificate_pem: bytes, private_key_pem: bytes, node_id: str
) -> None:
    """Refuse, with one sentence, client credentials that cannot work for ``node_id``.

    Checked before any connection: both files parse, the key belongs to the
    certificate, the federation CA issued it, it names ``node_id`` and it is
    within its validity period. A TLS handshake with such credentials would
    fail with an opaque error, retried until the node gives up.
    """
    import datetime as dt

    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import serialization

    try:
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        raise CertificateError("the CA certificate is not a PEM certificate.") from None
    try:
        certificate = x509.load_pem_x509_certificate(certificate_pem)
    except ValueError:
        raise CertificateError("the client certificate is not a PEM certificate.") from None
    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError):
        raise CertificateError("the client key is not an unencrypted PEM private key.") from None
    public = certificate.public_key()
    if public.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ) != key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise CertificateError("the client key does not belong to the client certificate.")
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError(
            f"the client certificate was not issued by this federation's CA "
            f"({ca.subject.rfc4514_string()})."
        ) from None
    named = node_id_from_certificate(certificate)
    if named != node_id:
        raise CertificateError(
            f"the client certificate belongs to node {named!r}, not to node {node_id!r}."
        )
    now = dt.datetime.now(dt.UTC)
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise CertificateError(
            f"the client certificate is valid from {certificate.not_valid_before_utc:%Y-%m-%d} "
            f"to {certificate.not_valid_after_utc:%Y-%m-%d}, not now."
        )
