"""The node's deltab plan when a valid aggregate cannot fit the configured model."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import numpy as np
import pytest

from node.errors import ModelFitError
from node.plans.deltab.cohort import load_cohort
from node.plans.deltab.plan import DeltabPlan
from proto.federation import load_federation
from zerosum.commands import federation as command


def _federation(out: Path) -> Path:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    argv = ["init", "--nodes", "a,b", "--out", str(out), "--synthetic", "--seed", "5"]
    argv += ["--n-features", "8", "--n-components", "8", "--holdout-size", "40"]
    assert command.run(parser.parse_args(argv)) == 0
    return out


def test_a_model_the_aggregate_cannot_support_is_one_sentence_and_capped_under_residual_dp(
    tmp_path: Path,
) -> None:
    out = _federation(tmp_path / "fed")
    config = load_federation(out / "federation.toml")
    cohort = load_cohort(out / "nodes" / "a" / "data.csv", config)
    clipping = config.plan.settings["clipping"]
    low, high = np.asarray(clipping["feature_low"]), np.asarray(clipping["feature_high"])
    features = cohort.features.copy()
    # Feature 7 becomes feature 0 mapped onto feature 7's public range, so their
    # pre-scaled values are equal and the sums support 7 components, not 8.
    features[:, 7] = low[7] + (features[:, 0] - low[0]) * (high[7] - low[7]) / (high[0] - low[0])
    cohort = dataclasses.replace(cohort, features=features)

    plan = DeltabPlan(config, cohort)
    with pytest.raises(ModelFitError) as refused:
        plan.receive("sums", plan.tensors("sums"))
    message = str(refused.value)
    assert message.startswith("the aggregate of round 'sums' cannot fit the configured model")
    assert "numerical rank 7" in message and "\n" not in message
    assert not plan.complete

    noised = dataclasses.replace(
        config, privacy=dataclasses.replace(config.privacy, residual_dp=True)
    )
    plan = DeltabPlan(noised, cohort)
    plan.receive("sums", plan.tensors("sums"))
    assert plan.complete
    brain_age, delta = plan.predict()
    assert np.isfinite(brain_age).all() and np.isfinite(delta).all()
