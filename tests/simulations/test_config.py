"""Presets, TOML overrides and the errors that name the bad field."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from simulations.config import PRESETS, SimulationConfigError, UtilityParams, load_config


def test_quick_preset_sweeps_every_axis_around_its_base() -> None:
    config = PRESETS["quick"]
    cells = config.utility_cells()
    assert cells[0] == config.base
    assert len(cells) == len(set(cells))
    for name, values in config.axes:
        seen = {getattr(c, name) for c in cells}
        assert set(values) <= seen
    assert config.reps >= 20
    full = PRESETS["full"]
    assert max(full.axis("n_nodes")) == 1000 and min(full.axis("n_nodes")) == 2
    assert min(full.axis("epsilon")) == 0.1 and max(full.axis("epsilon")) == 10.0


def test_toml_overrides_the_preset(tiny_config: Path) -> None:
    config = load_config("quick", tiny_config)
    assert config.seed == 99 and config.reps == 3
    assert config.base.n_nodes == 4 and config.base.epsilon == 1.0
    assert config.axis("delta") == ()
    assert config.attack_epsilons == (1.0,)
    assert config.attack.coalition_sizes == (1, 2)
    assert config.utility_cells() == [
        UtilityParams(n_nodes=4, n_per_node=300, n_features=5, holdout_size=150),
        UtilityParams(n_nodes=3, n_per_node=300, n_features=5, holdout_size=150),
        UtilityParams(n_nodes=4, epsilon=0.3, n_per_node=300, n_features=5, holdout_size=150),
        UtilityParams(n_nodes=4, epsilon=3.0, n_per_node=300, n_features=5, holdout_size=150),
    ]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[base]\nn_nodes = 1\n", "base.n_nodes"),
        ("[base]\nepsilon = -1\n", "base.epsilon"),
        ("[base]\nnodes = 3\n", "base.nodes"),
        ("[axes]\ndelta = [2.0]\n", "axes.delta"),
        ("[axes]\ncolour = [1]\n", "axes.colour"),
        ('schemes = ["zerosum", "magic"]\n', "schemes"),
        ("reps = 0\n", "reps"),
        ("[attack]\ntrials = 'many'\n", "attack.trials"),
        ("unknown = 1\n", "unknown"),
    ],
)
def test_bad_settings_name_the_field(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SimulationConfigError) as caught:
        load_config("quick", path)
    assert caught.value.field == field
    assert field in str(caught.value)


def test_missing_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(SimulationConfigError, match="does not exist"):
        load_config("quick", tmp_path / "absent.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("seed = = 1\n", encoding="utf-8")
    with pytest.raises(SimulationConfigError, match="not valid TOML"):
        load_config("quick", broken)
    with pytest.raises(SimulationConfigError, match="preset"):
        load_config("huge")
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(SimulationConfigError, match="nest"):
        load_config("quick", deep)
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(SimulationConfigError, match="FIFO"):
        load_config("quick", fifo)
