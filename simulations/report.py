"""``DIR/report.md``: the sweep's tables, figures, headline checks and caveats."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

from simulations.config import SimConfig
from simulations.dropout_report import dropout_section
from simulations.dropout_summary import summarise_dropout
from simulations.plots import (
    attack_bound_figure,
    coalition_figure,
    dropout_figure,
    headline_figure,
    tradeoff_figure,
    utility_figure,
)
from simulations.schemes import declared_privacy, variants
from simulations.summary import (
    Tables,
    axis_series,
    estimate,
    load_tables,
    must_show,
    num,
    variant_of,
    whole,
)
from simulations.sweep import TABLES, SweepOutcome, read_table

__all__ = ["write_report"]

FIGURES = "figures"

Figure = Callable[[str, str], str]


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _eps(value: float) -> str:
    if math.isinf(value):
        return "∞"
    if math.isnan(value):
        return "—"
    return f"{value:.3g}"


def _axis_table(tables: Tables, config: SimConfig, axis: str, metric: str) -> str:
    series = axis_series(tables.utility, config, axis, metric)
    values = sorted({x for points in series.values() for x, _ in points})
    header = [f"scheme \\ {axis}", *(f"{v:g}" for v in values)]
    rows = []
    for variant in variants(config.schemes, config.constructions):
        points = dict(series.get(variant, []))
        rows.append([variant.label, *(points[v].text() if v in points else "—" for v in values)])
    return _table(header, rows)


def _privacy_table(config: SimConfig) -> str:
    b = config.base
    m = b.coalition_size
    header = [
        "scheme",
        "outsider",
        f"outsider + {m} node(s)",
        "coordinator",
        f"coordinator + {m} node(s)",
    ]
    rows = []
    for variant in variants(config.schemes, config.constructions):
        p = declared_privacy(
            variant,
            n_nodes=b.n_nodes,
            epsilon=b.epsilon,
            delta=b.delta,
            collusion_threshold=b.collusion_threshold,
            coalition_size=m,
        )
        rows.append(
            [
                variant.label,
                _eps(p["outsider"].epsilon),
                _eps(p["outsider_coalition"].epsilon),
                _eps(p["coordinator"].epsilon),
                _eps(p["coalition"].epsilon),
            ]
        )
    return _table(header, rows)


def _attack_table(tables: Tables, epsilon: float) -> str:
    header = [
        "scheme",
        "observer",
        "m",
        "μ declared",
        "TPR@1% (bound)",
        "TPR@10% (bound)",
        "AUC (bound)",
        "within",
    ]
    rows = []
    for r in tables.attack:
        if not math.isclose(num(r, "epsilon"), epsilon):
            continue
        rows.append(
            [
                variant_of(r).label,
                str(r["observer"]).replace("_", " + "),
                str(r["coalition_size"]),
                _eps(num(r, "mu_declared")),
                f"{num(r, 'tpr_1'):.3f} ({num(r, 'tpr_1_bound_gdp'):.3f})",
                f"{num(r, 'tpr_10'):.3f} ({num(r, 'tpr_10_bound_gdp'):.3f})",
                f"{num(r, 'auc'):.3f} ({num(r, 'auc_bound'):.3f})",
                "yes" if whole(r, "within_bound") else "**no**",
            ]
        )
    return _table(header, rows)


def _reconstruction_table(tables: Tables) -> str:
    header = ["scheme", "observer", "RMSE (feature SDs)", "prior-only RMSE", "success rate"]
    rows = []
    for r in tables.reconstruction:
        rows.append(
            [
                variant_of(r).label,
                str(r["observer"]),
                f"{num(r, 'rmse_sd'):.3g} ± {1.96 * num(r, 'rmse_sd_se'):.2g}",
                f"{num(r, 'prior_rmse_sd'):.3g}",
                f"{num(r, 'success_rate'):.1%} ({r['successes']}/{r['targets']})",
            ]
        )
    return _table(header, rows)


def _overtheair_table(tables: Tables) -> str:
    grouped: dict[str, tuple[list[object], list[object]]] = {}
    for r in tables.overtheair:
        gaps, expected = grouped.setdefault(str(r["perturbation"]), ([], []))
        gaps.append(r["gap"])
        expected.append(r["expected_gap"])
    header = ["perturbation", "final optimality gap (mean ± 95% CI)", "exact expectation (mean)"]
    rows = [
        [kind, estimate(g).text(4), f"{estimate(e).mean:.4g}"] for kind, (g, e) in grouped.items()
    ]
    return _table(header, rows)


def _axes(config: SimConfig) -> list[str]:
    """The axes that vary (an empty list of values leaves only the base point)."""
    return [name for name, values in config.axes if values]


def _figures(tables: Tables, config: SimConfig, out: Path) -> dict[str, Path]:
    folder = out / FIGURES
    folder.mkdir(exist_ok=True)
    made: dict[str, Path] = {}
    if tables.utility:
        for axis in _axes(config):
            made[f"utility_{axis}"] = utility_figure(
                tables, config, axis, folder / f"utility_vs_{axis}.png"
            )
    if tables.attack:
        made["coalition"] = coalition_figure(tables, config, folder / "privacy_vs_coalition.png")
        made["attack"] = attack_bound_figure(tables, folder / "attack_vs_bound.png")
        if tables.utility:
            made["tradeoff"] = tradeoff_figure(tables, config, folder / "tradeoff.png")
    if tables.utility:
        made["headline"] = headline_figure(tables, config, folder / "headline.png")
    return made


def _utility_parts(tables: Tables, config: SimConfig, figure: Figure) -> list[str]:
    checks = must_show(tables, config)
    parts = [
        "Measures (per repetition, on a holdout from the same scanners): `mae_years`, the "
        "brain-age MAE |Ŷ − Y| of the model's age prediction; `delta_corr`, corr(δ̂, δ) of the "
        "unbiased delta with the synthetic true delta; `param_rel_error`, the relative error "
        "of the model's effective coefficients against the noiseless pooled fit; "
        "`aggregate_noise_var`, the aggregate's noise variance per entry in units of one "
        "egress's target variance. `results.csv` also holds `delta_mae_years`, mean |δ̂ − δ|: "
        "the noiseless unbiased delta spreads more than the true delta here, so a model wrecked "
        "by noise that returns δ̂ ≈ 0 can score better on it; read it with `delta_corr`.",
        "",
        "## Headline checks",
        "",
        _table(
            ["claim", "holds", "evidence"],
            [[c.claim, "yes" if c.passed else "**no**", c.detail] for c in checks],
        ),
        "",
        figure("headline", "headline"),
        "## Utility against ε",
        "",
        figure("utility_epsilon", "utility vs epsilon"),
        "Brain-age MAE, mean |Ŷ − Y| of the model's age prediction on the holdout (years), "
        "mean ± 95% CI over repetitions:",
        "",
        _axis_table(tables, config, "epsilon", "mae_years"),
        "",
        "corr(δ̂, true δ) of the unbiased delta against the synthetic ground truth:",
        "",
        _axis_table(tables, config, "epsilon", "delta_corr"),
        "",
        "## Utility against the number of nodes",
        "",
        figure("utility_n_nodes", "utility vs nodes"),
        "MAE (years):",
        "",
        _axis_table(tables, config, "n_nodes", "mae_years"),
        "",
        "Noise variance of the aggregate in units of one egress's target variance "
        "(independent ≈ K, zerosum+residual ≈ 1, zerosum exactly 0):",
        "",
        _axis_table(tables, config, "n_nodes", "aggregate_noise_var"),
        "",
        "## Other axes",
        "",
    ]
    for axis in _axes(config):
        if axis in ("epsilon", "n_nodes"):
            continue
        parts += [
            f"### {axis}",
            "",
            figure(f"utility_{axis}", f"utility vs {axis}"),
            "MAE (years):",
            "",
            _axis_table(tables, config, axis, "mae_years"),
            "",
        ]
    parts += [
        "## Declared privacy per observer (base point, one release)",
        "",
        "ε at δ from the μ-GDP accounting of `noise.accounting` (∞: the observer learns the "
        "node's contribution exactly). `seed_fedavg` shows the page's own declaration "
        "(ε per coefficient tensor, basic composition over five tensors) under its heuristic "
        "sensitivity, which is not a proven bound. A session of the default plan is this one "
        "release (sums); with mean imputation it has two (means, sums), composing as μ·√2.",
        "",
        _privacy_table(config),
        "",
    ]
    return parts


def _attack_parts(tables: Tables, config: SimConfig, figure: Figure) -> list[str]:
    b = config.base
    parts = [
        "## Privacy against coalition size",
        "",
        figure("coalition", "privacy vs coalition size"),
        "## Membership inference against the bound",
        "",
        f"Likelihood-ratio test against node 0's sums release (worst-case target subject; "
        f"K = {config.attack.n_nodes}, N = {config.attack.n_per_node}, P = "
        f"{config.attack.n_features}, {config.attack.trials} trials per hypothesis). Bounds: "
        "μ-GDP tradeoff Φ(Φ⁻¹(FPR) + μ) for TPR, Φ(μ/√2) for AUC. 'within' means no "
        "violation beyond 99.9% sampling error (also against the (ε, δ) bound).",
        "",
        figure("attack", "attack vs bound"),
        f"At ε = {b.epsilon:g}:",
        "",
        _attack_table(tables, b.epsilon),
        "",
    ]
    if tables.utility:
        parts += ["## Utility / privacy plane", "", figure("tradeoff", "trade-off plane")]
    return parts


def _reconstruction_parts(tables: Tables, config: SimConfig) -> list[str]:
    return [
        "## Reconstruction from two releases",
        "",
        f"One subject joins a node of N = {config.reconstruction.n_per_node} between two "
        f"sessions (K = {config.reconstruction.n_nodes}, P = "
        f"{config.reconstruction.n_features}, ε = {config.reconstruction.epsilon:g}); the "
        "attacker differences the releases and shrinks towards its prior. Success: "
        "correlation ≥ 0.5 between reconstructed and true standardised features.",
        "",
        _reconstruction_table(tables),
        "",
    ]


def _overtheair_parts(tables: Tables, config: SimConfig) -> list[str]:
    return [
        "## Reproduction: over-the-air FL with zero-sum perturbations",
        "",
        f"Gradient descent on a ridge regression with K = {config.overtheair.n_users} users, "
        f"d = {config.overtheair.dim}, {config.overtheair.iterations} steps, channel noise std "
        f"{config.overtheair.channel_noise_std:g}, perturbation std "
        f"{config.overtheair.perturbation_std:g} (zero-sum: complete-graph R with R_kk = σ²; "
        f"uncorrelated: R = σ²I, equal trace), {config.overtheair.reps} repetitions with common "
        "channel noise:",
        "",
        _overtheair_table(tables),
        "",
    ]


def _notes(tables: Tables, config: SimConfig) -> list[str]:
    b = config.base
    failed_fits = sum(1 for r in tables.utility if whole(r, "fit_ok") == 0)
    repaired = sum(1 for r in tables.utility if whole(r, "repaired_eigenvalues") > 0)
    return [
        "## Notes",
        "",
        "- Noise is added in fixed point (2⁻³² resolution) exactly as the protocol does; "
        "zero-sum masks cancel bit for bit, so `zerosum` reproduces `none` to the last bit.",
        "- Each round is one release per node calibrated to (ε, δ) against an outsider "
        "(analytic Gaussian mechanism, the round's tensors sharing the budget equally). With "
        f"collusion threshold T = {b.collusion_threshold} the zero-sum designs put more than "
        "the target on each egress, so the outsider's ε is below the target.",
        f"- Noisy aggregates are repaired before the solve (post-processing): N ≥ 2, counts ≥ 1, "
        f"and the centred moment matrix of (features, age) projected onto the PSD cone with a "
        f"floor. {repaired} of {len(tables.utility)} utility rows needed the projection; "
        f"{failed_fits} fits failed and count as missing.",
        "- `seed_fedavg` takes the shared basis from the exact aggregate and noises only the "
        "coefficients with the page's σ = Δ√(2 ln(1.25/δ))/ε and Δ = ‖U_k⁺‖₂·(age range); the "
        "same σ is used for b2 and gamma, which dominates its error.",
        "- The attack uses P = 5 features to keep trials cheap; releases are calibrated per "
        "egress, so the declared μ does not depend on P.",
        "",
    ]


def write_report(
    out_dir: str | Path,
    config: SimConfig,
    outcome: SweepOutcome,
    *,
    jobs: int,
    wall_seconds: float,
    engine: str | None = None,
) -> Path:
    """Write figures and ``report.md`` into ``out_dir``; returns the report's path.

    Only the scenarios the sweep ran get a section. ``engine`` describes where
    the cells ran when not in ``jobs`` local processes (a Dask cluster).
    """
    out = Path(out_dir)
    tables = load_tables(out)
    figures = _figures(tables, config, out)
    dropout_csv = out / TABLES["dropout"]
    dropouts = summarise_dropout(read_table(dropout_csv)) if dropout_csv.exists() else []
    if dropouts:
        (out / FIGURES).mkdir(exist_ok=True)
        figures["dropout"] = dropout_figure(
            dropouts, config.dropout.epsilon, out / FIGURES / "dropout.png"
        )
    b = config.base

    def figure(key: str, caption: str) -> str:
        if key not in figures:
            return ""
        return f"![{caption}]({figures[key].relative_to(out).as_posix()})\n"

    where = engine if engine is not None else f"{jobs} job(s)"
    parts = [
        "# Simulation report: correlated (zero-sum) vs independent noise",
        "",
        f"Preset `{config.preset}`, sweep seed {config.seed}, "
        + (f"{config.reps} repetitions per utility cell, " if tables.utility else "")
        + f"{len(outcome.cells)} cells ({len(outcome.ran)} run now, "
        f"{len(outcome.resumed)} resumed), {where}, wall time {wall_seconds:.1f} s. "
        f"Scenarios: {', '.join(config.scenarios)}.",
    ]
    if tables.utility:
        parts += [
            f"Base point: K = {b.n_nodes} nodes, ε = {b.epsilon:g} and δ = {b.delta:g} per "
            f"egress, N = {b.n_per_node} subjects per node, P = {b.n_features} features, site "
            f"offset SD {b.site_offset_sd:g}, collusion threshold T = {b.collusion_threshold}, "
            f"model `{b.model}` on the top {b.feature_proportion:.0%} of principal components. "
            "Each axis below varies one parameter around it; cells that differ only in ε or δ "
            "share their synthetic federations.",
            "",
            *_utility_parts(tables, config, figure),
        ]
    else:
        parts.append("")
    if tables.attack:
        parts += _attack_parts(tables, config, figure)
    if tables.reconstruction:
        parts += _reconstruction_parts(tables, config)
    if tables.overtheair:
        parts += _overtheair_parts(tables, config)
    if dropouts:
        parts += dropout_section(dropouts, config, figure("dropout", "dropouts"))
    if tables.utility or tables.attack:
        parts += _notes(tables, config)
    report = out / "report.md"
    report.write_text("\n".join(parts), encoding="utf-8")
    return report
