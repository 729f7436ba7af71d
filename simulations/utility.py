"""One repetition of the utility experiment: a federation, every scheme, one model each.

Pipeline per repetition (the one-release plan of ``node.deltab.plan``, noised):

1. Draw K sites and a holdout (``simulations.cohorts``); declare public bounds.
2. The sums round: every node's ``round_tensors("sums", …)`` — uncentred sums
   of its clipped, pre-scaled values — is encoded in fixed point
   (``noise.fixed_point``); the scheme's noise is added per node; the
   aggregator sums, repairs (``simulations.repair``) and centres and solves
   (``node.deltab.uncentred.model_from_sums``). The cohorts are complete, so
   nan_policy "drop" and one release: the session's whole privacy cost.
3. ``seed_fedavg`` instead takes the exact basis and averages noised local
   coefficients (``simulations.seed_fedavg``).
4. Evaluate on the holdout:

   * ``mae_years`` — the brain-age literature's MAE: mean |Ŷ − Y| of the
     model's age prediction Ŷ = Uβ₁ (the "simple" model's brain age, Y + δ₁),
     whatever delta model is configured;
   * ``delta_corr`` — corr(δ̂, δ) of the configured delta model against the
     true deltas, the quantity a brain-age study uses;
   * ``delta_mae_years`` — mean |δ̂ − δ|. With the synthetic cohorts' weak
     signal the noiseless unbiased delta has a larger spread than the true
     delta, so a model wrecked by noise that returns δ̂ ≈ 0 can score *better*
     on this one; read it together with ``delta_corr``;
   * ``param_rel_error`` — relative error of the model's effective
     coefficients against the noiseless pooled fit.

Noise. Tensor t of the round's M tensors has L2 sensitivity Δ_t from the
public bounds (``node.deltab.sums.sensitivity``) and noise scale
s_t = Δ_t·√M/μ*(ε, δ) — the node's calibrated release (``node.egress.release``):
each egress is (ε, δ)-DP against an outsider for the whole round. The unit plan of
``simulations.schemes.unit_plan`` supplies the design; independent noise uses
the per-egress target variance itself.

``aggregate_noise_var`` is the mean over the sums round's entries of
((noisy aggregate − exact aggregate)/s_t)², i.e. the aggregate's noise variance
in units of one egress's target variance: ≈ K for ``independent``, ≈ 1 for
``zerosum+residual`` (CAPE's central level), exactly 0 for ``zerosum``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from node.deltab import stats
from node.deltab.exceptions import DeltabWarning
from node.deltab.fedavg import COEFFICIENTS, model_from_coefficients
from node.deltab.model import BrainAgeModel
from node.deltab.plan import NodeMemory, PlanSettings, round_tensors
from node.deltab.scaling import Bounds
from node.deltab.sums import SUMS, sensitivity
from node.deltab.synthetic import Cohort
from node.deltab.uncentred import model_from_sums
from noise.accounting import gaussian_mu
from noise.fixed_point import FixedPointCodec
from simulations.cohorts import clip_features, make_federation, public_bounds
from simulations.config import UtilityParams
from simulations.egress_noise import independent_fixed, zero_sum_fixed
from simulations.repair import repair_sums
from simulations.schemes import (
    CONSTRUCTIONS,
    SCHEMES,
    Variant,
    declared_privacy,
    effective_collusion_threshold,
    unit_plan,
    variants,
)
from simulations.seed_fedavg import (
    PAGE_TENSORS,
    noised_coefficients,
    page_sensitivity,
    page_sigma,
)
from simulations.seeding import child, generator

__all__ = [
    "DATA_FIELDS",
    "FlatLayout",
    "effective_coefficients",
    "entry_scales",
    "release_noise",
    "utility_rep",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

# The parameters that decide the federation's data (everything else decides noise).
DATA_FIELDS = ("n_nodes", "n_per_node", "n_features", "site_offset_sd", "holdout_size")

# A variant's noise stream is the child at its position in the full list, so
# enabling or disabling other schemes never changes it.
_VARIANT_INDEX = {v: i for i, v in enumerate(variants(SCHEMES, CONSTRUCTIONS))}
_CODEC = FixedPointCodec()


@dataclass(frozen=True)
class FlatLayout:
    """A round's tensors flattened back to back in ``expected_shapes`` order."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, round_name: str, n_features: int) -> FlatLayout:
        shapes = stats.expected_shapes(round_name, n_features)
        return cls(tuple(shapes), tuple(shapes.values()))

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    def flatten(self, tensors: dict[str, FloatArray]) -> FloatArray:
        return np.concatenate(
            [np.asarray(tensors[n], dtype=np.float64).ravel() for n in self.names]
        )

    def unflatten(self, vector: FloatArray) -> dict[str, FloatArray]:
        out: dict[str, FloatArray] = {}
        offset = 0
        for name, shape, size in zip(self.names, self.shapes, self.sizes, strict=True):
            out[name] = vector[offset : offset + size].reshape(shape).copy()
            offset += size
        return out


