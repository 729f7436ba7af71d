"""The federation configuration as frozen dataclasses, each validated when it is made.

A federation is fixed out of band in one TOML file that every TRE and the
coordinator hold a copy of: the federation id, the coordinator's address and
CA certificate, every node with its pinned Ed25519 identity key, the privacy
policy, the fixed-point scale, session deadlines and the *plan* — which
computation the nodes run, round by round, with each round's public payload
layout. Defaults follow the DPUK guidance for UK TREs (ε ≤ 1 per release,
δ ≤ 1/N² for the minimum cohort size N ≥ 100, the Gaussian mechanism).

The plan's own settings (for the brain-age plan: ``[plan.model]`` and
``[plan.clipping]``) are tables this module keeps as they are and never
interprets: the plan validates them on the node side, and the coordinator,
which knows nothing of brain age, needs only the round layouts. Those layouts
are public and fixed here, so the coordinator derives every round's layout
from the config alone and no member can change it by what it sends.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, get_args

from noise.layout import Layout
from proto.federation.checks import (
    MISSING,
    ConfigError,
    choice,
    finite,
    positive,
    split_address,
    validate_identifier,
    whole,
)

__all__ = [
    "CONFIG_FORMAT",
    "MAX_DEADLINE_SECONDS",
    "MAX_FIXED_POINT_BITS",
    "MAX_NOISE_STD_UNITS",
    "MIN_DEADLINE_SECONDS",
    "MIN_FIXED_POINT_BITS",
    "OLD_FORMATS",
    "Construction",
    "FederationConfig",
    "GraphKind",
    "NodeEntry",
    "NoiseDesignSpec",
    "PlanSpec",
    "PrivacyPolicy",
    "RoundSpec",
    "SessionTimings",
    "normalise_fingerprint",
]

CONFIG_FORMAT: Final = "zerosum/v2/federation"
# Formats this version refuses, with what changed since (a config names its format).
OLD_FORMATS: Final = {
    "zerosum/v1/federation": (
        "its nodes computed their noise scales themselves, in floating point, and drew "
        "rounded normals; version 2 pins every scale in the config and draws discrete "
        "Gaussians"
    ),
}
# The largest noise standard deviation a config may pin, in grid units (2^50: the
# discrete samplers' range, noise.discrete.MAX_SCALE).
MAX_NOISE_STD_UNITS: Final = 1 << 50

Construction = Literal["pairwise", "cape"]
GraphKind = Literal["complete", "harary"]
_CONSTRUCTIONS: Final[tuple[str, ...]] = get_args(Construction)
_GRAPHS: Final[tuple[str, ...]] = get_args(GraphKind)

# Fixed point with F fractional bits holds magnitudes below 2^(63-F); the
# aggregate of sums over every subject of the federation must fit as well as
# each term, so F leaves at least 2^23 (8.4 million) of integer range, and at
# least 2^-16 of resolution.
MIN_FIXED_POINT_BITS: Final = 16
MAX_FIXED_POINT_BITS: Final = 40
# A deadline below a second cannot be met by a real node; one beyond thirty
# days is a typo (and would overflow the coordinator's clock arithmetic).
MIN_DEADLINE_SECONDS: Final = 1.0
MAX_DEADLINE_SECONDS: Final = 30 * 24 * 3600.0
# An ε below 0.001 buys no accuracy at all (the noise swamps any cohort); one
# above 1000 (tests use 300 for noise too small to matter) protects nothing and
# is a typo, like a budget above 10^5.
MIN_EPSILON: Final = 1e-3
MAX_EPSILON: Final = 1000.0
MAX_EPSILON_BUDGET: Final = 1e5
# Noise of standard deviation σ is σ·2^F in fixed point; 128 σ must stay well
# inside the signed 64-bit range, so σ ≤ 2^(56-F).
_NOISE_HEADROOM_BITS: Final = 56
# A cohort larger than any population; beyond it 1/N² underflows nothing but means nothing.
MAX_COHORT_SIZE: Final = 10**9
# 2^30 uint64 values (8 GiB) per payload: the coordinator's bound on what one
# node may make it store, and far above any model here.
MAX_ROUND_VALUES: Final = 1 << 30

_HEX64_RE: Final = re.compile(r"[0-9a-f]{64}")
# Plan round names: no "/" (CAPE's secure-sum rounds are "cape-sum/<name>").
_ROUND_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


_FINGERPRINT_RULE: Final = (
    "must be a list of certificate SHA-256 fingerprints, 64 hexadecimal digits each "
    "(colons between the bytes allowed)"
)
_ONE_FINGERPRINT_RULE: Final = (
    "must be a certificate's SHA-256 fingerprint: 64 hexadecimal digits (colons between "
    "the bytes allowed)"
)


def normalise_fingerprint(name: str, value: object) -> str:
    """A certificate's SHA-256 fingerprint as 64 lowercase hex digits.

    Accepts upper or lower case and the ``AB:CD:...`` form that
    ``openssl x509 -noout -fingerprint -sha256`` prints (after its
    ``sha256 Fingerprint=`` label); anything else is a ConfigError naming ``name``.
    """
    if not isinstance(value, str):
        raise ConfigError(name, value, _ONE_FINGERPRINT_RULE)
    text = value.strip().lower().replace(":", "")
    if not _HEX64_RE.fullmatch(text):
        raise ConfigError(name, value, _ONE_FINGERPRINT_RULE)
    return text


def _within(name: str, value: object, low: float, high: float) -> float:
    """``value`` as a finite float in [low, high]; a ConfigError naming the range otherwise."""
    result = positive(name, value)
    if not low <= result <= high:
        raise ConfigError(name, value, f"must be between {low:g} and {high:g}")
    return result


def _set(obj: object, name: str, value: object) -> None:
    # Normalising a frozen dataclass field during __post_init__.
    object.__setattr__(obj, name, value)


@dataclass(frozen=True)
class NodeEntry:
    """One TRE of the federation: its pinned identity key and its output checkers' keys.

    ``checker_public_keys`` are the Ed25519 public keys whose signed decision
    on this node's egress the node accepts (node/egress/approval.py); the matching
    private keys are held by the TRE's output checkers, never by the node.
    Empty means the node can only run with automatic approval.
    """

    node_id: str
    identity_public_key: bytes  # 32 raw bytes of an Ed25519 public key
    checker_public_keys: tuple[bytes, ...] = ()

    def __post_init__(self) -> None:
        validate_identifier("nodes.node_id", self.node_id)
        key = self.identity_public_key
        if not isinstance(key, bytes) or len(key) != 32:
            raise ConfigError(
                "nodes.identity_public_key", key, "must be a 32-byte Ed25519 public key"
            )
        checkers = self.checker_public_keys
        if not isinstance(checkers, list | tuple):
            raise ConfigError(
                "nodes.checker_public_keys", checkers, "must be a list of Ed25519 public keys"
            )
        for checker in checkers:
            if not isinstance(checker, bytes) or len(checker) != 32:
                raise ConfigError(
                    "nodes.checker_public_keys", checker, "must be a 32-byte Ed25519 public key"
                )
            if checker == key:
                raise ConfigError(
                    "nodes.checker_public_keys",
                    checker.hex(),
                    "is the node's own identity key; an output checker needs a key of its own",
                )
        if len(set(checkers)) != len(checkers):
            repeated = next(c for c in checkers if checkers.count(c) > 1)
            raise ConfigError("nodes.checker_public_keys", repeated.hex(), "is listed twice")
        _set(self, "checker_public_keys", tuple(checkers))


@dataclass(frozen=True)
class NoiseDesignSpec:
    """Which zero-sum noise to build (see ``noise.designs``).

    ``construction`` "pairwise" draws every pair term from a pairwise seed
    (a weighted graph Laplacian covariance); "cape" uses the secure-sum
    construction of Imtiaz, Mohammadi & Sarwate 2019 (arXiv 1904.10059), whose
    marginal covariance equals the complete graph's. ``graph`` "harary" keeps
    ``degree`` neighbours per node (Harary 1962) for large federations.
    ``target_std`` is the per-node standard deviation of the correlated noise
    in model units, or "calibrated": derive it from ε, δ and the sensitivity
    of the declared clipping bounds.
    """

    construction: Construction = "pairwise"
    graph: GraphKind = "complete"
    degree: int | None = None
    target_std: float | Literal["calibrated"] = "calibrated"

    def __post_init__(self) -> None:
        prefix = "privacy.noise_design."
        choice(prefix + "construction", self.construction, _CONSTRUCTIONS)
        choice(prefix + "graph", self.graph, _GRAPHS)
        if self.construction == "cape" and self.graph != "complete":
            raise ConfigError(
                prefix + "graph", self.graph, "construction 'cape' always uses the complete graph"
            )
        if self.graph == "harary":
            if self.degree is None:
                raise ConfigError(prefix + "degree", MISSING, "is required when graph = 'harary'")
            whole(prefix + "degree", self.degree, 2)
        elif self.degree is not None:
            raise ConfigError(prefix + "degree", self.degree, "applies only to graph = 'harary'")
        if self.target_std != "calibrated":
            _set(self, "target_std", positive(prefix + "target_std", self.target_std))

    @property
    def calibrated(self) -> bool:
        """True when the noise scale is derived from ε, δ and the sensitivity."""
        return self.target_std == "calibrated"


@dataclass(frozen=True)
class PrivacyPolicy:
    """Per-release (ε, δ), the total ε budget, residual DP and collusion threshold.

    ``residual_dp`` adds independent Gaussian noise so that the aggregate
    itself is (ε, δ)-DP, not only each egress. ``collusion_threshold`` T is the
    largest coalition of other nodes against which every node must keep its
    noise floor.
    """

    epsilon: float = 1.0
    delta: float = 1e-6
    epsilon_budget: float = 4.0
    residual_dp: bool = False
    collusion_threshold: int = 1
    noise_design: NoiseDesignSpec = field(default_factory=NoiseDesignSpec)

    def __post_init__(self) -> None:
        _set(self, "epsilon", _within("privacy.epsilon", self.epsilon, MIN_EPSILON, MAX_EPSILON))
        delta = finite("privacy.delta", self.delta)
        if not 0.0 < delta < 1.0:
            raise ConfigError("privacy.delta", self.delta, "must be strictly between 0 and 1")
        _set(self, "delta", delta)
        budget = _within(
            "privacy.epsilon_budget", self.epsilon_budget, MIN_EPSILON, MAX_EPSILON_BUDGET
        )
        if self.epsilon > budget:
            raise ConfigError(
                "privacy.epsilon",
                self.epsilon,
                f"must not exceed the total budget privacy.epsilon_budget = {budget!r}",
            )
        _set(self, "epsilon_budget", budget)
        if not isinstance(self.residual_dp, bool):
            raise ConfigError("privacy.residual_dp", self.residual_dp, "must be true or false")
        whole("privacy.collusion_threshold", self.collusion_threshold, 0)
        if not isinstance(self.noise_design, NoiseDesignSpec):
            raise ConfigError("privacy.noise_design", self.noise_design, "must be a table")


# Reruns of one plan round: each is another release of the same data.
MAX_RERUNS = 10


@dataclass(frozen=True)
class SessionTimings:
    """How long the coordinator waits for joins and for each round's uploads; how often it reruns.

    ``max_reruns`` R: at most R superseded attempts of one plan round (a
    round rerun after silent survivors), so at most R + 1 releases of it per
    session, each a counted release of the same data; the budget pre-check
    charges all R + 1.
    """

    join_deadline_seconds: float = 120.0
    round_deadline_seconds: float = 600.0
    max_reruns: int = 2

    def __post_init__(self) -> None:
        whole("session.max_reruns", self.max_reruns, 0, MAX_RERUNS)
        for name in ("join_deadline_seconds", "round_deadline_seconds"):
            value = positive(f"session.{name}", getattr(self, name))
            if not MIN_DEADLINE_SECONDS <= value <= MAX_DEADLINE_SECONDS:
                raise ConfigError(
                    f"session.{name}",
                    getattr(self, name),
                    f"must be between {MIN_DEADLINE_SECONDS:g} s and "
                    f"{MAX_DEADLINE_SECONDS:g} s (30 days)",
                )
            _set(self, name, value)


@dataclass(frozen=True)
class RoundSpec:
    """One round of the plan: its name, the public layout of its payloads, its noise scales.

    ``noise_std`` pins, per tensor, the standard deviation S_t of the noise
    every egress of the round carries, in grid units (an integer: σ_t·2^F
    rounded up), as ``federation init`` computed it once for everyone
    (node.egress.pinned_noise). Nodes derive every pair, CAPE and residual variance
    from it in exact rational arithmetic and never recompute a scale in
    floating point of their own, so both ends of a pair draw the same
    integers. Empty only while a config is being made.
    """

    name: str
    layout: Layout
    noise_std: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or _ROUND_RE.fullmatch(self.name) is None:
            raise ConfigError(
                "plan.rounds.name",
                self.name,
                "must be 1 to 64 characters from A-Z, a-z, 0-9, '_', '.', '-', starting with a "
                "letter or digit",
            )
        if not isinstance(self.layout, Layout):
            raise ConfigError(f"plan.rounds[{self.name}].tensors", self.layout, "must be a layout")
        if self.layout.size > MAX_ROUND_VALUES:
            raise ConfigError(
                f"plan.rounds[{self.name}].tensors",
                self.layout.size,
                f"a round holds at most {MAX_ROUND_VALUES} values (2^30, 8 GiB of uint64); "
                "this layout holds more",
            )
        self._check_noise_std()

    def _check_noise_std(self) -> None:
        where = f"plan.rounds[{self.name}].noise_std"
        if not isinstance(self.noise_std, Mapping):
            raise ConfigError(where, self.noise_std, "must be a table of tensor = integer")
        pinned: dict[str, int] = {}
        names = [slot.name for slot in self.layout]
        for tensor, value in self.noise_std.items():
            if tensor not in names:
                raise ConfigError(
                    f"{where}.{tensor}", value, f"names no tensor of the round ({', '.join(names)})"
                )
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or not 1 <= value <= MAX_NOISE_STD_UNITS
            ):
                raise ConfigError(
                    f"{where}.{tensor}",
                    value,
                    f"must be a whole number of grid units from 1 to 2^50 ({MAX_NOISE_STD_UNITS})",
                )
            pinned[str(tensor)] = int(value)
        if pinned and set(pinned) != set(names):
            missing = [n for n in names if n not in pinned]
            raise ConfigError(where, dict(pinned), f"pins no noise for tensor(s) {missing}")
        _set(self, "noise_std", {n: pinned[n] for n in names if n in pinned})

    @property
    def pinned(self) -> bool:
        """Whether the round's noise scales are pinned (a config made by ``federation init``)."""
        return bool(self.noise_std)


