"""A federation folder spoilt one file at a time, and the one-sentence refusal it must get."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

from cryptography import x509

from proto.tls import certificate_fingerprint
from tests.support.synthetic_init import init_synthetic


def two_node_federation(out: Path) -> Path:
    """Nodes a and b, their coordinator at a port nothing listens on (127.0.0.1:9)."""
    return init_synthetic(
        out,
        ("a", "b"),
        seed=1,
        n_features=5,
        n_components=2,
        cohort_sizes="120,130",
        options=["--force", "--coordinator", "127.0.0.1:9"],
    )


def to_dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def to_fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path, 0o600)


def revoke(folder: Path, certificate: Path) -> None:
    """List the fingerprint of the PEM certificate ``certificate`` as revoked in federation.toml."""
    fingerprint = certificate_fingerprint(x509.load_pem_x509_certificate(certificate.read_bytes()))
    config = folder / "federation.toml"
    text = config.read_text()
    config.write_text(text.replace("\n[privacy]", f'revoked = ["{fingerprint}"]\n\n[privacy]', 1))


def copy_of(fed: Path, tmp_path: Path, spoil: Callable[[Path], None]) -> Path:
    """A copy of the federation folder ``fed`` under ``tmp_path``, spoilt by ``spoil``."""
    folder = tmp_path / "fed"
    shutil.copytree(fed, folder, symlinks=True)
    spoil(folder)
    return folder


def refused_in_one_sentence(
    fed: Path,
    tmp_path: Path,
    case: tuple[Callable[[Path], None], str],
    run: Callable[[Path], tuple[int, str]],
) -> Path:
    """Spoil a copy of ``fed`` as ``case`` says; ``run`` on it (exit status, stderr) must end
    with status 2 and the case's message in one line of stderr, with no traceback."""
    spoil, message = case
    folder = copy_of(fed, tmp_path, spoil)
    code, err = run(folder)
    assert code == 2, err
    assert message in err
    assert err.count("\n") == 0 and "Traceback" not in err
    return folder