def entry_scales(layout: FlatLayout, sensitivities: dict[str, float], mu_star: float) -> FloatArray:
    """s_t = Δ_t·√M/μ* repeated over tensor t's entries (M = number of tensors)."""
    m = len(layout.names)
    per_tensor = [sensitivities[n] * math.sqrt(m) / mu_star for n in layout.names]
    return np.repeat(np.array(per_tensor), layout.sizes)


def release_noise(
    variant: Variant,
    *,
    n_nodes: int,
    collusion_threshold: int,
    scales: FloatArray,
    rng: np.random.Generator,
    codec: FixedPointCodec = _CODEC,
) -> IntArray:
    """Every node's noise for one release of ``variant``, in fixed point (K, d) int64."""
    if variant.scheme in ("none", "seed_fedavg"):
        return np.zeros((n_nodes, scales.size), dtype=np.int64)
    if variant.scheme == "independent":
        return independent_fixed(n_nodes, scales, 1.0, rng, codec)
    threshold = effective_collusion_threshold(variant.construction, n_nodes, collusion_threshold)
    plan = unit_plan(variant.construction, n_nodes, threshold, variant.residual)
    masks = zero_sum_fixed(plan.design, scales, rng, codec)
    return masks + independent_fixed(n_nodes, scales, plan.residual_variance, rng, codec)


def _aggregate(contributions: IntArray, noise: IntArray) -> FloatArray:
    """Decode Σ_k (q(x_k) + noise_k) with the protocol's wrapping uint64 sum."""
    egress = (contributions + noise).view(np.uint64)
    return _CODEC.decode(egress.sum(axis=0, dtype=np.uint64))


def effective_coefficients(model: BrainAgeModel, bounds: Bounds) -> FloatArray:
    """The model's delta response to each feature and to age, in years per half-range.

    For the linear models δ̂(x, age) is affine, so the change of δ̂ when one input
    moves by its public half-range from the centre of the bounds is its
    coefficient — a basis-free summary (PCA bases of two fits need not match).
    """
    p = bounds.n_features
    X = np.tile(bounds.feature_centre, (p + 2, 1))
    X[1 : p + 1] += np.diag(bounds.feature_half)
    age = np.full(p + 2, bounds.age_centre)
    age[p + 1] += bounds.age_half
    delta = model.predict_delta(X, age)
    coefficients: FloatArray = delta[1:] - delta[0]
    return coefficients


def _correlation(a: FloatArray, b: FloatArray) -> float:
    da, db = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(da @ da) * float(db @ db))
    return float(da @ db) / denominator if denominator > 0.0 else math.nan


@dataclass(frozen=True)
class _Evaluation:
    mae: float
    corr: float
    delta_mae: float
    rel_error: float


_FAILED = _Evaluation(math.nan, math.nan, math.nan, math.nan)


