"""A node's own files, spoilt: `zerosum node` exits 2 with one sentence before any contact.

Each case takes a fresh copy of a federation made by ``zerosum federation init``
and spoils one file: the cohort or a key replaced by a symlink to /dev/zero or
by a FIFO, a secret key made readable by others, the client certificate
swapped for one issued by an intermediate CA, or revoked in federation.toml.
The coordinator address is a port nothing listens on, so a node that got as
far as connecting would retry for two minutes instead of stopping at once.
Saved models and ``zerosum predict`` get the same treatment.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import zerosum.cli
from node.deltab.exceptions import ModelFileError
from node.deltab.persist import load_model
from node.deltab.synthetic import make_cohort, write_cohort_csv
from tests.support import spoilt_files as spoilt
from zerosum import pki
from zerosum.commands import node as node_command


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spoilt.two_node_federation(tmp_path_factory.mktemp("fed"))


def _run(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    node_command.add_arguments(parser)
    args = parser.parse_args(["--federation", str(folder), "--node-id", "a"])
    started = time.monotonic()
    code = node_command.run(args)
    assert time.monotonic() - started < 10.0
    return code, capsys.readouterr().err.strip()


def _under_intermediate(folder: Path) -> None:
    """Give node a a certificate issued by an intermediate CA the federation CA signed."""
    ca = pki.load_issued(
        (folder / "ca" / "ca.pem").read_bytes(), (folder / "ca" / "ca.key").read_bytes()
    )
    key = ec.generate_private_key(ec.SECP256R1())
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    intermediate = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "intermediate")]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(ca.private_key, hashes.SHA256())
    )
    leaf = pki.issue_client_certificate(pki.IssuedCertificate(intermediate, key), "a")
    node = folder / "nodes" / "a"
    (node / "client.pem").write_bytes(
        leaf.certificate_pem() + intermediate.public_bytes(serialization.Encoding.PEM)
    )
    (node / "client.key").write_bytes(leaf.private_key_pem())


def _revoke_a(folder: Path) -> None:
    spoilt.revoke(folder, folder / "nodes" / "a" / "client.pem")


def _swap_certificate(folder: Path) -> None:
    for name in ("client.pem", "client.key"):
        shutil.copy(folder / "nodes" / "b" / name, folder / "nodes" / "a" / name)


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "cohort-dev-zero": (
        lambda f: spoilt.to_dev_zero(f / "nodes/a/data.csv"),
        "data.csv is a character device; only a regular file is read",
    ),
    "cohort-fifo": (
        lambda f: spoilt.to_fifo(f / "nodes/a/data.csv"),
        "data.csv is a FIFO (named pipe); only a regular file is read",
    ),
    "config-dev-zero": (
        lambda f: spoilt.to_dev_zero(f / "federation.toml"),
        "federation.toml is a character device",
    ),
    "identity-dev-zero": (
        lambda f: spoilt.to_dev_zero(f / "nodes/a/identity.pem"),
        "identity.pem is a character device",
    ),
    "identity-fifo": (
        lambda f: spoilt.to_fifo(f / "nodes/a/identity.pem"),
        "identity.pem is a FIFO",
    ),
    "identity-0644": (
        lambda f: (f / "nodes/a/identity.pem").chmod(0o644),
        "identity.pem is a secret key but has mode 0644, so other users may read it; make it "
        "private with `chmod 600 ",
    ),
    "client-key-0666": (
        lambda f: (f / "nodes/a/client.key").chmod(0o666),
        "client.key is a secret key but has mode 0666",
    ),
    "client-pem-garbage": (
        lambda f: (f / "nodes/a/client.pem").write_bytes(b"garbage\n"),
        "the client certificate is not a PEM certificate.",
    ),
    "another-nodes-certificate": (_swap_certificate, "belongs to node 'b', not to node 'a'"),
    "under-an-intermediate": (_under_intermediate, "holds 2 certificates"),
    "revoked": (_revoke_a, "is revoked by this federation"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_spoilt_file_stops_the_node_in_one_sentence(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    spoilt.refused_in_one_sentence(fed, tmp_path, CASES[case], lambda f: _run(f, capsys))


def test_the_untouched_federation_gets_as_far_as_the_coordinator(fed: Path) -> None:
    # The reference point of the cases above: every local check passes.
    from node.session.setup import prepare

    setup = prepare(fed, "a", data=None, out=None, say=lambda _: None)
    assert setup.plan.n_subjects == 120


# ---------------------------------------------------------------- saved models


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("model")
    data = write_cohort_csv(make_cohort(150, 6, seed=8), folder / "train.csv")
    path = folder / "model.json"
    assert zerosum.cli.main(["deltab", "--train-features", str(data), "--feature-num", "4",
                             "--save", str(path)]) == 0  # fmt: skip
    return path


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (spoilt.to_dev_zero, "is a character device; only a regular file is read"),
        (spoilt.to_fifo, "is a FIFO (named pipe)"),
        (
            lambda p: p.write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}"),
            "the model file nests arrays or tables more than 64 levels deep",
        ),
    ],
    ids=["dev-zero", "fifo", "deep"],
)
def test_a_spoilt_model_file_is_one_sentence(
    model: Path, tmp_path: Path, spoil: Callable[[Path], None], message: str
) -> None:
    path = tmp_path / "model.json"
    shutil.copy(model, path)
    spoil(path)
    with pytest.raises(ModelFileError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_model(path)


def test_predict_writes_formula_ids_inert(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cohort = make_cohort(20, 6, seed=3)
    data = write_cohort_csv(cohort, tmp_path / "new.csv")
    rows = data.read_text().splitlines()
    header = rows[0].split(",")
    assert header[0] == "id"
    evil = ['=HYPERLINK("http://evil.example","x")', "@SUM(A1)", "-2+3", "+1"]
    for i, subject in enumerate(evil, 1):
        cells = rows[i].split(",")
        cells[0] = '"' + subject.replace('"', '""') + '"'
        rows[i] = ",".join(cells)
    data.write_text("\n".join(rows) + "\n")
    out = tmp_path / "out.csv"
    code = zerosum.cli.main(
        ["predict", "--model", str(model), "--data", str(data), "--output", str(out)]
    )
    assert code == 0, capsys.readouterr().err
    written = [line.split(",", 1)[0] for line in out.read_text().splitlines()[1:5]]
    assert written == ['"\'=HYPERLINK(""http://evil.example""', "'@SUM(A1)", "'-2+3", "+1"]
    ages = [float(line.rsplit(",", 3)[1]) for line in out.read_text().splitlines()[1:]]
    assert np.allclose(ages, cohort.age)


# ---------------------------------------------------------------- the node's records


def test_an_approval_from_outside_is_read_bounded(tmp_path: Path) -> None:
    from node.egress.approval import read_approval
    from node.errors import ApprovalError

    approval = tmp_path / "approval.json"
    os.mkfifo(approval, 0o600)
    with pytest.raises(ApprovalError, match="is a FIFO"):
        read_approval(tmp_path)
    approval.unlink()
    approval.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ApprovalError, match="nests arrays or tables more than 64 levels deep"):
        read_approval(tmp_path)


def test_the_ledger_and_private_records_refuse_what_the_node_never_wrote(tmp_path: Path) -> None:
    from node.records.atomic import read_private_bytes
    from node.records.ledger import LedgerError, PrivacyLedger

    ledger = tmp_path / "ledger.json"
    ledger.write_text('{"format": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(LedgerError, match="more than 64 levels deep"):
        PrivacyLedger.open(ledger, "a", 1e-6)
    ledger.unlink()
    os.mkfifo(ledger, 0o600)
    with pytest.raises(LedgerError, match="is a FIFO"):
        PrivacyLedger.open(ledger, "a", 1e-6)
    secret = tmp_path / "session.key"
    os.mkfifo(secret, 0o600)
    with pytest.raises(OSError, match="is not a regular file"):
        read_private_bytes(secret)
