"""Dropouts at scale: what survivors keep, what the aggregate carries, how often a round fails.

One round with dropouts, as the live protocol runs it (docs/design.md §4.6,
``node.protocol.unmask``, ``node.egress.release``):

1. The design is planned over all K participants: ``noise.policy.plan_noise``
   at unit sensitivity for the per-egress (ε, δ), collusion threshold T, on the
   complete graph or the Harary graph H_{d,K}, with or without CAPE's residual
   split σ_res² = σ_t²/K.
2. Every node drops before uploading, independently with probability r; D is
   the dropped set, S the survivors.
3. The coordinator asks each survivor k for its pair terms with D. Revealing
   them leaves k with

       v_k(D) = Σ_{j∈S, j≠k} c_kj² + σ_res²

   (``noise.designs.remaining_variance(design, D)``), and k refuses when
   v_k(D) < σ_t²(1 − FLOOR_RTOL) — ``node.egress.release.ReleaseNoise.floor_shortfall``,
   the rule a live node applies. The round ends infeasible when any survivor
   refuses, or when fewer than ``MIN_NODES`` survive (the federation's default
   ``min_nodes``).
4. What each survivor keeps. One that answered holds v_k(D) against an
   observer of its egress who also holds the revealed terms (the coordinator;
   counted as the ``outsider`` here, since the revealed terms leave the node),
   and v_k(D) − (the T largest c_kj² over j ∈ S, j ≠ k) once T other survivors
   pool their pair terms as well (``outsider_coalition``; colluding with a
   dropped node adds nothing once its terms are out). One that refused revealed
   nothing: it keeps R_kk + σ_res², and against T colluders the design's
   guarantee (``noise.policy.worst_remaining_variance``). A variance v gives
   μ = Δ/√v and ε = ``noise.accounting.gaussian_epsilon(μ, δ)``; v = 0 gives ε = ∞.
5. The aggregate of a feasible round carries |S|·σ_res²: the survivors' masks
   cancel once D's terms are subtracted, so zero-sum noise leaves 0 without
   residual noise and |S|/K·σ_t² with it.

Baseline (``independent``): every node adds N(0, σ_t²) on its own; a dropout
changes no egress's ε, and the aggregate carries |S|·σ_t².

Vectorised. The pair variances of a design take few distinct values (one for
the complete and Harary designs at a uniform target); with A_ℓ the 0/1 matrix
of pairs at level w_ℓ and X the reps × K matrix of survivors, the counts of
surviving partners per level are X·A_ℓ, so v_k(D) = Σ_ℓ (X·A_ℓ)_k w_ℓ + σ_res²,
and the worst T colluders take partners greedily from the highest level down.
Cost: one (reps × K)·(K × K) product per level — K = 1000 at 200 repetitions
in a fraction of a second.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from node.egress.release import FLOOR_RTOL
from noise.accounting import gaussian_epsilon
from noise.policy import NoisePlan, plan_noise
from simulations.schemes import node_ids
from simulations.seeding import child, generator

__all__ = [
    "DROPOUT_SCHEMES",
    "GRAPHS",
    "MIN_NODES",
    "DropoutParams",
    "SurvivorNoise",
    "dropout_plan",
    "dropout_rows",
    "survivor_noise",
]

DROPOUT_SCHEMES = ("independent", "zerosum", "zerosum+residual")
GRAPHS = ("complete", "harary")

#: Fewest survivors a round may finish with (``FederationConfig.min_nodes``'s default).
MIN_NODES = 2


@dataclass(frozen=True)
class DropoutParams:
    """One point of the dropout scenario: graph, K, dropout rate r, collusion threshold T.

    ``harary_degree`` is d of H_{d,K} for ``graph = "harary"`` and 0 for the
    complete graph.
    """

    graph: str = "complete"
    harary_degree: int = 0
    n_nodes: int = 100
    dropout_rate: float = 0.1
    collusion_threshold: int = 1
    epsilon: float = 1.0
    delta: float = 1e-6


def dropout_plan(params: DropoutParams, residual: bool) -> NoisePlan:
    """The round's design over all K participants (unit sensitivity)."""
    harary = params.graph == "harary"
    return plan_noise(
        node_ids(params.n_nodes),
        epsilon=params.epsilon,
        delta=params.delta,
        sensitivity=1.0,
        construction="pairwise",
        collusion_threshold=params.collusion_threshold,
        residual_dp=residual,
        graph="harary" if harary else "complete",
        degree=params.harary_degree if harary else None,
    )


