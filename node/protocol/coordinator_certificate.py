"""The certificate the coordinator presents, checked by the node against ``revoked``.

gRPC's Python client verifies the coordinator's chain to the federation CA
and the host name, but gives the node no peer certificate, so it cannot see
which certificate that was: a coordinator certificate listed in ``revoked``
would be accepted. Before its first call the node therefore makes one TLS
handshake of its own to the same address, with its own client certificate
and the same CA, offering ALPN ``h2`` as gRPC does, reads the certificate
the server presents and checks it (``proto.tls.check_coordinator_certificate``:
issued by the CA itself, no CA, for serverAuth, not revoked). A refusal is
one sentence naming the fingerprint, and the node stops before it has sent
anything of the session.

What this does not stop: an attacker on the network path holding a revoked
coordinator key who passes this one handshake through to the real
coordinator and intercepts only the gRPC connection after it (the two
connections look alike, but are not bound to each other).
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Iterable
from pathlib import Path

from proto.tls import check_coordinator_certificate

__all__ = ["coordinator_certificate", "verify_coordinator"]


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def coordinator_certificate(
    address: str,
    *,
    ca_certificate: Path,
    client_certificate: Path,
    client_key: Path,
    timeout: float,
) -> bytes:
    """The DER certificate the server at ``address`` presents to this node.

    Raises OSError (ssl.SSLError included) when no handshake completes.
    """
    host, port = _host_port(address)
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca_certificate))
    context.load_cert_chain(str(client_certificate), str(client_key))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection((host, port), timeout=timeout) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    if not der:
        raise ssl.SSLError(f"the server at {address} presented no certificate")
    return der


def verify_coordinator(
    address: str,
    *,
    ca_pem: bytes,
    ca_certificate: Path,
    client_certificate: Path,
    client_key: Path,
    revoked: Iterable[str],
    timeout: float,
) -> str:
    """The fingerprint of the coordinator's certificate, once checked (see the module docstring).

    Raises OSError when the coordinator cannot be reached, CertificateError
    (RevokedCertificateError) for a certificate the node refuses.
    """
    der = coordinator_certificate(
        address,
        ca_certificate=ca_certificate,
        client_certificate=client_certificate,
        client_key=client_key,
        timeout=timeout,
    )
    return check_coordinator_certificate(ca_pem, der, revoked=revoked)
