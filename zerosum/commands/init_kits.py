"""One kit per party: what `zerosum federation init` hands to each machine.

``federation init`` makes every key in one place. What each party must then
receive is a question of who may hold which secret, so init also writes,
under ``kits/``, one folder per party holding exactly that party's files in
the layout its command reads (the federation folder's own layout):

    kits/coordinator/        federation.toml, ca/ca.pem, coordinator/server.pem, server.key
    kits/node-<id>/          federation.toml, ca/ca.pem, nodes/<id>/identity.pem,
                             client.pem, client.key (and data.csv with --synthetic)
    kits/checker-<id>/       federation.toml, ca/ca.pem, checkers/<id>/checker.pem, checker.pub

and a README.txt with that party's commands. No kit holds another party's
private key; ``ca/ca.key`` and ``holdout.csv`` are in none (they stay with
whoever ran init). A checker who pinned their own key with ``--checker-key``
gets a kit without a key: only the config, to review against.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import TypeVar

from proto.federation import FederationConfig, config_hash

__all__ = ["KITS_FOLDER", "kit_files", "kit_names"]

KITS_FOLDER = "kits"
CONFIG_NAME = "federation.toml"
_SHARED = (PurePosixPath(CONFIG_NAME), PurePosixPath("ca/ca.pem"))

T = TypeVar("T")


def kit_names(config: FederationConfig) -> list[str]:
    """The kits' folder names under ``kits/``: the coordinator, each TRE, each checker."""
    names = ["coordinator"]
    names += [f"node-{n}" for n in config.node_ids]
    names += [f"checker-{n}" for n in config.node_ids]
    return names


def _owner(relative: PurePosixPath) -> str | None:
    """The kit a federation-folder file belongs to; None for shared or issuer-only files."""
    parts = relative.parts
    if parts[0] == "coordinator":
        return "coordinator"
    if parts[0] == "nodes" and len(parts) > 2:
        return f"node-{parts[1]}"
    if parts[0] == "checkers" and len(parts) > 2:
        return f"checker-{parts[1]}"
    return None


def kit_files(out: Path, files: Mapping[Path, T], config: FederationConfig) -> dict[Path, T]:
    """Each federation-folder file copied into the kit of every party that needs it.

    ``files`` maps paths under ``out`` to what will be written there (content
    and secrecy, or a synthetic cohort); the result maps the kit paths to the
    same values, plus nothing else (the READMEs come from :func:`readme_texts`).
    """
    kits = out / KITS_FOLDER
    result: dict[Path, T] = {}
    names = kit_names(config)
    for path, value in files.items():
        if not path.is_relative_to(out):
            continue
        relative = PurePosixPath(path.relative_to(out).as_posix())
        if relative in _SHARED:
            for name in names:
                result[kits / name / relative] = value
            continue
        owner = _owner(relative)
        if owner is not None:
            result[kits / owner / relative] = value
    return result


def _row(path: str, what: str) -> str:
    return f"  {path:<31} {what}\n"


def readme_texts(
    config: FederationConfig, *, generated_checkers: frozenset[str], synthetic: bool
) -> dict[str, str]:
    """README.txt of every kit, by kit name: what the folder holds and the party's commands."""
    digest = config_hash(config).hex()[:16]
    head = (
        f"zerosum federation {config.federation_id!r} (config hash {digest}...), "
        f"coordinator at {config.coordinator_address}.\n"
        "Copy this folder to the party's machine as it is (e.g. tar czf and scp); keep "
        "files marked SECRET at mode 0600 (chmod 600 FILE).\n\n"
    )
    texts = {
        "coordinator": head + "Kit of the COORDINATOR (runs outside the TREs).\n"
        "  federation.toml                 the shared config (every party holds the same copy)\n"
        "  ca/ca.pem                       the federation CA certificate\n"
        "  coordinator/server.pem          this server's TLS certificate\n"
        "  coordinator/server.key          SECRET: its TLS key\n\n"
        "Run from this folder, one state file per session:\n"
        "  zerosum coordinator --federation federation.toml --state sessions/1.sqlite\n"
        "  zerosum coordinator --federation federation.toml --state sessions/1.sqlite --status\n"
        "For the next session give a new --state (sessions/2.sqlite); the same command with\n"
        "the same --state resumes a session after a crash.\n"
    }
    for node_id in config.node_ids:
        data = _row(f"nodes/{node_id}/data.csv", "the synthetic cohort") if synthetic else ""
        texts[f"node-{node_id}"] = head + (
            f"Kit of TRE node {node_id!r}: copy it into the TRE; nothing here goes elsewhere.\n"
            "  federation.toml                 the shared config\n"
            "  ca/ca.pem                       the federation CA certificate\n"
            + _row(f"nodes/{node_id}/identity.pem", "SECRET: the node's Ed25519 identity key")
            + _row(f"nodes/{node_id}/client.pem", "its TLS client certificate")
            + _row(f"nodes/{node_id}/client.key", "SECRET: its TLS key")
            + f"{data}\n"
            "Run from this folder (the cohort CSV: an age column, the features in the "
            "config's order, optionally id):\n"
            f"  zerosum node --federation federation.toml --node-id {node_id} \\\n"
            f"      --data COHORT.csv --out nodes/{node_id}/out-1 --approve manual\n"
            f"Each egress waits in nodes/{node_id}/out-1/egress/round-<r>/ for your output "
            "checker's signed approval.json\n"
            "(see the checker kit's README.txt). Next session: a new --out (out-2); "
            f"keep nodes/{node_id}/state,\n"
            "the node's privacy ledger across sessions. Budget left:\n"
            f"  zerosum ledger --federation federation.toml --node-id {node_id}\n"
        )
        if node_id in generated_checkers:
            keys = _row(
                f"checkers/{node_id}/checker.pem",
                "SECRET: your Ed25519 signing key (never on the node's machine)",
            ) + _row(
                f"checkers/{node_id}/checker.pub", "its public half (pinned in federation.toml)"
            )
            key = f"checkers/{node_id}/checker.pem"
        else:
            keys = "  (no key: the config pins the public key you gave with --checker-key)\n"
            key = "YOUR-KEY.pem"
        texts[f"checker-{node_id}"] = head + (
            f"Kit of the OUTPUT CHECKER of node {node_id!r}.\n"
            "  federation.toml                 the shared config (the bundle's checks are "
            "against it)\n"
            "  ca/ca.pem                       the federation CA certificate\n"
            f"{keys}\n"
            "For each bundle the node's operator hands you (a copy of "
            "OUT/egress/round-<r>/, e.g. BUNDLE):\n"
            "  zerosum review BUNDLE --federation federation.toml\n"
            "  zerosum review BUNDLE --federation federation.toml --approve \\\n"
            f'      --key {key} --reviewer "NAME"        (or --reject --comment "why")\n'
            "Then return BUNDLE/approval.json to the operator, who imports it with\n"
            "  zerosum review OUT/egress/round-<r> --import-decision approval.json\n"
        )
    return texts
