"""`zerosum demo --plan logreg`: what the session's model is worth, and against what.

After the live session the demo recomputes, from the nodes' data files on
this machine (only a demo holds them all):

* non-private FedAvg of the clipped gradients — the same plan code run in
  one process, summing each round's tensors exactly in fixed point — whose
  weights the session's model must equal bit for bit;
* the same rounds with *independent* Gaussian noise on each node's sums, of
  the σ each node's egress actually carried (so the same per-egress ε), over
  several seeded draws;
* the pooled non-private fit (scikit-learn's logistic regression on every
  node's data at once, same ridge penalty);

and prints their holdout accuracy with each node's ledger.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["evaluate", "print_result"]

_DRAWS = 20


def _accuracy(plan: Any, table: Any) -> float:
    return float(np.mean((plan.probabilities(table.features) >= 0.5) == (table.labels == 1.0)))


def evaluate(out: Path, node_ids: list[str], seed: int = 2017) -> dict[str, Any]:
    from node.egress.bundle import EgressBundle
    from node.plans.logreg import LogregPlan, LogregSettings, load_weights, read_labelled
    from node.records.ledger import PrivacyLedger
    from noise.fixed_point import FixedPointCodec, wrapping_sum
    from proto.federation import load_federation

    config = load_federation(out / "federation.toml")
    settings = LogregSettings.from_tables(config.plan.settings)
    p = settings.n_features
    tables = {n: read_labelled(out / "nodes" / n / "data.csv", p) for n in node_ids}
    holdout = read_labelled(out / "holdout.csv", p)
    codec = FixedPointCodec(config.fixed_point_bits)

    def fresh() -> dict[str, LogregPlan]:
        return {n: LogregPlan(config, tables[n]) for n in node_ids}

    reference = fresh()
    for name in config.plan.round_names:
        layout = config.plan.round(name).layout
        parts = [layout.encode(plan.tensors(name), codec) for plan in reference.values()]
        total = layout.decode(wrapping_sum(parts), codec)
        for plan in reference.values():
            plan.receive(name, total)
    theta_ref = reference[node_ids[0]].theta
    session = [load_weights(out / "nodes" / n / "out" / "model.json")[0] for n in node_ids]
    identical = all(np.array_equal(theta, theta_ref) for theta in session)

    # σ per node and round, as each egress carried it.
    sigma: dict[tuple[str, str], dict[str, float]] = {}
    for n in node_ids:
        for manifest in (out / "nodes" / n / "out" / "egress").glob("round-*/manifest.json"):
            bundle = EgressBundle.read(manifest.parent)
            sigma[(n, bundle.round_name)] = {t.name: t.sigma for t in bundle.tensors}
    rng = np.random.default_rng(seed)
    noisy_accuracy, noisy_error = [], []
    scale = float(np.linalg.norm(theta_ref))
    for _ in range(_DRAWS):
        plans = fresh()
        for name in config.plan.round_names:
            total_f: dict[str, np.ndarray] = {}
            for n, plan in plans.items():
                for tensor, value in plan.tensors(name).items():
                    noise = rng.normal(0.0, sigma[(n, name)][tensor], size=np.shape(value))
                    total_f[tensor] = total_f.get(tensor, 0.0) + value + noise
            for plan in plans.values():
                plan.receive(name, total_f)
        noisy_accuracy.append(_accuracy(plans[node_ids[0]], holdout))
        noisy_error.append(float(np.linalg.norm(plans[node_ids[0]].theta - theta_ref)) / scale)

    from sklearn.linear_model import LogisticRegression

    x = np.vstack([settings.prescale(tables[n].features)[:, :-1] for n in node_ids])
    y = np.concatenate([tables[n].labels for n in node_ids])
    strength = 1.0 / (settings.l2 * len(y)) if settings.l2 > 0 else 1e12
    pooled = LogisticRegression(C=strength, max_iter=5000).fit(x, y)
    pooled_accuracy = float(
        np.mean(pooled.predict(settings.prescale(holdout.features)[:, :-1]) == holdout.labels)
    )

    ledgers = []
    for n in node_ids:
        ledger = PrivacyLedger.open(
            out / "nodes" / n / "state" / "ledger.json", n, config.privacy.delta
        )
        totals = {t.label: t for t in ledger.totals()}
        ledgers.append(
            {
                "node_id": n,
                "n_subjects": tables[n].features.shape[0],
                "releases": len([e for e in ledger.entries if e.kind == "release"]),
                "grad_sigma": sigma.get((n, config.plan.round_names[-1]), {}).get("grad"),
                "epsilon_outsider": totals["outsider"].epsilon,
                "epsilon_colluders": {k: t.epsilon for k, t in totals.items() if "colluders" in k},
            }
        )
    return {
        "plan": "logreg",
        "steps": settings.rounds,
        "holdout_subjects": int(holdout.labels.size),
        "accuracy_zero_sum": _accuracy_of(session[0], settings, holdout),
        "accuracy_nonprivate_fedavg": _accuracy(reference[node_ids[0]], holdout),
        "weights_identical_to_nonprivate_fedavg": identical,
        "accuracy_independent_noise_mean": float(np.mean(noisy_accuracy)),
        "accuracy_independent_noise_sd": float(np.std(noisy_accuracy)),
        "independent_noise_draws": _DRAWS,
        "weights_error_zero_sum": float(np.linalg.norm(session[0] - theta_ref)) / scale,
        "weights_error_independent_noise_mean": float(np.mean(noisy_error)),
        "accuracy_pooled_fit": pooled_accuracy,
        "ledgers": ledgers,
        "epsilon_budget": config.privacy.epsilon_budget,
        "epsilon_per_release": config.privacy.epsilon,
    }


def _accuracy_of(theta: np.ndarray, settings: Any, table: Any) -> float:
    from node.plans.logreg import sigmoid

    probability = sigmoid(settings.prescale(table.features) @ theta)
    return float(np.mean((probability >= 0.5) == (table.labels == 1.0)))


def print_result(result: dict[str, Any], seconds: float, n_nodes: int) -> None:
    print(
        f"zerosum demo --plan logreg: {n_nodes} TREs, the count then {result['steps']} gradient "
        f"steps, fresh zero-sum masks every round; session took {seconds:.1f} s"
    )
    print()
    print(f"holdout accuracy ({result['holdout_subjects']} subjects):")
    same = "yes" if result["weights_identical_to_nonprivate_fedavg"] else "NO"
    rows = (
        ("zero-sum masks (this session)", f"{result['accuracy_zero_sum']:.3f}"),
        (
            "non-private FedAvg, clipped gradients",
            f"{result['accuracy_nonprivate_fedavg']:.3f}   (weights identical bit for bit: {same})",
        ),
        (
            "independent noise, same per-egress σ",
            f"{result['accuracy_independent_noise_mean']:.3f} ± "
            f"{result['accuracy_independent_noise_sd']:.3f}   "
            f"({result['independent_noise_draws']} seeded draws)",
        ),
        ("pooled non-private fit (scikit-learn)", f"{result['accuracy_pooled_fit']:.3f}"),
    )
    for label, value in rows:
        print(f"  {label:<40} {value}")
    print(
        "  weights' distance from non-private FedAvg, ‖θ − θ_FedAvg‖/‖θ_FedAvg‖: zero-sum "
        f"{result['weights_error_zero_sum']:.3g}, independent noise "
        f"{result['weights_error_independent_noise_mean']:.3g} (mean)"
    )
    print()
    print(
        f"ledgers (ε per release {result['epsilon_per_release']:g}, budget "
        f"{result['epsilon_budget']:g}; μ-GDP composition):"
    )
    for row in result["ledgers"]:
        colluders = ", ".join(f"{k} {v:.3f}" for k, v in row["epsilon_colluders"].items())
        print(
            f"  {row['node_id']:>6}  N={row['n_subjects']:<4} {row['releases']} releases, "
            f"σ(grad) {row['grad_sigma']:.3g}; composed ε: outsider "
            f"{row['epsilon_outsider']:.3f}, {colluders}"
        )


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2)
