"""Differential-privacy accounting for Gaussian noise, per observer.

Exact Gaussian tradeoff. Adding N(0, σ²) to a query of L2 sensitivity Δ is
μ-GDP with μ = Δ/σ, and μ-GDP is (ε, δ)-DP exactly when

    δ(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2)

(the analytic Gaussian mechanism of Balle & Wang, ICML 2018, Theorem 8; in
the GDP form of Dong, Roth & Su, JRSS-B 2022, Corollary 2.13). Both terms are
evaluated in log space (``noise.gaussian_tail.log_ndtr``) and their difference
as log δ = a + log(−expm1(b − a)), so δ far below 1e-300 and ε in the
hundreds stay accurate. ε for a given δ, and the μ that meets a target
(ε, δ), are found by Brent's method on log δ after expanding a bracket
(Brent, *Algorithms for Minimization without Derivatives*, 1973, ch. 4:
inverse quadratic or secant steps, bisection whenever they would not shrink
the bracket fast enough). Both are written with the standard library alone,
so a node does not import scipy to start.

Composition. GDP composes exactly: r rounds of μ_t-GDP mechanisms are
sqrt(Σ μ_t²)-GDP (Dong, Roth & Su 2022, Corollary 3.3).

Correlated noise. An observer who sees y = x + n with n ~ N(0, Σ ⊗ I_d)
(one row per node, d iid coordinates) and wants to learn about node i's
contribution faces a Gaussian mechanism with μ = Δ·sqrt(e_iᵀ Σ⁺ e_i): the
Mahalanobis length of a shift of size Δ along e_i. If e_i has a component
outside range(Σ), that component is observed without noise and μ = ∞.

Observer classes. :class:`Observer` names who is looking: an ``outsider``
(one egress), ``colluders`` (one egress and the secrets of m colluding
nodes), the ``coordinator`` (every egress of a round) or a ``coalition`` (the
coordinator with m colluding nodes). Its ``label`` ("colluders:2") is how
ledgers, receipts and budgets write it.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Real
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from noise.designs import Design, conditional_covariance
from noise.errors import CalibrationError, DesignError, ObserverError
from noise.gaussian_tail import log_ndtr

__all__ = [
    "ENUMERATION_LIMIT",
    "Observer",
    "ObserverKind",
    "ObserverPrivacy",
    "calibrate_sigma",
    "compose_mu",
    "epsilon_for_sigma",
    "gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "observer_mu",
    "privacy_report",
]

ObserverKind = Literal["outsider", "colluders", "coordinator", "coalition"]
_KINDS: tuple[ObserverKind, ...] = ("outsider", "colluders", "coordinator", "coalition")
# Kinds with colluding nodes (size m >= 1); the others have none (size 0).
_GROUPS: tuple[ObserverKind, ...] = ("colluders", "coalition")

#: Coalitions are enumerated exhaustively when there are at most this many.
ENUMERATION_LIMIT = 2000

# e_i counts as inside range(Σ) when its projection residual is below this.
_RANGE_RTOL = 1e-8
# Coalitions whose μ agree to this relative tolerance count as tied.
_TIE_RTOL = 1e-12
_RTOL = 4.0 * np.finfo(np.float64).eps
_MAX_DOUBLINGS = 2100
# Brent's method: absolute tolerance and most steps (it needs far fewer).
_XTOL = 1e-300
_MAX_ITERATIONS = 2000


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise CalibrationError(name, value, "must be a real number")  # type: ignore[arg-type]
    x = float(value)
    if math.isnan(x):
        raise CalibrationError(name, x, "must be a number, not NaN")
    return x


def _positive(name: str, value: object) -> float:
    x = _number(name, value)
    if not (math.isfinite(x) and x > 0.0):
        raise CalibrationError(name, x, "must be finite and > 0")
    return x


def _delta_in_unit_interval(delta: object) -> float:
    d = _number("delta", delta)
    if not 0.0 < d < 1.0:
        raise CalibrationError("delta", d, "must lie strictly between 0 and 1")
    return d


def _log_delta(mu: float, epsilon: float) -> float:
    """log δ(ε; μ) for finite μ > 0 and finite ε >= 0."""
    a = log_ndtr(-epsilon / mu + mu / 2.0)
    if a == -math.inf:
        return -math.inf
    b = epsilon + log_ndtr(-epsilon / mu - mu / 2.0)
    gap = b - a
    if gap >= 0.0:  # only by rounding, when δ is below what doubles resolve
        return -math.inf
    return a + math.log(-math.expm1(gap))


def gaussian_delta(mu: float, epsilon: float) -> float:
    """Smallest δ for which μ-GDP implies (ε, δ)-DP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2).

    Defined for μ >= 0 (μ = ∞ gives δ = 1 and μ = 0 gives δ = 0) and ε >= 0.
    """
    m = _number("mu", mu)
    e = _number("epsilon", epsilon)
    if m < 0.0:
        raise CalibrationError("mu", m, "must be >= 0")
    if e < 0.0:
        raise CalibrationError("epsilon", e, "must be >= 0")
    if m == 0.0 or e == math.inf:
        return 0.0
    if m == math.inf:
        return 1.0
    return math.exp(_log_delta(m, e))


def _expand_up(f: Callable[[float], float], start: float) -> float:
    """Smallest start·2^j with f >= 0 (f increasing)."""
    x = start
    for _ in range(_MAX_DOUBLINGS):
        if f(x) >= 0.0:
            return x
        x *= 2.0
    raise ArithmeticError("bracket expansion did not terminate")  # pragma: no cover


def _expand_down(f: Callable[[float], float], start: float) -> float:
    """Largest start·2^-j with f <= 0 (f increasing)."""
    x = start
    for _ in range(_MAX_DOUBLINGS):
        if f(x) <= 0.0:
            return x
        x /= 2.0
    raise ArithmeticError("bracket expansion did not terminate")  # pragma: no cover


def _root(f: Callable[[float], float], lo: float, hi: float) -> float:
    """A root of ``f`` in [lo, hi], where f(lo) and f(hi) differ in sign (Brent's method).

    Stops once the bracket around the best point b is within
    ``_XTOL + _RTOL·|b|`` of it (at most ``_MAX_ITERATIONS`` steps).
    """
    f_lo, f_hi = f(lo), f(hi)
    if f_lo == 0.0:
        return lo
    if f_hi == 0.0:
        return hi
    if (f_lo < 0.0) == (f_hi < 0.0):
        raise ArithmeticError(f"f({lo}) and f({hi}) have the same sign")
    # b: the best estimate; c: the other end of the bracket; a: the previous b.
    a, f_a = lo, f_lo
    b, f_b = hi, f_hi
    c, f_c = a, f_a
    step = previous_step = b - a
    for _ in range(_MAX_ITERATIONS):
        if (f_b < 0.0) == (f_c < 0.0):
            c, f_c = a, f_a
            step = previous_step = b - a
        if abs(f_c) < abs(f_b):  # keep b the end with the smaller |f|
            a, f_a = b, f_b
            b, f_b = c, f_c
            c, f_c = a, f_a
        tolerance = 0.5 * (_XTOL + _RTOL * abs(b))
        half = 0.5 * (c - b)
        if abs(half) <= tolerance or f_b == 0.0:
            return b
        if abs(previous_step) >= tolerance and abs(f_a) > abs(f_b):
            previous_step, step = _interpolated(
                (a, f_a), (b, f_b), (c, f_c), steps=(step, previous_step), tolerance=tolerance
            )
        else:
            previous_step = step = half
        a, f_a = b, f_b
        b += step if abs(step) > tolerance else math.copysign(tolerance, half)
        f_b = f(b)
    raise ArithmeticError("root finding did not converge")  # pragma: no cover


def _interpolated(
    previous: tuple[float, float],
    best: tuple[float, float],
    other: tuple[float, float],
    *,
    steps: tuple[float, float],
    tolerance: float,
) -> tuple[float, float]:
    """Brent's (previous step, next step) from the points a, b, c and their values.

    The secant through a and b when a is c, inverse quadratic interpolation
    through all three otherwise; the step is taken only if it lands well
    inside the bracket and is less than half the step before last, else a
    bisection.
    """
    (a, f_a), (b, f_b), (c, f_c) = previous, best, other
    step, previous_step = steps
    half = 0.5 * (c - b)
    s = f_b / f_a
    if a == c:
        p, q = 2.0 * half * s, 1.0 - s
    else:
        r_ac, r_bc = f_a / f_c, f_b / f_c
        p = s * (2.0 * half * r_ac * (r_ac - r_bc) - (b - a) * (r_bc - 1.0))
        q = (r_ac - 1.0) * (r_bc - 1.0) * (s - 1.0)
    if p > 0.0:
        q = -q
    p = abs(p)
    if 2.0 * p < min(3.0 * half * q - abs(tolerance * q), abs(previous_step * q)):
        return step, p / q
    return half, half


def gaussian_epsilon(mu: float, delta: float) -> float:
    """Smallest ε >= 0 with δ(ε; μ) <= δ: the (ε, δ) guarantee of μ-GDP.

    μ = ∞ gives ε = ∞ (the observer sees the value exactly); μ = 0 gives 0.
    """
    m = _number("mu", mu)
    if m < 0.0:
        raise CalibrationError("mu", m, "must be >= 0")
    d = _delta_in_unit_interval(delta)
    if m == math.inf:
        return math.inf
    if m == 0.0:
        return 0.0
    target = math.log(d)
    if _log_delta(m, 0.0) <= target:
        return 0.0

    def excess(eps: float) -> float:  # decreasing in ε, so negate
        return target - _log_delta(m, eps)

    hi = _expand_up(excess, max(1.0, m * m / 2.0))
    return _root(excess, 0.0, hi)


def gaussian_mu(epsilon: float, delta: float) -> float:
    """Largest μ for which μ-GDP implies (ε, δ)-DP (solves δ(ε; μ) = δ for μ)."""
    e = _positive("epsilon", epsilon)
    d = _delta_in_unit_interval(delta)
    target = math.log(d)

    def excess(mu: float) -> float:  # increasing in μ
        return _log_delta(mu, e) - target

    hi = _expand_up(excess, 1.0)
    lo = _expand_down(excess, 1.0)
    return _root(excess, lo, hi)


def calibrate_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest σ for which adding N(0, σ²) to a Δ-sensitive query is (ε, δ)-DP: Δ/μ*(ε, δ).

    Tighter than the classic sqrt(2 ln(1.25/δ))·Δ/ε (Dwork & Roth 2014,
    Theorem A.1), and valid for every ε > 0, not only ε < 1.
    """
    delta_s = _positive("sensitivity", sensitivity)
    return delta_s / gaussian_mu(epsilon, delta)


def epsilon_for_sigma(sigma: float, delta: float, sensitivity: float) -> float:
    """ε of the Gaussian mechanism with noise std σ and sensitivity Δ at the given δ."""
    s = _positive("sigma", sigma)
    delta_s = _positive("sensitivity", sensitivity)
    return gaussian_epsilon(delta_s / s, delta)


def compose_mu(mus: Iterable[float]) -> float:
    """GDP composition: sqrt(Σ μ_t²) (Dong, Roth & Su 2022, Corollary 3.3); 0 for none."""
    values = []
    for i, mu in enumerate(mus):
        m = _number(f"mus[{i}]", mu)
        if m < 0.0:
            raise CalibrationError(f"mus[{i}]", m, "must be >= 0")
        values.append(m)
    return math.hypot(*values)


def observer_mu(covariance: NDArray[np.float64], index: int, sensitivity: float) -> float:
    """μ = Δ·sqrt(e_iᵀ Σ⁺ e_i) for an observer whose noise covariance is Σ.

    Σ⁺ is the pseudo-inverse over eigenvalues above K·eps·λ_max (numpy's
    rank rule). If the projection of e_i onto range(Σ) misses e_i by more
    than 1e-8 (relative), node i's contribution has a noiseless component
    and μ = ∞.
    """
    delta_s = _positive("sensitivity", sensitivity)
    sigma = np.asarray(covariance, dtype=np.float64)
    if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1] or sigma.shape[0] == 0:
        raise DesignError(
            "covariance", f"covariance must be a non-empty square matrix; got shape {sigma.shape}"
        )
    if not np.all(np.isfinite(sigma)):
        raise DesignError("covariance", "covariance must be finite")
    k = sigma.shape[0]
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or not 0 <= index < k:
        raise DesignError("index", f"index must be an integer in [0, {k}); got {index!r}")
    eigenvalues, vectors = np.linalg.eigh((sigma + sigma.T) / 2.0)
    largest = float(eigenvalues[-1])
    if largest <= 0.0:
        return math.inf
    kept = eigenvalues > largest * k * np.finfo(np.float64).eps
    row = vectors[index]
    outside = float(np.sum(row[~kept] ** 2))
    if math.sqrt(outside) > _RANGE_RTOL:
        return math.inf
    quadratic = float(np.sum(row[kept] ** 2 / eigenvalues[kept]))
    return delta_s * math.sqrt(quadratic)


