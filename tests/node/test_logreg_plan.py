"""The logistic-regression plan: clipped gradients bound the sensitivity; rounds run in order."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from node.errors import LocalDataError
from node.plans.logreg import (
    COUNT,
    LogregPlan,
    LogregSettings,
    clipped_gradient_sum,
    read_labelled,
    sigmoid,
)
from noise.fixed_point import FixedPointCodec, wrapping_sum
from proto.federation import ConfigError, FederationConfig, load_federation
from zerosum.commands import federation as command


@pytest.fixture(scope="module")
def federation(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("logreg") / "fed"
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    argv = ["init", "--plan", "logreg", "--nodes", "a,b,c", "--out", str(out), "--synthetic"]
    argv += ["--seed", "8", "--rounds", "6", "--epsilon-budget", "8"]
    assert command.run(parser.parse_args(argv)) == 0
    return out


def _plans(out: Path) -> tuple[FederationConfig, dict[str, LogregPlan]]:
    config = load_federation(out / "federation.toml")
    p = LogregSettings.from_tables(config.plan.settings).n_features
    return config, {
        n: LogregPlan(config, read_labelled(out / "nodes" / n / "data.csv", p)) for n in "abc"
    }


def test_one_subject_moves_a_rounds_sum_by_at_most_the_clip_norm() -> None:
    rng = np.random.default_rng(11)
    for clip in (0.1, 1.0, 3.0):
        for _ in range(30):
            x = np.hstack([rng.uniform(-1, 1, size=(40, 5)), np.ones((40, 1))])
            y = rng.integers(0, 2, size=40).astype(float)
            theta = rng.normal(0, 3, size=6)
            base, _ = clipped_gradient_sum(x[:-1], y[:-1], theta, clip)
            more, _ = clipped_gradient_sum(x, y, theta, clip)
            assert np.linalg.norm(more - base) <= clip * (1 + 1e-12)


def test_rounds_in_process_give_every_node_the_same_weights_as_full_batch_descent(
    federation: Path,
) -> None:
    config, plans = _plans(federation)
    settings = LogregSettings.from_tables(config.plan.settings)
    assert config.plan.round_names == (COUNT, *(f"step-{t}" for t in range(1, 7)))
    codec = FixedPointCodec(config.fixed_point_bits)
    for name in config.plan.round_names:
        layout = config.plan.round(name).layout
        total = layout.decode(
            wrapping_sum([layout.encode(p.tensors(name), codec) for p in plans.values()]), codec
        )
        for p in plans.values():
            p.receive(name, total)
    thetas = [p.theta for p in plans.values()]
    assert all(np.array_equal(thetas[0], t) for t in thetas)
    assert all(p.complete for p in plans.values())
    # The same steps on the pooled data in floating point: equal to fixed-point rounding.
    x = np.vstack([settings.prescale(p.table.features) for p in plans.values()])
    y = np.concatenate([p.table.labels for p in plans.values()])
    theta = np.zeros(x.shape[1])
    for _ in range(settings.rounds):
        grad, _ = clipped_gradient_sum(x, y, theta, settings.clip_norm)
        theta = theta - settings.learning_rate * (grad / len(y) + settings.l2 * theta)
    np.testing.assert_allclose(thetas[0], theta, rtol=0, atol=1e-7)
    accuracy = np.mean((sigmoid(x @ thetas[0]) >= 0.5) == (y == 1))
    assert accuracy > 0.85


def test_rounds_out_of_order_are_refused(federation: Path) -> None:
    _, plans = _plans(federation)
    plan = plans["a"]
    with pytest.raises(ValueError, match="round 'step-1' out of order"):
        plan.tensors("step-1")
    plan.receive(COUNT, {"n": np.asarray(456.0)})
    with pytest.raises(ValueError, match="out of order"):
        plan.receive(COUNT, {"n": np.asarray(456.0)})


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rounds": 0}, "plan.model.rounds"),
        ({"clip_norm": -1.0}, "plan.model.clip_norm"),
        ({"learning_rate": 0}, "plan.model.learning_rate"),
        ({"l2": -0.1}, "plan.model.l2"),
        ({"kind": "probit"}, "plan.model.kind"),
        ({"momentum": 0.9}, "plan.model.momentum"),
    ],
)
def test_settings_errors_name_the_field(
    federation: Path, change: dict[str, object], field: str
) -> None:
    tables = load_federation(federation / "federation.toml").plan.settings
    model = {**tables["model"], **change}
    with pytest.raises(ConfigError) as refused:
        LogregSettings.from_tables({**tables, "model": model})
    assert field in str(refused.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name,label,f1\nx,1,2\n", "the header must begin with id,label"),
        ("id,label,f1\nx,2,0.5\n", "label '2' is not 0 or 1"),
        ("id,label,f1\nx,1,0.5\nx,0,0.1\n", "subject ids repeat"),
        ("id,label,f1\nx,1,abc\n", "line 2: a value is not a number"),
        ("id,label,f1,f2\nx,1,0.5,1\n", "has 2 feature columns; the plan declares 1"),
    ],
)
def test_bad_data_files_are_one_sentence(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "data.csv"
    path.write_text(text)
    with pytest.raises(LocalDataError, match=words.replace("(", r"\(").replace(")", r"\)")):
        read_labelled(path, 1)


def test_init_stops_early_at_the_budget(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    out = tmp_path / "fed"
    argv = ["init", "--plan", "logreg", "--nodes", "a,b,c", "--out", str(out), "--synthetic"]
    assert command.run(parser.parse_args([*argv, "--rounds", "50"])) == 0
    said = capsys.readouterr().out
    config = load_federation(out / "federation.toml")
    kept = len(config.plan.round_names) - 1
    assert 1 <= kept < 50
    assert f"admits {kept} of the 50 requested gradient steps" in said
    assert LogregSettings.from_tables(config.plan.settings).rounds == kept
