"""The federation configuration: who takes part, under which privacy policy.

A federation is fixed out of band in one TOML file (``federation.toml``) that
every TRE and the coordinator hold a copy of (DESIGN.md §4.1): the federation
id, the coordinator's address and CA certificate, every node with its pinned
Ed25519 identity key, the privacy policy, the fixed-point scale, the model and
its public clipping bounds, and session deadlines. :func:`load_federation`
parses and validates it once, at the edge, into frozen dataclasses; anything
wrong raises :class:`ConfigError` naming the setting and its value, e.g.
``privacy.epsilon = -1.0: must be greater than 0``.

Defaults follow the DPUK guidance for UK TREs collected in the project's
background notes: ε ≤ 1.0 per release, δ ≤ 1/N² for the minimum cohort size
N ≥ 100, the Gaussian mechanism, and a total budget of about 4ε for one
model export (basic composition over the exported parameter groups).

The **config hash** (:func:`config_hash`) is SHA-256 over a canonical encoding
of the parsed settings (:func:`canonical_encoding`): compact JSON with keys
sorted, no whitespace, ASCII only, byte strings as lowercase hex, numbers as
Python's shortest round-trip ``repr`` (so ``1`` and ``1.0`` hash alike), node
entries sorted by node id, and a ``"format": "zerosum/v1/federation"`` member
naming the encoding. Changing any setting changes the hash; comments, key
order, whitespace and the order of ``[[nodes]]`` entries do not. The hash is
bound into every key-bundle signature and every pairwise seed derivation, so a
node configured for another federation (or another version of this one)
cannot be mixed in.

This module is pure: stdlib ``tomllib`` for reading, a hand-written writer for
:func:`dump_federation` (a fixed layout, so dumps are deterministic).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast, get_args

from noise.errors import NoiseError

__all__ = [
    "CONFIG_FORMAT",
    "MODEL_KINDS",
    "ClippingBounds",
    "ConfigError",
    "Construction",
    "FederationConfig",
    "GraphKind",
    "ModelKind",
    "ModelSpec",
    "NodeEntry",
    "NoiseDesignSpec",
    "PrivacyPolicy",
    "SessionTimings",
    "canonical_encoding",
    "check_stream",
    "config_hash",
    "dump_federation",
    "load_federation",
    "parse_federation",
    "validate_identifier",
]

CONFIG_FORMAT: Final = "zerosum/v1/federation"

Construction = Literal["pairwise", "cape"]
GraphKind = Literal["complete", "harary"]
ModelKind = Literal["simple", "unbiased", "unbiased_quadratic", "alternate", "alternate_quadratic"]
MODEL_KINDS: Final[tuple[str, ...]] = get_args(ModelKind)
_CONSTRUCTIONS: Final[tuple[str, ...]] = get_args(Construction)
_GRAPHS: Final[tuple[str, ...]] = get_args(GraphKind)

# Node and federation ids name folders and travel in length-prefixed fields:
# start with a letter or digit (never "." or ".."), at most 64 characters.
_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_ID_RULE: Final = (
    "must be 1 to 64 characters from A-Z, a-z, 0-9, '_', '.', '-', starting with a letter or digit"
)
_HEX64_RE: Final = re.compile(r"[0-9a-f]{64}")
_DNS_LABEL: Final = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_RE: Final = re.compile(rf"{_DNS_LABEL}(?:\.{_DNS_LABEL})*")


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING: Final = _Missing()


class ConfigError(NoiseError, ValueError):
    """A federation setting is missing, of the wrong type, or out of range.

    ``field`` is the dotted TOML path (``privacy.epsilon``, ``nodes[2].node_id``),
    ``value`` the offending value (:data:`MISSING` when absent) and ``reason``
    what a valid value looks like.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        if value is MISSING:
            message = f"{field} is missing: {reason}"
        else:
            shown = repr(value)
            if len(shown) > 80:
                shown = shown[:77] + "..."
            message = f"{field} = {shown}: {reason}"
        super().__init__(message)


# ----------------------------------------------------------------- checks