@dataclass(frozen=True)
class Observer:
    """An observer class: who looks at a node's releases, with how many colluding nodes.

    ``kind`` is "outsider" (whoever sees one egress: a reviewer, an
    eavesdropper), "colluders" (one egress and the secrets of ``size``
    colluding nodes), "coordinator" (every egress of a round) or "coalition"
    (the coordinator with ``size`` colluding nodes). ``size`` is 0 for the
    first and third and at least 1 for the other two.
    """

    kind: ObserverKind
    size: int = 0

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ObserverError(self.kind, f"is not one of {', '.join(_KINDS)}")
        if isinstance(self.size, bool) or not isinstance(self.size, int):
            raise ObserverError(self.kind, f"needs a whole number of nodes; got {self.size!r}")
        if self.kind in _GROUPS and self.size < 1:
            raise ObserverError(self.kind, f"needs at least 1 colluding node; got {self.size}")
        if self.kind not in _GROUPS and self.size != 0:
            raise ObserverError(self.kind, f"has no colluding nodes; got {self.size}")

    @classmethod
    def named(cls, kind: str, size: int = 0) -> Observer:
        """The observer class of ``kind`` (any string, checked) with ``size`` colluding nodes."""
        for known in _KINDS:
            if kind == known:
                return cls(known, size)
        raise ObserverError(kind, f"is not one of {', '.join(_KINDS)}")

    @classmethod
    def parse(cls, label: str) -> Observer:
        """The class a label names: "outsider", "coordinator", "colluders:m", "coalition:m".

        Only the form :attr:`label` writes is accepted ("colluders:2", never
        "colluders:02"), so that one class has one label.
        """
        if not isinstance(label, str):
            raise ObserverError(label, "must be a string label")
        return _parse_label(label)

    @property
    def label(self) -> str:
        """How ledgers and receipts write the class: "outsider", "coalition:2", …."""
        return f"{self.kind}:{self.size}" if self.kind in _GROUPS else self.kind

    @property
    def sees_every_egress(self) -> bool:
        """True for the coordinator and its coalitions, who see every node's egress."""
        return self.kind in ("coordinator", "coalition")

    @property
    def order(self) -> tuple[int, int]:
        """Sort key: outsider, colluders by size, coordinator, coalitions by size."""
        return (_KINDS.index(self.kind), self.size)

    def describe(self) -> str:
        """The class in words: "an outsider with 1 colluding node", …."""
        nodes = f"{self.size} colluding node{'s' if self.size != 1 else ''}"
        return {
            "outsider": "an outsider",
            "colluders": f"an outsider with {nodes}",
            "coordinator": "the coordinator",
            "coalition": f"the coordinator with {nodes}",
        }[self.kind]


