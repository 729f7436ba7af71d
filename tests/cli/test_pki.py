"""The federation CA: certificate profiles, node identities and secret files."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509 import DNSName, IPAddress
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store

from proto import tls
from proto.federation import ConfigError
from zerosum import pki


@pytest.fixture(scope="module")
def ca() -> pki.IssuedCertificate:
    return pki.create_ca("trial")


def _ext(certificate: x509.Certificate, kind: type[x509.ExtensionType]) -> Any:
    return certificate.extensions.get_extension_for_class(kind)


def test_ca_profile(ca: pki.IssuedCertificate) -> None:
    cert = ca.certificate
    assert cert.subject == cert.issuer
    assert isinstance(ca.private_key.curve, ec.SECP256R1)
    constraints = _ext(cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca and constraints.value.path_length == 0
    usage = _ext(cert, x509.KeyUsage).value
    assert usage.key_cert_sign and usage.crl_sign and not usage.digital_signature
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA256)
    public = cert.public_key()
    assert isinstance(public, ec.EllipticCurvePublicKey)
    public.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    span = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert span == dt.timedelta(days=pki.CA_VALID_DAYS)
    assert cert.not_valid_before_utc < dt.datetime.now(dt.UTC)


def test_server_certificate_names_and_usage(ca: pki.IssuedCertificate) -> None:
    server = pki.issue_server_certificate(ca, ["coord.example.org", "10.0.0.5", "localhost"])
    cert = server.certificate
    names = _ext(cert, x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost", "coord.example.org"]
    assert names.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("::1"),
        ipaddress.ip_address("10.0.0.5"),
    ]
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert not _ext(cert, x509.BasicConstraints).value.ca
    verifier = PolicyBuilder().store(Store([ca.certificate]))
    for subject in (DNSName("coord.example.org"), IPAddress(ipaddress.ip_address("10.0.0.5"))):
        verifier.build_server_verifier(subject).verify(cert, [])
    with pytest.raises(x509.verification.VerificationError):
        verifier.build_server_verifier(DNSName("elsewhere.example.org")).verify(cert, [])
    with pytest.raises(tls.CertificateError, match="carries no zerosum:node/<id> names"):
        tls.node_id_from_certificate(cert)


def test_client_certificate_identifies_its_node(ca: pki.IssuedCertificate) -> None:
    client = pki.issue_client_certificate(ca, "site-7")
    cert = client.certificate
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "site-7"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)[0].value == "trial"
    assert list(_ext(cert, x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    PolicyBuilder().store(Store([ca.certificate])).build_client_verifier().verify(cert, [])
    assert tls.node_id_from_certificate(cert) == "site-7"
    assert tls.node_id_from_certificate(client.certificate_pem()) == "site-7"
    context = {"x509_pem_cert": [client.certificate_pem()], "transport_security_type": [b"ssl"]}
    assert tls.node_id_from_auth_context(context) == "site-7"


def test_auth_context_names_each_certificate_its_own_node_every_call(
    ca: pki.IssuedCertificate,
) -> None:
    # The node id of a certificate is remembered; a refusal is not.
    contexts = {
        node: {"x509_pem_cert": [pki.issue_client_certificate(ca, node).certificate_pem()]}
        for node in ("site-1", "site-2")
    }
    for _ in range(3):
        for node, context in contexts.items():
            assert tls.node_id_from_auth_context(context) == node
    server = {"x509_pem_cert": [pki.issue_server_certificate(ca, ["localhost"]).certificate_pem()]}
    for _ in range(2):
        with pytest.raises(tls.CertificateError, match="carries no zerosum:node/<id> names"):
            tls.node_id_from_auth_context(server)


def test_auth_context_without_certificate_is_refused() -> None:
    with pytest.raises(tls.CertificateError, match="no client certificate"):
        tls.node_id_from_auth_context({"transport_security_type": [b"ssl"]})


def _forged(
    ca: pki.IssuedCertificate, common_name: str, uris: list[str], *, san: bool = True
) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
    )
    if san:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(u) for u in uris]),
            critical=False,
        )
    return builder.sign(ca.private_key, hashes.SHA256())


@pytest.mark.parametrize(
    ("common_name", "uris", "san", "message"),
    [
        ("a", ["zerosum:node/a", "zerosum:node/b"], True, "carries 2 zerosum:node/<id> names"),
        ("b", ["zerosum:node/a"], True, "names node 'a' in its SAN but not in its CN"),
        ("a", [], False, "carries no"),
        ("a", ["https://example.org/a"], True, "carries no"),
        ("..", ["zerosum:node/.."], True, "node_id = '..'"),
    ],
)
def test_node_id_refuses_ambiguous_certificates(
    ca: pki.IssuedCertificate, common_name: str, uris: list[str], san: bool, message: str
) -> None:
    with pytest.raises(tls.CertificateError, match=message):
        tls.node_id_from_certificate(_forged(ca, common_name, uris, san=san))


def test_ids_are_validated(ca: pki.IssuedCertificate) -> None:
    with pytest.raises(ConfigError, match="node_id = 'a/b'"):
        pki.issue_client_certificate(ca, "a/b")
    with pytest.raises(ConfigError, match="federation_id = ''"):
        pki.create_ca("")


def test_load_issued_round_trip_and_mismatch(ca: pki.IssuedCertificate) -> None:
    again = pki.load_issued(ca.certificate_pem(), ca.private_key_pem())
    assert again.certificate == ca.certificate
    other = pki.create_ca("other")
    with pytest.raises(tls.CertificateError, match="does not belong"):
        pki.load_issued(ca.certificate_pem(), other.private_key_pem())
    from noise.keys import IdentityKey

    with pytest.raises(tls.CertificateError, match="expected an ECDSA private key"):
        pki.load_issued(ca.certificate_pem(), IdentityKey.generate().to_pem())
    # A leaf issued by a reloaded CA still chains to the original.
    leaf = pki.issue_client_certificate(again, "n1").certificate
    PolicyBuilder().store(Store([ca.certificate])).build_client_verifier().verify(leaf, [])


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_private_files_are_0600_from_creation(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = pki.write_private_file(tmp_path / "k.pem", b"secret")
    finally:
        os.umask(old)
    assert _mode(path) == 0o600
    assert path.read_bytes() == b"secret"
    with pytest.raises(FileExistsError):
        pki.write_private_file(path, b"again")
    path.chmod(0o644)
    pki.write_private_file(path, b"again", overwrite=True)
    assert _mode(path) == 0o600
    assert path.read_bytes() == b"again"


def test_private_file_never_follows_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    link = tmp_path / "link"
    link.symlink_to(victim)
    with pytest.raises(FileExistsError):
        pki.write_private_file(link, b"secret")
    pki.write_private_file(link, b"secret", overwrite=True)
    assert victim.read_bytes() == b"keep"
    assert not link.is_symlink() and link.read_bytes() == b"secret"


def test_public_files(tmp_path: Path) -> None:
    path = pki.write_public_file(tmp_path / "c.pem", b"cert")
    with pytest.raises(FileExistsError):
        pki.write_public_file(path, b"other")
    pki.write_public_file(path, b"other", overwrite=True)
    assert path.read_bytes() == b"other"