@dataclass(frozen=True)
class SurvivorNoise:
    """Per repetition (rows) and node (columns); entries of dropped nodes are meaningless.

    ``after_reveal`` is v_k(D); ``answered`` says whether k's floor check
    passed; ``outsider`` and ``coalition`` are the variances k keeps against
    one egress (with the revealed terms) and against T more colluders.
    ``strict`` says whether k would still answer under a stricter rule than
    the live one: the floor kept against D and T colluding survivors together.
    """

    alive: NDArray[np.bool_]
    after_reveal: NDArray[np.float64]
    answered: NDArray[np.bool_]
    strict: NDArray[np.bool_]
    outsider: NDArray[np.float64]
    coalition: NDArray[np.float64]


def _left_after_coalition(
    counts: list[NDArray[np.float64]], levels: NDArray[np.float64], t: int, res: float
) -> NDArray[np.float64]:
    """Σ_ℓ w_ℓ·(n_ℓ − taken_ℓ) + σ_res² when t colluders take the largest pairs first.

    Levels come in decreasing order; counting what is left (rather than
    subtracting what is taken) keeps an emptied egress at exactly σ_res².
    """
    budget = np.full(counts[0].shape, float(t))
    left = np.full(counts[0].shape, res)
    for count, level in zip(counts, levels, strict=True):
        step = np.minimum(count, budget)
        left += (count - step) * level
        budget -= step
    return left


def survivor_noise(
    plan: NoisePlan, alive: NDArray[np.bool_], collusion_threshold: int | None = None
) -> SurvivorNoise:
    """What every node keeps in each repetition, given who survived (``alive``: reps × K).

    The colluders counted are the design's threshold T unless given.
    """
    design = plan.design
    w = design.pair_variances
    res = plan.residual_variance
    floor = plan.target_variance
    t = design.collusion_threshold if collusion_threshold is None else collusion_threshold
    survivors = np.atleast_2d(np.asarray(alive, dtype=np.bool_))
    if survivors.shape[1] != w.shape[0]:
        raise ValueError(
            f"alive must have one column per node ({w.shape[0]}); got shape {survivors.shape}"
        )
    levels = np.unique(w[w > 0.0])[::-1]
    x = survivors.astype(np.float64)
    masks = [(w == level).astype(np.float64) for level in levels]
    # The design is symmetric, so X·A_ℓ counts each node's surviving partners at level ℓ.
    alive_counts = [x @ mask for mask in masks]
    all_counts = [np.broadcast_to(mask.sum(axis=1), x.shape) for mask in masks]
    after = np.full(x.shape, res)
    for count, level in zip(alive_counts, levels, strict=True):
        after += count * level
    full = np.broadcast_to(w.sum(axis=1) + res, x.shape)
    answered = survivors & (after >= floor * (1.0 - FLOOR_RTOL))
    outsider = np.where(answered, after, full)
    revealed_and_t = _left_after_coalition(alive_counts, levels, t, res)
    against_t = np.where(
        answered, revealed_and_t, _left_after_coalition(all_counts, levels, t, res)
    )
    return SurvivorNoise(
        alive=survivors,
        after_reveal=after,
        answered=answered,
        strict=survivors & (revealed_and_t >= floor * (1.0 - FLOOR_RTOL)),
        outsider=outsider,
        coalition=against_t,
    )