def _evaluate(
    model: BrainAgeModel, holdout: Cohort, bounds: Bounds, reference: FloatArray
) -> _Evaluation:
    estimate = model.predict_delta(holdout.features, holdout.age)
    configured = model.model
    model.set_params(model="simple")
    try:
        # The simple delta is Ŷ − Y, the age prediction's error.
        age_error = model.predict_delta(holdout.features, holdout.age)
    finally:
        model.set_params(model=configured)
    if not (np.all(np.isfinite(estimate)) and np.all(np.isfinite(age_error))):
        return _FAILED
    theta = effective_coefficients(model, bounds)
    return _Evaluation(
        mae=float(np.mean(np.abs(age_error))),
        corr=_correlation(estimate, holdout.true_delta),
        delta_mae=float(np.mean(np.abs(estimate - holdout.true_delta))),
        rel_error=float(np.linalg.norm(theta - reference) / np.linalg.norm(reference)),
    )


class _Rep:
    """The shared state of one repetition: data, exact contributions, caches."""

    def __init__(
        self,
        params: UtilityParams,
        data_seed: np.random.SeedSequence,
        noise_seed: np.random.SeedSequence,
    ) -> None:
        self.params = params
        self.noise_root = noise_seed
        fed = make_federation(
            n_nodes=params.n_nodes,
            n_per_node=params.n_per_node,
            n_features=params.n_features,
            site_offset_sd=params.site_offset_sd,
            holdout_size=params.holdout_size,
            seed=data_seed,
        )
        self.sites = fed.sites
        self.holdout = fed.holdout
        self.bounds = public_bounds(fed.population, params.site_offset_sd)
        self.settings = PlanSettings(
            model=params.model,
            feature_proportion=params.feature_proportion or None,
            bounds=self.bounds,
        )
        self.mu_star = gaussian_mu(params.epsilon, params.delta)
        self.layout = FlatLayout.of(SUMS, params.n_features)
        self.sums = self._encode()
        self.scales = entry_scales(self.layout, sensitivity(SUMS, self.bounds), self.mu_star)
        pooled_x = np.vstack([s.features for s in self.sites])
        pooled_age = np.concatenate([s.age for s in self.sites])
        pooled_x, pooled_age = clip_features(pooled_x, pooled_age, self.bounds)
        reference = BrainAgeModel(
            params.model, feature_proportion=params.feature_proportion or None, nan_policy="drop"
        ).fit(pooled_x, pooled_age)
        self.reference_theta = effective_coefficients(reference, self.bounds)
        self.reference = _evaluate(reference, self.holdout, self.bounds, self.reference_theta)
        self._exact_model: BrainAgeModel | None = None

    def _encode(self) -> IntArray:
        """Every node's sums contribution in fixed point, (K, d) int64."""
        rows = []
        for site in self.sites:
            state = NodeMemory(settings=self.settings)
            tensors = round_tensors(SUMS, site.features, site.age, state)
            rows.append(_CODEC.encode_scaled_int(self.layout.flatten(tensors), tensor=SUMS))
        return np.stack(rows)

    def solve(self, aggregate: Mapping[str, FloatArray]) -> BrainAgeModel:
        """The model from a (repaired) sums aggregate."""
        return model_from_sums(aggregate, self.bounds, **self.settings.model_params())

    def exact_model(self) -> BrainAgeModel:
        """The noiseless federated model (the shared basis of ``seed_fedavg``)."""
        if self._exact_model is None:
            exact = _aggregate(self.sums, np.zeros_like(self.sums))
            self._exact_model = self.solve(self.layout.unflatten(exact))
        return self._exact_model


def _statistics_variant(
    rep: _Rep, variant: Variant, rng: np.random.Generator
) -> tuple[BrainAgeModel | None, float, int]:
    """One noised release of ``variant``; the model (None if unsolvable), noise ratio, repairs."""
    p = rep.params
    noise = release_noise(
        variant,
        n_nodes=p.n_nodes,
        collusion_threshold=p.collusion_threshold,
        scales=rep.scales,
        rng=rng,
    )
    noisy = _aggregate(rep.sums, noise)
    exact = _aggregate(rep.sums, np.zeros_like(noise))
    ratio = float(np.mean(((noisy - exact) / rep.scales) ** 2))
    repaired, raised = repair_sums(rep.layout.unflatten(noisy))
    try:
        model = rep.solve(repaired)
    except ValueError:
        return None, ratio, raised
    return model, ratio, raised


