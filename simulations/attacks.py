"""Membership inference against one node's release, per observer class, next to the DP bound.

Game. Node 0 releases its sums-round sums s = s⁻ + b·v plus its scheme's
noise, where s⁻ is its data without the target subject, v the target's own
contribution, and b ∈ {0, 1} whether the target is in. The attacker knows
everything except b (Nasr et al. 2021, "Adversary instantiation: lower bounds
for differentially private machine learning", IEEE S&P): s⁻ and v for every
node, the design, the noise scales, and whatever its observer class sees —

* ``outsider``: node 0's egress alone;
* ``coordinator``: every node's egress of the round;
* ``outsider_coalition`` of m: node 0's egress plus the secrets of nodes 1…m
  (their pair terms, or for CAPE their own draws ê_j and the secure sum Σê);
* ``coalition`` of m: the coordinator plus the secrets of nodes 1…m.

What the coalition can subtract is computed from the simulated latent draws
(``simulations.egress_noise``), not assumed; the attacker's covariance is the
accounting's own ``noise.designs.conditional_covariance``. A test checks the
two agree.

Test. With observations o − s⁻ = b·v⊗e_0 + n and n ~ N(0, Σ ⊗ diag(s²)), the
Neyman–Pearson most powerful test thresholds the log-likelihood ratio, which
is affine in T = Σ_e (v_e/s_e²)·e_0ᵀΣ⁺(o_e − s⁻_e). T is Gaussian with
separation μ_v = sqrt(Σ_e v_e²/s_e² · e_0ᵀΣ⁺e_0) ≤ μ_declared. When e_0 is
not in range(Σ) (zero-sum noise without residual, seen by the coordinator)
the component of e_0 outside the range is observed without noise and T
separates the hypotheses exactly.

Bounds reported next to the empirical rates (FPR α, TPR β):

* μ-GDP: β ≤ Φ(Φ⁻¹(α) + μ) and AUC ≤ Φ(μ/√2) (Dong, Roth & Su 2022, JRSS-B);
* (ε, δ)-DP: β ≤ min(e^ε α + δ, 1 − e^{−ε}(1 − δ − α)) (Kairouz, Oh &
  Viswanath 2015, ICML, Theorem 2.1).

Empirical rates carry Clopper–Pearson intervals (``simulations.roc``);
``within_bound`` is false only if the TPR's lower 99.9 % limit exceeds the
bound evaluated at the FPR's upper 99.9 % limit — a violation beyond sampling
error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy.special import ndtr

from node.deltab.plan import NodeMemory, PlanSettings, round_tensors
from node.deltab.sums import SUMS, sensitivity
from noise.accounting import gaussian_mu
from noise.designs import conditional_covariance
from simulations.cohorts import make_federation, public_bounds, worst_case_subject
from simulations.config import AttackParams
from simulations.egress_noise import draw_zero_sum
from simulations.roc import FPR_LEVELS, dp_tpr_bound, gdp_tpr_bound, roc_summary
from simulations.schemes import (
    CONSTRUCTIONS,
    Variant,
    declared_privacy,
    effective_collusion_threshold,
    unit_plan,
    variants,
)
from simulations.seeding import child, generator
from simulations.utility import FlatLayout, entry_scales

__all__ = [
    "ATTACK_SCHEMES",
    "View",
    "likelihood_ratio_scores",
    "membership_attack",
    "observer_view",
    "target_mu",
]

FloatArray = NDArray[np.float64]

ATTACK_SCHEMES = ("none", "independent", "zerosum", "zerosum+residual")
_CHUNK = 500


@dataclass(frozen=True, eq=False)
class View:
    """What one observer holds: the noise left on each observed egress, and its covariance."""

    observer: str
    coalition_size: int
    noise: FloatArray  # (trials, n_observed, d), unit scale
    covariance: FloatArray  # (n_observed, n_observed), unit scale
    target: int  # index of node 0 among the observed nodes


def _single(observer: str) -> bool:
    return observer in ("outsider", "outsider_coalition")


def observer_view(
    variant: Variant,
    observer: str,
    coalition_size: int,
    *,
    n_nodes: int,
    collusion_threshold: int,
    trials: int,
    size: int,
    rng: np.random.Generator,
) -> View:
    """Draw ``trials`` releases of ``variant``'s unit noise and reduce them to ``observer``'s view.

    Observers: ``outsider`` (node 0's egress), ``outsider_coalition`` (node 0's
    egress and the secrets of nodes 1…m), ``coordinator`` (every egress) and
    ``coalition`` (every egress and the secrets of nodes 1…m).
    """
    m = coalition_size if observer in ("coalition", "outsider_coalition") else 0
    honest = [0] if _single(observer) else [0, *range(1 + m, n_nodes)]
    if variant.scheme == "none":
        zeros = np.zeros((trials, len(honest), size))
        return View(observer, m, zeros, np.zeros((len(honest), len(honest))), 0)
    if variant.scheme == "independent":
        draws = rng.standard_normal((trials, n_nodes, size))
        return View(observer, m, draws[:, honest], np.eye(len(honest)), 0)
    threshold = effective_collusion_threshold(variant.construction, n_nodes, collusion_threshold)
    plan = unit_plan(variant.construction, n_nodes, threshold, variant.residual)
    design, res = plan.design, plan.residual_variance
    draw = draw_zero_sum(design, size, rng, batch=(trials,), latents=True)
    residual = math.sqrt(res) * rng.standard_normal((trials, n_nodes, size))
    if observer == "outsider":
        var = design.variance(design.node_ids[0]) + res
        return View(observer, 0, draw.noise[:, :1] + residual[:, :1], np.array([[var]]), 0)
    coalition = design.node_ids[1 : 1 + m]
    remaining = [0, *range(1 + m, n_nodes)]
    if design.construction == "cape":
        assert draw.node_draws is not None
        # The coalition knows Σê (secure sum) and its own ê_j, hence Σ_H ê_h; given
        # that sum the honest ê_H have mean Σ_H ê_h / n_H.
        own = draw.node_draws[:, remaining]
        known = own - own.mean(axis=1, keepdims=True)
    else:
        assert draw.edges is not None and draw.edge_draws is not None
        edges = draw.edges
        in_coalition = np.zeros(n_nodes, dtype=bool)
        in_coalition[1 : 1 + m] = True
        touched = in_coalition[edges.first] | in_coalition[edges.second]
        incidence = edges.incidence[:, touched].toarray()
        pooled = np.einsum("ke,ted->tkd", incidence, draw.edge_draws[:, touched])
        known = (draw.noise - pooled)[:, remaining]
    ids, sigma = conditional_covariance(design, coalition, res)
    if list(ids) != [design.node_ids[i] for i in remaining]:
        raise AssertionError("the coalition's honest set disagrees with the accounting's")
    noise = known + residual[:, remaining]
    if _single(observer):
        return View(observer, m, noise[:, :1], sigma[:1, :1], 0)
    return View(observer, m, noise, sigma, 0)


def likelihood_ratio_scores(
    view: View, signal: FloatArray, scales: FloatArray, member: bool
) -> FloatArray:
    """T for every trial of ``view`` (see the module docstring); ``signal`` is v, (d,)."""
    observed = view.noise * scales  # real-scale noise on every observed egress
    if member:
        observed = observed.copy()
        observed[:, view.target] += signal
    weights = signal / scales**2
    sigma = view.covariance
    n = sigma.shape[0]
    values, vectors = np.linalg.eigh((sigma + sigma.T) / 2.0)
    largest = float(values[-1]) if n else 0.0
    kept = values > largest * n * np.finfo(np.float64).eps if largest > 0.0 else np.zeros(n, bool)
    row = vectors[view.target]
    inside = vectors[:, kept] @ (row[kept] / values[kept]) if kept.any() else np.zeros(n)
    outside = vectors[:, ~kept] @ row[~kept]
    # A noiseless direction, if any, separates the hypotheses exactly: project on it.
    direction = outside if math.sqrt(float(outside @ outside)) > 1e-8 else inside
    scores: FloatArray = np.einsum("tod,o,d->t", observed, direction, weights)
    return scores


def target_mu(view: View, signal: FloatArray, scales: FloatArray) -> float:
    """μ_v of this target against this observer (∞ when part of e_0 is noiseless)."""
    sigma = view.covariance
    values, vectors = np.linalg.eigh((sigma + sigma.T) / 2.0)
    n = sigma.shape[0]
    largest = float(values[-1])
    if largest <= 0.0:
        return math.inf
    kept = values > largest * n * np.finfo(np.float64).eps
    row = vectors[view.target]
    if math.sqrt(float(np.sum(row[~kept] ** 2))) > 1e-8:
        return math.inf
    quadratic = float(np.sum(row[kept] ** 2 / values[kept]))
    return math.sqrt(float(np.sum(signal**2 / scales**2)) * quadratic)


def _attack_variants() -> tuple[Variant, ...]:
    return variants(ATTACK_SCHEMES, CONSTRUCTIONS)


def membership_attack(
    params: AttackParams, seed: np.random.SeedSequence
) -> list[dict[str, object]]:
    """One row per (variant, observer): empirical TPR/FPR/AUC next to the declared bounds."""
    fed = make_federation(
        n_nodes=params.n_nodes,
        n_per_node=params.n_per_node,
        n_features=params.n_features,
        site_offset_sd=params.site_offset_sd,
        holdout_size=0,
        seed=child(seed, 0),
    )
    bounds = public_bounds(fed.population, params.site_offset_sd)
    layout = FlatLayout.of(SUMS, params.n_features)
    target_x, target_age = worst_case_subject(bounds)
    state = NodeMemory(settings=PlanSettings(bounds=bounds))
    signal = layout.flatten(
        round_tensors(SUMS, target_x[np.newaxis], np.array([target_age]), state)
    )
    mu_star = gaussian_mu(params.epsilon, params.delta)
    scales = entry_scales(layout, sensitivity(SUMS, bounds), mu_star)
    sizes = [m for m in params.coalition_sizes if m <= params.n_nodes - 1]
    observers = [("outsider", 0)] + [("outsider_coalition", m) for m in sizes]
    observers += [("coordinator", 0)] + [("coalition", m) for m in sizes]
    rows: list[dict[str, object]] = []
    for vi, variant in enumerate(_attack_variants()):
        for oi, (observer, m) in enumerate(observers):
            rng = generator(child(child(seed, 1), vi * 1000 + oi))
            null_parts: list[FloatArray] = []
            member_parts: list[FloatArray] = []
            view = None
            for start in range(0, params.trials, _CHUNK):
                count = min(_CHUNK, params.trials - start)
                for member, parts in ((False, null_parts), (True, member_parts)):
                    view = observer_view(
                        variant,
                        observer,
                        m,
                        n_nodes=params.n_nodes,
                        collusion_threshold=params.collusion_threshold,
                        trials=count,
                        size=signal.size,
                        rng=rng,
                    )
                    parts.append(likelihood_ratio_scores(view, signal, scales, member))
            assert view is not None
            summary = roc_summary(np.concatenate(null_parts), np.concatenate(member_parts))
            privacy = declared_privacy(
                variant,
                n_nodes=params.n_nodes,
                epsilon=params.epsilon,
                delta=params.delta,
                collusion_threshold=params.collusion_threshold,
                coalition_size=max(m, 1),
            )
            declared = privacy[observer]
            mu_v = target_mu(view, signal, scales)
            row: dict[str, object] = {
                "scheme": variant.scheme,
                "construction": variant.construction,
                "observer": observer,
                "coalition_size": m,
                "mu_declared": declared.mu,
                "epsilon_declared": declared.epsilon,
                "mu_target": mu_v,
                "auc": summary.auc,
                "auc_lo": summary.auc_lo,
                "auc_hi": summary.auc_hi,
                "auc_bound": 1.0
                if math.isinf(declared.mu)
                else float(ndtr(declared.mu / math.sqrt(2))),
                "advantage": summary.advantage,
            }
            within = summary.auc_lo <= float(row["auc_bound"])  # type: ignore[arg-type]
            for level, f, t, fhi, tlo, thi in zip(
                FPR_LEVELS,
                summary.fpr,
                summary.tpr,
                summary.fpr_hi,
                summary.tpr_lo,
                summary.tpr_hi,
                strict=True,
            ):
                tag = f"{round(level * 100)}"
                gdp = gdp_tpr_bound(fhi, declared.mu)
                dp = dp_tpr_bound(fhi, declared.epsilon, params.delta)
                row |= {
                    f"fpr_{tag}": f,
                    f"tpr_{tag}": t,
                    f"tpr_{tag}_lo": tlo,
                    f"tpr_{tag}_hi": thi,
                    f"tpr_{tag}_expected": gdp_tpr_bound(f, mu_v),
                    f"tpr_{tag}_bound_gdp": gdp_tpr_bound(f, declared.mu),
                    f"tpr_{tag}_bound_dp": dp_tpr_bound(f, declared.epsilon, params.delta),
                }
                within = within and tlo <= min(gdp, dp) + 1e-12
            row["within_bound"] = int(within)
            rows.append(row)
    return rows