def _set(obj: object, name: str, value: object) -> None:
    # Normalising a frozen dataclass field during __post_init__.
    object.__setattr__(obj, name, value)


def _float(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(name, value, "must be a number")
    result = float(value)
    if not math.isfinite(result):
        raise ConfigError(name, value, "must be a finite number")
    return result


def _positive(name: str, value: object) -> float:
    result = _float(name, value)
    if result <= 0:
        raise ConfigError(name, value, "must be greater than 0")
    return result


def _int(name: str, value: object, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, value, "must be a whole number")
    if value < lo or (hi is not None and value > hi):
        bound = f"at least {lo}" if hi is None else f"between {lo} and {hi}"
        raise ConfigError(name, value, f"must be {bound}")
    return value


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise ConfigError(name, value, f"must be one of {listed}")
    return value


def validate_identifier(name: str, value: object) -> str:
    """Return ``value`` if it is a valid node or federation id, else raise ConfigError.

    Ids name folders and travel in length-prefixed fields: 1 to 64 characters
    from A-Z, a-z, 0-9, '_', '.', '-', the first a letter or digit.
    """
    if not isinstance(value, str) or _ID_RE.fullmatch(value) is None:
        raise ConfigError(name, value, _ID_RULE)
    return value


def _split_address(name: str, value: object) -> tuple[str, int]:
    rule = "must be host:port (a DNS name, an IPv4 address or a bracketed IPv6 address)"
    if not isinstance(value, str) or ":" not in value:
        raise ConfigError(name, value, rule)
    host, _, port_text = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ConfigError(name, value, rule) from None
        host = host[1:-1]
    elif _HOST_RE.fullmatch(host) is None or len(host) > 253:
        raise ConfigError(name, value, rule)
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(name, value, "port must be a whole number between 1 and 65535")
    return host, int(port_text)


# ----------------------------------------------------------------- settings


@dataclass(frozen=True)
class NodeEntry:
    """One TRE of the federation and its pinned long-term identity key."""

    node_id: str
    identity_public_key: bytes  # 32 raw bytes of an Ed25519 public key

    def __post_init__(self) -> None:
        validate_identifier("nodes.node_id", self.node_id)
        key = self.identity_public_key
        if not isinstance(key, bytes) or len(key) != 32:
            raise ConfigError(
                "nodes.identity_public_key", key, "must be a 32-byte Ed25519 public key"
            )


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
        _choice(prefix + "construction", self.construction, _CONSTRUCTIONS)
        _choice(prefix + "graph", self.graph, _GRAPHS)
        if self.construction == "cape" and self.graph != "complete":
            raise ConfigError(
                prefix + "graph", self.graph, "construction 'cape' always uses the complete graph"
            )
        if self.graph == "harary":
            if self.degree is None:
                raise ConfigError(prefix + "degree", MISSING, "is required when graph = 'harary'")
            _int(prefix + "degree", self.degree, 2)
        elif self.degree is not None:
            raise ConfigError(prefix + "degree", self.degree, "applies only to graph = 'harary'")
        if self.target_std != "calibrated":
            _set(self, "target_std", _positive(prefix + "target_std", self.target_std))

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
    noise floor (DESIGN.md §3, §5).
    """

    epsilon: float = 1.0
    delta: float = 1e-6
    epsilon_budget: float = 4.0
    residual_dp: bool = False
    collusion_threshold: int = 1
    noise_design: NoiseDesignSpec = field(default_factory=NoiseDesignSpec)

    def __post_init__(self) -> None:
        _set(self, "epsilon", _positive("privacy.epsilon", self.epsilon))
        delta = _float("privacy.delta", self.delta)
        if not 0.0 < delta < 1.0:
            raise ConfigError("privacy.delta", self.delta, "must be strictly between 0 and 1")
        _set(self, "delta", delta)
        budget = _positive("privacy.epsilon_budget", self.epsilon_budget)
        if self.epsilon > budget:
            raise ConfigError(
                "privacy.epsilon",
                self.epsilon,
                f"must not exceed the total budget privacy.epsilon_budget = {budget!r}",
            )
        _set(self, "epsilon_budget", budget)
        if not isinstance(self.residual_dp, bool):
            raise ConfigError("privacy.residual_dp", self.residual_dp, "must be true or false")
        _int("privacy.collusion_threshold", self.collusion_threshold, 0)
        if not isinstance(self.noise_design, NoiseDesignSpec):
            raise ConfigError("privacy.noise_design", self.noise_design, "must be a table")


@dataclass(frozen=True)
class ModelSpec:
    """The brain-age model every node fits (Smith et al. 2019, NeuroImage 200:528-539)."""

    n_features: int
    n_components: int
    kind: ModelKind = "unbiased"

    def __post_init__(self) -> None:
        _choice("model.kind", self.kind, MODEL_KINDS)
        _int("model.n_features", self.n_features, 1)
        _int("model.n_components", self.n_components, 1)
        if self.n_components > self.n_features:
            raise ConfigError(
                "model.n_components",
                self.n_components,
                f"must not exceed model.n_features = {self.n_features}",
            )


FeatureBound = float | tuple[float, ...]


@dataclass(frozen=True)
class ClippingBounds:
    """Public clipping bounds that fix the sensitivity of every released sum.

    Ages are clipped to [age_low, age_high]; features to [feature_low,
    feature_high], given once for all features or as one value per feature.
    """

    age_low: float
    age_high: float
    feature_low: FeatureBound
    feature_high: FeatureBound

    def __post_init__(self) -> None:
        low = _float("clipping.age_low", self.age_low)
        high = _float("clipping.age_high", self.age_high)
        if high <= low:
            raise ConfigError(
                "clipping.age_high", self.age_high, f"must exceed clipping.age_low = {low!r}"
            )
        _set(self, "age_low", low)
        _set(self, "age_high", high)
        lows = self._bound("clipping.feature_low", self.feature_low)
        highs = self._bound("clipping.feature_high", self.feature_high)
        _set(self, "feature_low", lows)
        _set(self, "feature_high", highs)
        lo_list = lows if isinstance(lows, tuple) else None
        hi_list = highs if isinstance(highs, tuple) else None
        if lo_list is not None and hi_list is not None and len(lo_list) != len(hi_list):
            raise ConfigError(
                "clipping.feature_high",
                highs,
                f"lists {len(hi_list)} bounds but clipping.feature_low lists {len(lo_list)}",
            )
        count = len(lo_list) if lo_list is not None else len(hi_list) if hi_list else 1
        for index in range(count):
            lo = lo_list[index] if lo_list is not None else cast(float, lows)
            hi = hi_list[index] if hi_list is not None else cast(float, highs)
            if hi <= lo:
                where = f"[{index}]" if hi_list is not None else ""
                raise ConfigError(
                    f"clipping.feature_high{where}", hi, f"must exceed the lower bound {lo!r}"
                )

    @staticmethod
    def _bound(name: str, value: object) -> FeatureBound:
        if isinstance(value, list | tuple):
            if not value:
                raise ConfigError(name, value, "must be a number or a non-empty list of numbers")
            return tuple(_float(f"{name}[{i}]", v) for i, v in enumerate(value))
        return _float(name, value)

    @property
    def per_feature(self) -> bool:
        """True when at least one feature bound is given per feature."""
        return isinstance(self.feature_low, tuple) or isinstance(self.feature_high, tuple)

    def feature_bounds(self, n_features: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Lower and upper bounds expanded to one value per feature."""

        def expand(bound: FeatureBound, name: str) -> tuple[float, ...]:
            if isinstance(bound, tuple):
                if len(bound) != n_features:
                    raise ConfigError(
                        name, bound, f"lists {len(bound)} bounds for {n_features} features"
                    )
                return bound
            return (bound,) * n_features

        return (
            expand(self.feature_low, "clipping.feature_low"),
            expand(self.feature_high, "clipping.feature_high"),
        )


@dataclass(frozen=True)
class SessionTimings:
    """How long the coordinator waits for joins and for each round's uploads."""

    join_deadline_seconds: float = 120.0
    round_deadline_seconds: float = 600.0

    def __post_init__(self) -> None:
        for name in ("join_deadline_seconds", "round_deadline_seconds"):
            _set(self, name, _positive(f"session.{name}", getattr(self, name)))


@dataclass(frozen=True)
class FederationConfig:
    """Everything the nodes and the coordinator must agree on before a session.

    ``nodes`` is kept sorted by node id. ``base_dir`` is the folder the file
    was read from (relative paths such as ``ca_certificate`` resolve against
    it); it is a local fact, so it takes no part in equality, the dump or the
    config hash.
    """

    federation_id: str
    coordinator_address: str
    ca_certificate: str
    nodes: tuple[NodeEntry, ...]
    model: ModelSpec
    clipping: ClippingBounds
    privacy: PrivacyPolicy = field(default_factory=PrivacyPolicy)
    fixed_point_bits: int = 32
    min_cohort_size: int = 100
    min_nodes: int = 2
    session: SessionTimings = field(default_factory=SessionTimings)
    # noise.stream.stream_fingerprint() of the installation that made the
    # federation; None skips the check (a federation written by hand).
    stream_check: str | None = None
    base_dir: Path | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        validate_identifier("federation_id", self.federation_id)
        _split_address("coordinator_address", self.coordinator_address)
        if not isinstance(self.ca_certificate, str) or not self.ca_certificate.strip():
            raise ConfigError(
                "ca_certificate", self.ca_certificate, "must be the path of a PEM file"
            )
        _int("fixed_point_bits", self.fixed_point_bits, 1, 62)
        _int("min_cohort_size", self.min_cohort_size, 1)
        if self.stream_check is not None and (
            not isinstance(self.stream_check, str) or not _HEX64_RE.fullmatch(self.stream_check)
        ):
            raise ConfigError(
                "stream_check", self.stream_check, "must be 64 lowercase hexadecimal digits"
            )
        for name, kind in (
            ("model", ModelSpec),
            ("clipping", ClippingBounds),
            ("privacy", PrivacyPolicy),
            ("session", SessionTimings),
        ):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(name, getattr(self, name), f"must be a {kind.__name__}")
        self._check_nodes()
        count = len(self.nodes)
        _int("min_nodes", self.min_nodes, 2, count)
        self._check_privacy(count)
        if isinstance(self.clipping.feature_low, tuple) or isinstance(
            self.clipping.feature_high, tuple
        ):
            self.clipping.feature_bounds(self.model.n_features)

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
        _set(self, "nodes", tuple(sorted(nodes, key=lambda n: n.node_id)))

    def _check_privacy(self, count: int) -> None:
        privacy = self.privacy
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

    def node(self, node_id: str) -> NodeEntry:
        """The entry of ``node_id``; KeyError naming the federation when absent."""
        for entry in self.nodes:
            if entry.node_id == node_id:
                return entry
        raise KeyError(f"node {node_id!r} is not part of federation {self.federation_id!r}")

    @property
    def coordinator_host(self) -> str:
        """Host part of the coordinator address (IPv6 without brackets)."""
        return _split_address("coordinator_address", self.coordinator_address)[0]

    @property
    def coordinator_port(self) -> int:
        """Port of the coordinator address."""
        return _split_address("coordinator_address", self.coordinator_address)[1]

    @property
    def ca_certificate_path(self) -> Path:
        """The CA certificate file, resolved against the config file's folder."""
        path = Path(self.ca_certificate)
        if path.is_absolute() or self.base_dir is None:
            return path
        return self.base_dir / path


# ----------------------------------------------------------------- reading


class _Table:
    """One TOML table: must be a table, and every key in it must be known."""

    def __init__(self, data: object, name: str, known: tuple[str, ...]) -> None:
        if data is MISSING:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(name, data, "must be a table")
        for key, value in data.items():
            if key not in known:
                expected = ", ".join(known)
                raise ConfigError(
                    self._join(name, key), value, f"unknown setting; expected one of {expected}"
                )
        self._data: dict[str, object] = dict(data)
        self._name = name

    @staticmethod
    def _join(name: str, key: str) -> str:
        return f"{name}.{key}" if name else key

    def path(self, key: str) -> str:
        return self._join(self._name, key)

    def take(self, key: str) -> object:
        return self._data.pop(key, MISSING)

    def required(self, key: str, reason: str) -> object:
        value = self.take(key)
        if value is MISSING:
            raise ConfigError(self.path(key), MISSING, reason)
        return value

    def arguments(self, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
        """Keyword arguments for a dataclass: required keys, and optional ones when present."""
        # Any: the dataclasses check every value's type themselves.
        found: dict[str, Any] = {key: self.required(key, "is required") for key in required}
        for key in optional:
            value = self.take(key)
            if value is not MISSING:
                found[key] = value
        return found


def _decode_key(name: str, value: object) -> bytes:
    rule = "must be a 32-byte Ed25519 public key written as 64 hex digits or in base64"
    if not isinstance(value, str):
        raise ConfigError(name, value, rule)
    text = value.strip()
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        return bytes.fromhex(text)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(name, value, rule) from None
    if len(raw) != 32:
        raise ConfigError(name, value, rule)
    return raw


def _parse_nodes(value: object) -> tuple[NodeEntry, ...]:
    if value is MISSING:
        raise ConfigError("nodes", MISSING, "list each node in a [[nodes]] table")
    if not isinstance(value, list):
        raise ConfigError("nodes", value, "must be an array of [[nodes]] tables")
    entries = []
    for index, item in enumerate(value):
        table = _Table(item, f"nodes[{index}]", ("node_id", "identity_public_key"))
        node_id = table.required("node_id", "every node needs an id")
        key = _decode_key(
            table.path("identity_public_key"),
            table.required("identity_public_key", "every node needs its identity public key"),
        )
        try:
            entries.append(NodeEntry(cast(str, node_id), key))
        except ConfigError as error:
            leaf = error.field.rpartition(".")[2]
            raise ConfigError(table.path(leaf), error.value, error.reason) from None
    return tuple(entries)


_TOP_KEYS: Final = (
    "federation_id",
    "coordinator_address",
    "ca_certificate",
    "fixed_point_bits",
    "min_cohort_size",
    "min_nodes",
    "stream_check",
    "privacy",
    "model",
    "clipping",
    "session",
    "nodes",
)
_PRIVACY_KEYS: Final = ("epsilon", "delta", "epsilon_budget", "residual_dp", "collusion_threshold")
_DESIGN_KEYS: Final = ("construction", "graph", "degree", "target_std")
_MODEL_KEYS: Final = ("kind", "n_features", "n_components")
_CLIPPING_KEYS: Final = ("age_low", "age_high", "feature_low", "feature_high")
_SESSION_KEYS: Final = ("join_deadline_seconds", "round_deadline_seconds")


def parse_federation(
    text: str, *, base_dir: Path | None = None, source: str = "federation.toml"
) -> FederationConfig:
    """Parse and validate federation TOML text (see :func:`load_federation`).

    Checks run in a fixed order (unknown or misplaced settings, then the
    nodes, then each section, then the top-level settings and everything that
    relates several of them) and stop at the first problem. ``source`` names
    the text in the error raised when it is not TOML at all.
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("file", source, f"is not valid TOML ({error})") from None
    top = _Table(data, "", _TOP_KEYS)
    privacy_table = _Table(top.take("privacy"), "privacy", (*_PRIVACY_KEYS, "noise_design"))
    design_table = _Table(privacy_table.take("noise_design"), "privacy.noise_design", _DESIGN_KEYS)
    model_table = _Table(top.take("model"), "model", _MODEL_KEYS)
    clipping_table = _Table(top.take("clipping"), "clipping", _CLIPPING_KEYS)
    session_table = _Table(top.take("session"), "session", _SESSION_KEYS)
    nodes = _parse_nodes(top.take("nodes"))

    design = NoiseDesignSpec(**design_table.arguments((), _DESIGN_KEYS))
    privacy = PrivacyPolicy(
        noise_design=design,
        **privacy_table.arguments((), _PRIVACY_KEYS),
    )
    model = ModelSpec(**model_table.arguments(("n_features", "n_components"), ("kind",)))
    clipping = ClippingBounds(**clipping_table.arguments(_CLIPPING_KEYS, ()))
    session = SessionTimings(**session_table.arguments((), _SESSION_KEYS))
    settings = top.arguments(
        ("federation_id", "coordinator_address", "ca_certificate"),
        ("fixed_point_bits", "min_cohort_size", "min_nodes", "stream_check"),
    )
    return FederationConfig(
        nodes=nodes,
        model=model,
        clipping=clipping,
        privacy=privacy,
        session=session,
        base_dir=base_dir,
        **settings,
    )


def load_federation(path: str | Path) -> FederationConfig:
    """Read, parse and validate a federation TOML file.

    Relative paths inside the file resolve against the file's folder
    (``config.base_dir``). Raises :class:`ConfigError` naming the first bad
    setting; OSError when the file cannot be read.
    """
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError("file", str(path), f"is not UTF-8 text ({error.reason})") from None
    return parse_federation(text, base_dir=path.resolve().parent, source=str(path))


# ----------------------------------------------------------------- writing


def _toml_string(text: str) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def _toml_float(value: float) -> str:
    # repr is the shortest text that reads back to the same double, and is a
    # valid TOML float for every finite value ("1e-06", "100.0").
    return repr(float(value))


def _toml_bound(bound: FeatureBound) -> str:
    if not isinstance(bound, tuple):
        return _toml_float(bound)
    per_line = 8
    if len(bound) <= per_line:
        return "[" + ", ".join(_toml_float(v) for v in bound) + "]"
    rows = [
        "    " + ", ".join(_toml_float(v) for v in bound[start : start + per_line]) + ","
        for start in range(0, len(bound), per_line)
    ]
    return "[\n" + "\n".join(rows) + "\n]"


def dump_federation(config: FederationConfig) -> str:
    """Write ``config`` as TOML in a fixed layout; ``parse_federation`` reads it back equal."""
    privacy, design = config.privacy, config.privacy.noise_design
    target = (
        _toml_string("calibrated")
        if design.target_std == "calibrated"
        else _toml_float(design.target_std)
    )
    lines = [
        "# zerosum federation configuration. Every node and the coordinator hold an",
        "# identical copy: its config hash is bound into every signature and seed.",
        "",
        f"federation_id = {_toml_string(config.federation_id)}",
        f"coordinator_address = {_toml_string(config.coordinator_address)}",
        "# relative to this file's folder",
        f"ca_certificate = {_toml_string(config.ca_certificate)}",
        "# fraction bits F of the uint64 fixed-point encoding (scale 2^-F)",
        f"fixed_point_bits = {config.fixed_point_bits}",
        "# smallest cohort a node may contribute (N); delta must be at most 1/N²",
        f"min_cohort_size = {config.min_cohort_size}",
        "# fewest surviving nodes a round may be aggregated from",
        f"min_nodes = {config.min_nodes}",
    ]
    if config.stream_check is not None:
        lines += [
            "# SHA-256 of the reference Gaussian stream (noise.stream.stream_fingerprint);",
            "# a node whose installation draws differently refuses to start",
            f"stream_check = {_toml_string(config.stream_check)}",
        ]
    lines += [
        "",
        "[privacy]",
        "# (epsilon, delta) per release; epsilon_budget caps the composed total",
        f"epsilon = {_toml_float(privacy.epsilon)}",
        f"delta = {_toml_float(privacy.delta)}",
        f"epsilon_budget = {_toml_float(privacy.epsilon_budget)}",
        "# independent noise so the aggregate itself is differentially private",
        f"residual_dp = {'true' if privacy.residual_dp else 'false'}",
        "# largest coalition of other nodes every node must stay protected against",
        f"collusion_threshold = {privacy.collusion_threshold}",
        "",
        "[privacy.noise_design]",
        '# construction: "pairwise" or "cape"; graph: "complete" or "harary" (with degree)',
        f"construction = {_toml_string(design.construction)}",
        f"graph = {_toml_string(design.graph)}",
    ]
    if design.degree is not None:
        lines.append(f"degree = {design.degree}")
    lines += [
        '# per-node noise standard deviation, or "calibrated" from epsilon, delta and clipping',
        f"target_std = {target}",
        "",
        "[model]",
        "# simple, unbiased, unbiased_quadratic, alternate or alternate_quadratic",
        f"kind = {_toml_string(config.model.kind)}",
        f"n_features = {config.model.n_features}",
        f"n_components = {config.model.n_components}",
        "",
        "[clipping]",
        "# public bounds; feature bounds are one number for all features or one per feature",
        f"age_low = {_toml_float(config.clipping.age_low)}",
        f"age_high = {_toml_float(config.clipping.age_high)}",
        f"feature_low = {_toml_bound(config.clipping.feature_low)}",
        f"feature_high = {_toml_bound(config.clipping.feature_high)}",
        "",
        "[session]",
        f"join_deadline_seconds = {_toml_float(config.session.join_deadline_seconds)}",
        f"round_deadline_seconds = {_toml_float(config.session.round_deadline_seconds)}",
    ]
    for entry in config.nodes:
        lines += [
            "",
            "[[nodes]]",
            f"node_id = {_toml_string(entry.node_id)}",
            f"identity_public_key = {_toml_string(entry.identity_public_key.hex())}",
        ]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------- hashing


def _canonical_document(config: FederationConfig) -> dict[str, object]:
    privacy, design, clipping = config.privacy, config.privacy.noise_design, config.clipping

    def bound(value: FeatureBound) -> float | list[float]:
        return list(value) if isinstance(value, tuple) else value

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
        "model": {
            "kind": config.model.kind,
            "n_features": config.model.n_features,
            "n_components": config.model.n_components,
        },
        "clipping": {
            "age_low": clipping.age_low,
            "age_high": clipping.age_high,
            "feature_low": bound(clipping.feature_low),
            "feature_high": bound(clipping.feature_high),
        },
        "session": {
            "join_deadline_seconds": config.session.join_deadline_seconds,
            "round_deadline_seconds": config.session.round_deadline_seconds,
        },
        "nodes": [
            {"node_id": n.node_id, "identity_public_key": n.identity_public_key.hex()}
            for n in config.nodes
        ],
    }
    if config.stream_check is not None:
        # Absent rather than null when unset, so older federation files keep their hash.
        document["stream_check"] = config.stream_check
    return document


def canonical_encoding(config: FederationConfig) -> bytes:
    """The exact bytes :func:`config_hash` digests (documented in the module docstring)."""
    text = json.dumps(
        _canonical_document(config),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return text.encode("ascii")


def config_hash(config: FederationConfig) -> bytes:
    """SHA-256 (32 bytes) of :func:`canonical_encoding`: the federation's identity."""
    return hashlib.sha256(canonical_encoding(config)).digest()


def check_stream(config: FederationConfig) -> None:
    """Refuse an installation whose keyed Gaussian streams differ from the federation's.

    ``config.stream_check`` is the reference digest pinned when the federation
    was made (``noise.stream.stream_fingerprint``); a node whose numpy,
    randomgen or maths library draws a different stream from the same key
    would add masks that do not cancel. Raises :class:`ConfigError` naming the
    installed versions; does nothing when no digest is pinned.
    """
    if config.stream_check is None:
        return
    from importlib.metadata import version

    from noise.stream import stream_fingerprint

    local = stream_fingerprint()
    if local != config.stream_check:
        raise ConfigError(
            "stream_check",
            config.stream_check,
            f"differs from this installation's reference stream {local[:16]}… "
            f"(numpy {version('numpy')}, randomgen {version('randomgen')}): masks drawn here "
            "would not cancel with the other nodes' masks; install the numpy and randomgen "
            "versions the federation was made with",
        )
