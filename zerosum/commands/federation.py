"""`zerosum federation init`: a new federation's config, certificates and keys.

(`zerosum federation revoke`, which revokes a certificate, lives in
``zerosum/commands/revoke.py``.)

Writes, under the output folder::

    federation.toml                 the shared config (identity keys pinned)
    ca/ca.pem, ca/ca.key            the federation CA (key: 0600, keep offline)
    coordinator/server.pem, .key    the coordinator's TLS certificate and key
    nodes/<id>/identity.pem         the node's Ed25519 identity key (0600)
    nodes/<id>/client.pem, .key     the node's TLS client certificate and key
    nodes/<id>/data.csv             with --synthetic: a cohort per node
    checkers/<id>/checker.pem       the Ed25519 key of node <id>'s output checker
                                    (0600; hand it to that TRE's checker, not the node)
    checkers/<id>/checker.pub       its public half (pinned in federation.toml)
    holdout.csv                     with --synthetic: held-out subjects
    kits/<party>/                   one kit per party, holding exactly its files
                                    (zerosum/commands/init_kits.py)

``--checker-key NODE=PUBFILE`` (repeatable) pins a checker's existing public
key instead; a node given one gets no generated checker key. Everything is
generated and validated in memory first; nothing is written if
any input is wrong or any target file exists (unless --force).
"""

from __future__ import annotations

import argparse
import math
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from node.egress.pinned_noise import pin_noise
from node.errors import NodeError
from node.plans.deltab.plan import deltab_plan_spec
from node.plans.deltab.settings import (
    DEFAULT_MAX_CLIPPED_FRACTION,
    ClippingBounds,
    DeltabSettings,
)
from noise.errors import NoiseError
from noise.keys import IdentityKey
from noise.stream import stream_fingerprint
from proto.errors import ProtoError
from proto.federation import (
    FederationConfig,
    NodeEntry,
    NoiseDesignSpec,
    PlanSpec,
    PrivacyPolicy,
    SessionTimings,
    config_hash,
    dump_federation,
)
from zerosum import pki
from zerosum.commands import init_inputs as inputs
from zerosum.commands import init_kits, init_logreg
from zerosum.commands import revoke as revoke_command
from zerosum.commands.init_inputs import InitError
from zerosum.errors import CommandError

if TYPE_CHECKING:
    from node.deltab.synthetic import Cohort
    from node.plans.logreg import LogregSettings
    from node.records.ledger import ObserverTotal

DESCRIPTION = """\
Set up a federation: `zerosum federation init` writes the shared config
(federation.toml, with every node's identity key pinned), a throwaway CA, the
coordinator's TLS certificate, per node an Ed25519 identity key and a TLS
client certificate, and per node an Ed25519 key for its output checker
(checkers/<id>/checker.pem, pinned in the config; only a decision signed with
it releases that node's egress) unless --checker-key names the checker's own
public key; with --synthetic also a synthetic cohort per node.
"""

EPILOG = """\
examples:
  zerosum federation init --nodes site-a,site-b,site-c --out fed --synthetic --seed 7
  zerosum federation init --nodes a,b,c,d --out fed --construction cape --residual-dp
  zerosum federation init --nodes a,b --out fed --feature-bounds bounds.csv --age-range 45,80
  zerosum federation init --nodes a,b --out fed --feature-range=-4,4 --feature-names l,r,icv
  zerosum federation init --nodes a,b --out fed --checker-key a=a-checker.pub

A real cohort needs public bounds that fit its data: --feature-bounds (a CSV
feature,low,high, one row per feature column, in the cohorts' column order) or
--feature-range with --feature-names. Each bound is stored with its feature's
name; every node checks its header against them and refuses to start when a
feature is clipped for more than --max-clipped-fraction of its subjects.
"""

