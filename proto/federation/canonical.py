"""The config hash: SHA-256 over one canonical encoding of the parsed settings.

:func:`canonical_encoding` is compact JSON with keys sorted, no whitespace,
ASCII only, byte strings as lowercase hex, floats as Python's shortest
round-trip ``repr`` and ints as ints, node entries sorted by node id, and a
``"format": "zerosum/v2/federation"`` member naming the encoding. The plan's
tables enter as they were parsed, each round as its name, tensor layout and
pinned noise scales (``noise_std``, grid units) when it has them.
Changing any setting changes the hash; comments, key order, whitespace and
the order of ``[[nodes]]`` entries do not. A node's output checker keys
enter as ``checker_public_keys`` (hex, sorted) when it has any;
a node without them is encoded as before they existed. Settings of the federation's own
sections are normalised first (``epsilon = 1`` and ``epsilon = 1.0`` hash
alike); a plan's tables are hashed as written, so within them ``1`` and
``1.0`` differ — every party holds the same file, so they always agree.
The ``revoked`` list of certificate fingerprints is left out: revoking a
certificate must not change the identity of a federation, nor stop a running
session from resuming.

The hash is bound into every key-bundle signature, every pairwise seed and
every upload statement, so a node configured for another federation (or
another version of this one) cannot be mixed in.
"""

from __future__ import annotations

import hashlib
import json

from proto.federation.schema import CONFIG_FORMAT, FederationConfig, NodeEntry, RoundSpec

__all__ = ["canonical_encoding", "config_hash"]


def _node(entry: NodeEntry) -> dict[str, object]:
    node: dict[str, object] = {
        "node_id": entry.node_id,
        "identity_public_key": entry.identity_public_key.hex(),
    }
    # Absent when empty, so a federation without checker keys keeps its hash.
    if entry.checker_public_keys:
        node["checker_public_keys"] = sorted(key.hex() for key in entry.checker_public_keys)
    return node


def _document(config: FederationConfig) -> dict[str, object]:
    privacy, design, plan = config.privacy, config.privacy.noise_design, config.plan
    document: dict[str, object] = {
        "format": CONFIG_FORMAT,
        "federation_id": config.federation_id,
        "coordinator_address": config.coordinator_address,
        "ca_certificate": config.ca_certificate,
        "fixed_point_bits": config.fixed_point_bits,
        "min_cohort_size": config.min_cohort_size,
        "min_nodes": config.min_nodes,
        "privacy": {
            "epsilon": privacy.epsilon,
            "delta": privacy.delta,
            "epsilon_budget": privacy.epsilon_budget,
            "residual_dp": privacy.residual_dp,
            "collusion_threshold": privacy.collusion_threshold,
            "noise_design": {
                "construction": design.construction,
                "graph": design.graph,
                "degree": design.degree,
                "target_std": design.target_std,
            },
        },
        "session": {
            "join_deadline_seconds": config.session.join_deadline_seconds,
            "round_deadline_seconds": config.session.round_deadline_seconds,
            "max_reruns": config.session.max_reruns,
        },
        "plan": {
            "name": plan.name,
            "version": plan.version,
            "settings": dict(plan.settings),
            "rounds": [_round(r) for r in plan.rounds],
        },
        "nodes": [_node(n) for n in config.nodes],
    }
    if config.stream_check is not None:
        document["stream_check"] = config.stream_check
    if plan.digest:
        document["plan"] = {**document["plan"], "digest": plan.digest}  # type: ignore[dict-item]
    return document


def _round(spec: RoundSpec) -> dict[str, object]:
    entry: dict[str, object] = {"name": spec.name, "tensors": spec.layout.to_json()}
    if spec.noise_std:
        entry["noise_std"] = dict(spec.noise_std)
    return entry


def canonical_encoding(config: FederationConfig) -> bytes:
    """The exact bytes :func:`config_hash` digests (documented in the module docstring)."""
    text = json.dumps(
        _document(config),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return text.encode("ascii")


def config_hash(config: FederationConfig) -> bytes:
    """SHA-256 (32 bytes) of :func:`canonical_encoding`: the federation's identity."""
    return hashlib.sha256(canonical_encoding(config)).digest()
