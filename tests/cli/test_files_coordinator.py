"""`zerosum coordinator` refuses spoilt files and values in one sentence, before it listens.

The coordinator's TLS files are read bounded (a FIFO or /dev/zero in their
place is refused at once), its key must be private, its certificate must
match the key and be issued directly by the federation CA and not revoked;
``--linger`` is range-checked like the config's deadlines. Every case exits 2
with one line on stderr and opens no port.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography import x509

import zerosum.cli
from proto.tls import certificate_fingerprint
from tests.support import spoilt_files as spoilt
from zerosum import pki


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return spoilt.two_node_federation(tmp_path_factory.mktemp("fed"))


def _client_as_server(folder: Path) -> None:
    for suffix in ("pem", "key"):
        shutil.copy(folder / f"nodes/a/client.{suffix}", folder / f"coordinator/server.{suffix}")


def _foreign_ca(folder: Path) -> None:
    other = pki.create_ca("elsewhere")
    server = pki.issue_server_certificate(other)
    (folder / "coordinator/server.pem").write_bytes(server.certificate_pem())
    (folder / "coordinator/server.key").write_bytes(server.private_key_pem())


def _revoke_server(folder: Path) -> None:
    spoilt.revoke(folder, folder / "coordinator/server.pem")


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "key-0644": (
        lambda f: (f / "coordinator/server.key").chmod(0o644),
        "server.key is a secret key but has mode 0644, so other users may read it; make it "
        "private with `chmod 600",
    ),
    "key-fifo": (lambda f: spoilt.to_fifo(f / "coordinator/server.key"), "server.key is a FIFO"),
    "certificate-dev-zero": (
        lambda f: spoilt.to_dev_zero(f / "coordinator/server.pem"),
        "server.pem is a character device",
    ),
    "ca-fifo": (lambda f: spoilt.to_fifo(f / "ca/ca.pem"), "ca.pem is a FIFO"),
    "garbage-certificate": (
        lambda f: (f / "coordinator/server.pem").write_bytes(b"garbage"),
        "the server certificate is not a PEM certificate.",
    ),
    "mismatched-key": (
        lambda f: shutil.copy(f / "nodes/a/client.key", f / "coordinator/server.key"),
        "the server key does not belong to the server certificate.",
    ),
    "client-certificate": (_client_as_server, "the server certificate is not for serverAuth"),
    "foreign-ca": (_foreign_ca, "was not issued directly by this federation's CA"),
    "revoked": (_revoke_server, "the certificate of the coordinator"),
}


def _run(folder: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    started = time.monotonic()
    code = zerosum.cli.main(
        ["coordinator", "--federation", str(folder / "federation.toml"),
         "--listen", "127.0.0.1:0", *extra]
    )  # fmt: skip
    assert time.monotonic() - started < 10.0
    return code, capsys.readouterr().err.strip()


@pytest.mark.parametrize("case", list(CASES))
def test_spoilt_tls_files_stop_the_coordinator(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    folder = spoilt.refused_in_one_sentence(fed, tmp_path, CASES[case], lambda f: _run(f, capsys))
    assert not (folder / "coordinator" / "state.sqlite").exists()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e308"])
def test_linger_is_range_checked(fed: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, err = _run(fed, capsys, "--linger", value)
    assert code == 2
    assert "--linger" in err and "must be between 0 and 2.592e+06 seconds (30 days)" in err


# ---------------------------------------------------------------- zerosum federation revoke


def test_revoke_and_reissue_a_node_certificate(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from proto.federation import config_hash, load_federation
    from proto.tls import RevokedCertificateError, check_node_credentials

    folder = tmp_path / "fed"
    shutil.copytree(fed, folder, symlinks=True)
    before = load_federation(folder / "federation.toml")
    old_pem = (folder / "nodes/b/client.pem").read_bytes()
    old = certificate_fingerprint(x509.load_pem_x509_certificate(old_pem))
    argv = ["federation", "revoke", "--federation", str(folder), "--node-id", "b", "--reissue"]
    assert zerosum.cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"revoked certificate SHA-256 {old}" in out and "restart the coordinator" in out
    after = load_federation(folder / "federation.toml")
    assert after.revoked == (old,)
    assert config_hash(after) == config_hash(before)
    ca = (folder / "ca/ca.pem").read_bytes()
    with pytest.raises(RevokedCertificateError):
        old_key = (fed / "nodes/b/client.key").read_bytes()
        check_node_credentials(ca, old_pem, old_key, "b", revoked=after.revoked)
    new_pem = (folder / "nodes/b/client.pem").read_bytes()
    new_key = folder / "nodes/b/client.key"
    assert new_key.stat().st_mode & 0o777 == 0o600
    check_node_credentials(ca, new_pem, new_key.read_bytes(), "b", revoked=after.revoked)
    # Again, by fingerprint in the colon form: already listed, nothing changes.
    colons = ":".join(old[i : i + 2] for i in range(0, 64, 2)).upper()
    text = (folder / "federation.toml").read_text()
    argv = ["federation", "revoke", "--federation", str(folder), "--fingerprint", colons]
    assert zerosum.cli.main(argv) == 0
    assert "was already revoked" in capsys.readouterr().out
    assert (folder / "federation.toml").read_text() == text
    # A second certificate joins the list on the same line.
    other = certificate_fingerprint(
        x509.load_pem_x509_certificate((folder / "nodes/a/client.pem").read_bytes())
    )
    argv = ["federation", "revoke", "--federation", str(folder), "--certificate",
            str(folder / "nodes/a/client.pem")]  # fmt: skip
    assert zerosum.cli.main(argv) == 0
    assert load_federation(folder / "federation.toml").revoked == tuple(sorted((old, other)))
    assert (folder / "federation.toml").read_text().count("revoked = ") == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--node-id", "zed"], "node 'zed' is not part of federation"),
        (
            ["--fingerprint", "abc"],
            "--fingerprint = 'abc': must be a certificate's SHA-256 fingerprint",
        ),
        (["--fingerprint", "ab" * 32, "--reissue"], "--reissue goes with --node-id"),
        (["--certificate", "{fed}/federation.toml"], "federation.toml is not a PEM certificate"),
    ],
)
def test_revoke_refuses_in_one_sentence(
    fed: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    text = (fed / "federation.toml").read_text()
    extra = [part.format(fed=fed) for part in extra]
    assert zerosum.cli.main(["federation", "revoke", "--federation", str(fed), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0
    assert (fed / "federation.toml").read_text() == text


def test_reissue_with_an_unreadable_ca_key_refuses_in_one_sentence(
    fed: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "fed"
    shutil.copytree(fed, folder, symlinks=True)
    (folder / "ca" / "ca.key").write_bytes(b"garbage")
    (folder / "ca" / "ca.key").chmod(0o600)
    argv = ["federation", "revoke", "--federation", str(folder), "--node-id", "a", "--reissue"]
    assert zerosum.cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "the key is not an unencrypted PEM private key." in err and err.count("\n") == 0


def test_an_empty_state_file_left_by_a_failed_start_is_not_an_ended_session(
    tmp_path: Path,
) -> None:
    """A coordinator that stopped before its first commit (a full disk) leaves an empty file;
    the next start takes it as fresh instead of refusing it as a session that ended."""
    from zerosum.commands.coordinator import _ended_session

    state = tmp_path / "state.sqlite"
    state.write_bytes(b"")
    assert _ended_session(state) is None
    assert _ended_session(tmp_path / "missing.sqlite") is None