def _plain(name: str, value: object) -> Any:
    """A deep copy of a TOML value made of JSON types only (no dates, no NaN)."""
    if isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(name, value, "must be a finite number")
        return value
    if isinstance(value, list | tuple):
        return [_plain(f"{name}[{i}]", item) for i, item in enumerate(value)]
    if isinstance(value, Mapping):
        return {str(k): _plain(f"{name}.{k}", v) for k, v in value.items()}
    raise ConfigError(name, value, "must be a number, string, boolean, array or table")


@dataclass(frozen=True)
class PlanSpec:
    """Which computation the nodes run: name, version, public rounds and the plan's tables.

    ``settings`` maps each of the plan's own tables (``[plan.<table>]``) to
    its contents, unvalidated here: the plan that ``name`` identifies checks
    them on the node side. ``rounds`` fixes, in order, every round's name and
    payload layout.
    """

    name: str
    version: str
    rounds: tuple[RoundSpec, ...]
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # SHA-256 of the plan's code as governance approved it (node.plans.registry);
    # "" when the config pins none.
    digest: str = ""

    def __post_init__(self) -> None:
        validate_identifier("plan.name", self.name)
        if not isinstance(self.version, str) or not self.version.strip():
            raise ConfigError("plan.version", self.version, "must be a non-empty string")
        if not isinstance(self.digest, str) or (
            self.digest and (len(self.digest) != 64 or self.digest.strip("0123456789abcdef"))
        ):
            raise ConfigError(
                "plan.digest", self.digest, "must be 64 lowercase hex digits (a SHA-256)"
            )
        rounds = tuple(self.rounds)
        if not rounds or not all(isinstance(r, RoundSpec) for r in rounds):
            raise ConfigError("plan.rounds", rounds, "list at least one [[plan.rounds]] table")
        names = [r.name for r in rounds]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ConfigError("plan.rounds.name", repeated[0], "is listed twice")
        _set(self, "rounds", rounds)
        if not isinstance(self.settings, Mapping):
            raise ConfigError("plan", self.settings, "plan settings must be tables")
        tables: dict[str, dict[str, Any]] = {}
        for key, table in self.settings.items():
            if key in ("name", "version", "rounds") or not isinstance(table, Mapping):
                raise ConfigError(f"plan.{key}", table, "must be a table of the plan's settings")
            tables[str(key)] = _plain(f"plan.{key}", table)
        _set(self, "settings", tables)

    @property
    def round_names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rounds)

    def round(self, name: str) -> RoundSpec:
        """The round called ``name``; KeyError naming the plan's rounds when absent."""
        for spec in self.rounds:
            if spec.name == name:
                return spec
        raise KeyError(f"plan {self.name!r} has no round {name!r} ({', '.join(self.round_names)})")

    def table(self, name: str) -> dict[str, Any]:
        """A copy of the plan's table ``[plan.<name>]`` (empty when absent)."""
        found = self.settings.get(name, {})
        copied: dict[str, Any] = json.loads(json.dumps(found))
        return copied


