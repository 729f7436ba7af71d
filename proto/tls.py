"""Who is on the other end of a TLS connection: node ids from federation certificates.

Mutual TLS proves which certificate a peer holds, once the TLS layer has
verified it against the federation CA. A node's client certificate names its
node in a single subjectAltName URI ``zerosum:node/<id>`` (and its subject CN,
when present, says the same); :func:`node_id_from_certificate` reads it, so
the coordinator can refuse any message whose claimed ``node_id`` differs from
the authenticated one. Both sides use this module: the coordinator on every
call, the certificate tools when they issue and check certificates.

Depth. The federation CA is made with pathlen 0: it signs leaves only. The
TLS stack inside gRPC does not enforce that (a leaf issued by a CA:TRUE
intermediate under the federation CA, sent with the intermediate, completes
the handshake), so :class:`PeerVerifier` checks, right after the handshake,
that the peer's leaf was signed by the federation CA's own key and is not a
CA itself, and refuses every other chain. The same rule is applied to a
party's own credentials before it starts (:func:`check_node_credentials`,
:func:`check_server_credentials`), each fault one sentence.

Revocation. The federation config lists the SHA-256 fingerprints of revoked
certificates (``revoked``); :func:`certificate_fingerprint` computes one
(the value ``openssl x509 -noout -fingerprint -sha256`` prints). A
fingerprint names one certificate exactly, so a node whose key leaked gets a
new certificate under the same node id while the old one stays refused; to
remove a node altogether, remove it from ``[[nodes]]``.
"""

from __future__ import annotations

import datetime as dt
import functools
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Final

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from proto.errors import ProtoError
from proto.federation.checks import ConfigError, validate_identifier

__all__ = [
    "NODE_URI_PREFIX",
    "CertificateError",
    "PeerVerifier",
    "RevokedCertificateError",
    "certificate_fingerprint",
    "check_coordinator_certificate",
    "check_node_credentials",
    "check_server_credentials",
    "node_id_from_auth_context",
    "node_id_from_certificate",
]

NODE_URI_PREFIX: Final = "zerosum:node/"


# Verified peer certificates remembered by a PeerVerifier (a few per node).
_VERIFIED_CACHE: Final = 4096


class CertificateError(ProtoError, ValueError):
    """A certificate does not identify a federation node, and why."""


class RevokedCertificateError(CertificateError):
    """A certificate is on the federation's revocation list; names its node and fingerprint."""


def certificate_fingerprint(certificate: x509.Certificate) -> str:
    """SHA-256 of the certificate's DER encoding, as 64 lowercase hex digits."""
    return certificate.fingerprint(hashes.SHA256()).hex()


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
    return _node_id_of_pem(bytes(pems[0]))


@functools.lru_cache(maxsize=_VERIFIED_CACHE)
def _node_id_of_pem(pem: bytes) -> str:
    """:func:`node_id_from_certificate` of PEM bytes, remembered (a pure function of them).

    The coordinator's call guard names the caller of every call from its
    certificate; parsing it each time took about 56 µs a call. A certificate
    that names no node raises each time (exceptions are not remembered).
    """
    return node_id_from_certificate(pem)


def _load_certificates(pem: bytes, what: str) -> list[x509.Certificate]:
    try:
        found = x509.load_pem_x509_certificates(pem)
    except ValueError:
        raise CertificateError(f"the {what} is not a PEM certificate.") from None
    return found


def _load_ca(ca_pem: bytes) -> x509.Certificate:
    certificates = _load_certificates(ca_pem, "CA certificate")
    if len(certificates) != 1:
        raise CertificateError(
            f"the CA certificate file holds {len(certificates)} certificates; a federation "
            "has one CA."
        )
    ca = certificates[0]
    try:
        constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CertificateError(
            f"the CA certificate ({ca.subject.rfc4514_string()}) is not a CA (basicConstraints "
            "CA:TRUE is missing)."
        )
    return ca


