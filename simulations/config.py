"""Sweep configuration: presets, TOML overrides, validation, and the list of cells.

A sweep varies one parameter at a time around a base point (the ``[base]``
table), over the values listed in ``[axes]``; every distinct parameter set is
a *utility cell* run ``reps`` times. Attack, reconstruction and over-the-air
cells are listed from their own tables. A TOML file overrides the chosen
preset key by key::

    seed = 7
    reps = 20
    schemes = ["none", "independent", "zerosum", "zerosum+residual", "seed_fedavg"]
    constructions = ["pairwise", "cape"]

    [base]
    n_nodes = 10
    epsilon = 1.0

    [axes]
    epsilon = [0.1, 1.0, 10.0]

    [attack]
    trials = 4000

    [dropout]
    graphs = ["complete", "harary"]
    n_nodes = [10, 100, 1000]
    rates = [0.0, 0.1, 0.3]

``scenarios`` picks which kinds of cell the sweep runs (default: all of
``SCENARIOS``). The ``[dropout]`` table lists the dropout scenario's cells
(``simulations.dropout``): every combination of graph (the complete graph,
and the Harary graph once per degree in ``harary_degrees``), K, dropout rate
and collusion threshold T for which a design exists (T ≤ K − 2 for the
complete graph, T < d < K for H_{d,K}); ``n_nodes = []`` leaves it out.

Unknown keys and bad values raise :class:`SimulationConfigError`, naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from bounded.files import LocalFileError, MissingFileError, read_limited_text
from bounded.nesting import NestingError, check_text_nesting
from node.deltab import MODELS as deltab_models
from simulations.dropout import GRAPHS, DropoutParams
from simulations.errors import SimulationError
from simulations.schemes import CONSTRUCTIONS, SCHEMES

__all__ = [
    "AXES",
    "PRESETS",
    "SCENARIOS",
    "AttackParams",
    "DropoutParams",
    "DropoutSweep",
    "OverTheAirParams",
    "ReconstructionParams",
    "SimConfig",
    "SimulationConfigError",
    "UtilityParams",
    "load_config",
]

#: The kinds of cell a sweep can run, in report order.
SCENARIOS = ("utility", "attack", "reconstruction", "overtheair", "dropout")

MODELS = deltab_models  # listed once, in node.deltab

# A sweep configuration is a few kilobytes of TOML.
_CONFIG_BYTES = 1 << 20


class SimulationConfigError(SimulationError, ValueError):
    """A simulation setting is unknown or out of range; names the field and the value."""

    def __init__(self, field_name: str, value: object, reason: str) -> None:
        self.field = field_name
        self.value = value
        self.reason = reason
        super().__init__(f"simulation setting {field_name} = {value!r} {reason}")


@dataclass(frozen=True)
class UtilityParams:
    """One point of the utility sweep.

    ``feature_proportion`` keeps the top floor(p·P) principal components (Smith
    et al. 2019 keep 10–25 %); 0 keeps every component (least squares on all
    features), which noisy scatter matrices make ill-conditioned.
    """

    n_nodes: int = 10
    epsilon: float = 1.0
    delta: float = 1e-6
    n_per_node: int = 1000
    n_features: int = 20
    site_offset_sd: float = 0.5
    collusion_threshold: int = 1
    coalition_size: int = 1
    holdout_size: int = 1000
    model: str = "unbiased"
    feature_proportion: float = 0.25


AXES = ("n_nodes", "epsilon", "delta", "n_per_node", "n_features", "site_offset_sd")


@dataclass(frozen=True)
class AttackParams:
    """Membership inference against one node's scatter-round release (one ε per cell).

    The attack uses few features (5) to keep the trials cheap: the release is
    calibrated per egress, so the declared μ does not depend on P.
    """

    n_nodes: int = 10
    epsilon: float = 1.0
    delta: float = 1e-6
    n_per_node: int = 200
    n_features: int = 5
    site_offset_sd: float = 0.5
    collusion_threshold: int = 1
    coalition_sizes: tuple[int, ...] = (1, 2, 4, 8)
    trials: int = 2000


@dataclass(frozen=True)
class ReconstructionParams:
    """Difference attack on two releases of a small node (with and without one subject)."""

    n_nodes: int = 5
    epsilon: float = 1.0
    delta: float = 1e-6
    n_per_node: int = 20
    n_features: int = 20
    site_offset_sd: float = 0.5
    collusion_threshold: int = 1
    targets: int = 200


@dataclass(frozen=True)
class OverTheAirParams:
    """Gradient descent under the over-the-air model with zero-sum vs uncorrelated perturbations."""

    n_users: int = 10
    dim: int = 20
    samples_per_user: int = 40
    ridge: float = 0.1
    iterations: int = 200
    perturbation_std: float = 1.0
    channel_noise_std: float = 0.05
    power_scaling: float = 1.0
    reps: int = 20


@dataclass(frozen=True)
class DropoutSweep:
    """The dropout scenario: the grid of (graph, K, rate, T) cells and their repetitions."""

    graphs: tuple[str, ...] = GRAPHS
    harary_degrees: tuple[int, ...] = (8,)
    n_nodes: tuple[int, ...] = (10, 50)
    rates: tuple[float, ...] = (0.0, 0.1, 0.3)
    collusion_thresholds: tuple[int, ...] = (1, 3)
    epsilon: float = 1.0
    delta: float = 1e-6
    reps: int = 50

    def cells(self) -> list[DropoutParams]:
        """Every combination with a feasible design, graph by graph, then K, T and rate."""
        graphs: list[tuple[str, int]] = []
        for graph in self.graphs:
            if graph == "harary":
                graphs += [("harary", d) for d in self.harary_degrees]
            else:
                graphs.append((graph, 0))
        out: list[DropoutParams] = []
        for graph, degree in graphs:
            for k in self.n_nodes:
                for t in self.collusion_thresholds:
                    if graph == "complete" and t > k - 2:
                        continue
                    if graph == "harary" and not t < degree < k:
                        continue
                    out += [
                        DropoutParams(graph, degree, k, float(r), t, self.epsilon, self.delta)
                        for r in self.rates
                    ]
        return out


@dataclass(frozen=True)
class SimConfig:
    """Everything a sweep needs; cells and seeds are functions of it alone."""

    preset: str
    seed: int
    reps: int
    schemes: tuple[str, ...]
    constructions: tuple[str, ...]
    base: UtilityParams
    axes: tuple[tuple[str, tuple[float, ...]], ...]
    attack: AttackParams
    attack_epsilons: tuple[float, ...]
    reconstruction: ReconstructionParams
    overtheair: OverTheAirParams
    dropout: DropoutSweep = DropoutSweep()
    scenarios: tuple[str, ...] = SCENARIOS

    def utility_cells(self) -> list[UtilityParams]:
        """Distinct parameter sets: the base, then each axis value in the order given."""
        cells: list[UtilityParams] = [self.base]
        for name, values in self.axes:
            for value in values:
                cast: object = int(value) if name in _INT_FIELDS else float(value)
                point = replace(self.base, **{name: cast})  # type: ignore[arg-type]
                if point not in cells:
                    cells.append(point)
        return cells

    def attack_cells(self) -> list[AttackParams]:
        return [replace(self.attack, epsilon=float(e)) for e in self.attack_epsilons]

    def axis(self, name: str) -> tuple[float, ...]:
        return dict(self.axes).get(name, ())


_INT_FIELDS = {
    "n_nodes",
    "n_per_node",
    "n_features",
    "collusion_threshold",
    "coalition_size",
    "holdout_size",
    "trials",
    "targets",
    "n_users",
    "dim",
    "samples_per_user",
    "iterations",
    "reps",
}

_QUICK = SimConfig(
    preset="quick",
    seed=20251129,
    reps=20,
    schemes=SCHEMES,
    constructions=CONSTRUCTIONS,
    base=UtilityParams(),
    axes=(
        ("n_nodes", (2, 5, 10, 50)),
        ("epsilon", (0.1, 0.3, 1.0, 3.0, 10.0)),
        ("delta", (1e-9, 1e-6, 1e-3)),
        ("n_per_node", (250, 1000, 4000)),
        ("n_features", (10, 20)),
        ("site_offset_sd", (0.0, 0.5, 1.0)),
    ),
    attack=AttackParams(),
    attack_epsilons=(0.1, 0.3, 1.0, 3.0, 10.0),
    reconstruction=ReconstructionParams(),
    overtheair=OverTheAirParams(),
    dropout=DropoutSweep(),
)

_FULL = replace(
    _QUICK,
    preset="full",
    reps=20,
    axes=(
        ("n_nodes", (2, 3, 5, 10, 20, 50, 100, 200, 500, 1000)),
        ("epsilon", (0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)),
        ("delta", (1e-9, 1e-7, 1e-6, 1e-5, 1e-3)),
        ("n_per_node", (50, 100, 200, 500, 1000, 2000, 5000, 10000)),
        ("n_features", (5, 10, 20, 50)),
        ("site_offset_sd", (0.0, 0.25, 0.5, 1.0, 2.0)),
    ),
    attack=replace(AttackParams(), trials=10000),
    attack_epsilons=(0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0),
    reconstruction=replace(ReconstructionParams(), targets=1000),
    overtheair=replace(OverTheAirParams(), reps=50),
    dropout=DropoutSweep(
        harary_degrees=(8, 32),
        n_nodes=(10, 30, 100, 300, 1000),
        rates=(0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3),
        collusion_thresholds=(1, 3, 10, 30),
        reps=200,
    ),
)

PRESETS: dict[str, SimConfig] = {"quick": _QUICK, "full": _FULL}


# -- validation ---------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


_POSITIVE_INTS = frozenset(
    {"n_per_node", "n_features", "holdout_size", "trials", "targets", "reps"}
    | {"n_users", "dim", "samples_per_user", "iterations"}
)
_NOT_NEGATIVE = ("site_offset_sd", "ridge", "channel_noise_std", "perturbation_std")
# Number-valued settings: the test a finite value must pass, and the reason when it does not.
_NUMBER_RULES: dict[str, tuple[Callable[[float], bool], str]] = {
    "epsilon": (lambda x: x > 0.0, "must be > 0"),
    "delta": (lambda x: 0.0 < x < 1.0, "must lie strictly between 0 and 1"),
    **{name: ((lambda x: x >= 0.0), "must be >= 0") for name in _NOT_NEGATIVE},
    "feature_proportion": (
        lambda x: 0.0 <= x <= 1.0,
        "must lie in [0, 1] (0 keeps every component)",
    ),
    "power_scaling": (lambda x: x > 0.0, "must be > 0"),
}


def _check_value(where: str, name: str, value: object) -> None:
    """Range checks shared by every parameter of that name."""
    label = f"{where}.{name}" if where else name
    if name in _INT_FIELDS:
        _check_int(label, name, value)
    elif name == "model":
        if value not in MODELS:
            raise SimulationConfigError(label, value, f"must be one of {list(MODELS)}")
    elif name == "coalition_sizes":
        if not isinstance(value, tuple) or not all(_is_int(v) and v >= 1 for v in value):
            raise SimulationConfigError(label, value, "must be a list of whole numbers >= 1")
    else:
        _check_number(label, name, value)


def _check_int(label: str, name: str, value: object) -> None:
    if not _is_int(value):
        raise SimulationConfigError(label, value, "must be a whole number")
    assert isinstance(value, int)
    if name == "n_nodes" and not 2 <= value <= 100_000:
        raise SimulationConfigError(label, value, "must be between 2 and 100000 nodes")
    if name in _POSITIVE_INTS and value < 1:
        raise SimulationConfigError(label, value, "must be at least 1")
    if name in ("collusion_threshold", "coalition_size") and value < 0:
        raise SimulationConfigError(label, value, "must be 0 or more")


def _check_number(label: str, name: str, value: object) -> None:
    if not _is_number(value) or not math.isfinite(float(value)):  # type: ignore[arg-type]
        raise SimulationConfigError(label, value, "must be a finite number")
    rule = _NUMBER_RULES.get(name)
    if rule is not None and not rule[0](float(value)):  # type: ignore[arg-type]
        raise SimulationConfigError(label, value, rule[1])


def _override(section: str, current: Any, table: object) -> Any:
    """``current`` (a params dataclass) with the keys of ``table`` replaced, after checks."""
    if not isinstance(table, Mapping):
        raise SimulationConfigError(section, table, "must be a table of settings")
    known = {f.name: f for f in fields(current)}
    changes: dict[str, object] = {}
    for name, given in table.items():
        if name not in known:
            raise SimulationConfigError(
                f"{section}.{name}", given, f"is not a known setting; known: {sorted(known)}"
            )
        value: object = tuple(given) if isinstance(given, list) else given
        if isinstance(getattr(current, name), float) and isinstance(value, int):
            value = float(value)
        _check_value(section, name, value)
        changes[name] = value
    return replace(current, **changes)


def _override_axes(
    current: tuple[tuple[str, tuple[float, ...]], ...], table: object
) -> tuple[tuple[str, tuple[float, ...]], ...]:
    if not isinstance(table, Mapping):
        raise SimulationConfigError("axes", table, "must be a table of parameter lists")
    axes = dict(current)
    for name, values in table.items():
        if name not in AXES:
            raise SimulationConfigError(
                f"axes.{name}", values, f"is not a sweep axis; axes: {list(AXES)}"
            )
        if not isinstance(values, list):
            raise SimulationConfigError(f"axes.{name}", values, "must be a list of values")
        for v in values:
            _check_value("axes", name, float(v) if name not in _INT_FIELDS and _is_int(v) else v)
        axes[name] = tuple(values)
    return tuple((name, axes[name]) for name in AXES if name in axes)


def _names(field_name: str, value: object, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SimulationConfigError(
            field_name, value, f"must be a non-empty list drawn from {list(allowed)}"
        )
    for v in value:
        if v not in allowed:
            raise SimulationConfigError(field_name, v, f"is not one of {list(allowed)}")
    return tuple(v for v in allowed if v in value)


def _int_list(label: str, value: object, low: int, high: int, *, empty: bool) -> tuple[int, ...]:
    if not isinstance(value, list) or (not value and not empty):
        raise SimulationConfigError(
            label, value, "must be a " + ("" if empty else "non-empty ") + "list"
        )
    for v in value:
        if not _is_int(v) or not low <= v <= high:
            raise SimulationConfigError(label, v, f"must be a whole number from {low} to {high}")
    return tuple(value)


def _rates(label: str, value: object) -> tuple[float, ...]:
    if not isinstance(value, list) or not value:
        raise SimulationConfigError(label, value, "must be a non-empty list of rates")
    for v in value:
        if not _is_number(v) or not 0.0 <= float(v) < 1.0:
            raise SimulationConfigError(label, v, "must be a dropout rate in [0, 1)")
    return tuple(float(v) for v in value)


def _whole_number(label: str, value: object, low: int, reason: str) -> int:
    if not _is_int(value) or value < low:  # type: ignore[operator]
        raise SimulationConfigError(label, value, reason)
    assert isinstance(value, int)
    return value


# [dropout] settings read by a function of their own (label, value); the others are numbers.
_DROPOUT_READERS: dict[str, Callable[[str, object], object]] = {
    "graphs": lambda label, value: _names(label, value, GRAPHS),
    "harary_degrees": lambda label, value: _int_list(label, value, 2, 100_000, empty=False),
    "n_nodes": lambda label, value: _int_list(label, value, 2, 100_000, empty=True),
    "collusion_thresholds": lambda label, value: _int_list(label, value, 0, 100_000, empty=False),
    "rates": _rates,
    "reps": lambda label, value: _whole_number(label, value, 1, "must be a whole number >= 1"),
}


def _override_dropout(current: DropoutSweep, table: object) -> DropoutSweep:
    if not isinstance(table, Mapping):
        raise SimulationConfigError("dropout", table, "must be a table of settings")
    known = {f.name for f in fields(DropoutSweep)}
    changes: dict[str, Any] = {}
    for name, value in table.items():
        label = f"dropout.{name}"
        if name not in known:
            raise SimulationConfigError(
                label, value, f"is not a known setting; known: {sorted(known)}"
            )
        reader = _DROPOUT_READERS.get(name)
        if reader is not None:
            changes[name] = reader(label, value)
        else:  # epsilon, delta
            number = float(value) if _is_int(value) else value
            _check_value("dropout", name, number)
            changes[name] = number
    return replace(current, **changes)


def _attack(config: SimConfig, value: object) -> dict[str, Any]:
    """[attack], whose ``epsilons`` list is a setting of the config rather than of the attack."""
    changes: dict[str, Any] = {}
    table = dict(value) if isinstance(value, Mapping) else value
    if isinstance(table, dict) and "epsilons" in table:
        eps = table.pop("epsilons")
        if not isinstance(eps, list) or not eps:
            raise SimulationConfigError("attack.epsilons", eps, "must be a non-empty list")
        for e in eps:
            _check_value("attack", "epsilon", e)
        changes["attack_epsilons"] = tuple(float(e) for e in eps)
    changes["attack"] = _override("attack", config.attack, table)
    return changes


# Each top-level key of a simulation config: its reader, from the config and the value to
# the changes it makes.
_TOP_READERS: dict[str, Callable[[SimConfig, object], dict[str, Any]]] = {
    "seed": lambda c, v: {
        "seed": _whole_number("seed", v, 0, "must be a non-negative whole number")
    },
    "reps": lambda c, v: {"reps": _whole_number("reps", v, 1, "must be a whole number >= 1")},
    "schemes": lambda c, v: {"schemes": _names("schemes", v, SCHEMES)},
    "constructions": lambda c, v: {"constructions": _names("constructions", v, CONSTRUCTIONS)},
    "base": lambda c, v: {"base": _override("base", c.base, v)},
    "axes": lambda c, v: {"axes": _override_axes(c.axes, v)},
    "attack": _attack,
    "reconstruction": lambda c, v: {
        "reconstruction": _override("reconstruction", c.reconstruction, v)
    },
    "overtheair": lambda c, v: {"overtheair": _override("overtheair", c.overtheair, v)},
    "dropout": lambda c, v: {"dropout": _override_dropout(c.dropout, v)},
    "scenarios": lambda c, v: {"scenarios": _names("scenarios", v, SCENARIOS)},
}


def apply_overrides(config: SimConfig, data: Mapping[str, object]) -> SimConfig:
    """``config`` with the settings of a parsed TOML document applied."""
    top = {f.name for f in fields(SimConfig)} - {"preset", "axes", "attack_epsilons"}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        reader = _TOP_READERS.get(key)
        if reader is None:
            known = sorted(top | {"axes", "attack"})
            raise SimulationConfigError(key, value, f"is not a known setting; known: {known}")
        changes.update(reader(config, value))
    return dataclasses.replace(config, **changes)


def load_config(
    preset: str = "quick",
    path: str | Path | None = None,
    *,
    scenarios: Sequence[str] | None = None,
) -> SimConfig:
    """The preset, overridden by the TOML file at ``path`` if given, then by ``scenarios``."""
    if preset not in PRESETS:
        raise SimulationConfigError("preset", preset, f"must be one of {sorted(PRESETS)}")
    config = PRESETS[preset]
    if path is not None:
        config = _load_file(config, Path(path))
    if scenarios is not None:
        config = replace(config, scenarios=_names("scenarios", list(scenarios), SCENARIOS))
    return config


def _load_file(config: SimConfig, source: Path) -> SimConfig:
    try:
        text = read_limited_text(source, _CONFIG_BYTES, what="simulation config")
        check_text_nesting(text, what=str(source), syntax="toml")
        data = tomllib.loads(text)
    except MissingFileError:
        raise SimulationConfigError("config", str(source), "does not exist") from None
    except (LocalFileError, NestingError) as exc:
        raise SimulationConfigError("config", str(source), str(exc)) from None
    except tomllib.TOMLDecodeError as exc:
        raise SimulationConfigError("config", str(source), f"is not valid TOML ({exc})") from None
    return apply_overrides(config, data)
