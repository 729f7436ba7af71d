"""Every variance a node draws with, as an exact fraction of the pinned scale.

The federation config pins, per round and tensor t, the per-egress noise
standard deviation S_t in grid units (an integer: σ_t·2^F rounded up, computed
once by ``zerosum federation init``). A noise design spends S_t² by rules that
involve only whole numbers — the number of nodes K, each node's degree d_k in
the pair graph and the collusion threshold T — so every node can turn S_t²
into its draws' variances in rational arithmetic, bit for bit the same on every
installation:

* residual noise on (the aggregate is itself private): σ_res² = S²/K per node
  (CAPE's split, Imtiaz, Mohammadi & Sarwate 2019), and the zero-sum part
  supplies the rest, S²·(1 − 1/K); off: σ_res² = 0 and the zero-sum part is S²;
* pairwise designs (complete or Harary graph, one target for every node):
  c_ij² = (zero-sum part)/(min(d_i, d_j) − T), which any T colluders leave at
  least the target on every egress (``noise.designs``);
* CAPE: τ² = (zero-sum part)·(K − T)/(K − T − 1), since a coalition of T leaves
  τ²(1 − 1/(K − T)).

These are the rules of ``noise.policy.plan_noise`` and ``noise.designs``;
:func:`exact_noise` reads the graph and K from a planned design and checks that
its floating-point variances agree with the fractions, so the two descriptions
cannot drift apart. A design with explicit pair variances has no such rule and
is refused here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction

from noise.designs import Design
from noise.errors import InfeasibleDesignError

__all__ = ["ExactNoise", "exact_noise"]

# How far a planned float variance may sit from its exact fraction (rounding only).
_AGREEMENT_RTOL = 1e-9


@dataclass(frozen=True)
class ExactNoise:
    """Rational weights: each variance is weight × S² for a tensor pinned at S grid units."""

    construction: str
    node_ids: tuple[str, ...]
    residual_weight: Fraction
    cape_weight: Fraction = Fraction(0)
    pair_weights: Mapping[tuple[str, str], Fraction] = field(default_factory=dict)

    def pair_weight(self, a: str, b: str) -> Fraction:
        """c_ab²/S² (0 when a and b share no pair term)."""
        return self.pair_weights.get((min(a, b), max(a, b)), Fraction(0))

    def pair_variance(self, a: str, b: str, std_units: int) -> Fraction:
        """c_ab² in grid units² for a tensor whose pinned scale is ``std_units``."""
        return self.pair_weight(a, b) * std_units * std_units

    def cape_variance(self, std_units: int) -> Fraction:
        """τ² in grid units²."""
        return self.cape_weight * std_units * std_units

    def residual_variance(self, std_units: int) -> Fraction:
        """σ_res² in grid units² (0 when residual noise is off)."""
        return self.residual_weight * std_units * std_units

    def with_nodes(self, node_ids: tuple[str, ...]) -> ExactNoise:
        """The same weights over fewer nodes (a CAPE rerun keeps τ² and σ_res²)."""
        kept = {pair: w for pair, w in self.pair_weights.items() if set(pair) <= set(node_ids)}
        return ExactNoise(
            self.construction, tuple(node_ids), self.residual_weight, self.cape_weight, kept
        )


def _agree(planned: float, exact: Fraction, what: str) -> None:
    if abs(planned - float(exact)) > _AGREEMENT_RTOL * max(abs(planned), float(exact)):
        raise InfeasibleDesignError(
            None,
            f"{what}: the planned variance {planned!r} is not the exact rule's {float(exact)!r}",
        )


def exact_noise(
    design: Design,
    *,
    target_variance: float,
    residual_variance: float,
    residual_dp: bool,
    collusion_threshold: int,
) -> ExactNoise:
    """The exact weights of a design planned by ``noise.policy.plan_noise``.

    ``target_variance`` and ``residual_variance`` are the plan's (at any
    scale): they only serve to check that the design's float variances are
    the fractions' (see the module docstring).
    """
    ids = design.node_ids
    k = len(ids)
    residual = Fraction(1, k) if residual_dp else Fraction(0)
    correlated = 1 - residual
    _agree(residual_variance, residual * Fraction(target_variance), "residual noise")
    if design.construction == "cape":
        honest = k - collusion_threshold
        if honest < 2:
            raise InfeasibleDesignError(
                None, f"CAPE among {k} nodes with collusion threshold {collusion_threshold}"
            )
        weight = correlated * Fraction(honest, honest - 1)
        _agree(design.cape_variance, weight * Fraction(target_variance), "CAPE draw")
        return ExactNoise("cape", ids, residual, cape_weight=weight)
    if design.kind not in ("complete", "harary"):
        raise InfeasibleDesignError(
            None,
            f"a {design.kind!r} design has no exact rule for its pair variances; the config "
            "can pin only complete and Harary designs",
        )
    threshold = design.collusion_threshold
    adjacency = design.pair_variances > 0.0
    degree = {n: int(row.sum()) for n, row in zip(ids, adjacency, strict=True)}
    pairs: dict[tuple[str, str], Fraction] = {}
    for i, a in enumerate(ids):
        for j in range(i + 1, k):
            if not adjacency[i, j]:
                continue
            b = ids[j]
            weight = correlated / (min(degree[a], degree[b]) - threshold)
            _agree(
                float(design.pair_variances[i, j]),
                weight * Fraction(target_variance),
                f"pair {a!r}–{b!r}",
            )
            pairs[(a, b)] = weight
    return ExactNoise("pairwise", ids, residual, pair_weights=pairs)