def _seed_fedavg_variant(
    rep: _Rep, rng: np.random.Generator
) -> tuple[BrainAgeModel | None, float, int]:
    """Exact basis, then the page's noised coefficients averaged by N."""
    p = rep.params
    basis = rep.exact_model()
    sent = []
    per_egress = []
    noise_sum: FloatArray | None = None
    for site in rep.sites:
        state = NodeMemory(settings=rep.settings, model=basis)
        exact = round_tensors(COEFFICIENTS, site.features, site.age, state)
        sigma = page_sigma(page_sensitivity(basis, site.features, rep.bounds), p.epsilon, p.delta)
        noised = noised_coefficients(exact, sigma, rng)
        sent.append(noised)
        n = float(exact["n"])
        per_egress.append((n * sigma) ** 2)
        diff = np.concatenate([(noised[t] - exact[t]).ravel() for t in PAGE_TENSORS])
        noise_sum = diff if noise_sum is None else noise_sum + diff
    assert noise_sum is not None
    ratio = float(np.mean(noise_sum**2) / np.mean(per_egress))
    try:
        model = model_from_coefficients(stats.combine(sent), basis)
    except ValueError:
        return None, ratio, 0
    return model, ratio, 0


def utility_rep(
    params: UtilityParams,
    chosen: Sequence[Variant],
    data_seed: np.random.SeedSequence,
    noise_seed: np.random.SeedSequence,
) -> list[dict[str, object]]:
    """One row per variant: utility, aggregate noise and the declared per-egress privacy.

    ``data_seed`` draws the federation and ``noise_seed`` the noise (one child
    per variant). The sweep gives cells that differ only in privacy parameters
    the same data seeds — common random numbers — so curves along ε or δ compare
    the schemes on the same federations.
    """
    with warnings.catch_warnings():
        # Heavily noised aggregates make the solve drop features or the quadratic
        # term; that is the utility loss being measured, not a fault.
        warnings.simplefilter("ignore", DeltabWarning)
        rep = _Rep(params, data_seed, noise_seed)
        rows = []
        for variant in chosen:
            rng = generator(child(rep.noise_root, _VARIANT_INDEX[variant]))
            if variant.scheme == "seed_fedavg":
                model, ratio, raised = _seed_fedavg_variant(rep, rng)
            else:
                model, ratio, raised = _statistics_variant(rep, variant, rng)
            result = (
                _FAILED
                if model is None
                else _evaluate(model, rep.holdout, rep.bounds, rep.reference_theta)
            )
            privacy = declared_privacy(
                variant,
                n_nodes=params.n_nodes,
                epsilon=params.epsilon,
                delta=params.delta,
                collusion_threshold=params.collusion_threshold,
                coalition_size=params.coalition_size,
                seed_fedavg_tensors=len(PAGE_TENSORS),
            )
            rows.append(
                {
                    "scheme": variant.scheme,
                    "construction": variant.construction,
                    "mae_years": result.mae,
                    "delta_corr": result.corr,
                    "param_rel_error": result.rel_error,
                    "delta_mae_years": result.delta_mae,
                    "aggregate_noise_var": ratio,
                    "egress_epsilon_outsider": privacy["outsider"].epsilon,
                    "egress_epsilon_coordinator": privacy["coordinator"].epsilon,
                    "egress_epsilon_coalition": privacy["coalition"].epsilon,
                    "egress_epsilon_outsider_coalition": privacy["outsider_coalition"].epsilon,
                    "egress_mu_outsider": privacy["outsider"].mu,
                    "egress_mu_coordinator": privacy["coordinator"].mu,
                    "egress_mu_coalition": privacy["coalition"].mu,
                    "egress_mu_outsider_coalition": privacy["outsider_coalition"].mu,
                    "effective_collusion_threshold": effective_collusion_threshold(
                        variant.construction, params.n_nodes, params.collusion_threshold
                    ),
                    "fit_ok": int(model is not None and math.isfinite(result.mae)),
                    "repaired_eigenvalues": raised,
                    "reference_mae_years": rep.reference.mae,
                    "reference_delta_corr": rep.reference.corr,
                }
            )
        return rows
