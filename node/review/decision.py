"""Which keys may decide on a bundle, and what the folder's current decision is worth.

A decision (node/egress/approval.py) is valid only when it is for the manifest on
disk and signed by one of the output checker keys that the federation config
pins for the bundle's node (``[[nodes]] checker_public_keys``). A valid
decision is final. Anything else in ``approval.json`` — unreadable, signed by
another key (even that node's identity key), with a bad signature, or made
for another manifest — is *refused*: the node will not act on it, and a
listed checker may replace it with a valid decision.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from node.egress.approval import Approval, read_approval, verify_approval
from node.egress.bundle import EgressBundle
from node.errors import ApprovalError, NodeError
from node.review.findings import Finding, look, note
from noise.keys import key_fingerprint
from proto.federation import ConfigError, FederationConfig, config_hash, load_federation

__all__ = [
    "CONFIG_NAME",
    "DecisionState",
    "ReviewKeyError",
    "checker_keys",
    "current_decision",
    "decision_finding",
    "federation_for",
]

CONFIG_NAME = "federation.toml"


class _Bundle(Protocol):
    """What finding a bundle's federation needs: a round's egress or a delta summary."""

    @property
    def node_id(self) -> str: ...

    @property
    def config_hash(self) -> str: ...


class ReviewKeyError(NodeError, ValueError):
    """The federation config or a checker key cannot be used for this bundle."""


def federation_for(
    folder: Path, bundle: _Bundle, given: Path | None
) -> tuple[FederationConfig, Path] | None:
    """The federation config of ``bundle`` and its path; None when none is found.

    ``given`` is read when set; otherwise the first ``federation.toml`` in the
    folder's ancestors (a federation folder keeps nodes/<id>/… below it).
    The config's hash must equal the one the bundle records, so a checker
    never judges keys against another federation's list.
    """
    if given is None:
        for parent in Path(folder).resolve().parents:
            if (parent / CONFIG_NAME).is_file():
                given = parent / CONFIG_NAME
                break
        else:
            return None
    try:
        config = load_federation(given)
    except (ConfigError, OSError) as error:
        raise ReviewKeyError(f"cannot read the federation config {given}: {error}") from None
    digest = config_hash(config).hex()
    if bundle.config_hash and bundle.config_hash != digest:
        raise ReviewKeyError(
            f"{given} has config hash {digest[:16]}…, but the bundle was made under config "
            f"{bundle.config_hash[:16]}…; pass the node's federation config with --federation"
        )
    if bundle.node_id not in config.node_ids:
        raise ReviewKeyError(
            f"the bundle's node {bundle.node_id!r} is not part of federation "
            f"{config.federation_id!r} ({given})"
        )
    return config, given


def checker_keys(config: FederationConfig, node_id: str) -> dict[bytes, str]:
    """The output checker keys pinned for ``node_id``, each with a label for messages."""
    return {
        key: f"checker key {key_fingerprint(key)} of node {node_id!r}"
        for key in config.node(node_id).checker_public_keys
    }


@dataclass(frozen=True)
class DecisionState:
    """What ``approval.json`` holds: nothing, a valid (final) decision, or a refused file."""

    state: Literal["none", "valid", "refused"]
    approval: Approval | None = None
    reason: str = ""


def current_decision(folder: Path, keys: dict[bytes, str]) -> DecisionState:
    """Classify the folder's ``approval.json`` against the node's checker ``keys``."""
    try:
        found = read_approval(folder)
    except ApprovalError as error:
        return DecisionState("refused", None, str(error))
    if found is None:
        return DecisionState("none")
    try:
        verify_approval(
            found, manifest_sha256=EgressBundle.manifest_sha256(folder), accepted_keys=keys
        )
    except ApprovalError as error:
        return DecisionState("refused", found, str(error))
    return DecisionState("valid", found)


def decision_finding(
    decision: DecisionState, config: FederationConfig | None, node_id: str
) -> Finding:
    """What the folder's ``approval.json`` means for the checker, as one finding."""
    approval = decision.approval
    if decision.state == "valid" and approval is not None:
        return note(
            "decision",
            f"decided already: {approval.decision} by {approval.reviewer} at "
            f"{approval.timestamp} (final)",
        )
    if (
        decision.state == "refused"
        and approval is not None
        and config is not None
        and approval.public_key == config.node(node_id).identity_public_key
    ):
        return note(
            "decision",
            "approved automatically by the node itself (--approve auto), not by an output "
            "checker; a node run with --approve manual would not act on it",
        )
    if decision.state == "refused":
        return look(
            "decision",
            f"approval.json is refused: {decision.reason}; the node will not act on it — an "
            "output checker of this node may replace it (--approve|--reject --replace)",
        )
    return note(
        "decision",
        "no decision yet: add --approve or --reject with --key (a checker key of node "
        f"{node_id!r}) and --reviewer",
    )
