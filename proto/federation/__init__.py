"""The federation configuration every party holds: schema, TOML reading and writing, hash.

``federation.toml`` fixes who takes part (nodes and their pinned identity
keys, the coordinator's address and CA), under which privacy policy, with
which fixed-point scale and deadlines, and which plan the nodes run with every
round's public payload layout. It is the first part of the session protocol:
its canonical hash is bound into every signature and seed.

* ``checks``: :class:`ConfigError` and the value rules;
* ``schema``: the frozen dataclasses, validated when made;
* ``reading``: :func:`load_federation` / :func:`parse_federation`;
* ``writing``: :func:`dump_federation`;
* ``canonical``: :func:`canonical_encoding` and :func:`config_hash`.
"""

from __future__ import annotations

from proto.federation.canonical import canonical_encoding, config_hash
from proto.federation.checks import MISSING, ConfigError, validate_identifier
from proto.federation.reading import MAX_CONFIG_BYTES, load_federation, parse_federation
from proto.federation.schema import (
    CONFIG_FORMAT,
    Construction,
    FederationConfig,
    GraphKind,
    NodeEntry,
    NoiseDesignSpec,
    PlanSpec,
    PrivacyPolicy,
    RoundSpec,
    SessionTimings,
    normalise_fingerprint,
)
from proto.federation.writing import dump_federation

__all__ = [
    "CONFIG_FORMAT",
    "MAX_CONFIG_BYTES",
    "MISSING",
    "ConfigError",
    "Construction",
    "FederationConfig",
    "GraphKind",
    "NodeEntry",
    "NoiseDesignSpec",
    "PlanSpec",
    "PrivacyPolicy",
    "RoundSpec",
    "SessionTimings",
    "canonical_encoding",
    "config_hash",
    "dump_federation",
    "load_federation",
    "normalise_fingerprint",
    "parse_federation",
    "validate_identifier",
]
