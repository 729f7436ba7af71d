"""Figures of a sweep (matplotlib, Agg backend): utility, privacy and their trade-off.

Every figure draws a mean line with a shaded 95 % interval per scheme
(``simulations.summary``). Colours and markers are fixed per scheme so that
figures can be read side by side.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, NullFormatter

from simulations.config import SimConfig
from simulations.dropout_summary import DropoutSummary
from simulations.schemes import OBSERVERS, Variant, declared_privacy
from simulations.summary import Estimate, Tables, axis_series, num, variant_of, whole

__all__ = [
    "attack_bound_figure",
    "coalition_figure",
    "dropout_figure",
    "headline_figure",
    "tradeoff_figure",
    "utility_figure",
]

STYLE: dict[str, tuple[str, str, str]] = {
    "none": ("#444444", "o", "-"),
    "independent": ("#d62728", "s", "-"),
    "zerosum (pairwise)": ("#1f77b4", "^", "-"),
    "zerosum (cape)": ("#17becf", "v", "--"),
    "zerosum+residual (pairwise)": ("#2ca02c", "D", "-"),
    "zerosum+residual (cape)": ("#98df8a", "d", "--"),
    "seed_fedavg": ("#9467bd", "P", "-"),
}

AXIS_LABELS = {
    "epsilon": "ε per egress",
    "n_nodes": "nodes K",
    "n_per_node": "subjects per node N",
    "n_features": "features P",
    "delta": "δ per egress",
    "site_offset_sd": "site offset SD (non-IID)",
}
METRIC_LABELS = {
    "mae_years": "brain-age MAE |Ŷ − Y| (years)",
    "delta_mae_years": "mean |δ̂ − δ| (years)",
    "delta_corr": "corr(δ̂, true δ)",
    "param_rel_error": "relative coefficient error",
    "aggregate_noise_var": "aggregate noise variance / egress σ²",
}
LOG_METRICS = {"param_rel_error", "aggregate_noise_var"}
SPREAD_METRICS = {"mae_years", "delta_mae_years"}
LOG_AXES = {"epsilon", "n_nodes", "n_per_node", "delta"}


def _style(variant: Variant) -> tuple[str, str, str]:
    return STYLE.get(variant.label, ("#7f7f7f", "x", ":"))


def _band(ax: Axes, variant: Variant, series: Sequence[tuple[float, Estimate]]) -> None:
    points = [(x, e) for x, e in series if e.n > 0 and math.isfinite(e.mean)]
    if not points:
        return
    colour, marker, line = _style(variant)
    x = np.array([p[0] for p in points])
    mean = np.array([p[1].mean for p in points])
    lo = np.array([p[1].lo for p in points])
    hi = np.array([p[1].hi for p in points])
    ax.plot(x, mean, color=colour, marker=marker, linestyle=line, label=variant.label, ms=4)
    ax.fill_between(x, lo, hi, color=colour, alpha=0.18, linewidth=0)


def _minor_label(value: float, _: object) -> str:
    """Label the 2× and 5× minor ticks of a log axis, so short ranges stay readable."""
    mantissa = value / 10 ** math.floor(math.log10(value)) if value > 0 else 0.0
    return (
        f"{value:g}" if round(mantissa) in (2, 5) and abs(mantissa - round(mantissa)) < 1e-9 else ""
    )


def _panel(
    ax: Axes, tables: Tables, config: SimConfig, axis: str, metric: str, *, skip: Sequence[str] = ()
) -> None:
    series = axis_series(tables.utility, config, axis, metric)
    series = {v: p for v, p in series.items() if v.scheme not in skip}
    means = [e.mean for points in series.values() for _, e in points if e.n and e.mean > 0]
    # Errors spanning more than a decade (a wrecked scheme) read better on a log scale.
    log_y = metric in LOG_METRICS or (
        metric in SPREAD_METRICS and bool(means) and max(means) > 10 * min(means)
    )
    for variant, points in series.items():
        shown = [(x, e) for x, e in points if e.mean > 0] if log_y else points
        _band(ax, variant, shown)
    values = sorted({x for points in series.values() for x, _ in points})
    if axis in LOG_AXES:
        ax.set_xscale("log")
        ax.set_xticks(values)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(_minor_label))
    ax.set_xlabel(AXIS_LABELS.get(axis, axis))
    ax.set_ylabel(METRIC_LABELS.get(metric, metric))
    ax.grid(True, which="major", alpha=0.3)


def _base_text(config: SimConfig, axis: str) -> str:
    b = config.base
    parts = {
        "n_nodes": f"K={b.n_nodes}",
        "epsilon": f"ε={b.epsilon:g}",
        "delta": f"δ={b.delta:g}",
        "n_per_node": f"N={b.n_per_node}",
        "n_features": f"P={b.n_features}",
        "site_offset_sd": f"site sd={b.site_offset_sd:g}",
    }
    return ", ".join(v for k, v in parts.items() if k != axis) + f", {config.reps} reps, 95% CI"


def utility_figure(tables: Tables, config: SimConfig, axis: str, path: Path) -> Path:
    """MAE, corr(δ̂, δ) and (along K) the aggregate noise variance against one axis."""
    metrics = ["mae_years", "delta_corr"]
    if axis == "n_nodes":
        metrics.append("aggregate_noise_var")
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 4.2))
    for ax, metric in zip(np.atleast_1d(axes), metrics, strict=True):
        skip = ("none", "zerosum") if metric == "aggregate_noise_var" else ()
        _panel(ax, tables, config, axis, metric, skip=skip)
        if metric == "aggregate_noise_var":
            ks = np.array(
                sorted({float(v) for v in config.axis("n_nodes")} | {config.base.n_nodes})
            )
            ax.plot(ks, ks, color="#d62728", lw=0.8, ls=":", label="K (theory)")
            ax.plot(ks, np.ones_like(ks), color="#2ca02c", lw=0.8, ls=":", label="1 (theory)")
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        f"Utility against {AXIS_LABELS.get(axis, axis)} ({_base_text(config, axis)})", fontsize=10
    )
    fig.tight_layout(rect=(0, 0.1, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def coalition_figure(tables: Tables, config: SimConfig, path: Path) -> Path:
    """Declared ε against coalition size (both constructions) and the empirical attack AUC."""
    k = config.attack.n_nodes
    eps = config.base.epsilon
    sizes = list(range(0, k))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.3))
    for scheme, observer, title in (
        ("zerosum", "outsider_coalition", "one egress + m nodes"),
        ("zerosum+residual", "coalition", "coordinator + m nodes"),
    ):
        for construction in ("pairwise", "cape"):
            variant = Variant(scheme, construction)
            values = []
            for m in sizes:
                privacy = declared_privacy(
                    variant,
                    n_nodes=k,
                    epsilon=eps,
                    delta=config.base.delta,
                    collusion_threshold=config.attack.collusion_threshold,
                    coalition_size=max(m, 1),
                )
                name = (
                    observer
                    if m
                    else ("outsider" if observer.startswith("outsider") else "coordinator")
                )
                values.append(privacy[name].epsilon)
            colour, marker, line = _style(variant)
            shown = [v if math.isfinite(v) else np.nan for v in values]
            left.plot(
                sizes,
                shown,
                color=colour,
                marker=marker,
                ls=line,
                ms=4,
                label=f"{variant.label}: {title}",
            )
    left.axhline(eps, color="#444444", lw=0.8, ls=":", label=f"target ε = {eps:g}")
    left.axvline(
        config.attack.collusion_threshold,
        color="#999999",
        lw=0.8,
        ls="--",
        label=f"design threshold T = {config.attack.collusion_threshold}",
    )
    left.set_yscale("log")
    left.set_xlabel("colluding nodes m")
    left.set_ylabel("declared ε of one release (∞ not drawn)")
    left.set_title(f"Declared privacy, K = {k}", fontsize=10)
    left.grid(True, alpha=0.3)
    left.legend(fontsize=7)
    rows = [r for r in tables.attack if math.isclose(num(r, "epsilon"), eps)]
    for scheme, observer in (("zerosum", "outsider_coalition"), ("zerosum+residual", "coalition")):
        for construction in ("pairwise", "cape"):
            variant = Variant(scheme, construction)
            alone = "outsider" if observer == "outsider_coalition" else "coordinator"
            chosen = sorted(
                (
                    r
                    for r in rows
                    if variant_of(r) == variant and r["observer"] in (observer, alone)
                ),
                key=lambda r: whole(r, "coalition_size"),
            )
            if not chosen:
                continue
            sizes_seen = np.array([whole(r, "coalition_size") for r in chosen])
            auc = np.array([num(r, "auc") for r in chosen])
            lo = np.array([num(r, "auc_lo") for r in chosen])
            hi = np.array([num(r, "auc_hi") for r in chosen])
            bound = np.array([num(r, "auc_bound") for r in chosen])
            colour, marker, line = _style(variant)
            right.errorbar(
                sizes_seen,
                auc,
                yerr=[auc - lo, hi - auc],
                color=colour,
                marker=marker,
                ls=line,
                ms=4,
                capsize=2,
                label=f"{variant.label} ({observer.replace('_', ' + ')})",
            )
            right.plot(sizes_seen, bound, color=colour, lw=0.8, ls=":")
    right.set_xlabel("colluding nodes m")
    right.set_ylabel("membership-inference AUC (dotted: μ-GDP bound)")
    right.set_title(f"Likelihood-ratio attack at ε = {eps:g} (99.9% CI)", fontsize=10)
    right.grid(True, alpha=0.3)
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def tradeoff_figure(tables: Tables, config: SimConfig, path: Path) -> Path:
    """Utility corr(δ̂, δ) against privacy 2(1 − AUC), one point per ε (the CVB paper's Fig. 11)."""
    utility = axis_series(tables.utility, config, "epsilon", "delta_corr")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, observer in zip(axes, ("outsider", "coordinator"), strict=True):
        for variant, points in utility.items():
            if variant.scheme == "seed_fedavg":
                continue
            xs, ys, ylo, yhi, xlo, xhi = [], [], [], [], [], []
            for eps, est in points:
                match = [
                    r
                    for r in tables.attack
                    if variant_of(r) == variant
                    and r["observer"] == observer
                    and math.isclose(num(r, "epsilon"), eps)
                ]
                if not match or est.n == 0:
                    continue
                auc, lo, hi = (num(match[0], c) for c in ("auc", "auc_lo", "auc_hi"))
                xs.append(2 * (1 - auc))
                xlo.append(2 * (1 - hi))
                xhi.append(2 * (1 - lo))
                ys.append(est.mean)
                ylo.append(est.lo)
                yhi.append(est.hi)
            if not xs:
                continue
            colour, marker, line = _style(variant)
            x, y = np.array(xs), np.array(ys)
            ax.errorbar(
                x,
                y,
                xerr=[x - np.array(xlo), np.array(xhi) - x],
                yerr=[y - np.array(ylo), np.array(yhi) - y],
                color=colour,
                marker=marker,
                ls=line,
                ms=4,
                capsize=2,
                lw=1,
                label=variant.label,
            )
        ax.set_xlabel("privacy 2(1 − AUC) of the best membership test (1 = no information)")
        ax.set_title(f"observer: {observer}", fontsize=10)
        ax.set_xlim(-0.03, 1.05)
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("utility corr(δ̂, true δ)")
    axes[0].legend(fontsize=7, loc="lower left")
    epsilons = ", ".join(f"{e:g}" for e in config.attack_epsilons)
    fig.suptitle(
        f"Utility / privacy plane over ε ∈ {{{epsilons}}} "
        f"(K={config.base.n_nodes}; top right is best)",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attack_bound_figure(tables: Tables, path: Path) -> Path:
    """Empirical TPR at FPR 1 % and 10 % against the declared μ-GDP bound (all below y = x)."""
    fig, ax = plt.subplots(figsize=(5, 4.6))
    for tag, marker in (("1", "o"), ("10", "s")):
        for observer, colour in zip(
            OBSERVERS, ("#1f77b4", "#17becf", "#d62728", "#ff7f0e"), strict=True
        ):
            rows = [r for r in tables.attack if r["observer"] == observer]
            bound = np.array([num(r, f"tpr_{tag}_bound_gdp") for r in rows])
            tpr = np.array([num(r, f"tpr_{tag}") for r in rows])
            lo = np.array([num(r, f"tpr_{tag}_lo") for r in rows])
            hi = np.array([num(r, f"tpr_{tag}_hi") for r in rows])
            if not rows:
                continue
            ax.errorbar(
                bound,
                tpr,
                yerr=[tpr - lo, hi - tpr],
                fmt=marker,
                color=colour,
                ms=3,
                alpha=0.7,
                capsize=0,
                lw=0.6,
                label=f"{observer.replace('_', ' + ')}, FPR {tag}%",
            )
    ax.plot([0, 1], [0, 1], color="#444444", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(5e-3, 1.1)
    ax.set_ylim(1e-3, 1.1)
    ax.set_xlabel("bound Φ(Φ⁻¹(FPR) + μ_declared)")
    ax.set_ylabel("empirical TPR (99.9% CI)")
    ax.set_title("Membership inference vs the declared bound", fontsize=10)
    ax.grid(True, alpha=0.3, which="both")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def headline_figure(tables: Tables, config: SimConfig, path: Path) -> Path:
    """Two panels for the README: MAE against ε, and the aggregate's noise against K."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.9))
    _panel(left, tables, config, "epsilon", "mae_years", skip=("seed_fedavg",))
    left.set_title(
        f"Brain-age MAE (K={config.base.n_nodes}, N={config.base.n_per_node}/node); "
        "zerosum = none exactly",
        fontsize=9,
    )
    _panel(
        right,
        tables,
        config,
        "n_nodes",
        "aggregate_noise_var",
        skip=("none", "zerosum", "seed_fedavg"),
    )
    right.set_title(
        f"Noise left in the aggregate (ε={config.base.epsilon:g}); zerosum: exactly 0", fontsize=9
    )
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _few(values: Sequence[int], most: int) -> list[int]:
    """Up to ``most`` of the sorted ``values``: the ends and evenly spaced ones between."""
    ordered = sorted(set(values))
    if len(ordered) <= most:
        return ordered
    picks = np.linspace(0, len(ordered) - 1, most).round().astype(int)
    return [ordered[i] for i in sorted(set(picks.tolist()))]


def dropout_figure(summaries: Sequence[DropoutSummary], target_epsilon: float, path: Path) -> Path:
    """Per graph: infeasible-round fraction and the worst survivor's ε against outsider + T.

    Zero-sum noise without residual (with residual the floor decisions are
    the same); ε is the median over the rounds that finished, none drawn where
    no round finished. Colour is K (up to three), line style is T (up to three
    per graph); dotted black: independent noise, never infeasible and ε at the
    target. An infinite ε is drawn as a triangle on the top edge.
    """
    zerosum = [s for s in summaries if s.scheme == "zerosum"]
    graphs = list(dict.fromkeys((s.key.graph, s.key.harary_degree) for s in zerosum))
    ks = _few([s.key.n_nodes for s in zerosum], 3)
    colours = dict(zip(ks, ("#1f77b4", "#ff7f0e", "#2ca02c"), strict=False))
    curves: list[tuple[int, int, str, list[DropoutSummary]]] = []
    for column, (graph, degree) in enumerate(graphs):
        here = [s for s in zerosum if (s.key.graph, s.key.harary_degree) == (graph, degree)]
        ts = _few([s.key.collusion_threshold for s in here], 3)
        for k in ks:
            for line, t in zip(("-", "--", ":"), ts, strict=False):
                points = sorted(
                    (s for s in here if (s.key.n_nodes, s.key.collusion_threshold) == (k, t)),
                    key=lambda s: s.key.dropout_rate,
                )
                if points:
                    curves.append((column, k, line, points))
    finite = [
        s.epsilon_coalition_finished
        for *_, points in curves
        for s in points
        if math.isfinite(s.epsilon_coalition_finished)
    ]
    top = max([1.2 * target_epsilon, *(1.1 * e for e in finite)])
    columns = max(len(graphs), 1)
    fig, axes = plt.subplots(2, columns, figsize=(4.6 * columns, 7.4), squeeze=False)
    for column, k, line, points in curves:
        top_ax, bottom_ax = axes[0, column], axes[1, column]
        colour = colours[k]
        t = points[0].key.collusion_threshold
        rates = np.array([100.0 * s.key.dropout_rate for s in points])
        fraction = np.array([s.infeasible_fraction for s in points])
        lo = np.array([s.infeasible_interval[0] for s in points])
        hi = np.array([s.infeasible_interval[1] for s in points])
        label = f"K={k}, T={t}"
        top_ax.plot(rates, fraction, color=colour, ls=line, marker="o", ms=3, label=label)
        top_ax.fill_between(rates, lo, hi, color=colour, alpha=0.12, lw=0)
        eps = np.array([s.epsilon_coalition_finished for s in points])
        shown = np.where(np.isinf(eps), top, eps)
        bottom_ax.plot(rates, shown, color=colour, ls=line, marker="o", ms=3, label=label)
        bare = np.isinf(eps)
        if bare.any():
            bottom_ax.plot(rates[bare], shown[bare], ls="none", marker="^", ms=8, color=colour)
    for column, (graph, degree) in enumerate(graphs):
        top_ax, bottom_ax = axes[0, column], axes[1, column]
        top_ax.axhline(0.0, color="#000000", lw=0.8, ls=":", label="independent")
        bottom_ax.axhline(target_epsilon, color="#000000", lw=0.8, ls=":")
        top_ax.set_ylim(-0.03, 1.03)
        bottom_ax.set_ylim(target_epsilon * 0.97, top * 1.03)
        top_ax.set_title("complete" if graph == "complete" else f"harary d={degree}", fontsize=10)
        top_ax.legend(fontsize=7, loc="best")
        for ax in (top_ax, bottom_ax):
            ax.grid(True, alpha=0.3)
            ax.set_xlabel("dropout rate r (%)")
    axes[0, 0].set_ylabel("rounds infeasible (zerosum), 95% CI")
    axes[1, 0].set_ylabel("ε kept vs outsider + T\n(worst survivor, median finished round)")
    fig.suptitle(
        f"Dropouts: target ε = {target_epsilon:g} per egress (dotted); ▲ on the top edge: ε = ∞",
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
