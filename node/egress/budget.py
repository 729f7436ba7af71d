"""The ε budget against every observer class the policy names, for a release and a session.

``privacy.epsilon_budget`` caps the composed ε this node's data may reach,
across every session recorded in its ledger (``node.records.ledger``), against each
observer class the policy bounds:

* ``outsider`` — whoever sees one egress (a reviewer, an eavesdropper);
* ``colluders:m`` for m = 1..T — an outsider holding one egress together
  with the secrets of m colluding nodes (T = ``privacy.collusion_threshold``);
* with residual noise on (``privacy.residual_dp``), ``coordinator`` — every
  egress of a round — and ``coalition:m`` — the coordinator with m colluding
  nodes.

Without residual noise the coordinator adds up the egresses and learns the
exact sums, by design (docs/design.md §5): μ = ∞ for ``coordinator`` and
``coalition:m``. Those classes are not held to the cap; a refusal lists them.

Each release's μ per class comes from ``node.egress.release.ReleaseNoise.mu``;
releases compose as μ = sqrt(Σ μ_r²) and ε is read off the Gaussian tradeoff
at the ledger's δ (Dong, Roth & Su 2022, Corollary 3.3; Balle & Wang 2018).
:func:`session_cost` gives the μ of each of a session's plan rounds among its
participants; :func:`over_budget` composes prospective releases with the
ledger and returns every checked class above the cap.

An unmask answer with pair terms is a release too: it raises the μ of the
round's release for the coalition classes (``ReleaseNoise.mu_after_unmask``).
:func:`reveal_excess` composes the ledger with the release raised that way
and returns every checked class that would pass the cap — an unbounded class
(μ = ∞, no noise left against it) always does — so that the node refuses
before the answer is recorded or sent (docs/design.md §4.6).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from node.egress.release import plan_release
from node.plans.interface import TensorSensitivity
from node.records.ledger import ObserverTotal, PrivacyLedger, observer_of
from noise.accounting import Observer, compose_mu, gaussian_epsilon
from proto.federation import FederationConfig

__all__ = [
    "BUDGET_RTOL",
    "ClassExcess",
    "checked",
    "describe",
    "excess_sentence",
    "one_session",
    "over_budget",
    "reveal_excess",
    "reveal_sentence",
    "session_cost",
    "standalone_totals",
    "unbounded_note",
]

# Relative slack of the budget comparison: a cost that meets the cap exactly
# in exact arithmetic must not be refused for a rounding error.
BUDGET_RTOL = 1e-12


def checked(label: str, residual_dp: bool) -> bool:
    """Whether observer class ``label`` is held to the cap (see the module docstring)."""
    return residual_dp or not observer_of(label).sees_every_egress


def describe(label: str) -> str:
    """The observer class in words: "an outsider with 1 colluding node", …."""
    return observer_of(label).describe()


def session_cost(
    config: FederationConfig,
    participants: Collection[str],
    node_id: str,
    rounds: Mapping[str, Sequence[TensorSensitivity]],
) -> dict[str, dict[str, float]]:
    """μ per observer class of each plan round (by name) of one session among ``participants``.

    Each round is planned as ``node.egress.release.plan_release`` plans it when it
    opens with these participants; under CAPE that is the model round (its
    secure-sum round releases no data).
    """
    return {
        name: plan_release(config, participants, node_id, sensitivities, name).mu()
        for name, sensitivities in rounds.items()
    }


def one_session(
    config: FederationConfig,
    rounds: Mapping[str, Sequence[TensorSensitivity]],
    *,
    laplace: Sequence[float] = (),
) -> tuple[ObserverTotal, ...]:
    """One full session's composed cost per observer class, the worst over the nodes.

    Every node of the federation takes part and every plan round in
    ``rounds`` is released ``session.max_reruns`` + 1 times (the worst case
    the rerun cap allows: every attempt but the last superseded), and each
    Laplace release in ``laplace`` (ε, seen by every class; the delta
    summary) once: what the first session may cost a node whose ledger is
    empty.
    """
    attempts = config.session.max_reruns + 1
    worst: dict[str, ObserverTotal] = {}
    for node_id in config.node_ids:
        costs = session_cost(config, config.node_ids, node_id, rounds)
        releases = [mu for mu in costs.values() for _ in range(attempts)]
        for total in standalone_totals(releases, config.privacy.delta):
            if total.label not in worst or total.mu > worst[total.label].mu:
                worst[total.label] = total
    pure = math.fsum(laplace)
    if not laplace:
        return tuple(worst.values())
    if not worst:
        worst["outsider"] = ObserverTotal(Observer("outsider"), 0.0, 0.0, config.privacy.delta, 0)
    return tuple(
        ObserverTotal(
            t.observer,
            t.mu,
            t.epsilon + pure,
            t.delta,
            t.releases + len(laplace),
            laplace_epsilon=pure,
        )
        for t in worst.values()
    )


@dataclass(frozen=True)
class ClassExcess:
    """A checked observer class whose composed ε would pass the cap."""

    observer: Observer
    epsilon: float
    releases: int
    before_epsilon: float  # what the ledger holds against the class already
    before_releases: int

    @property
    def label(self) -> str:
        """The class as the ledger writes it ("colluders:1")."""
        return self.observer.label


def standalone_totals(
    releases: Sequence[Mapping[str, float]], delta: float
) -> tuple[ObserverTotal, ...]:
    """Composed totals of ``releases`` alone (no ledger), per observer class."""
    labels: list[str] = []
    for mu in releases:
        labels.extend(label for label in mu if label not in labels)
    out = []
    for label in labels:
        mus = [mu[label] for mu in releases if label in mu]
        total = math.inf if any(math.isinf(m) for m in mus) else compose_mu(mus)
        out.append(
            ObserverTotal(
                observer_of(label), total, gaussian_epsilon(total, delta), delta, len(mus)
            )
        )
    return tuple(out)


def over_budget(
    ledger: PrivacyLedger,
    releases: Sequence[Mapping[str, float]],
    *,
    budget: float,
    residual_dp: bool,
    laplace: Sequence[float] = (),
) -> list[ClassExcess]:
    """Every checked class whose total with ``releases`` added would exceed ``budget``.

    ``laplace``: the ε of prospective Laplace releases (a delta summary), which
    every observer class sees.
    """
    before = {t.label: t for t in ledger.totals()}
    out = []
    for total in ledger.totals(extras=releases, laplace=laplace):
        if not checked(total.label, residual_dp):
            continue
        if total.epsilon > budget * (1.0 + BUDGET_RTOL):
            prior = before.get(total.label)
            out.append(
                ClassExcess(
                    observer=total.observer,
                    epsilon=total.epsilon,
                    releases=total.releases,
                    before_epsilon=prior.epsilon if prior else 0.0,
                    before_releases=prior.releases if prior else 0,
                )
            )
    return out


def excess_sentence(excess: ClassExcess) -> str:
    """One class's excess in words, with its numbers."""
    added = excess.releases - excess.before_releases
    return (
        f"against {describe(excess.label)} ({excess.label}) to ε = {excess.epsilon:.4g} over "
        f"{excess.releases} release{'s' if excess.releases != 1 else ''} ({added} new; the "
        f"ledger holds ε = {excess.before_epsilon:.4g} over {excess.before_releases})"
    )


