"""TLS depth (only the federation CA issues certificates) and revocation, with real gRPC.

Certificates are made in the test: the federation CA of ``zerosum.pki`` (CA:TRUE,
pathlen 0), and, to attack it, an intermediate CA:TRUE certificate that the
federation CA signed and that signs a node's certificate in turn. gRPC's TLS
layer completes the handshake with such a chain; the coordinator must refuse
it after the handshake (UNAUTHENTICATED), refuse a revoked certificate
(PERMISSION_DENIED), and change nothing in its state for either. Each party's
own credentials are checked the same way before it starts.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from coordinator.server import RunningServer, ServerTLS, start_server
from coordinator.session import Session
from coordinator.store import Store
from proto.convert import key_bundle_to_pb
from proto.federation import ConfigError, config_hash, normalise_fingerprint
from proto.tls import (
    NODE_URI_PREFIX,
    CertificateError,
    PeerVerifier,
    RevokedCertificateError,
    certificate_fingerprint,
    check_node_credentials,
    check_server_credentials,
)
from proto.zerosum.v1 import session_pb2 as pb
from proto.zerosum.v1 import session_pb2_grpc as pb_grpc
from tests.coordinator.support import Federation, make_federation
from tests.support.sample_config import make_config
from zerosum import pki

pytestmark = pytest.mark.integration


def _certificate(
    issuer: pki.IssuedCertificate,
    common_name: str,
    *,
    ca: bool,
    usage: x509.ObjectIdentifier | None = None,
    node_id: str | None = None,
) -> pki.IssuedCertificate:
    """A certificate signed by ``issuer``: an intermediate CA, or a leaf for ``node_id``."""
    key = ec.generate_private_key(ec.SECP256R1())
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(issuer.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if node_id is not None:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_id)]
            ),
            critical=False,
        )
    return pki.IssuedCertificate(builder.sign(issuer.private_key, hashes.SHA256()), key)


@dataclass
class Authority:
    ca: pki.IssuedCertificate
    intermediate: pki.IssuedCertificate
    server: pki.IssuedCertificate

    @property
    def ca_pem(self) -> bytes:
        return self.ca.certificate_pem()

    def under_intermediate(self, node_id: str) -> pki.IssuedCertificate:
        return _certificate(
            self.intermediate,
            node_id,
            ca=False,
            usage=ExtendedKeyUsageOID.CLIENT_AUTH,
            node_id=node_id,
        )


@pytest.fixture(scope="module")
def authority() -> Authority:
    ca = pki.create_ca("testfed")
    intermediate = _certificate(ca, "rogue intermediate", ca=True)
    return Authority(ca, intermediate, pki.issue_server_certificate(ca))


# ---------------------------------------------------------------- own credentials


def test_the_federation_ca_says_pathlen_0(authority: Authority) -> None:
    constraints = authority.ca.certificate.extensions.get_extension_for_class(
        x509.BasicConstraints
    ).value
    assert constraints.ca and constraints.path_length == 0


def test_good_credentials_pass(authority: Authority) -> None:
    node = pki.issue_client_certificate(authority.ca, "a")
    check_node_credentials(authority.ca_pem, node.certificate_pem(), node.private_key_pem(), "a")
    server = authority.server
    check_server_credentials(authority.ca_pem, server.certificate_pem(), server.private_key_pem())


def test_a_node_certificate_under_an_intermediate_is_refused(authority: Authority) -> None:
    leaf = authority.under_intermediate("a")
    with pytest.raises(CertificateError, match="not issued directly by this federation's CA"):
        check_node_credentials(
            authority.ca_pem, leaf.certificate_pem(), leaf.private_key_pem(), "a"
        )
    chain = leaf.certificate_pem() + authority.intermediate.certificate_pem()
    with pytest.raises(CertificateError, match=r"holds 2 certificates.*no intermediates"):
        check_node_credentials(authority.ca_pem, chain, leaf.private_key_pem(), "a")


def test_a_ca_certificate_is_no_node_certificate(authority: Authority) -> None:
    # Signed by the federation CA itself, but CA:TRUE: it could sign nodes of its own.
    rogue = _certificate(authority.ca, "a", ca=True, node_id="a")
    with pytest.raises(CertificateError, match="is itself a CA certificate"):
        check_node_credentials(
            authority.ca_pem, rogue.certificate_pem(), rogue.private_key_pem(), "a"
        )


def test_credentials_that_cannot_work_say_so_in_one_sentence(authority: Authority) -> None:
    a = pki.issue_client_certificate(authority.ca, "a")
    b = pki.issue_client_certificate(authority.ca, "b")
    ca = authority.ca_pem
    with pytest.raises(CertificateError, match="key does not belong to the client certificate"):
        check_node_credentials(ca, a.certificate_pem(), b.private_key_pem(), "a")
    with pytest.raises(CertificateError, match="belongs to node 'b', not to node 'a'"):
        check_node_credentials(ca, b.certificate_pem(), b.private_key_pem(), "a")
    with pytest.raises(CertificateError, match="not a PEM certificate"):
        check_node_credentials(ca, b"garbage", a.private_key_pem(), "a")
    other = pki.create_ca("testfed")
    with pytest.raises(CertificateError, match="not issued directly"):
        check_node_credentials(
            other.certificate_pem(), a.certificate_pem(), a.private_key_pem(), "a"
        )
    with pytest.raises(CertificateError, match="is not a CA"):
        check_node_credentials(a.certificate_pem(), a.certificate_pem(), a.private_key_pem(), "a")
    server = authority.server
    with pytest.raises(CertificateError, match="not for serverAuth"):
        check_server_credentials(ca, a.certificate_pem(), a.private_key_pem())
    with pytest.raises(CertificateError, match="key does not belong to the server certificate"):
        check_server_credentials(ca, server.certificate_pem(), a.private_key_pem())


def test_a_revoked_certificate_is_refused_at_startup(authority: Authority) -> None:
    a = pki.issue_client_certificate(authority.ca, "a")
    revoked = (certificate_fingerprint(a.certificate),)
    with pytest.raises(RevokedCertificateError, match=r"node 'a'.*is revoked"):
        check_node_credentials(
            authority.ca_pem, a.certificate_pem(), a.private_key_pem(), "a", revoked=revoked
        )
    server = authority.server
    with pytest.raises(RevokedCertificateError, match=r"the coordinator.*is revoked"):
        check_server_credentials(
            authority.ca_pem,
            server.certificate_pem(),
            server.private_key_pem(),
            revoked=(certificate_fingerprint(server.certificate),),
        )


def test_the_fingerprint_is_what_openssl_prints(authority: Authority) -> None:
    certificate = authority.server.certificate
    fingerprint = certificate_fingerprint(certificate)
    der = certificate.public_bytes(serialization.Encoding.DER)
    assert fingerprint == hashlib.sha256(der).hexdigest()
    colons = ":".join(fingerprint[i : i + 2] for i in range(0, 64, 2)).upper()
    assert normalise_fingerprint("revoked[0]", colons) == fingerprint


# ---------------------------------------------------------------- the revocation list


def test_the_revocation_list_is_read_and_kept_out_of_the_hash() -> None:
    fingerprint = "ab" * 32
    plain = make_config()
    listed = make_config(revoked=["AB:" * 31 + "AB", fingerprint.upper()])
    assert listed.revoked == (fingerprint,)
    assert config_hash(listed) == config_hash(plain)
    for bad in ("abc", 7, "zz" * 32):
        with pytest.raises(ConfigError, match=r"revoked\[0\].*SHA-256 fingerprint:"):
            make_config(revoked=[bad])
    with pytest.raises(ConfigError, match="revoked"):
        make_config(revoked="ab" * 32)


# ---------------------------------------------------------------- a real server


@dataclass
class Served:
    fed: Federation
    session: Session
    server: RunningServer
    channels: list[grpc.Channel]

    def join(self, node: str, credential: pki.IssuedCertificate, chain: bytes = b"") -> None:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem,
            private_key=credential.private_key_pem(),
            certificate_chain=credential.certificate_pem() + chain,
        )
        channel = grpc.secure_channel(f"127.0.0.1:{self.server.port}", credentials)
        self.channels.append(channel)
        bundle = self.fed.bundle(node, self.session.session_id)
        message = key_bundle_to_pb(bundle)
        pb_grpc.CoordinatorStub(channel).Join(pb.JoinRequest(bundle=message), timeout=20)

    ca_pem: bytes = b""


@pytest.fixture
def revoked_b(authority: Authority) -> pki.IssuedCertificate:
    return pki.issue_client_certificate(authority.ca, "b")


@pytest.fixture
def served(
    tmp_path: Path, authority: Authority, revoked_b: pki.IssuedCertificate
) -> Iterator[Served]:
    fed = make_federation(("a", "b", "c"))
    session = Session(Store(tmp_path / "state.sqlite"), fed.config)
    tls = ServerTLS(
        certificate=authority.server.certificate_pem(),
        private_key=authority.server.private_key_pem(),
        ca_certificate=authority.ca_pem,
        revoked=(certificate_fingerprint(revoked_b.certificate),),
    )
    server = start_server(session, tls, listen="127.0.0.1:0", tick_seconds=0.05)
    served = Served(fed, session, server, [], ca_pem=authority.ca_pem)
    yield served
    for channel in served.channels:
        channel.close()
    server.stop(0)
    session.store.close()


def test_the_server_refuses_a_leaf_under_an_intermediate(
    served: Served, authority: Authority
) -> None:
    leaf = authority.under_intermediate("a")
    with pytest.raises(grpc.RpcError) as caught:
        served.join("a", leaf, chain=authority.intermediate.certificate_pem())
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "not issued directly by this federation's CA" in (caught.value.details() or "")
    assert served.session.store.members() == []
    # A certificate the CA issued directly joins as usual.
    served.join("a", pki.issue_client_certificate(authority.ca, "a"))
    assert [m.node_id for m in served.session.store.members()] == ["a"]


def test_the_server_refuses_a_revoked_certificate_and_takes_a_reissued_one(
    served: Served, authority: Authority, revoked_b: pki.IssuedCertificate
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        served.join("b", revoked_b)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    details = caught.value.details() or ""
    assert "node 'b'" in details and "is revoked" in details
    assert certificate_fingerprint(revoked_b.certificate) in details
    assert served.session.store.members() == []
    served.join("b", pki.issue_client_certificate(authority.ca, "b"))
    assert [m.node_id for m in served.session.store.members()] == ["b"]


def test_the_verifier_remembers_only_good_certificates(
    authority: Authority, revoked_b: pki.IssuedCertificate
) -> None:
    verifier = PeerVerifier(
        authority.ca_pem, revoked=(certificate_fingerprint(revoked_b.certificate),)
    )
    good = pki.issue_client_certificate(authority.ca, "a")
    context = {"x509_pem_cert": [good.certificate_pem()]}
    assert verifier.node_id(context) == "a"
    assert verifier.node_id(context) == "a"
    for _ in range(2):
        with pytest.raises(RevokedCertificateError):
            verifier.node_id({"x509_pem_cert": [revoked_b.certificate_pem()]})
    with pytest.raises(CertificateError, match="no client certificate"):
        verifier.node_id({})
