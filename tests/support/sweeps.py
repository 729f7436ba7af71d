"""A tiny sweep configuration for the sweep and CLI tests (its fixture: simulations/conftest.py)."""

from __future__ import annotations

from pathlib import Path

TINY_TOML = """\
seed = 99
reps = {reps}

[base]
n_nodes = 4
n_per_node = 300
n_features = 5
holdout_size = 150

[axes]
n_nodes = [3]
epsilon = [0.3, 3.0]
delta = []
n_per_node = []
n_features = []
site_offset_sd = []

[attack]
n_nodes = 4
n_per_node = 50
n_features = 3
trials = 200
coalition_sizes = [1, 2]
epsilons = [1.0]

[reconstruction]
targets = 30

[overtheair]
reps = 3
iterations = 40
"""


def write_tiny_config(folder: Path, *, reps: int = 3) -> Path:
    path = folder / "tiny.toml"
    path.write_text(TINY_TOML.format(reps=reps), encoding="utf-8")
    return path