def unbounded_note(labels: Collection[str], residual_dp: bool) -> str:
    """The classes not held to the cap because they are unbounded by design, or ''."""
    free = [label for label in labels if not checked(label, residual_dp)]
    if not free:
        return ""
    return (
        f"not held to the budget: {', '.join(free)} (without residual noise the coordinator "
        "learns the exact sums, ε = ∞ by design; privacy.residual_dp bounds it)"
    )


def reveal_excess(
    ledger: PrivacyLedger,
    *,
    session_id: str,
    round_index: int,
    after: Mapping[str, float],
    budget: float,
    residual_dp: bool,
) -> list[ClassExcess]:
    """Every checked class an unmask answer would take above ``budget``.

    ``after`` is the μ per class of the round's release once the answer's
    pair terms are revealed; the ledger's latest release of (session, round)
    is raised to it, as the unmask entry would raise it once recorded.
    """
    before = {t.label: t for t in ledger.totals()}
    out = []
    for total in ledger.totals(unmask=(session_id, round_index, after)):
        if not checked(total.label, residual_dp):
            continue
        if math.isinf(total.mu) or total.epsilon > budget * (1.0 + BUDGET_RTOL):
            prior = before.get(total.label)
            out.append(
                ClassExcess(
                    observer=total.observer,
                    epsilon=total.epsilon,
                    releases=total.releases,
                    before_epsilon=prior.epsilon if prior else 0.0,
                    before_releases=prior.releases if prior else 0,
                )
            )
    return out


def reveal_sentence(
    excess: ClassExcess,
    *,
    before: Mapping[str, float],
    after: Mapping[str, float],
    delta: float,
    budget: float,
) -> str:
    """Why an unmask answer is refused for one class, with the numbers.

    ``before``/``after``: the release's μ per class without and with the
    answer's pair terms revealed.
    """
    was, then = before.get(excess.label, 0.0), after.get(excess.label, 0.0)

    def eps(mu: float) -> str:
        return "inf" if math.isinf(mu) else f"{gaussian_epsilon(mu, delta):.4g}"

    left = (
        "no noise at all (μ = inf)"
        if math.isinf(then)
        else f"μ = {then:.4g} (ε = {eps(then)} for this release, was {eps(was)})"
    )
    total = "inf" if math.isinf(excess.epsilon) else f"{excess.epsilon:.4g}"
    return (
        f"{describe(excess.label)} ({excess.label}) would face {left}, bringing its total to "
        f"ε = {total} over {excess.releases} release{'s' if excess.releases != 1 else ''} "
        f"(the ledger holds ε = {excess.before_epsilon:.4g}), above the budget of {budget:g}"
    )