# A ledger repeats a handful of labels thousands of times; each parses once
# (an unknown label raises and is not remembered).
@functools.lru_cache(maxsize=256)
def _parse_label(label: str) -> Observer:
    kind, colon, size = label.partition(":")
    if not colon and kind in _KINDS and kind not in _GROUPS:
        return Observer(kind)
    if colon and kind in _GROUPS and size.isascii() and size.isdigit() and int(size) >= 1:
        observer = Observer(kind, int(size))
        if observer.label == label:
            return observer
    raise ObserverError(
        label, "is not 'outsider', 'coordinator', 'colluders:<m>' or 'coalition:<m>' (m >= 1)"
    )


@dataclass(frozen=True)
class ObserverPrivacy:
    """What one observer class can learn about one node's contributions.

    ``noise_std`` is the per-round standard deviation of the equivalent
    scalar Gaussian mechanism (Δ/μ_round; 0 when μ is infinite); ``mu`` and
    ``epsilon`` hold the total over ``rounds`` identical rounds at ``delta``.
    ``coalition`` lists the colluding nodes behind the reported worst case.
    """

    node_id: str
    observer: ObserverKind
    coalition_size: int
    noise_std: float
    mu: float
    epsilon: float
    delta: float
    rounds: int
    coalition: tuple[str, ...] = ()

    @property
    def observer_class(self) -> Observer:
        """The observer class of this row ("coalition" with its size)."""
        return Observer(self.observer, self.coalition_size)


