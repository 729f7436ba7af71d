"""Everything a node prepares before it contacts anyone, and refuses to start without.

:func:`prepare` loads the federation config, checks that this installation
draws the federation's Gaussian streams (``node.preflight``), reads the node's
Ed25519 identity key and checks it is the one pinned for the node, checks the
TLS credentials (``proto.tls.check_node_credentials``: issued directly by the
federation CA to this node, matching their key, not revoked; the keys private
to their owner), finds the installed plan the config names and checks its
version and code digest (``node.plans.registry``), opens it on the local data,
runs the cohort's pre-flight (``node.preflight``: subjects read and used,
the share clipped per feature, refused past ``plan.clipping.max_clipped_fraction``
or below ``min_cohort_size``), and settles the output folder OUT and the state
folder STATE (``node.records.state_folder``). Every problem is a
:class:`~node.errors.SetupError` with one sentence (the command exits 2;
:class:`~node.errors.PreflightRefused` carries one sentence per problem),
found before a connection is opened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bounded.files import KIB, LocalFileError, read_limited, read_secret
from node.errors import PreflightRefused, SetupError
from node.plans.interface import ModelPlan
from node.plans.registry import plan_for
from node.preflight import check_stream
from noise.errors import NoiseError
from noise.fixed_point import FixedPointCodec
from noise.keys import IdentityKey
from proto.federation import ConfigError, FederationConfig, config_hash, load_federation
from proto.tls import CertificateError, check_node_credentials

__all__ = ["LocalSetup", "prepare"]

# Certificates and keys are a few kilobytes; anything larger is not one.
_CREDENTIAL_BYTES = 64 * KIB


@dataclass(frozen=True)
class LocalSetup:
    """What the node holds before the session: config, keys, TLS files, plan."""

    node_id: str
    config_path: Path
    config: FederationConfig
    config_hash: bytes
    codec: FixedPointCodec
    identity: IdentityKey
    tls: tuple[Path, Path, Path]  # CA certificate, client certificate, client key
    plan: ModelPlan
    out: Path
    state: Path  # the node's state folder (node.records.state_folder): its ledger and sessions


def _check_tls(tls: tuple[Path, Path, Path], node_id: str, revoked: tuple[str, ...]) -> None:
    """Refuse TLS files that cannot work, in one sentence, before any connection is tried.

    A certificate of another node, one not issued directly by the federation
    CA, one that does not match its key or one the federation revoked would
    otherwise fail in the handshake, retried until the node gives up.
    """
    ca_path, certificate_path, key_path = tls
    try:
        ca = read_limited(ca_path, _CREDENTIAL_BYTES, what="CA certificate")
        certificate = read_limited(certificate_path, _CREDENTIAL_BYTES, what="client certificate")
        key = read_secret(key_path, _CREDENTIAL_BYTES, what="client key")
    except LocalFileError as error:
        raise SetupError(str(error)) from None
    try:
        check_node_credentials(ca, certificate, key, node_id, revoked=revoked)
    except CertificateError as error:
        raise SetupError(f"{certificate_path}: {error}") from None


def _config_path(federation: Path) -> Path:
    return federation / "federation.toml" if federation.is_dir() else federation


def prepare(
    federation: Path,
    node_id: str,
    *,
    data: Path | None,
    out: Path | None,
    say: Callable[[str], None],
    state: Path | None = None,
    verbose: bool = False,
) -> LocalSetup:
    """Load and check everything local (raises :class:`SetupError` naming the fault).

    ``verbose`` reports the share clipped of every column, not only of those clipped.
    """
    config_path = _config_path(Path(federation))
    try:
        config = load_federation(config_path)
        config.node(node_id)  # KeyError naming the federation when unknown
        check_stream(config)
        definition = plan_for(config, warn=say)
    except (ConfigError, LocalFileError) as error:
        raise SetupError(str(error)) from None
    except KeyError as error:
        raise SetupError(str(error.args[0])) from None
    if config.stream_check is None:
        say(
            f"{config_path} pins no stream_check, so this node cannot confirm that it "
            "draws the same Gaussian streams as the other nodes (masks drawn differently do "
            "not cancel); `zerosum federation init` pins one"
        )
    base = config.base_dir or config_path.parent
    node_dir = base / "nodes" / node_id
    identity_path = node_dir / "identity.pem"
    try:
        # A key that others may read is refused (bounded.files.read_secret).
        identity = IdentityKey.from_pem(
            read_secret(identity_path, _CREDENTIAL_BYTES, what="identity key")
        )
    except LocalFileError as error:
        raise SetupError(str(error)) from None
    except NoiseError as error:
        raise SetupError(f"{identity_path}: {error}") from None
    if identity.public_bytes() != config.node(node_id).identity_public_key:
        raise SetupError(
            f"{identity_path} is not the identity key pinned for node {node_id!r} in {config_path}"
        )
    tls = (config.ca_certificate_path, node_dir / "client.pem", node_dir / "client.key")
    _check_tls(tls, node_id, config.revoked)
    data_path = Path(data) if data is not None else node_dir / "data.csv"
    try:
        plan = definition.open(config, data_path)
    except ConfigError as error:
        raise SetupError(str(error)) from None
    say(f"{plan.n_subjects} subjects from {data_path} (plan {definition.name!r})")
    report = plan.preflight()
    for line in report.lines(every_column=verbose):
        say(line)
    if not report.passed:
        raise PreflightRefused(report.problems())
    out_path = Path(out) if out is not None else node_dir / "out"
    state_path = Path(state) if state is not None else node_dir / "state"
    if out_path.resolve() == state_path.resolve():
        raise SetupError(
            f"the state folder and the output folder are both {out_path}; the state folder "
            "(--state) holds the node's ledger across sessions and must be a folder of its own"
        )
    return LocalSetup(
        node_id=node_id,
        config_path=config_path,
        config=config,
        config_hash=config_hash(config),
        codec=FixedPointCodec(config.fixed_point_bits),
        identity=identity,
        tls=tls,
        plan=plan,
        out=out_path,
        state=state_path,
    )