CONFIG_NAME = "federation.toml"
# Half-width, in population standard deviations, of the public synthetic
# feature bounds: wide enough that clipping almost never bites.
_SYNTHETIC_HALF_WIDTH = 6.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    init = actions.add_parser(
        "init",
        help="write a new federation's config, CA, certificates and identity keys",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_init_arguments(init)
    revoke = actions.add_parser(
        "revoke",
        help="revoke a node's (or any) TLS certificate, and optionally issue a new one",
        description=revoke_command.DESCRIPTION,
        epilog=revoke_command.EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    revoke_command.add_revoke_arguments(revoke)


def add_init_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", required=True, help="comma-separated node ids (at least 2)")
    parser.add_argument("--out", required=True, type=Path, help="folder to write into")
    parser.add_argument("--force", action="store_true", help="replace existing files")
    parser.add_argument("--federation-id", default="zerosum", help="(default zerosum)")
    parser.add_argument(
        "--coordinator",
        default="localhost:50051",
        metavar="HOST:PORT",
        help="address nodes dial; also put in the server certificate (default localhost:50051)",
    )
    parser.add_argument(
        "--checker-key",
        action="append",
        default=[],
        metavar="NODE=PUBFILE",
        help=(
            "pin an output checker's Ed25519 public key (PEM or 64 hex digits) for NODE; "
            "repeatable; nodes without one get a generated key in checkers/<id>/"
        ),
    )
    parser.add_argument(
        "--plan",
        choices=["deltab", "logreg"],
        default="deltab",
        help="what the nodes compute: deltab, the brain-age model (default), or logreg, a "
        "logistic regression by T rounds of federated gradient descent",
    )
    data = parser.add_argument_group("synthetic data")
    data.add_argument("--synthetic", action="store_true", help="write a synthetic cohort per node")
    data.add_argument(
        "--seed", type=int, default=None, help="seed for --synthetic (default: fresh, printed)"
    )
    data.add_argument(
        "--cohort-sizes",
        default=None,
        metavar="N,N,...",
        help="subjects per node, in --nodes order (default cycles 400,250,600,300,500)",
    )
    data.add_argument("--holdout-size", type=int, default=500, help="(default 500)")
    privacy = parser.add_argument_group("privacy")
    privacy.add_argument("--epsilon", type=float, default=1.0, help="ε per release (default 1.0)")
    privacy.add_argument("--delta", type=float, default=1e-6, help="δ per release (default 1e-6)")
    privacy.add_argument(
        "--epsilon-budget",
        type=float,
        default=4.0,
        help="cap on each node's total ε across all its sessions, for every observer class the "
        "policy bounds; refused below one session's cost (default 4.0)",
    )
    privacy.add_argument(
        "--residual-dp",
        action="store_true",
        help="independent noise so the aggregate is differentially private too",
    )
    privacy.add_argument(
        "--construction",
        choices=["pairwise", "cape"],
        default="pairwise",
        help="(default pairwise)",
    )
    privacy.add_argument(
        "--graph", choices=["complete", "harary"], default="complete", help="(default complete)"
    )
    privacy.add_argument("--degree", type=int, default=None, help="neighbours per node (harary)")
    privacy.add_argument(
        "--collusion-threshold",
        type=int,
        default=None,
        help="largest coalition of other nodes to withstand (default min(1, K - 2))",
    )
    privacy.add_argument("--min-cohort-size", type=int, default=100, help="(default 100)")
    privacy.add_argument(
        "--min-nodes",
        type=int,
        default=None,
        help="fewest survivors per round (default and least allowed: the fewest with which no "
        "dropout leaves an observer class without noise, T + 2 on the complete graph)",
    )
    model = parser.add_argument_group("model")
    model.add_argument(
        "--n-features",
        type=int,
        default=None,
        help="features P (default: the number of --feature-bounds rows or --feature-names; "
        "40 with --synthetic)",
    )
    model.add_argument("--n-components", type=int, default=10, help="components J (default 10)")
    model.add_argument(
        "--model-kind",
        default="unbiased",
        help="simple, unbiased, unbiased_quadratic, alternate or alternate_quadratic "
        "(default unbiased; zerosum deltab predicts with unbiased_quadratic by default, as the "
        "public deltab does)",
    )
    model.add_argument(
        "--nan-policy",
        choices=["drop", "mean"],
        default="drop",
        help=(
            "missing feature values: drop the subject at its node (complete data: one round), "
            "or impute the global mean of the observed values (an extra round of means) "
            "(default drop)"
        ),
    )
    model.add_argument(
        "--age-range", default=None, metavar="LO,HI", help="public age bounds (default 18,100)"
    )
    model.add_argument(
        "--feature-range",
        default=None,
        metavar="LO,HI",
        help="public bounds shared by every feature, e.g. --feature-range=-5,5 (with "
        "--feature-names)",
    )
    model.add_argument(
        "--feature-names",
        default=None,
        metavar="NAME,...",
        help="the cohorts' feature columns, in order, for --feature-range",
    )
    model.add_argument(
        "--feature-bounds",
        type=Path,
        default=None,
        metavar="CSV",
        help="public bounds per feature instead: a CSV with the header feature,low,high and "
        "one row per feature, named as the data's columns and in their order",
    )
    model.add_argument(
        "--max-clipped-fraction",
        type=float,
        default=DEFAULT_MAX_CLIPPED_FRACTION,
        metavar="F",
        help="a node refuses to start when any feature (or age) is clipped to the bounds for "
        f"more than this share of its subjects (default {DEFAULT_MAX_CLIPPED_FRACTION:g})",
    )
    summary = parser.add_argument_group("delta summary (off by default)")
    summary.add_argument(
        "--delta-summary",
        type=float,
        default=None,
        metavar="EPS",
        help="after the model, each node releases its subjects' delta mean, SD and quantiles "
        "with Laplace noise at ε = EPS, as an output of its own that its checker reviews "
        "([plan.delta_summary]; counts against --epsilon-budget)",
    )
    summary.add_argument(
        "--delta-range",
        default=None,
        metavar="LO,HI",
        help="public range (years) the deltas are clipped to for the summary; it and "
        "--min-cohort-size fix the noise (default -15,15)",
    )
    init_logreg.add_arguments(parser)
    timing = parser.add_argument_group("session deadlines")
    timing.add_argument("--join-deadline", type=float, default=120.0, help="seconds (default 120)")
    timing.add_argument("--round-deadline", type=float, default=600.0, help="seconds (default 600)")
    timing.add_argument(
        "--max-reruns",
        type=int,
        default=SessionTimings.max_reruns,
        help="superseded attempts allowed per plan round, each a counted release of the same "
        "data; the budget check charges them all (default %(default)s)",
    )


@dataclass(frozen=True)
class _Plan:
    """Everything to write, generated and validated before the first file is touched."""

    config: FederationConfig
    files: dict[Path, tuple[bytes, bool]]  # path -> (content, secret)
    cohorts: dict[Path, Cohort]  # synthetic data: path -> cohort
    seed: int | None
    generated_checkers: frozenset[str] = frozenset()


def _synthetic(
    args: argparse.Namespace, node_ids: Sequence[str]
) -> tuple[dict[str, Cohort], Cohort, ClippingBounds, int]:
    """Cohorts per node, a holdout, and public clipping bounds from the generator's design.

    Feature j is bounded by μ_j + σ_j·(o_j ± 6·s_j) over every site's scanner
    offset o and scale s (population mean μ and spread σ): six standard
    deviations of the standardised signal, which clipping essentially never
    reaches, while keeping the bounds (and so the sensitivity) finite.
    """
    from node.deltab.synthetic import make_federation_cohorts

    seed = args.seed if args.seed is not None else secrets.randbits(128)
    sizes = inputs.sizes(args.cohort_sizes, len(node_ids))
    small = [(n, s) for n, s in zip(node_ids, sizes, strict=True) if s < args.min_cohort_size]
    if small:
        node_id, size = small[0]
        raise InitError(
            f"node {node_id!r} would get {size} subjects, below --min-cohort-size "
            f"{args.min_cohort_size}."
        )
    try:
        federation = make_federation_cohorts(
            sizes, args.n_features, seed, holdout_size=args.holdout_size
        )
    except ValueError as error:  # the generator's own argument checks (node.deltab.synthetic)
        raise InitError(str(error)) from None
    population = federation.population
    lows: list[float] = []
    highs: list[float] = []
    w = _SYNTHETIC_HALF_WIDTH
    for j in range(args.n_features):
        low = min(float(e.offset[j] - w * e.scale[j]) for e in federation.site_effects)
        high = max(float(e.offset[j] + w * e.scale[j]) for e in federation.site_effects)
        mean, sd = float(population.feature_mean[j]), float(population.feature_sd[j])
        lows.append(math.floor((mean + sd * low) * 100) / 100)
        highs.append(math.ceil((mean + sd * high) * 100) / 100)
    # The generator's site age ranges have ends at multiples of 5 years, so
    # rounding the drawn extremes outward recovers the declared span.
    cohorts = [*federation.sites, federation.holdout]
    ages = [float(a) for c in cohorts for a in (c.age.min(), c.age.max()) if c.n_subjects]
    clipping = ClippingBounds(
        age_low=float(5 * math.floor(min(ages) / 5)),
        age_high=float(5 * math.ceil(max(ages) / 5)),
        feature_low=tuple(lows),
        feature_high=tuple(highs),
        feature_names=tuple(federation.sites[0].feature_names),
        max_clipped_fraction=args.max_clipped_fraction,
    )
    by_node = dict(zip(node_ids, federation.sites, strict=True))
    return by_node, federation.holdout, clipping, seed


def _declared_clipping(args: argparse.Namespace) -> ClippingBounds:
    """The bounds of a real cohort, each with its feature's name; there is no default.

    Bounds that do not fit the data clip most values flat and the fit runs
    on what is left, so a federation without --synthetic must declare them.
    """
    if args.feature_bounds is None and args.feature_range is None:
        raise InitError(
            "a real cohort needs public bounds that fit its data: give --feature-bounds CSV "
            "(feature,low,high, one row per feature column) or --feature-range LO,HI with "
            "--feature-names; --synthetic makes synthetic cohorts with bounds of their own."
        )
    names: list[str]
    low: float | list[float]
    high: float | list[float]
    if args.feature_bounds is not None:
        names, low, high = inputs.feature_bounds(args.feature_bounds, args.n_features)
    else:
        if args.feature_names is None:
            raise InitError(
                "--feature-range needs --feature-names NAME,... (the cohorts' feature columns, "
                "in order), so that every node can check its columns against the bounds."
            )
        names = inputs.feature_names(args.feature_names)
        low, high = inputs.pair("--feature-range", args.feature_range)
    if args.n_features is None:
        args.n_features = len(names)
    elif args.n_features != len(names):
        raise InitError(
            f"--feature-names lists {len(names)} features for --n-features {args.n_features}."
        )
    age = inputs.pair("--age-range", args.age_range or "18,100")
    return ClippingBounds.from_table(
        {
            "age_low": age[0],
            "age_high": age[1],
            "feature_names": names,
            "feature_low": low,
            "feature_high": high,
            "max_clipped_fraction": args.max_clipped_fraction,
        },
        args.n_features,
    )


def _deltab_spec(args: argparse.Namespace, clipping: ClippingBounds) -> PlanSpec:
    """The brain-age plan's [plan] from the options, validated like a config that was read."""
    tables: dict[str, dict[str, object]] = {
        "model": {
            "kind": args.model_kind,
            "n_features": args.n_features,
            "n_components": args.n_components,
            "nan_policy": args.nan_policy,
        },
        "clipping": clipping.to_table(),
    }
    if args.delta_range is not None and args.delta_summary is None:
        raise InitError("--delta-range sets the delta summary's range; add --delta-summary EPS.")
    if args.delta_summary is not None:
        delta_range = inputs.pair("--delta-range", args.delta_range or "-15,15")
        tables["delta_summary"] = {
            "enabled": True,
            "epsilon": args.delta_summary,
            "delta_low": delta_range[0],
            "delta_high": delta_range[1],
        }
    settings = DeltabSettings.from_tables(tables)
    return deltab_plan_spec(settings)


def _pinned(spec: PlanSpec) -> PlanSpec:
    """``spec`` with the installed plan's version and code digest (node.plans.registry)."""
    from node.plans.registry import installed_plans

    return installed_plans()[spec.name].pins(spec)


def _check_bounds_options(args: argparse.Namespace) -> None:
    """Refuse clipping options that contradict each other (InitError)."""
    if args.feature_bounds is not None and args.feature_range is not None:
        raise InitError("give --feature-range or --feature-bounds, not both.")
    if args.feature_names is not None and args.feature_bounds is not None:
        raise InitError("--feature-bounds names its features; drop --feature-names.")
    if not args.synthetic or args.plan == "logreg":
        return
    if (
        args.age_range is not None
        or args.feature_range is not None
        or args.feature_bounds is not None
    ):
        raise InitError(
            "--synthetic sets its own clipping bounds; drop --age-range/--feature-range/"
            "--feature-bounds."
        )
    if args.feature_names is not None:
        raise InitError("--synthetic names its own features; drop --feature-names.")


def _deltab_plan(
    args: argparse.Namespace, node_ids: Sequence[str], out: Path
) -> tuple[PlanSpec, dict[Path, Cohort], int | None]:
    """The brain-age plan's [plan]; with --synthetic its cohorts (and holdout) and their seed."""
    if not args.synthetic:
        return _deltab_spec(args, _declared_clipping(args)), {}, None
    if args.n_features is None:
        args.n_features = 40
    by_node, holdout, clipping, seed = _synthetic(args, node_ids)
    cohorts = {out / "nodes" / n / "data.csv": c for n, c in by_node.items()}
    cohorts[out / "holdout.csv"] = holdout
    return _deltab_spec(args, clipping), cohorts, seed


def _credential_files(
    config: FederationConfig,
    out: Path,
    node_ids: Sequence[str],
    identities: dict[str, IdentityKey],
    checkers: dict[str, IdentityKey],
) -> dict[Path, tuple[bytes, bool]]:
    """The CA, the coordinator's and every node's TLS files and keys, the generated checkers'."""
    ca = pki.create_ca(config.federation_id)
    server = pki.issue_server_certificate(ca, [config.coordinator_host])
    files: dict[Path, tuple[bytes, bool]] = {
        out / "ca" / "ca.pem": (ca.certificate_pem(), False),
        out / "ca" / "ca.key": (ca.private_key_pem(), True),
        out / "coordinator" / "server.pem": (server.certificate_pem(), False),
        out / "coordinator" / "server.key": (server.private_key_pem(), True),
    }
    for node_id in node_ids:
        client = pki.issue_client_certificate(ca, node_id)
        folder = out / "nodes" / node_id
        files[folder / "identity.pem"] = (identities[node_id].to_pem(), True)
        files[folder / "client.pem"] = (client.certificate_pem(), False)
        files[folder / "client.key"] = (client.private_key_pem(), True)
    for node_id, checker in checkers.items():
        folder = out / "checkers" / node_id
        files[folder / "checker.pem"] = (checker.to_pem(), True)
        files[folder / "checker.pub"] = (pki.ed25519_public_pem(checker.public_bytes()), False)
    return files


def _plan(args: argparse.Namespace) -> _Plan:
    node_ids = inputs.node_ids(args.nodes)
    out: Path = args.out
    threshold = (
        args.collusion_threshold
        if args.collusion_threshold is not None
        else min(1, len(node_ids) - 2)
    )
    _check_bounds_options(args)
    logreg: LogregSettings | None = None
    seed: int | None = None
    cohorts: dict[Path, Cohort] = {}
    extra: dict[Path, bytes] = {}
    if args.plan == "logreg":
        spec, logreg, extra, seed = init_logreg.build(args, node_ids, out)
    else:
        spec, cohorts, seed = _deltab_plan(args, node_ids, out)
    spec = _pinned(spec)

    identities = {node_id: IdentityKey.generate() for node_id in node_ids}
    given = inputs.checker_keys(args.checker_key, node_ids)
    checkers = {n: IdentityKey.generate() for n in node_ids if n not in given}
    checker_public = dict(given)
    for node_id, checker in checkers.items():
        checker_public[node_id] = [checker.public_bytes()]
    config = FederationConfig(
        federation_id=args.federation_id,
        coordinator_address=args.coordinator,
        ca_certificate="ca/ca.pem",
        nodes=tuple(
            NodeEntry(n, identities[n].public_bytes(), tuple(checker_public[n])) for n in node_ids
        ),
        plan=spec,
        privacy=PrivacyPolicy(
            epsilon=args.epsilon,
            delta=args.delta,
            epsilon_budget=args.epsilon_budget,
            residual_dp=args.residual_dp,
            collusion_threshold=threshold,
            noise_design=NoiseDesignSpec(
                construction=args.construction, graph=args.graph, degree=args.degree
            ),
        ),
        min_cohort_size=args.min_cohort_size,
        min_nodes=_min_nodes(args, len(node_ids), threshold),
        session=SessionTimings(args.join_deadline, args.round_deadline, args.max_reruns),
        stream_check=stream_fingerprint(),
        base_dir=out,
    )

    if logreg is not None:
        config = init_logreg.fit_budget(
            config, logreg, lambda c: _over_budget(c) is not None, say=print
        )
    # Every noise scale fixed once, here, for every party (node.egress.pinned_noise).
    config = pin_noise(config)
    _check_budget(config)
    files = _credential_files(config, out, node_ids, identities, checkers)
    # Written last, so a federation.toml on disk means the folder is complete.
    for path, content in extra.items():  # the logreg plan's data files
        files[path] = (content, False)
    comments = DeltabSettings.comments() if config.plan.name == "deltab" else {}
    text = dump_federation(config, comments=comments)
    files[out / CONFIG_NAME] = (text.encode("utf-8"), False)
    kit_files = init_kits.kit_files(out, files, config)
    readmes = init_kits.readme_texts(
        config, generated_checkers=frozenset(checkers), synthetic=bool(cohorts) or bool(extra)
    )
    for name, readme in readmes.items():
        kit_files[out / init_kits.KITS_FOLDER / name / "README.txt"] = (readme.encode(), False)
    # The kits go before the main federation.toml, which stays the last file written.
    config_entry = files.pop(out / CONFIG_NAME)
    files.update(kit_files)
    files[out / CONFIG_NAME] = config_entry
    cohorts.update(init_kits.kit_files(out, cohorts, config))
    return _Plan(config, files, cohorts, seed, frozenset(checkers))


def _over_budget(config: FederationConfig) -> tuple[ObserverTotal, float] | None:
    """The worst checked class one session would take past the budget, and the ε needed.

    The cost is that of ``node.egress.budget.one_session``: every node, every plan
    round released once, the worst node; classes unbounded by design (the
    coordinator without residual noise) are not held to the budget. None when
    the budget admits a session (or the design itself is infeasible, which the
    nodes refuse with its reason).
    """
    from node.egress.budget import BUDGET_RTOL, checked, one_session
    from node.egress.pinned_noise import pinned
    from node.plans.registry import installed_plans
    from noise.errors import NoiseError

    if not pinned(config):
        config = pin_noise(config)
    privacy = config.privacy
    definition = installed_plans()[config.plan.name]
    rounds = {
        name: definition.public_sensitivities(config, name) for name in config.plan.round_names
    }
    laplace: list[float] = []
    if config.plan.name == "deltab":
        summary = DeltabSettings.from_tables(config.plan.settings).delta_summary
        laplace = [summary.epsilon] if summary is not None and summary.enabled else []
    try:
        totals = one_session(config, rounds, laplace=laplace)
    except NoiseError:
        return None
    over = [
        t
        for t in totals
        if checked(t.label, privacy.residual_dp)
        and t.epsilon > privacy.epsilon_budget * (1.0 + BUDGET_RTOL)
    ]
    if not over:
        return None
    need = max(t.epsilon for t in totals if checked(t.label, privacy.residual_dp))
    return max(over, key=lambda t: t.epsilon), need


def _check_budget(config: FederationConfig) -> None:
    """Refuse a budget that one session's releases would pass for any class it caps."""
    from node.egress.budget import describe

    found = _over_budget(config)
    if found is None:
        return
    worst, need = found
    privacy = config.privacy
    suggest = math.ceil(need * 100 - 1e-9) / 100
    raise InitError(
        f"--epsilon-budget {privacy.epsilon_budget:g} is below the cost of one session against "
        f"{describe(worst.label)} ({worst.label}): ε = {worst.epsilon:.4g} over "
        f"{worst.releases} release{'s' if worst.releases != 1 else ''} at δ = "
        f"{privacy.delta:g}, so no node could take part in any session; pass "
        f"--epsilon-budget {suggest:g} or more (one session), or a multiple for more sessions."
    )


def _write(plan: _Plan, *, force: bool) -> None:
    secret_folders = {path.parent for path, (_, secret) in plan.files.items() if secret}
    for folder in sorted({path.parent for path in plan.files}):
        # Folders created to hold private keys are the owner's alone.
        folder.mkdir(parents=True, exist_ok=True, mode=0o700 if folder in secret_folders else 0o777)
    if plan.cohorts:
        from node.deltab.synthetic import write_cohort_csv

        for path, cohort in plan.cohorts.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            write_cohort_csv(cohort, path)
    for path, (content, secret) in plan.files.items():
        writer = pki.write_private_file if secret else pki.write_public_file
        writer(path, content, overwrite=force)


def _summary(plan: _Plan, out: Path) -> str:
    config = plan.config
    width = max(len(n) for n in config.node_ids)
    lines = [
        f"federation {config.federation_id!r}: {len(config.nodes)} nodes, "
        f"config hash {config_hash(config).hex()[:16]}…, written to {out}",
        f"  {CONFIG_NAME:<34} share with every node and the coordinator (identical copies)",
        f"  {'ca/ca.pem':<34} share with every node and the coordinator",
        f"  {'ca/ca.key':<34} SECRET: keep offline; it can mint certificates",
        f"  {'coordinator/server.pem, server.key':<34} coordinator only (server.key SECRET)",
    ]
    for node_id in config.node_ids:
        folder = f"nodes/{node_id}/".ljust(width + 7)
        lines.append(
            f"  {folder + '*':<34} node {node_id!r} only (identity.pem and client.key SECRET)"
        )
    for node_id in config.node_ids:
        if node_id in plan.generated_checkers:
            folder = f"checkers/{node_id}/".ljust(width + 10)
            lines.append(
                f"  {folder + '*':<34} the output checker of {node_id!r} only "
                "(checker.pem SECRET; never on the node)"
            )
        else:
            lines.append(f"  output checker of {node_id!r}: the key given with --checker-key")
    kits = ", ".join(init_kits.kit_names(config))
    lines.append(
        f"  {init_kits.KITS_FOLDER}/<party>/: one folder per party holding exactly its files, "
        f"with a README.txt of its commands: {kits}"
    )
    if config.plan.name == "deltab":
        clipping = DeltabSettings.from_tables(config.plan.settings).clipping
        names = clipping.feature_names
        shown = ", ".join(names[:3]) + (", …" if len(names) > 3 else "")
        lines.append(
            f"  bounds for {len(names)} features, by name ({shown}); "
            f"a node refuses a feature clipped for more than {clipping.max_clipped_fraction:.0%} "
            "of its subjects (check first: zerosum node --check)"
        )
    if plan.cohorts:
        counts = ", ".join(
            f"{path.parent.name}={cohort.n_subjects}"
            for path, cohort in plan.cohorts.items()
            if path.name == "data.csv" and path.parent.parent == out / "nodes"
        )
        lines.append(f"  synthetic cohorts (seed {plan.seed}): {counts}; holdout.csv")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.action == "revoke":
        return revoke_command.run_revoke(args)
    if args.action != "init":  # pragma: no cover - argparse restricts the choices
        return 2
    out: Path = args.out
    try:
        plan = _plan(args)
    except (CommandError, ProtoError, NoiseError, NodeError) as error:
        print(f"zerosum federation init: {error}", file=sys.stderr)
        return 2
    if not args.force:
        existing = [p for p in [out / CONFIG_NAME, *plan.files, *plan.cohorts] if p.exists()]
        if existing:
            first = existing[0]
            print(
                f"zerosum federation init: {first} already exists; pass --force to replace it.",
                file=sys.stderr,
            )
            return 2
    _write(plan, force=args.force)
    print(_summary(plan, out))
    print(survivors_line(plan.config))
    return 0


def safe_min_nodes(
    node_count: int, threshold: int, *, construction: str, graph: str, degree: int | None
) -> int:
    """The fewest survivors with which no dropout leaves an observer class without noise.

    Pairwise, complete graph: a survivor shares a pair term with each of the
    other K − 1 nodes; its unmask answer reveals those with the |D| dropped
    nodes, and T colluders pool theirs, so K − 1 − |D| − T terms are left,
    at least one exactly when |S| = K − |D| ≥ T + 2. Harary graph of degree d:
    in the worst case every dropped node is a neighbour, so d − |D| − T ≥ 1,
    |S| ≥ K − d + T + 1. CAPE reveals no pair terms (a round with dropouts is
    rerun among S), and T colluders among |S| nodes leave τ²(1 − 1/(|S| − T)),
    positive exactly when |S| ≥ T + 2. Never below 2 (the config's least).
    """
    if construction == "pairwise" and graph == "harary" and degree is not None:
        need = node_count - degree + threshold + 1
    else:
        need = threshold + 2
    return max(need, 2)


def _min_nodes(args: argparse.Namespace, node_count: int, threshold: int) -> int:
    """``--min-nodes``, or the safe default; refused below the safe value (InitError)."""
    need = safe_min_nodes(
        node_count,
        threshold,
        construction=args.construction,
        graph=args.graph,
        degree=args.degree,
    )
    # Above K the design itself is infeasible, which the noise design's check names.
    need = min(need, node_count)
    if args.min_nodes is None:
        return need
    if args.min_nodes < need:
        raise InitError(
            f"--min-nodes {args.min_nodes} is below {need}, the fewest survivors with which "
            f"revealing pair terms with the dropped nodes (collusion threshold {threshold}) "
            "never leaves an observer class without noise; pass --min-nodes "
            f"{need} or more, or lower --collusion-threshold"
        )
    return int(args.min_nodes)


def survivors_line(config: FederationConfig) -> str:
    """One line on what ``min_nodes`` means for dropouts in this federation."""
    count = len(config.nodes)
    lost = count - config.min_nodes
    if lost <= 0:
        may = "no node may drop out (the session stops at the first dropout)"
    else:
        may = f"at most {lost} node{'s' if lost > 1 else ''} may drop out of a round"
    return (
        f"min_nodes = {config.min_nodes}: every round needs that many survivors, so that no "
        f"dropout leaves an observer class without noise (collusion threshold "
        f"{config.privacy.collusion_threshold}); with {count} nodes {may}."
    )