def _sensitivities(design: Design, sensitivity: float | Mapping[str, float]) -> dict[str, float]:
    if isinstance(sensitivity, Mapping):
        unknown = sorted(set(sensitivity) - set(design.node_ids), key=str)
        if unknown:
            raise DesignError(
                "sensitivity",
                f"sensitivity given for unknown node id {unknown[0]!r}; "
                f"the design's nodes are {list(design.node_ids)}",
            )
        out = {}
        for n in design.node_ids:
            if n not in sensitivity:
                raise CalibrationError(
                    f"sensitivity[{n!r}]", math.nan, "is missing; give every node a sensitivity"
                )
            out[n] = _positive(f"sensitivity[{n!r}]", sensitivity[n])
        return out
    value = _positive("sensitivity", sensitivity)
    return dict.fromkeys(design.node_ids, value)


def _coalition_mu(
    design: Design, node_id: str, coalition: Sequence[str], residual: float, sens: float
) -> float:
    honest, sigma = conditional_covariance(design, coalition, residual)
    return observer_mu(sigma, honest.index(node_id), sens)


def _worst_coalition(
    design: Design, node_id: str, size: int, residual: float, sens: float
) -> tuple[tuple[str, ...], float]:
    """The coalition of ``size`` other nodes that maximises μ against ``node_id``.

    Exhaustive when there are at most ENUMERATION_LIMIT coalitions; otherwise
    greedy (add, one at a time, the colluder that raises μ most), which can
    miss the true worst case: its μ is then a lower bound on the worst μ.
    """
    others = [n for n in design.node_ids if n != node_id]
    if math.comb(len(others), size) <= ENUMERATION_LIMIT:
        best: tuple[tuple[str, ...], float] = ((), -math.inf)
        for combo in itertools.combinations(others, size):
            mu = _coalition_mu(design, node_id, combo, residual, sens)
            # Ties (up to rounding) keep the first coalition in sorted order.
            if mu > best[1] * (1.0 + _TIE_RTOL) or best[1] == -math.inf:
                best = (combo, mu)
                if mu == math.inf:
                    break
        return best
    chosen: list[str] = []
    mu = -math.inf
    for _ in range(size):
        candidates = [n for n in others if n not in chosen]
        mu, pick = -math.inf, candidates[0]
        for c in candidates:
            trial = _coalition_mu(design, node_id, [*chosen, c], residual, sens)
            if trial > mu * (1.0 + _TIE_RTOL) or mu == -math.inf:
                mu, pick = trial, c
        chosen.append(pick)
    return tuple(sorted(chosen)), mu