class _Epsilons:
    """ε at δ for unit sensitivity and noise variance v, cached by v (few distinct values)."""

    def __init__(self, delta: float) -> None:
        self.delta = delta
        self._cache: dict[float, float] = {}

    def __call__(self, variances: NDArray[np.float64]) -> NDArray[np.float64]:
        distinct, where = np.unique(variances, return_inverse=True)
        values = np.empty(distinct.shape)
        for i, v in enumerate(distinct.tolist()):
            if v not in self._cache:
                self._cache[v] = (
                    math.inf if v <= 0.0 else gaussian_epsilon(1.0 / math.sqrt(v), self.delta)
                )
            values[i] = self._cache[v]
        return values[where].reshape(variances.shape)


def _kept(outsider: NDArray[np.float64], coalition: NDArray[np.float64]) -> dict[str, float]:
    """Worst and mean ε over one round's survivors (NaN when nobody survived)."""
    if outsider.size == 0:
        return dict.fromkeys(_KEPT, math.nan)
    return {
        "epsilon_outsider_max": float(outsider.max()),
        "epsilon_outsider_mean": float(outsider.mean()),
        "epsilon_coalition_max": float(coalition.max()),
        "epsilon_coalition_mean": float(coalition.mean()),
    }


_KEPT = (
    "epsilon_outsider_max",
    "epsilon_outsider_mean",
    "epsilon_coalition_max",
    "epsilon_coalition_mean",
)


def dropout_rows(
    params: DropoutParams, reps: int, root: np.random.SeedSequence
) -> Iterator[dict[str, object]]:
    """Rows per repetition and scheme; repetition r drops nodes from ``child(root, r)``.

    Every scheme of a repetition sees the same dropouts. ``aggregate_noise_var``
    is in units of σ_t² (NaN when the round is infeasible); ``exposed_fraction``
    is the share of survivors left below σ_t² against T colluders;
    ``infeasible_strict`` whether the round would end under the stricter rule
    of :class:`SurvivorNoise` (not what a live node applies).
    """
    k = params.n_nodes
    alive = np.empty((reps, k), dtype=np.bool_)
    for rep in range(reps):
        alive[rep] = generator(child(root, rep)).random(k) >= params.dropout_rate
    epsilons = _Epsilons(params.delta)
    plans = {s: dropout_plan(params, s == "zerosum+residual") for s in DROPOUT_SCHEMES[1:]}
    target = plans["zerosum"].target_variance
    target_epsilon = float(epsilons(np.array([target]))[0])
    kept = {scheme: survivor_noise(plan, alive) for scheme, plan in plans.items()}
    for rep in range(reps):
        row_alive = alive[rep]
        n_survivors = int(row_alive.sum())
        base: dict[str, object] = {
            "rep": rep,
            "dropped": k - n_survivors,
            "survivors": n_survivors,
        }
        # Independent noise: no pair terms to reveal, nothing to refuse.
        feasible = n_survivors >= MIN_NODES
        same = np.full(n_survivors, target_epsilon)
        yield {
            "scheme": "independent",
            **base,
            "refusals": 0,
            "infeasible": int(not feasible),
            "infeasible_strict": int(not feasible),
            "aggregate_noise_var": float(n_survivors) if feasible else math.nan,
            **_kept(same, same),
            "exposed_fraction": 0.0 if n_survivors else math.nan,
        }
        for scheme in DROPOUT_SCHEMES[1:]:
            noise = kept[scheme]
            refusals = int((row_alive & ~noise.answered[rep]).sum())
            feasible = n_survivors >= MIN_NODES and refusals == 0
            strict = n_survivors >= MIN_NODES and bool(noise.strict[rep][row_alive].all())
            residual = plans[scheme].residual_variance
            against_t = noise.coalition[rep][row_alive]
            exposed = against_t < target * (1.0 - FLOOR_RTOL)
            yield {
                "scheme": scheme,
                **base,
                "refusals": refusals,
                "infeasible": int(not feasible),
                "infeasible_strict": int(not strict),
                "aggregate_noise_var": n_survivors * residual / target if feasible else math.nan,
                **_kept(epsilons(noise.outsider[rep][row_alive]), epsilons(against_t)),
                "exposed_fraction": float(exposed.mean()) if n_survivors else math.nan,
            }
