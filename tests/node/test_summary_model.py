"""The delta summary is ε-DP in the node's cohort: its model leaves the node's subjects out.

"ε-DP for any fixed model" covered only an observer who already holds the
exact model; the federated model depends on every subject. The summary now
scores a node's subjects with the model fitted on the *other* nodes' sums
(the aggregate less the node's own fixed-point contribution), so one subject
added or removed changes its own delta and nothing else — exactly, bit for
bit, shown here — and the Laplace sensitivities hold whatever else an
observer knows. No file of the bundle, which leaves the TRE whole, holds the
exact N.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from node.deltab import BrainAgeModel
from node.plans.deltab.cohort import LocalCohort, load_cohort
from node.plans.deltab.delta_summary import summarise
from node.plans.deltab.plan import DeltabPlan, plan_settings
from node.plans.deltab.settings import DeltabSettings
from node.plans.deltab.summary_bundle import SummaryBundle, audit_folder, summary_folder
from node.plans.deltab.summary_review import review_summary
from noise.fixed_point import FixedPointCodec, wrapping_sum
from proto.federation import FederationConfig, load_federation
from zerosum.commands import federation as command

NODES = ("a", "b", "c")


def _init(out: Path, *extra: str) -> int:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    argv = ["init", "--nodes", ",".join(NODES), "--out", str(out), "--synthetic", "--seed", "7"]
    argv += ["--n-features", "6", "--n-components", "3", "--holdout-size", "40"]
    argv += ["--cohort-sizes", "120,110,130", *extra]
    return command.run(parser.parse_args(argv))


@pytest.fixture(scope="module", params=["drop", "mean"])
def federation(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[FederationConfig, dict[str, Any]]:
    policy = str(request.param)
    out = tmp_path_factory.mktemp(f"summary-model-{policy}") / "fed"
    assert _init(out, "--delta-summary", "1.0", "--nan-policy", policy) == 0
    config = load_federation(out / "federation.toml")
    cohorts = {n: load_cohort(out / "nodes" / n / "data.csv", config) for n in NODES}
    if policy == "mean":
        # Gaps for the imputation to fill: 5 % of the feature values, none of a's last subject.
        rng = np.random.default_rng(11)
        for node, cohort in cohorts.items():
            features = cohort.features.copy()
            gaps = rng.random(features.shape) < 0.05
            if node == "a":
                gaps[-1] = False
            features[gaps] = np.nan
            cohorts[node] = dataclasses.replace(cohort, features=features)
    return config, cohorts


def _session(
    config: FederationConfig, cohorts: dict[str, LocalCohort], members: tuple[str, ...]
) -> dict[str, DeltabPlan]:
    """Each member's plan after taking in the exact aggregate of every round."""
    codec = FixedPointCodec(config.fixed_point_bits)
    plans = {n: DeltabPlan(config, cohorts[n]) for n in members}
    for spec in config.plan.rounds:
        layout = spec.layout
        words = wrapping_sum(layout.encode(p.tensors(spec.name), codec) for p in plans.values())
        for plan in plans.values():
            plan.receive(spec.name, layout.decode(words, codec))
    return plans


def test_a_node_is_scored_with_the_model_of_the_others_and_its_subjects_move_only_themselves(
    federation: tuple[FederationConfig, dict[str, Any]],
) -> None:
    config, cohorts = federation
    plans = _session(config, cohorts, NODES)
    # The model of b and c alone, applied to a's subjects: the same numbers exactly.
    others = _session(config, cohorts, ("b", "c"))["b"].state.model
    assert others is not None
    a = cohorts["a"]
    deltas = plans["a"].summary_deltas()
    assert np.array_equal(deltas, others.predict_delta(a.features, a.age))
    assert np.isfinite(deltas).sum() > 100

    # a without its last subject: every other subject's delta is bit for bit the same
    # (the model it is scored with does not depend on a's cohort) ...
    smaller = dataclasses.replace(a, ids=a.ids[:-1], age=a.age[:-1], features=a.features[:-1])
    again = _session(config, {**cohorts, "a": smaller}, NODES)
    assert np.array_equal(again["a"].summary_deltas(), deltas[:-1], equal_nan=True)
    # ... while under the federated model, which the old summary used, all of them moved.
    moved = again["a"].predict()[1] - plans["a"].predict()[1][:-1]
    finite = np.isfinite(moved)
    assert np.count_nonzero(moved[finite]) == np.count_nonzero(finite) > 100