@dataclass(frozen=True)
class FederationConfig:
    """Everything the nodes and the coordinator must agree on before a session.

    ``revoked`` lists the SHA-256 fingerprints of TLS certificates the
    coordinator refuses (:func:`normalise_fingerprint` accepts the colon
    form ``openssl x509 -fingerprint -sha256`` prints); it is kept sorted and
    takes no part in the config hash, so a certificate can be revoked while a
    session runs, by restarting the coordinator with the new list, without
    changing the identity every signature is bound to. ``nodes`` is kept
    sorted by node id. ``base_dir`` is the folder the file
    was read from (relative paths such as ``ca_certificate`` resolve against
    it); it is a local fact, so it takes no part in equality, the dump or the
    config hash.
    """

    federation_id: str
    coordinator_address: str
    ca_certificate: str
    nodes: tuple[NodeEntry, ...]
    plan: PlanSpec
    privacy: PrivacyPolicy = field(default_factory=PrivacyPolicy)
    fixed_point_bits: int = 32
    min_cohort_size: int = 100
    min_nodes: int = 2
    session: SessionTimings = field(default_factory=SessionTimings)
    # noise.stream.stream_fingerprint() of the installation that made the
    # federation; None skips the check (a federation written by hand).
    stream_check: str | None = None
    # SHA-256 fingerprints (64 lowercase hex digits) of revoked TLS certificates.
    revoked: tuple[str, ...] = ()
    base_dir: Path | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        validate_identifier("federation_id", self.federation_id)
        split_address("coordinator_address", self.coordinator_address)
        if not isinstance(self.ca_certificate, str) or not self.ca_certificate.strip():
            raise ConfigError(
                "ca_certificate", self.ca_certificate, "must be the path of a PEM file"
            )
        if (
            isinstance(self.fixed_point_bits, bool)
            or not isinstance(self.fixed_point_bits, int)
            or not MIN_FIXED_POINT_BITS <= self.fixed_point_bits <= MAX_FIXED_POINT_BITS
        ):
            raise ConfigError(
                "fixed_point_bits",
                self.fixed_point_bits,
                f"must be a whole number between {MIN_FIXED_POINT_BITS} and "
                f"{MAX_FIXED_POINT_BITS}: with F fractional bits every sum, and the aggregate "
                "over all nodes, must stay below 2^(63-F) in magnitude",
            )
        whole("min_cohort_size", self.min_cohort_size, 1, MAX_COHORT_SIZE)
        if self.stream_check is not None and (
            not isinstance(self.stream_check, str) or not _HEX64_RE.fullmatch(self.stream_check)
        ):
            raise ConfigError(
                "stream_check", self.stream_check, "must be 64 lowercase hexadecimal digits"
            )
        for name, kind in (
            ("plan", PlanSpec),
            ("privacy", PrivacyPolicy),
            ("session", SessionTimings),
        ):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(name, getattr(self, name), f"must be a {kind.__name__}")
        self._check_revoked()
        self._check_nodes()
        count = len(self.nodes)
        whole("min_nodes", self.min_nodes, 2, count)
        self._check_privacy(count)

    def _check_revoked(self) -> None:
        revoked = self.revoked
        if not isinstance(revoked, list | tuple):
            raise ConfigError("revoked", revoked, _FINGERPRINT_RULE)
        found = [normalise_fingerprint(f"revoked[{i}]", item) for i, item in enumerate(revoked)]
        _set(self, "revoked", tuple(sorted(set(found))))

    def _check_nodes(self) -> None:
        nodes = self.nodes
        if not isinstance(nodes, list | tuple) or not all(isinstance(n, NodeEntry) for n in nodes):
            raise ConfigError("nodes", nodes, "must be a list of node entries")
        if len(nodes) < 2:
            raise ConfigError("nodes", [n.node_id for n in nodes], "must list at least 2 nodes")
        owners: dict[bytes, str] = {}
        seen: set[str] = set()
        for entry in nodes:
            if entry.node_id in seen:
                raise ConfigError("nodes.node_id", entry.node_id, "is listed twice")
            seen.add(entry.node_id)
            other = owners.setdefault(entry.identity_public_key, entry.node_id)
            if other != entry.node_id:
                raise ConfigError(
                    f"nodes.{entry.node_id}.identity_public_key",
                    entry.identity_public_key.hex(),
                    f"is also the identity key of node {other!r}; every node needs its own",
                )
        for entry in nodes:
            for checker in entry.checker_public_keys:
                if checker in owners:
                    raise ConfigError(
                        f"nodes.{entry.node_id}.checker_public_keys",
                        checker.hex(),
                        f"is the identity key of node {owners[checker]!r}; an output checker "
                        "needs a key no node holds",
                    )
        _set(self, "nodes", tuple(sorted(nodes, key=lambda n: n.node_id)))

    def _check_privacy(self, count: int) -> None:
        privacy = self.privacy
        target = privacy.noise_design.target_std
        ceiling = 2.0 ** (_NOISE_HEADROOM_BITS - self.fixed_point_bits)
        if target != "calibrated" and float(target) > ceiling:
            raise ConfigError(
                "privacy.noise_design.target_std",
                target,
                f"must be at most 2^(56-F) = {ceiling:.12g} with fixed_point_bits F = "
                f"{self.fixed_point_bits}, so that 128 standard deviations of noise stay "
                "inside the fixed-point range",
            )
        threshold = privacy.collusion_threshold
        if threshold > count - 2:
            raise ConfigError(
                "privacy.collusion_threshold",
                threshold,
                f"must be at most {count - 2} with {count} nodes: a node needs at least one "
                "honest peer outside any coalition to keep its pairwise noise",
            )
        bound = 1.0 / self.min_cohort_size**2
        if privacy.delta > bound:
            raise ConfigError(
                "privacy.delta",
                privacy.delta,
                f"must be at most 1/N² = {bound:g} for min_cohort_size N = {self.min_cohort_size}",
            )
        degree = privacy.noise_design.degree
        if degree is not None:
            if degree > count - 1:
                raise ConfigError(
                    "privacy.noise_design.degree",
                    degree,
                    f"must be at most {count - 1} (the other nodes) with {count} nodes",
                )
            if degree <= threshold:
                raise ConfigError(
                    "privacy.noise_design.degree",
                    degree,
                    f"must exceed privacy.collusion_threshold = {threshold} so a coalition "
                    "cannot cover all of a node's neighbours",
                )

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Node ids, sorted."""
        return tuple(n.node_id for n in self.nodes)

    @property
    def identity_keys(self) -> dict[str, bytes]:
        """Pinned Ed25519 identity public key of each node."""
        return {n.node_id: n.identity_public_key for n in self.nodes}

    @property
    def checker_keys(self) -> dict[str, tuple[bytes, ...]]:
        """The output checkers' Ed25519 public keys of each node (empty when none)."""
        return {n.node_id: n.checker_public_keys for n in self.nodes}

    def node(self, node_id: str) -> NodeEntry:
        """The entry of ``node_id``; KeyError naming the federation when absent."""
        for entry in self.nodes:
            if entry.node_id == node_id:
                return entry
        raise KeyError(
            f"node {node_id!r} is not part of federation {self.federation_id!r}; its nodes are "
            f"{', '.join(self.node_ids)}"
        )

    @property
    def coordinator_host(self) -> str:
        """Host part of the coordinator address (IPv6 without brackets)."""
        return split_address("coordinator_address", self.coordinator_address)[0]

    @property
    def coordinator_port(self) -> int:
        """Port of the coordinator address."""
        return split_address("coordinator_address", self.coordinator_address)[1]

    @property
    def ca_certificate_path(self) -> Path:
        """The CA certificate file, resolved against the config file's folder."""
        path = Path(self.ca_certificate)
        if path.is_absolute() or self.base_dir is None:
            return path
        return self.base_dir / path
