"""Why a TLS connection to the coordinator fails, in one sentence naming the certificate.

gRPC reports a failed handshake as UNAVAILABLE, the status of a coordinator
that is restarting, so the gateway would retry it until its patience runs
out. When a call fails so, :func:`tls_mismatch` makes one handshake of its
own with Python's ``ssl`` and the node's files (its client certificate and
key; ALPN ``h2`` as gRPC does), checks the certificate the coordinator
presents against the node's CA certificate, and reads the outcome:

* the coordinator's certificate does not verify against the node's CA (the
  node holds another federation's CA, or the coordinator another's
  certificate), or does not name the address dialled: a sentence naming the
  node's CA file and the issuer the coordinator's certificate names;
* the coordinator answers the handshake with a TLS alert refusing the
  client certificate (it trusts another CA): a sentence naming the node's
  client certificate and its issuer;
* anything else — no listener, a reset, a timeout, a handshake that goes
  through and an HTTP/2 server that answers — is no certificate mismatch:
  None, and the gateway keeps retrying. Only a definite verdict of the TLS
  layer ends the retries, so a broken network never passes for a mismatch.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

__all__ = ["tls_mismatch"]

# The client's HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4).
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
# Alerts a TLS server sends when it does not accept the client's certificate.
_CLIENT_REFUSED = ("UNKNOWN_CA", "BAD_CERTIFICATE", "CERTIFICATE_REQUIRED", "DECRYPT_ERROR")


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _key_id(certificate: x509.Certificate, *, issuer: bool) -> str:
    """The first 8 bytes of the (authority or subject) key identifier in hex, or ''."""
    try:
        if issuer:
            found = certificate.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier)
            key = found.value.key_identifier
        else:
            key = certificate.extensions.get_extension_for_class(
                x509.SubjectKeyIdentifier
            ).value.digest
    except x509.ExtensionNotFound:
        return ""
    return f" (key {key[:6].hex(':')})" if key else ""


def _names(pem_or_der: bytes, *, der: bool = False) -> tuple[str, str]:
    """(subject, issuer) of a certificate in words, with key identifiers.

    Two federations made with the same id have CAs of the same name; their
    keys tell them apart.
    """
    certificate = (
        x509.load_der_x509_certificate(pem_or_der)
        if der
        else x509.load_pem_x509_certificate(pem_or_der)
    )
    subject = _common_name(certificate.subject) + _key_id(certificate, issuer=False)
    issuer = _common_name(certificate.issuer) + _key_id(certificate, issuer=True)
    return subject, issuer


def _common_name(name: x509.Name) -> str:
    found = name.get_attributes_for_oid(x509.NameOID.COMMON_NAME)
    return repr(str(found[0].value)) if found else name.rfc4514_string()


def _names_host(certificate: x509.Certificate, host: str) -> bool:
    """Whether the certificate's subjectAltName names ``host`` (an IP address or DNS name)."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return True  # nothing to compare; gRPC decides
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower() in (n.lower() for n in names.get_values_for_type(x509.DNSName))
    return address in names.get_values_for_type(x509.IPAddress)


def tls_mismatch(
    address: str,
    *,
    ca_certificate: Path,
    client_certificate: Path,
    client_key: Path,
    timeout: float = 2.0,
) -> str | None:
    """A sentence saying which certificate does not match at ``address``, or None (see above).

    One connection: the handshake takes the coordinator's certificate without
    judging it, which is then checked against the node's CA here (so the
    sentence can name what was presented); the coordinator judges the node's
    client certificate as it always does, and logs a refusal.
    """
    prepared = _prepared(address, ca_certificate, client_certificate, client_key)
    if prepared is None:
        return None  # the node's own files were checked at setup; nothing to say here
    host, port, ca, context = prepared
    try:
        raw = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with raw:
        try:
            with context.wrap_socket(raw, server_hostname=host) as tls:
                presented = tls.getpeercert(binary_form=True)
                if presented is not None:
                    verdict = _check_presented(address, host, ca, ca_certificate, presented)
                    if verdict is not None:
                        return verdict
                # TLS 1.3: the server judges the client certificate after the
                # client's side of the handshake; its alert comes with the first read.
                tls.sendall(_PREFACE)
                tls.recv(9)
                return None
        except ssl.SSLError as error:
            return _client_refused(error, address, client_certificate)
        except OSError:
            return None


def _prepared(
    address: str, ca_certificate: Path, client_certificate: Path, client_key: Path
) -> tuple[str, int, x509.Certificate, ssl.SSLContext] | None:
    """Host, port, the node's CA and a client context that judges nothing; None if unreadable."""
    try:
        host, port = _split(address)
        ca_pem = ca_certificate.read_bytes()
        ca = x509.load_pem_x509_certificate(ca_pem)
    except (OSError, ValueError):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        context.load_cert_chain(str(client_certificate), str(client_key))
    except (OSError, ssl.SSLError):
        return None
    context.set_alpn_protocols(["h2"])
    return host, port, ca, context


def _client_refused(error: ssl.SSLError, address: str, client_certificate: Path) -> str | None:
    """The sentence for a handshake the coordinator ended over this node's certificate."""
    reason = str(error.reason or "")
    if not any(alert in reason for alert in _CLIENT_REFUSED):
        return None
    _, issuer = _names(client_certificate.read_bytes())
    return (
        f"the coordinator at {address} refused this node's client certificate "
        f"{client_certificate} (issued by {issuer}) in the TLS handshake "
        f"({reason}): it trusts another CA, so this node holds another "
        "federation's certificates or the coordinator another federation's CA"
    )


def _check_presented(
    address: str, host: str, ca: x509.Certificate, ca_path: Path, presented: bytes
) -> str | None:
    """The sentence for a coordinator certificate this node's CA did not issue, or None."""
    try:
        certificate = x509.load_der_x509_certificate(presented)
    except ValueError:
        return f"the coordinator at {address} presented a certificate that cannot be read"
    subject, issuer = _names(presented, der=True)
    try:
        certificate.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        ca_subject, _ = _names(ca.public_bytes(serialization.Encoding.DER), der=True)
        return (
            f"the coordinator at {address} presented a certificate ({subject}, issued by "
            f"{issuer}) that this node's CA certificate {ca_path} ({ca_subject}) did not "
            "issue: this node holds another federation's CA, or the coordinator another "
            "federation's certificate; use the files of the federation this coordinator serves"
        )
    if not _names_host(certificate, host):
        return (
            f"the coordinator's certificate ({subject}) does not name {host}, the address this "
            f"node dials ({address}): pass --coordinator with the address the certificate was "
            "made for, or reissue the coordinator's certificate"
        )
    return None