def test_no_file_of_the_summary_bundle_holds_the_exact_n(
    federation: tuple[FederationConfig, dict[str, Any]], tmp_path: Path
) -> None:
    config, _ = federation
    settings = DeltabSettings.from_tables(config.plan.settings).delta_summary
    assert settings is not None
    n = 4321
    deltas = np.random.default_rng(3).normal(0.0, 4.0, size=n)
    summary = summarise(deltas, settings, n_floor=config.min_cohort_size, seed=bytes([5]) * 32)
    bundle = SummaryBundle.write(
        tmp_path,
        summary,
        session_id="s" * 32,
        node_id="a",
        config_hash="00" * 32,
        model_sha256="11" * 32,
        totals=(),
    )
    folder = summary_folder(tmp_path)
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    assert {p.name for p in files} >= {"manifest.json", "results.json", "values.csv"}
    digest = re.compile(r"[0-9a-f]{64}")
    # A timestamp's microseconds may spell any four digits (…:07.154321).
    timestamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?")
    for path in files:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".json":
            for value in _leaves(json.loads(text)):
                if isinstance(value, str) and (
                    digest.fullmatch(value) or timestamp.fullmatch(value)
                ):
                    continue
                assert value != n and not (isinstance(value, str) and str(n) in value), (
                    path.name,
                    value,
                )
        else:
            assert str(n) not in text, path.name
    assert bundle.manifest["sdc"]["n_at_least"] == config.min_cohort_size
    # The exact N stays in the TRE, where the reviewer's --audit checks it.
    audit = json.loads((audit_folder(tmp_path) / "audit.json").read_text(encoding="utf-8"))
    assert audit["n_subjects"] == n
    review = review_summary(folder, audit=audit_folder(tmp_path))
    sdc = [f for f in review.findings if f.check == "sdc"]
    assert [f.level for f in sdc] == ["pass"] and f"N = {n} subjects in the audit" in sdc[0].message


def _leaves(document: Any) -> list[Any]:
    if isinstance(document, dict):
        return [x for key, value in document.items() for x in [key, *_leaves(value)]]
    if isinstance(document, list):
        return [x for value in document for x in _leaves(value)]
    return [document]


def test_the_mean_imputation_round_releases_nothing_that_depends_on_another_node(
    tmp_path: Path,
) -> None:
    """Under nan_policy "mean" a node's sums are the same whatever the others hold.

    The means are applied to the aggregates (node.deltab.sums), so node a's
    two payloads are identical bytes next to different partners, and the
    federated model still equals the pooled mean-imputed fit.
    """
    assert _init(tmp_path / "fed", "--nan-policy", "mean") == 0
    config = load_federation(tmp_path / "fed" / "federation.toml")
    rng = np.random.default_rng(2)
    cohorts = {}
    for node in NODES:
        cohort = load_cohort(tmp_path / "fed" / "nodes" / node / "data.csv", config)
        features = cohort.features.copy()
        features[rng.random(features.shape) < 0.1] = np.nan
        cohorts[node] = dataclasses.replace(cohort, features=features)
    codec = FixedPointCodec(config.fixed_point_bits)
    payloads = []
    for partner in ("b", "c"):
        plans = _session(config, cohorts, ("a", partner))
        payloads.append(
            [
                spec.layout.encode(plans["a"].tensors(spec.name), codec)
                for spec in config.plan.rounds
            ]
        )
    assert all(np.array_equal(x, y) for x, y in zip(*payloads, strict=True))
    plans = _session(config, cohorts, NODES)
    settings = plan_settings(config)
    pooled = BrainAgeModel(settings.model, n_components=settings.n_components, nan_policy="mean")
    pooled.fit(
        np.vstack([cohorts[n].features for n in NODES]),
        np.concatenate([cohorts[n].age for n in NODES]),
    )
    holdout = cohorts["a"]
    federated = plans["a"].state.model
    assert federated is not None
    got = federated.predict_age(holdout.features, holdout.age)
    want = pooled.predict_age(holdout.features, holdout.age)
    assert np.max(np.abs(got - want)) <= 1e-9 * np.max(np.abs(want))