def _row(
    node_id: str,
    observer: ObserverKind,
    mu_round: float,
    *,
    sens: float,
    delta: float,
    rounds: int,
    coalition: tuple[str, ...] = (),
) -> ObserverPrivacy:
    mu_total = mu_round * math.sqrt(rounds)
    return ObserverPrivacy(
        node_id=node_id,
        observer=observer,
        coalition_size=len(coalition),
        noise_std=0.0 if mu_round == math.inf else sens / mu_round,
        mu=mu_total,
        epsilon=gaussian_epsilon(mu_total, delta),
        delta=delta,
        rounds=rounds,
        coalition=coalition,
    )


def privacy_report(
    design: Design,
    *,
    residual_variance: float,
    sensitivity: float | Mapping[str, float],
    delta: float,
    rounds: int = 1,
    coalition_sizes: Iterable[int] = (),
) -> list[ObserverPrivacy]:
    """Per node: what an outsider, the coordinator and coordinator-plus-coalitions learn.

    * ``outsider`` (a reviewer or eavesdropper seeing one egress): variance
      R_kk + σ_res², μ = Δ_k / sqrt(R_kk + σ_res²).
    * ``coordinator`` (sees every egress): covariance R + σ_res² I. Summing
      the egresses cancels the correlated noise, so along the aggregate
      direction only residual noise is left; without residual noise
      (σ_res² = 0) the coordinator learns the exact sum and μ = ε = ∞.
    * ``coalition`` for each m in ``coalition_sizes``: the coordinator plus
      the worst coalition of m other nodes, using the conditional covariance
      (Schur complement) of :func:`noise.designs.conditional_covariance`;
      "worst" is the largest μ, found by enumeration when there are at most
      ENUMERATION_LIMIT coalitions and greedily otherwise (then a lower bound).

    μ composes over ``rounds`` identical rounds as μ·sqrt(rounds); ε is
    reported at ``delta`` for the composed μ. Rows come node by node (sorted
    ids), each as outsider, coordinator, then the coalitions in the order given.
    """
    res = _number("residual_variance", residual_variance)
    if not (math.isfinite(res) and res >= 0.0):
        raise CalibrationError("residual_variance", res, "must be finite and >= 0")
    d = _delta_in_unit_interval(delta)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise CalibrationError("rounds", rounds, "must be a whole number >= 1")
    k = len(design.node_ids)
    sizes = list(coalition_sizes)
    for m in sizes:
        if isinstance(m, bool) or not isinstance(m, int) or not 1 <= m <= k - 1:
            raise CalibrationError(
                "coalition_sizes",
                m,
                f"each coalition size must be a whole number from 1 to {k - 1} "
                f"(the other nodes of a {k}-node design)",
            )
    sens = _sensitivities(design, sensitivity)
    full = design.covariance()
    full[np.diag_indices(k)] += res
    report: list[ObserverPrivacy] = []
    for i, node in enumerate(design.node_ids):
        s = sens[node]
        outsider_mu = observer_mu(np.array([[design.variance(node) + res]]), 0, s)
        coordinator_mu = observer_mu(full, i, s)
        report.append(_row(node, "outsider", outsider_mu, sens=s, delta=d, rounds=rounds))
        report.append(_row(node, "coordinator", coordinator_mu, sens=s, delta=d, rounds=rounds))
        for m in sizes:
            coalition, mu = _worst_coalition(design, node, m, res, s)
            report.append(
                _row(node, "coalition", mu, sens=s, delta=d, rounds=rounds, coalition=coalition)
            )
    return report