def _is_ca(certificate: x509.Certificate) -> bool:
    try:
        return bool(certificate.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except x509.ExtensionNotFound:
        return False


def _check_leaf(ca: x509.Certificate, leaf: x509.Certificate, what: str) -> None:
    """Refuse ``leaf`` unless the federation CA's own key signed it and it is no CA."""
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise CertificateError(
            f"the {what} ({leaf.subject.rfc4514_string()}) was not issued directly by this "
            f"federation's CA ({ca.subject.rfc4514_string()}); only the CA may issue "
            "certificates (pathlen 0), never an intermediate."
        ) from None
    if _is_ca(leaf):
        raise CertificateError(
            f"the {what} ({leaf.subject.rfc4514_string()}) is itself a CA certificate; a node "
            "or coordinator certificate must have CA:FALSE."
        )


def _check_revoked(leaf: x509.Certificate, revoked: Iterable[str], who: str) -> None:
    fingerprint = certificate_fingerprint(leaf)
    if fingerprint in set(revoked):
        raise RevokedCertificateError(
            f"the certificate of {who} (SHA-256 {fingerprint}) is revoked by this federation "
            "(listed in revoked in federation.toml); it needs a newly issued certificate."
        )


def _check_pair(certificate_pem: bytes, private_key_pem: bytes, what: str) -> x509.Certificate:
    certificates = _load_certificates(certificate_pem, f"{what} certificate")
    if len(certificates) != 1:
        raise CertificateError(
            f"the {what} certificate file holds {len(certificates)} certificates; it must hold "
            "one, issued directly by the federation CA (no intermediates)."
        )
    certificate = certificates[0]
    try:
        key = serialization.load_pem_private_key(private_key_pem, password=None)
    except (ValueError, TypeError):
        raise CertificateError(f"the {what} key is not an unencrypted PEM private key.") from None
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    if certificate.public_key().public_bytes(der, spki) != key.public_key().public_bytes(der, spki):
        raise CertificateError(f"the {what} key does not belong to the {what} certificate.")
    return certificate


def _check_usage(certificate: x509.Certificate, usage: x509.ObjectIdentifier, what: str) -> None:
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return  # no restriction: any use
    if usage not in usages:
        wanted = "serverAuth" if usage == ExtendedKeyUsageOID.SERVER_AUTH else "clientAuth"
        raise CertificateError(
            f"the {what} certificate is not for {wanted} (its extendedKeyUsage excludes it)."
        )


def _check_validity(certificate: x509.Certificate, what: str) -> None:
    now = dt.datetime.now(dt.UTC)
    if not certificate.not_valid_before_utc <= now <= certificate.not_valid_after_utc:
        raise CertificateError(
            f"the {what} certificate is valid from {certificate.not_valid_before_utc:%Y-%m-%d} "
            f"to {certificate.not_valid_after_utc:%Y-%m-%d}, not now."
        )


def check_node_credentials(
    ca_pem: bytes,
    certificate_pem: bytes,
    private_key_pem: bytes,
    node_id: str,
    *,
    revoked: Iterable[str] = (),
) -> None:
    """Refuse, with one sentence, client credentials that cannot work for ``node_id``.

    Checked before any connection: the files parse, the key belongs to the
    certificate, the federation CA issued it directly (no intermediate, and
    the certificate is no CA itself), it names ``node_id``, is meant for
    client authentication, is within its validity period and is not in
    ``revoked`` (SHA-256 fingerprints). A TLS handshake with such credentials
    would fail with an opaque error, retried until the node gives up.
    """
    ca = _load_ca(ca_pem)
    certificate = _check_pair(certificate_pem, private_key_pem, "client")
    _check_leaf(ca, certificate, "client certificate")
    named = node_id_from_certificate(certificate)
    if named != node_id:
        raise CertificateError(
            f"the client certificate belongs to node {named!r}, not to node {node_id!r}."
        )
    _check_usage(certificate, ExtendedKeyUsageOID.CLIENT_AUTH, "client")
    _check_validity(certificate, "client")
    _check_revoked(certificate, revoked, f"node {node_id!r}")


def check_server_credentials(
    ca_pem: bytes, certificate_pem: bytes, private_key_pem: bytes, *, revoked: Iterable[str] = ()
) -> None:
    """Refuse, with one sentence, coordinator credentials the nodes would not accept.

    The same checks as :func:`check_node_credentials`, for a certificate
    meant for server authentication and naming no node. A certificate whose
    extensions cannot be parsed is a :class:`CertificateError` too.
    """
    try:
        ca = _load_ca(ca_pem)
        certificate = _check_pair(certificate_pem, private_key_pem, "server")
        _check_leaf(ca, certificate, "server certificate")
        _check_usage(certificate, ExtendedKeyUsageOID.SERVER_AUTH, "server")
    except CertificateError:
        raise
    except ValueError as error:  # a malformed extension, found when it is first read
        raise CertificateError(f"a certificate cannot be read: {error}.") from None
    _check_validity(certificate, "server")
    _check_revoked(certificate, revoked, "the coordinator")


def check_coordinator_certificate(
    ca_pem: bytes, certificate_der: bytes, *, revoked: Iterable[str] = ()
) -> str:
    """Refuse the certificate a coordinator presented unless the federation would issue it.

    A node's TLS handshake has checked the chain to the federation CA; this
    adds what the node's side of gRPC cannot: the leaf was signed by the CA's
    own key, is no CA, is for server authentication, and its fingerprint is
    not in ``revoked``. Returns the fingerprint; raises
    :class:`CertificateError` (:class:`RevokedCertificateError`) naming it.
    """
    ca = _load_ca(ca_pem)
    try:
        leaf = x509.load_der_x509_certificate(certificate_der)
    except ValueError:
        raise CertificateError("the coordinator's certificate cannot be read.") from None
    _check_leaf(ca, leaf, "coordinator's certificate")
    _check_usage(leaf, ExtendedKeyUsageOID.SERVER_AUTH, "coordinator")
    _check_revoked(leaf, revoked, "the coordinator")
    return certificate_fingerprint(leaf)


class PeerVerifier:
    """The node id of an authenticated gRPC peer, after the federation's own checks.

    The TLS layer has verified the peer's chain to the federation CA; this
    adds what it does not enforce: the leaf must be signed by the CA's own key
    (pathlen 0: no intermediate may issue node certificates) and be no CA
    itself, and its fingerprint must not be in ``revoked``. A leaf that fails
    raises :class:`CertificateError` (the coordinator answers
    UNAUTHENTICATED); a revoked one :class:`RevokedCertificateError`
    (PERMISSION_DENIED). Results for certificates already seen are
    remembered, so a call costs one dictionary lookup after the first.
    """

    def __init__(self, ca_pem: bytes, revoked: Iterable[str] = ()) -> None:
        self._ca = _load_ca(ca_pem)
        self._revoked = frozenset(revoked)
        self._verified: dict[bytes, str] = {}
        self._lock = threading.Lock()

    def node_id(self, auth_context: Mapping[str, Any]) -> str:
        """The node id of the peer of ``auth_context`` (``ServicerContext.auth_context()``)."""
        pems = list(auth_context.get("x509_pem_cert") or ())
        if len(pems) != 1 or not isinstance(pems[0], bytes):
            raise CertificateError("the peer presented no client certificate.")
        pem = bytes(pems[0])
        with self._lock:
            known = self._verified.get(pem)
        if known is not None:
            return known
        try:
            leaf = x509.load_pem_x509_certificate(pem)
        except ValueError:
            raise CertificateError("the peer's certificate cannot be read.") from None
        _check_leaf(self._ca, leaf, "client certificate")
        node_id = node_id_from_certificate(leaf)
        _check_revoked(leaf, self._revoked, f"node {node_id!r}")
        with self._lock:
            if len(self._verified) >= _VERIFIED_CACHE:
                self._verified.clear()
            self._verified[pem] = node_id
        return node_id
