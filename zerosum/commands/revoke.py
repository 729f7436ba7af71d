"""`zerosum federation revoke`: list a certificate in ``revoked``, and optionally issue a new one.

The certificate is named by a node id (its ``nodes/<id>/client.pem``), by a
PEM file or by its SHA-256 fingerprint. The ``revoked = [...]`` line of
``federation.toml`` is replaced (or added before the first table) and the
file re-read: the edited config must equal the old one in every other setting
and list the fingerprint, or nothing is written. ``--reissue`` then issues the
node a new client certificate and key from ``ca/ca.key``. The coordinator
reads the list when it starts; the revocation takes effect when it restarts.
The list takes no part in the config hash (docs/design.md §5.1), so sessions
resume and the other TREs' copies stay valid.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Final

from cryptography import x509

from bounded.files import KIB, read_limited, read_limited_text, read_secret
from proto.errors import ProtoError
from proto.federation import (
    MAX_CONFIG_BYTES,
    ConfigError,
    FederationConfig,
    load_federation,
    normalise_fingerprint,
    parse_federation,
)
from proto.federation.writing import toml_value
from proto.tls import CertificateError, certificate_fingerprint
from zerosum import pki
from zerosum.errors import CommandError, UsageError

__all__ = ["add_revoke_arguments", "revoke_certificate", "run_revoke"]

_PREFIX: Final = "zerosum federation revoke"
_CREDENTIAL_BYTES: Final = 64 * KIB
# A top-level `revoked = [ ... ]`, on one line or wrapped over several.
_REVOKED_RE: Final = re.compile(r"^revoked\s*=\s*\[[^\]]*\][^\n]*\n?", re.MULTILINE)
_FIRST_TABLE_RE: Final = re.compile(r"^\s*\[", re.MULTILINE)

DESCRIPTION = """\
Revoke a TLS certificate of the federation: its SHA-256 fingerprint is added
to `revoked` in federation.toml, and the coordinator refuses it on every call
(PERMISSION_DENIED) once restarted. Name the certificate by --node-id (the
node's nodes/<id>/client.pem), --certificate or --fingerprint. With --reissue
(and --node-id) the node gets a new client.pem and client.key, issued by
ca/ca.key; hand them to that TRE.
"""

EPILOG = """\
examples:
  zerosum federation revoke --federation fed --node-id site-b --reissue
  zerosum federation revoke --federation fed/federation.toml --fingerprint 3F:A2:...

exit status: 0 when written, 2 with one sentence when nothing was changed.
"""


def add_revoke_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--federation",
        required=True,
        type=Path,
        metavar="F",
        help="the federation.toml file, or the folder holding it",
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--node-id", help="revoke this node's nodes/<id>/client.pem")
    which.add_argument("--certificate", type=Path, metavar="PEM", help="revoke this certificate")
    which.add_argument("--fingerprint", metavar="SHA256", help="revoke by SHA-256 fingerprint")
    parser.add_argument(
        "--reissue",
        action="store_true",
        help="with --node-id: issue the node a new client certificate and key from ca/ca.key",
    )


def _fingerprint_of(path: Path) -> str:
    pem = read_limited(path, _CREDENTIAL_BYTES, what="certificate")
    try:
        return certificate_fingerprint(x509.load_pem_x509_certificate(pem))
    except ValueError:  # what cryptography raises for a file that is not a certificate
        raise CertificateError(f"{path} is not a PEM certificate") from None


def _edited(text: str, revoked: tuple[str, ...]) -> str:
    line = f"revoked = {toml_value(list(revoked))}\n"
    if _REVOKED_RE.search(text):
        return _REVOKED_RE.sub(lambda _: line, text, count=1)
    table = _FIRST_TABLE_RE.search(text)
    at = table.start() if table else len(text)
    comment = (
        "# SHA-256 fingerprints of revoked TLS certificates: the coordinator refuses\n"
        "# them (not part of the config hash; restart the coordinator to apply)\n"
    )
    return text[:at] + comment + line + "\n" + text[at:]


def _write_in_place(path: Path, text: str) -> None:
    mode = path.stat().st_mode & 0o777
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def revoke_certificate(config_path: Path, fingerprint: str) -> tuple[FederationConfig, bool]:
    """Add ``fingerprint`` to ``revoked`` in ``config_path``; (new config, whether it changed).

    Raises ConfigError or LocalFileError (nothing written) when the file cannot
    be read, or when the edit would change anything but the revocation list.
    """
    fingerprint = normalise_fingerprint("--fingerprint", fingerprint)
    before = load_federation(config_path)
    if fingerprint in before.revoked:
        return before, False
    text = read_limited_text(config_path, MAX_CONFIG_BYTES, what="federation config")
    wanted = tuple(sorted({*before.revoked, fingerprint}))
    edited = _edited(text, wanted)
    after = parse_federation(edited, base_dir=before.base_dir, source=str(config_path))
    if after.revoked != wanted or dataclasses.replace(after, revoked=before.revoked) != before:
        raise ConfigError(
            "revoked",
            list(before.revoked),
            f"cannot be edited safely in {config_path} (write the line "
            f"revoked = {toml_value(list(wanted))} at the top of the file by hand)",
        )
    _write_in_place(config_path, edited)
    return after, True


def _reissue(config: FederationConfig, node_id: str) -> tuple[Path, str]:
    base = config.base_dir or Path(".")
    ca_folder = config.ca_certificate_path.parent
    ca = pki.load_issued(
        read_limited(config.ca_certificate_path, _CREDENTIAL_BYTES, what="CA certificate"),
        read_secret(ca_folder / "ca.key", _CREDENTIAL_BYTES, what="CA key"),
    )
    issued = pki.issue_client_certificate(ca, node_id)
    folder = base / "nodes" / node_id
    pki.write_public_file(folder / "client.pem", issued.certificate_pem(), overwrite=True)
    pki.write_private_file(folder / "client.key", issued.private_key_pem(), overwrite=True)
    return folder, certificate_fingerprint(issued.certificate)


def run_revoke(args: argparse.Namespace) -> int:
    federation: Path = args.federation
    config_path = federation / "federation.toml" if federation.is_dir() else federation
    try:
        config = load_federation(config_path)
        base = config.base_dir or config_path.parent
        if args.reissue and args.node_id is None:
            raise UsageError("--reissue goes with --node-id")
        if args.node_id is not None:
            config.node(args.node_id)  # KeyError naming the federation
            fingerprint = _fingerprint_of(base / "nodes" / args.node_id / "client.pem")
        elif args.certificate is not None:
            fingerprint = _fingerprint_of(args.certificate)
        else:
            fingerprint = normalise_fingerprint("--fingerprint", args.fingerprint)
        config, changed = revoke_certificate(config_path, fingerprint)
        done = "revoked" if changed else "was already revoked:"
        print(f"{_PREFIX}: {done} certificate SHA-256 {fingerprint} in {config_path}")
        if args.reissue:
            folder, issued = _reissue(config, args.node_id)
            print(
                f"{_PREFIX}: issued node {args.node_id!r} a new client certificate "
                f"(SHA-256 {issued}) in {folder}/client.pem and client.key; hand both to that TRE"
            )
    except KeyError as error:
        print(f"{_PREFIX}: {error.args[0]}", file=sys.stderr)
        return 2
    except (ProtoError, CommandError, OSError) as error:  # config or certificate; usage; file
        print(f"{_PREFIX}: {error}", file=sys.stderr)
        return 2
    print(f"{_PREFIX}: restart the coordinator to apply the revocation list")
    return 0
