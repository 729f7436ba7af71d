"""How much noise each tensor of a round gets, and what that buys against each observer.

One round's egress is one *release*: the policy's (ε, δ) applies to the whole
vector a node sends, not to each tensor separately. Tensor t has L2
sensitivity Δ_t (from the public clipping bounds); with per-entry Gaussian
noise of std σ_t an observer facing noise of that scale is, jointly over the
M tensors of the round, μ-GDP with μ = sqrt(Σ_t (Δ_t/σ_t)²) (a Gaussian
mechanism with diagonal covariance; Dong, Roth & Su 2022, JRSS-B). With the
calibrated policy every tensor gets the same share, σ_t = Δ_t·√M / μ*(ε, δ),
so the release as a whole meets (ε, δ) against an outsider exactly
(μ* from the analytic Gaussian mechanism, Balle & Wang 2018). With a fixed
``target_std`` every tensor gets that std and the receipt reports the ε it
implies.

The noise *design* (pairwise graph or CAPE, residual share, collusion
threshold) is planned once at unit scale by :func:`noise.policy.plan_noise`
over the session's final roster, and each tensor uses that design scaled by
s_t² (variances) — so every node derives identical pair variances, and every
privacy figure of the unit design scales by Δ_t/s_t. Observer classes:
"outsider" (one egress), "colluders:m" (one egress and the secrets of the
worst m other nodes: the noise left is ``worst_remaining_variance``),
"coordinator" (every egress of the round) and "coalition:m" (the coordinator
plus the worst m other nodes pooling their secrets), from
:func:`noise.accounting.privacy_report`; m runs over 1..T, the policy's
collusion threshold (capped at K − 1), for either construction.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction

import numpy as np

from node.egress.receipt import DPReceipt, MaskingFacts, ObserverRelease, TensorEntry
from node.plans.interface import TensorSensitivity
from noise.accounting import (
    Observer,
    ObserverPrivacy,
    gaussian_epsilon,
    gaussian_mu,
    observer_mu,
    privacy_report,
)
from noise.designs import Design, cape_design, conditional_covariance, remaining_variance
from noise.discrete import discretisation_tv, sampler_delta, sum_tv
from noise.exact_noise import ExactNoise, exact_noise
from noise.policy import NoisePlan, plan_noise, worst_remaining_variance
from proto.federation import ConfigError, FederationConfig
from proto.federation.schema import RoundSpec

__all__ = [
    "FLOOR_RTOL",
    "ReleaseNoise",
    "cape_floor_shortfall",
    "pinned_stds",
    "plan_release",
    "scale_design",
    "with_cape_participants",
]

# Relative slack of the noise-floor check: designs meet their targets with
# equality up to floating-point rounding.
FLOOR_RTOL = 1e-9


def with_cape_participants(noise: ReleaseNoise, participants: Collection[str]) -> ReleaseNoise:
    """The CAPE plan of ``noise`` rerun among fewer ``participants``, keeping τ² and σ_res².

    A CAPE rerun reuses every node's draw ê_k (so the coordinator, which sees
    both attempts, learns nothing new); its zero-sum noise then has variance
    τ²(1 − 1/K') over the K' remaining nodes.
    """
    ids = sorted(participants)
    design = cape_design(ids, noise.unit.design.cape_variance)
    return replace(
        noise,
        unit=replace(noise.unit, design=design),
        exact=None if noise.exact is None else noise.exact.with_nodes(tuple(ids)),
    )


def cape_floor_shortfall(noise: ReleaseNoise, collusion_threshold: int, dropped: int) -> str | None:
    """Why a CAPE round among ``noise``'s participants would breach the floor, or None.

    :func:`with_cape_participants` keeps τ² but shrinks K, so among K' nodes
    an egress keeps τ²(1 − 1/(K' − m)) + σ_res² against m colluders (the
    coordinator knows the CAPE sum, so m nodes pooling their draws learn the
    honest rest's sum). The plan met the per-egress target at m = T for the
    full roster of K. Like the pairwise floor check, which reveals the pair
    terms with the ``dropped`` nodes and so spends that much of the collusion
    budget T, the rerun is checked against m = max(T − dropped, 0) colluders:
    every remaining participant must then keep the target, which holds exactly
    while dropped ≤ T (K' − m = K − T) and fails beyond. Against a full T
    colluders no rerun among fewer nodes could ever pass, as τ² is fixed.
    """
    design = noise.unit.design
    floor = noise.unit.target_variance
    colluders = max(collusion_threshold - max(dropped, 0), 0)
    left = {
        node: worst_remaining_variance(design, node, colluders, noise.unit.residual_variance)
        for node in design.node_ids
    }
    worst = min(left, key=lambda node: (left[node], node != noise.node_id))
    if left[worst] >= floor * (1.0 - FLOOR_RTOL):
        return None
    first = noise.tensors[0].name
    scale = noise.scales[first]
    whose = "my egress" if worst == noise.node_id else f"the egress of node {worst!r}"
    return (
        f"a CAPE rerun among {len(design.node_ids)} nodes would leave σ = "
        f"{math.sqrt(left[worst]) * scale:.4g} on {whose} against {colluders} colluding "
        f"node(s) ({dropped} dropped, collusion threshold {collusion_threshold}), below my "
        f"floor of {math.sqrt(floor) * scale:.4g} (tensor {first!r})"
    )


def scale_design(design: Design, factor: float) -> Design:
    """The same design with every variance multiplied by ``factor`` (> 0)."""
    return Design(
        node_ids=design.node_ids,
        pair_variances=design.pair_variances * factor,
        construction=design.construction,
        kind=design.kind,
        cape_variance=design.cape_variance * factor,
        collusion_threshold=design.collusion_threshold,
    )


@dataclass(frozen=True)
class ReleaseNoise:
    """The noise plan of one round for one node, at unit scale plus per-tensor scales."""

    node_id: str
    unit: NoisePlan
    tensors: tuple[TensorSensitivity, ...]
    scales: Mapping[str, float]
    delta: float
    calibration: str
    # The policy's T; None takes the design's (a CAPE design carries none of its own).
    collusion_threshold: int | None = None
    # S_t per tensor, the config's pinned noise scale in grid units, and the
    # design's exact weights: every variance a draw uses is weight × S_t².
    pinned: Mapping[str, int] = field(default_factory=dict)
    exact: ExactNoise | None = None
    # Entries per tensor (for the draws and the discretisation term).
    sizes: Mapping[str, int] = field(default_factory=dict)
    _coalition_mu: dict[int, float] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )
    _unit_report: dict[str, float] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    # -- per-tensor noise -----------------------------------------------

    def design(self, name: str) -> Design:
        """Tensor ``name``'s design (the unit design scaled by s_t²)."""
        return scale_design(self.unit.design, self.scales[name] ** 2)

    # -- exact variances in grid units (what the draws use) ---------------

    def _exact(self) -> ExactNoise:
        if self.exact is None:
            raise ValueError("this release has no pinned noise scales (made without a config)")
        return self.exact

    def pair_variances(self, name: str) -> dict[str, Fraction]:
        """c_kj² in grid units² for every pair partner j of this node, tensor ``name``."""
        exact = self._exact()
        std = self.pinned[name]
        return {
            peer: exact.pair_variance(self.node_id, peer, std)
            for peer in exact.node_ids
            if peer != self.node_id and exact.pair_weight(self.node_id, peer) > 0
        }

    def cape_variance_units(self, name: str) -> Fraction:
        """τ² in grid units² for tensor ``name``."""
        return self._exact().cape_variance(self.pinned[name])

    def residual_variance_units(self, name: str) -> Fraction:
        """σ_res² in grid units² for tensor ``name`` (0 with residual noise off)."""
        return self._exact().residual_variance(self.pinned[name])

    def residual_variance(self, name: str) -> float:
        return self.unit.residual_variance * self.scales[name] ** 2

    def residual_std(self, name: str) -> float:
        return math.sqrt(self.residual_variance(name))

    def sigma(self, name: str) -> float:
        """Per-entry noise std of this node's egress as an outsider sees it."""
        unit = self.unit.design.variance(self.node_id) + self.unit.residual_variance
        return math.sqrt(unit) * self.scales[name]

    def floor_variance(self, name: str) -> float:
        """The per-egress target variance this node must keep (its noise floor)."""
        return self.unit.target_variance * self.scales[name] ** 2

    def _sensitivity(self, name: str) -> TensorSensitivity:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor {name!r} in this release")

    # -- privacy --------------------------------------------------------

    @property
    def _ratio(self) -> float:
        """sqrt(Σ_t (Δ_t/s_t)²): how a unit-scale μ translates to the whole release."""
        return math.sqrt(sum((t.sensitivity / self.scales[t.name]) ** 2 for t in self.tensors))

    def _unit_mu(self) -> dict[str, float]:
        if not self._unit_report:
            rows = _unit_report(
                self.unit.design,
                self.unit.residual_variance,
                self.delta,
                self.max_reported_coalition,
            )
            for row in rows:
                if row.node_id != self.node_id:
                    continue
                label = (
                    f"coalition:{row.coalition_size}"
                    if row.observer == "coalition"
                    else row.observer
                )
                self._unit_report[label] = row.mu
                if row.observer == "coalition":
                    self._coalition_mu[row.coalition_size] = row.mu
                if row.observer == "outsider":
                    for size in range(1, self.max_reported_coalition + 1):
                        self._unit_report[f"colluders:{size}"] = self._colluders_unit_mu(size)
        return self._unit_report

    def _colluders_unit_mu(self, size: int) -> float:
        """μ at unit scale of one egress whose worst ``size`` other nodes share their secrets.

        What is left is Gaussian of variance v = ``worst_remaining_variance``
        (m largest pair terms known; for CAPE τ²(1 − 1/(K − m)) + σ_res²), so
        μ = 1/√v, the outsider's formula with v for R_kk + σ_res².
        """
        left = worst_remaining_variance(
            self.unit.design, self.node_id, size, self.unit.residual_variance
        )
        return math.inf if left <= 0.0 else 1.0 / math.sqrt(left)

    @property
    def threshold(self) -> int:
        """The collusion threshold T the receipt reports coalitions up to."""
        if self.collusion_threshold is not None:
            return self.collusion_threshold
        return self.unit.design.collusion_threshold

    @property
    def max_reported_coalition(self) -> int:
        k = len(self.unit.design.node_ids)
        return max(min(self.threshold, k - 1), 0)

    def mu(self) -> dict[str, float]:
        """μ of this release per observer class label."""
        return {label: mu * self._ratio for label, mu in self._unit_mu().items()}

    def receipt_rows(self) -> tuple[ObserverRelease, ...]:
        return tuple(
            ObserverRelease.of(
                Observer.parse(label), mu, gaussian_epsilon(mu, self.delta), self.delta
            )
            for label, mu in self.mu().items()
        )

    def draws(self) -> int:
        """How many integers this node draws for its egress (pair terms, CAPE, residual)."""
        per_entry = len(self.pair_variances(self.tensors[0].name)) if self.exact else 0
        if self.exact is not None and self.exact.construction == "cape":
            per_entry = 1
        if self.exact is not None and self.exact.residual_weight > 0:
            per_entry += 1
        return per_entry * sum(self.sizes.values())

    def discretisation_delta(self, epsilon: float) -> float:
        """δ_discretisation of this release for every one-egress class, at ``epsilon``.

        On each entry the noise left to an observer of one egress is a sum of
        n independent discrete Gaussians, within τ = 10·Σ_{k<n} e^(−2π²v·k/(k+1))
        in total variation of one discrete Gaussian of their summed variance
        (v the smallest component's variance; Kairouz, Liu & Steinke 2021,
        ICML), which is within 1/(8V) of the rounded continuous Gaussian of the
        same variance V ≥ S_t² (``noise.discrete.discretisation_tv``). The
        rounded Gaussian is post-processing of the Gaussian mechanism the μ
        figures describe, so the release is (ε, δ(ε; μ) + (1 + e^ε)·η)-DP with
        η the sum of those distances over its entries.
        """
        if self.exact is None:
            return 0.0
        eta = 0.0
        for t in self.tensors:
            std = self.pinned[t.name]
            components = [float(v) for v in self.pair_variances(t.name).values()]
            if self.exact.construction == "cape":
                components = [float(self.cape_variance_units(t.name))]
            residual = float(self.residual_variance_units(t.name))
            if residual > 0:
                components.append(residual)
            eta += self.sizes.get(t.name, 0) * (
                sum_tv(components) + discretisation_tv(float(std) ** 2)
            )
        return min(1.0, (1.0 + math.exp(min(epsilon, 700.0))) * eta)

    def receipt(self, cumulative: Sequence[ObserverRelease], releases: int) -> DPReceipt:
        # The δ terms hold for every one-egress class; (1 + e^ε) is taken at the largest
        # ε any of them is reported at, so the term covers each.
        rows = self.receipt_rows()
        one_egress = [r.epsilon for r in rows if r.observer in ("outsider", "colluders")]
        epsilon = min(max(one_egress, default=0.0), 700.0)
        return DPReceipt(
            delta=self.delta,
            release=self.receipt_rows(),
            cumulative=tuple(cumulative),
            releases_in_ledger=releases,
            calibration=self.calibration,
            delta_sampler=sampler_delta(self.draws(), epsilon),
            delta_discretisation=self.discretisation_delta(epsilon),
        )

    def masking_facts(self, residual_dp: bool) -> MaskingFacts:
        unit_var = self.unit.design.variance(self.node_id) + self.unit.residual_variance
        fractions = []
        for size in range(1, self.max_reported_coalition + 1):
            left = worst_remaining_variance(
                self.unit.design, self.node_id, size, self.unit.residual_variance
            )
            fractions.append(math.sqrt(left / unit_var) if unit_var > 0 else 0.0)
        return MaskingFacts(
            construction=self.unit.design.construction,
            graph=self.unit.design.kind,
            n_nodes=len(self.unit.design.node_ids),
            collusion_threshold=self.threshold,
            remaining_std_fraction=tuple(fractions),
            residual_dp=residual_dp,
        )

    def entries(self, shapes: Mapping[str, tuple[int, ...]]) -> tuple[TensorEntry, ...]:
        """Manifest entries in the order of ``shapes`` (the payload layout)."""
        out = []
        offset = 0
        for name, shape in shapes.items():
            size = math.prod(shape)
            sens = self._sensitivity(name)
            coalition = tuple(
                math.sqrt(
                    worst_remaining_variance(
                        self.design(name), self.node_id, s, self.residual_variance(name)
                    )
                )
                for s in range(1, self.max_reported_coalition + 1)
            )
            out.append(
                TensorEntry(
                    name=name,
                    shape=tuple(shape),
                    offset=offset,
                    size=size,
                    sigma=self.sigma(name),
                    sensitivity=sens.sensitivity,
                    sensitivity_derivation=sens.derivation,
                    coalition_sigma=coalition,
                )
            )
            offset += size
        return tuple(out)

    # -- unmasking ------------------------------------------------------

    def floor_shortfall(self, dropped: Collection[str]) -> str | None:
        """Why revealing pair terms with ``dropped`` would breach the floor, or None.

        Revealing them is like letting the dropped nodes collude: the noise
        left on this node's egress is ``remaining_variance(design, dropped)``
        (plus residual), which must stay at or above the per-egress target.
        """
        left = remaining_variance(self.unit.design, dropped, self.unit.residual_variance)[
            self.node_id
        ]
        floor = self.unit.target_variance
        if left >= floor * (1.0 - FLOOR_RTOL):
            return None
        first = self.tensors[0].name
        scale = self.scales[first]
        return (
            f"noise left on my egress would fall to σ = {math.sqrt(left) * scale:.4g}, below my "
            f"floor of {math.sqrt(floor) * scale:.4g} (tensor {first!r}) once my pair terms "
            f"with {sorted(dropped)} are revealed"
        )

    def mu_after_unmask(self, dropped: Collection[str]) -> dict[str, float]:
        """μ of this release per observer class once pair terms with ``dropped`` are revealed.

        The coordinator then knows what the dropped nodes would have pooled,
        so it faces the conditional covariance given ``dropped``; a coalition
        of m is bounded by the worst coalition of m + |dropped| (capped at K − 1),
        and so, should the coordinator pass the answers on, are m colluders
        with an outsider.
        """
        before = self.mu()
        honest, sigma = conditional_covariance(
            self.unit.design, dropped, self.unit.residual_variance
        )
        after = dict(before)
        after["coordinator"] = max(
            before.get("coordinator", 0.0),
            observer_mu(sigma, honest.index(self.node_id), 1.0) * self._ratio,
        )
        k = len(self.unit.design.node_ids)
        for label in list(after):
            kind, _, count = label.partition(":")
            if kind not in ("coalition", "colluders"):
                continue
            size = min(int(count) + len(set(dropped)), k - 1)
            worst = (
                self._worst_coalition_mu(size)
                if kind == "coalition"
                else self._colluders_unit_mu(size)
            )
            after[label] = max(after[label], worst * self._ratio)
        return after

    def _worst_coalition_mu(self, size: int) -> float:
        self._unit_mu()
        if size not in self._coalition_mu:
            rows = privacy_report(
                self.unit.design,
                residual_variance=self.unit.residual_variance,
                sensitivity=1.0,
                delta=self.delta,
                coalition_sizes=[size],
            )
            for row in rows:
                if row.node_id == self.node_id and row.observer == "coalition":
                    self._coalition_mu[size] = row.mu
        return self._coalition_mu[size]


# The unit-scale privacy report covers every node of a design at once; the
# budget checks plan the same design for each node in turn (node.egress.budget), so
# the report is kept for the few designs seen last instead of recomputed K times.
_REPORTS: dict[tuple[object, ...], list[ObserverPrivacy]] = {}
_REPORTS_KEPT = 8


def _unit_report(
    design: Design, residual_variance: float, delta: float, max_coalition: int
) -> list[ObserverPrivacy]:
    """``privacy_report`` at unit sensitivity, shared by every node of the same design."""
    key = (
        design.node_ids,
        design.construction,
        design.kind,
        design.cape_variance,
        design.collusion_threshold,
        hashlib.sha256(np.ascontiguousarray(design.pair_variances).tobytes()).digest(),
        residual_variance,
        delta,
        max_coalition,
    )
    found = _REPORTS.get(key)
    if found is None:
        found = privacy_report(
            design,
            residual_variance=residual_variance,
            sensitivity=1.0,
            delta=delta,
            coalition_sizes=range(1, max_coalition + 1),
        )
        if len(_REPORTS) >= _REPORTS_KEPT:
            _REPORTS.pop(next(iter(_REPORTS)))
        _REPORTS[key] = found
    return found


def _round_spec(
    config: FederationConfig, round_name: str | None, sensitivities: Sequence[TensorSensitivity]
) -> RoundSpec:
    if round_name is not None:
        return config.plan.round(round_name)
    names = [t.name for t in sensitivities]
    for spec in config.plan.rounds:
        if [slot.name for slot in spec.layout] == names:
            return spec
    raise ValueError(f"no round of plan {config.plan.name!r} has the tensors {names}")


def _grid_sensitivity(t: TensorSensitivity, size: int, frac_bits: int) -> TensorSensitivity:
    """Δ_t + √d·2^-F: the sensitivity of the rounded values q(x) the node actually releases.

    Rounding each of d entries to the grid moves it by at most half a unit, so
    two neighbouring datasets' encodings differ by at most 2^F·Δ_t + √d grid
    units in L2 (each entry's difference is at most |2^F·(x − x′)| + 1).
    """
    extra = math.sqrt(size) * math.ldexp(1.0, -frac_bits)
    return TensorSensitivity(
        t.name,
        t.sensitivity + extra,
        f"{t.derivation}; plus √{size}·2^-{frac_bits} = {extra:.3g} for rounding to the grid",
    )


def pinned_stds(
    config: FederationConfig, round_name: str | None, sensitivities: Sequence[TensorSensitivity]
) -> dict[str, int]:
    """S_t for every tensor of the round, as the config pins them (ConfigError if none)."""
    spec = _round_spec(config, round_name, sensitivities)
    if not spec.pinned:
        raise ConfigError(
            f"plan.rounds[{spec.name}].noise_std",
            "missing",
            "the federation config pins no noise scale for this round, so the nodes could not "
            "agree on their draws; make the config with `zerosum federation init`",
        )
    return dict(spec.noise_std)


def plan_release(
    config: FederationConfig,
    participants: Collection[str],
    node_id: str,
    sensitivities: Sequence[TensorSensitivity],
    round_name: str | None = None,
) -> ReleaseNoise:
    """Plan one round's noise for ``node_id`` among ``participants`` (the final roster).

    The noise scale of every tensor is the config's pinned S_t (grid units);
    ``sensitivities`` (from the public bounds, plus the grid's rounding) only
    enter the privacy figures. ``round_name`` names the round (default: the
    first round whose tensors these are).
    """
    if not sensitivities:
        raise ValueError("a release needs at least one tensor")
    privacy = config.privacy
    spec = privacy.noise_design
    ids = sorted(participants)
    if node_id not in ids:
        raise ValueError(f"node {node_id!r} is not among the participants {ids}")
    round_spec = _round_spec(config, round_name, sensitivities)
    pinned = pinned_stds(config, round_spec.name, sensitivities)
    sizes = {slot.name: slot.size for slot in round_spec.layout}
    unknown = [t.name for t in sensitivities if t.name not in pinned]
    if unknown:
        raise ValueError(f"round {round_spec.name!r} has no tensor(s) {unknown}")
    unit = plan_noise(
        ids,
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        sensitivity=1.0,
        construction=spec.construction,
        collusion_threshold=privacy.collusion_threshold,
        residual_dp=privacy.residual_dp,
        graph=spec.graph,
        degree=spec.degree,
    )
    exact = exact_noise(
        unit.design,
        target_variance=unit.target_variance,
        residual_variance=unit.residual_variance,
        residual_dp=privacy.residual_dp,
        collusion_threshold=privacy.collusion_threshold,
    )
    bits = config.fixed_point_bits
    grid = tuple(_grid_sensitivity(t, sizes[t.name], bits) for t in sensitivities)
    # The unit plan's per-egress variance is its target; scale it to S_t·2^-F.
    unit_std = math.sqrt(unit.target_variance)
    scales = {t.name: math.ldexp(pinned[t.name], -bits) / unit_std for t in sensitivities}
    m = len(sensitivities)
    if spec.target_std == "calibrated":
        calibration = (
            f"(ε, δ) = ({privacy.epsilon:g}, {privacy.delta:g}) per release, shared equally by "
            f"its {m} tensors: σ_t = Δ_t·√{m}/μ* with μ* = "
            f"{gaussian_mu(privacy.epsilon, privacy.delta):.6g} (analytic Gaussian mechanism), "
            "Δ_t including the grid's rounding, pinned in the config as S_t = ⌈σ_t·2^F⌉ grid "
            "units; discrete Gaussian noise (Canonne, Kamath & Steinke 2020)"
        )
    else:
        calibration = (
            f"fixed per-node noise std {spec.target_std:g} for every tensor, pinned in the "
            f"config as ⌈σ·2^F⌉ grid units; ε reported at δ = {privacy.delta:g}; discrete "
            "Gaussian noise (Canonne, Kamath & Steinke 2020)"
        )
    return ReleaseNoise(
        node_id=node_id,
        unit=unit,
        tensors=grid,
        scales=scales,
        delta=privacy.delta,
        calibration=calibration,
        collusion_threshold=privacy.collusion_threshold,
        pinned={t.name: pinned[t.name] for t in sensitivities},
        exact=exact,
        sizes={t.name: sizes[t.name] for t in sensitivities},
    )
