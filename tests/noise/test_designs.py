"""Covariance designs: construction, collusion targets, validation, and properties."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noise.designs import (
    Design,
    cape_design,
    complete_design,
    conditional_covariance,
    explicit_design,
    harary_design,
    remaining_variance,
)
from noise.errors import CalibrationError, InfeasibleDesignError


def _ids(k: int) -> list[str]:
    return [f"n{i:02d}" for i in range(k)]


def _laplacian_ok(r: np.ndarray) -> None:
    scale = max(float(np.abs(r).max()), 1e-300)
    assert np.array_equal(r, r.T)
    assert np.all(np.abs(r.sum(axis=1)) <= 1e-12 * scale * r.shape[0])
    assert float(np.linalg.eigvalsh(r).min()) >= -1e-12 * scale * r.shape[0]


# --- complete graph ---------------------------------------------------------


def test_complete_uniform_weights_and_variance() -> None:
    ids = _ids(5)
    design = complete_design(ids, 2.0, collusion_threshold=1)
    expected = 2.0 / (5 - 1 - 1)
    off = ~np.eye(5, dtype=bool)
    assert np.allclose(design.pair_variances[off], expected, rtol=0, atol=1e-15)
    assert design.variance("n00") == pytest.approx(4 * expected, rel=1e-15)
    assert design.construction == "pairwise"
    assert design.kind == "complete"
    assert design.collusion_threshold == 1
    _laplacian_ok(design.covariance())


def test_complete_without_collusion_meets_target_exactly() -> None:
    design = complete_design(_ids(4), 3.0)
    for n in design.node_ids:
        assert design.variance(n) == pytest.approx(3.0, rel=1e-15)


def test_complete_heterogeneous_uses_pairwise_maximum() -> None:
    targets = {"a": 1.0, "b": 4.0, "c": 2.0, "d": 0.5}
    design = complete_design(list(targets), targets, collusion_threshold=1)
    for a, b in itertools.combinations(targets, 2):
        assert design.pair_std(a, b) ** 2 == pytest.approx(
            max(targets[a], targets[b]) / 2.0, rel=1e-15
        )
    for coalition in itertools.combinations(targets, 1):
        for node, left in remaining_variance(design, coalition).items():
            assert left >= targets[node] * (1 - 1e-12)


def test_complete_infeasible_names_node_and_fix() -> None:
    with pytest.raises(InfeasibleDesignError) as info:
        complete_design(["b", "a", "c"], 1.0, collusion_threshold=2)
    assert info.value.node_id == "a"
    assert (
        "with 3 nodes and collusion threshold 2, node 'a' has no pair left that the "
        "coalition does not know; lower the threshold or add nodes"
    ) in str(info.value)


def test_node_ids_are_sorted_and_validated() -> None:
    design = complete_design(["zeta", "alpha", "mu"], 1.0)
    assert design.node_ids == ("alpha", "mu", "zeta")
    with pytest.raises(InfeasibleDesignError, match=r"'a'.*more than once"):
        complete_design(["a", "b", "a"], 1.0)
    with pytest.raises(InfeasibleDesignError, match="at least 2 nodes"):
        complete_design(["a"], 1.0)
    with pytest.raises(TypeError, match="non-empty string"):
        complete_design(["a", ""], 1.0)
    with pytest.raises(TypeError, match="non-empty string"):
        complete_design(["a", 3], 1.0)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="not the string 'abc'"):
        complete_design("abc", 1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, True, "1"])
def test_scalar_target_must_be_finite_positive(bad: object) -> None:
    with pytest.raises(InfeasibleDesignError, match="must be finite and > 0") as info:
        complete_design(_ids(3), bad)  # type: ignore[arg-type]
    assert info.value.node_id is None


def test_mapping_targets_are_checked_per_node() -> None:
    ids = ["a", "b", "c"]
    with pytest.raises(InfeasibleDesignError, match=r"node 'b'.*-2\.0 must be finite") as info:
        complete_design(ids, {"a": 1.0, "b": -2.0, "c": 1.0})
    assert info.value.node_id == "b"
    with pytest.raises(InfeasibleDesignError, match="no target variance") as info:
        complete_design(ids, {"a": 1.0, "b": 1.0})
    assert info.value.node_id == "c"
    with pytest.raises(ValueError, match="unknown node id 'z'"):
        complete_design(ids, {"a": 1.0, "b": 1.0, "c": 1.0, "z": 1.0})


def test_collusion_threshold_validation() -> None:
    with pytest.raises(InfeasibleDesignError, match="threshold must be >= 0; got -1"):
        complete_design(_ids(3), 1.0, collusion_threshold=-1)
    with pytest.raises(TypeError, match="collusion_threshold"):
        complete_design(_ids(3), 1.0, collusion_threshold=1.0)  # type: ignore[arg-type]


# --- Harary graphs ----------------------------------------------------------


def _degrees(design: Design) -> list[int]:
    return [len(design.neighbours(n)) for n in design.node_ids]


def test_harary_even_degree_is_a_ring_lattice() -> None:
    ids = _ids(8)
    design = harary_design(ids, 4, 1.0)
    assert design.neighbours("n00") == ("n01", "n02", "n06", "n07")
    assert _degrees(design) == [4] * 8
    assert design.kind == "harary"


def test_harary_odd_degree_even_nodes_adds_diameters() -> None:
    design = harary_design(_ids(8), 3, 1.0)
    assert design.neighbours("n00") == ("n01", "n04", "n07")
    assert design.neighbours("n05") == ("n01", "n04", "n06")
    assert _degrees(design) == [3] * 8


def test_harary_odd_degree_odd_nodes_standard_construction() -> None:
    design = harary_design(_ids(7), 3, 1.0)
    degrees = _degrees(design)
    # ⌈kK/2⌉ edges; node 0 has one extra partner, all others exactly k.
    assert sum(degrees) // 2 == math.ceil(3 * 7 / 2)
    assert degrees == [4, 3, 3, 3, 3, 3, 3]
    assert design.neighbours("n00") == ("n01", "n03", "n04", "n06")


def test_harary_degree_k_minus_one_is_complete() -> None:
    for k in (5, 6):
        design = harary_design(_ids(k), k - 1, 1.0)
        assert _degrees(design) == [k - 1] * k


@pytest.mark.parametrize(("k", "degree"), [(5, 2), (6, 3), (7, 3), (7, 4), (9, 5), (10, 2)])
def test_harary_graph_is_degree_connected(k: int, degree: int) -> None:
    """Removing any degree − 1 nodes leaves the graph connected (Harary 1962)."""
    design = harary_design(_ids(k), degree, 1.0)
    adjacency = design.pair_variances > 0
    for removed in itertools.combinations(range(k), degree - 1):
        alive = [i for i in range(k) if i not in removed]
        seen = {alive[0]}
        frontier = [alive[0]]
        while frontier:
            i = frontier.pop()
            for j in alive:
                if adjacency[i, j] and j not in seen:
                    seen.add(j)
                    frontier.append(j)
        assert seen == set(alive)


def test_harary_uniform_weight_is_target_over_degree_minus_threshold() -> None:
    design = harary_design(_ids(9), 4, 3.0, collusion_threshold=2)
    positive = design.pair_variances[design.pair_variances > 0]
    assert np.allclose(positive, 3.0 / (4 - 2), rtol=1e-15, atol=0)
    assert design.collusion_threshold == 2


def test_harary_heterogeneous_targets_met_against_threshold() -> None:
    ids = _ids(7)
    targets = {n: float(i + 1) for i, n in enumerate(ids)}
    design = harary_design(ids, 3, targets, collusion_threshold=1)
    for coalition in itertools.combinations(ids, 1):
        for node, left in remaining_variance(design, coalition).items():
            assert left >= targets[node] * (1 - 1e-12)


def test_harary_errors() -> None:
    ids = _ids(5)
    with pytest.raises(InfeasibleDesignError, match="degree 2 and collusion threshold 2"):
        harary_design(ids, 2, 1.0, collusion_threshold=2)
    with pytest.raises(InfeasibleDesignError, match="degree 5 needs at least 6 nodes; got 5"):
        harary_design(ids, 5, 1.0)
    with pytest.raises(InfeasibleDesignError, match="at least 1; got 0"):
        harary_design(ids, 0, 1.0)
    with pytest.raises(TypeError, match="degree must be an int"):
        harary_design(ids, 2.0, 1.0)  # type: ignore[arg-type]


# --- explicit weights -------------------------------------------------------


def test_explicit_design_reads_pairs_symmetrically() -> None:
    design = explicit_design(["a", "b", "c"], {("b", "a"): 2.0, ("b", "c"): 0.5, ("a", "c"): 0})
    assert design.pair_std("a", "b") == design.pair_std("b", "a") == math.sqrt(2.0)
    assert design.pair_std("a", "c") == 0.0
    assert design.pair_std("a", "a") == 0.0
    assert design.neighbours("a") == ("b",)
    assert design.variance("b") == 2.5
    assert design.kind == "explicit"
    assert design.collusion_threshold == 0
    # the same pair listed in both orders with the same value is accepted
    again = explicit_design(["a", "b"], {("a", "b"): 1.0, ("b", "a"): 1.0})
    assert again.pair_std("a", "b") == 1.0


def test_explicit_design_validation() -> None:
    ids = ["a", "b", "c"]
    with pytest.raises(ValueError, match="unknown node id 'z'"):
        explicit_design(ids, {("a", "z"): 1.0})
    with pytest.raises(InfeasibleDesignError, match="joins the node to itself") as info:
        explicit_design(ids, {("a", "a"): 1.0})
    assert info.value.node_id == "a"
    for bad in (-1.0, math.nan, math.inf, True):
        with pytest.raises(InfeasibleDesignError, match="must be finite and >= 0"):
            explicit_design(ids, {("a", "b"): bad})
    with pytest.raises(InfeasibleDesignError, match="given twice with different variances"):
        explicit_design(ids, {("a", "b"): 1.0, ("b", "a"): 2.0, ("b", "c"): 1.0})
    with pytest.raises(TypeError, match="pair keys"):
        explicit_design(ids, {("a", "b", "c"): 1.0})  # type: ignore[dict-item]
    with pytest.raises(
        InfeasibleDesignError, match="node 'c' has no pair partner, so its mask would be zero"
    ) as info:
        explicit_design(ids, {("a", "b"): 1.0, ("b", "c"): 0.0})
    assert info.value.node_id == "c"


# --- CAPE -------------------------------------------------------------------


def test_cape_design_marginal_covariance() -> None:
    k, tau2 = 6, 2.5
    design = cape_design(_ids(k), tau2)
    expected = tau2 * (np.eye(k) - np.ones((k, k)) / k)
    assert np.allclose(design.covariance(), expected, rtol=0, atol=1e-15)
    assert design.construction == "cape"
    assert design.kind == "cape"
    assert design.cape_variance == tau2
    # reported as the complete graph with c² = τ²/K
    assert design.pair_std("n00", "n03") ** 2 == pytest.approx(tau2 / k, rel=1e-15)
    for bad in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(InfeasibleDesignError, match="CAPE variance"):
            cape_design(_ids(3), bad)


# --- the Design value object ------------------------------------------------


def test_design_is_immutable_hashable_and_comparable() -> None:
    a = complete_design(_ids(4), 1.0)
    b = complete_design(list(reversed(_ids(4))), 1.0)
    assert a == b
    assert hash(a) == hash(b)
    assert a != complete_design(_ids(4), 2.0)
    assert a != cape_design(_ids(4), 1.0)
    assert a != "not a design"
    with pytest.raises(ValueError, match="read-only"):
        a.pair_variances[0, 1] = 5.0
    with pytest.raises(AttributeError):
        a.kind = "harary"  # type: ignore[misc]


def test_design_copies_its_input_array() -> None:
    w = np.array([[0.0, 1.0], [1.0, 0.0]])
    design = Design(("a", "b"), w, "pairwise", "explicit")
    w[0, 1] = w[1, 0] = 9.0
    assert design.pair_std("a", "b") == 1.0


def test_design_index_and_unknown_ids() -> None:
    design = complete_design(["a", "b", "c"], 1.0)
    assert design.index("c") == 2
    for call in (
        lambda: design.index("x"),
        lambda: design.variance("x"),
        lambda: design.neighbours("x"),
        lambda: design.pair_std("a", "x"),
    ):
        with pytest.raises(ValueError, match="unknown node id 'x'"):
            call()


@pytest.mark.parametrize(
    ("kwargs", "error", "pattern"),
    [
        ({"node_ids": ["a", "b"]}, TypeError, "tuple of strings"),
        ({"node_ids": ("b", "a")}, ValueError, "sorted and unique"),
        ({"pair_variances": np.zeros((3, 3))}, ValueError, "2×2 matrix"),
        ({"pair_variances": np.array([[0.0, -1.0], [-1.0, 0.0]])}, ValueError, "non-negative"),
        ({"pair_variances": np.array([[0.0, 1.0], [2.0, 0.0]])}, ValueError, "symmetric"),
        ({"pair_variances": np.array([[1.0, 1.0], [1.0, 0.0]])}, ValueError, "zero diagonal"),
        ({"kind": "cape"}, ValueError, "does not belong"),
        ({"kind": "ring"}, ValueError, "does not belong"),
        ({"cape_variance": 1.0}, ValueError, "only meaningful"),
        ({"construction": "cape", "kind": "cape"}, ValueError, "cape_variance must be"),
        ({"collusion_threshold": -1}, ValueError, "collusion_threshold must be >= 0"),
        ({"collusion_threshold": 1.5}, TypeError, "collusion_threshold must be an int"),
    ],
)
def test_design_constructor_validates(kwargs: dict[str, object], error: type, pattern: str) -> None:
    fields: dict[str, object] = {
        "node_ids": ("a", "b"),
        "pair_variances": np.array([[0.0, 1.0], [1.0, 0.0]]),
        "construction": "pairwise",
        "kind": "explicit",
    }
    fields.update(kwargs)
    with pytest.raises(error, match=pattern):
        Design(**fields)  # type: ignore[arg-type]


# --- what a coalition leaves ------------------------------------------------


def test_conditional_covariance_pairwise_is_honest_subgraph_laplacian() -> None:
    design = explicit_design(
        ["a", "b", "c", "d"],
        {("a", "b"): 1.0, ("a", "c"): 2.0, ("b", "c"): 3.0, ("c", "d"): 4.0, ("b", "d"): 0.5},
    )
    honest, sigma = conditional_covariance(design, ["d"], residual_variance=0.25)
    assert honest == ("a", "b", "c")
    expected = np.array([[3.0, -1.0, -2.0], [-1.0, 4.0, -3.0], [-2.0, -3.0, 5.0]]) + 0.25 * np.eye(
        3
    )
    assert np.array_equal(sigma, expected)
    left = remaining_variance(design, {"d"}, 0.25)
    assert left == {"a": 3.25, "b": 4.25, "c": 5.25}


def test_conditional_covariance_cape_formula() -> None:
    design = cape_design(_ids(6), 2.0)
    honest, sigma = conditional_covariance(design, ("n01", "n04"), residual_variance=0.5)
    assert honest == ("n00", "n02", "n03", "n05")
    expected = 2.0 * (np.eye(4) - np.ones((4, 4)) / 4) + 0.5 * np.eye(4)
    assert np.allclose(sigma, expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("kind", ["complete", "cape"])
def test_empty_coalition_gives_full_covariance(kind: str) -> None:
    design = complete_design(_ids(5), 1.0) if kind == "complete" else cape_design(_ids(5), 1.0)
    honest, sigma = conditional_covariance(design, (), residual_variance=0.3)
    assert honest == design.node_ids
    assert np.allclose(sigma, design.covariance() + 0.3 * np.eye(5), rtol=0, atol=1e-15)


def test_coalition_validation() -> None:
    design = complete_design(["a", "b", "c"], 1.0)
    with pytest.raises(ValueError, match="unknown node id 'x'"):
        remaining_variance(design, ["a", "x"])
    with pytest.raises(TypeError, match="not the string 'ab'"):
        remaining_variance(design, "ab")
    with pytest.raises(ValueError, match="every node"):
        conditional_covariance(design, ["a", "b", "c"])
    for bad in (-1.0, math.nan, math.inf, True):
        with pytest.raises(CalibrationError, match="residual_variance"):
            remaining_variance(design, ["a"], bad)


# --- properties ---------------------------------------------------------------

_targets = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def _pairwise_designs(draw: st.DrawFn) -> tuple[Design, dict[str, float]]:
    k = draw(st.integers(min_value=2, max_value=7))
    ids = _ids(k)
    threshold = draw(st.integers(min_value=0, max_value=k - 2))
    if draw(st.booleans()):
        targets = {n: draw(_targets) for n in ids}
    else:
        value = draw(_targets)
        targets = dict.fromkeys(ids, value)
    target_arg: float | dict[str, float] = (
        targets if len(set(targets.values())) > 1 else targets[ids[0]]
    )
    if k >= 3 and draw(st.booleans()):
        degree = draw(st.integers(min_value=threshold + 1, max_value=k - 1))
        design = harary_design(ids, degree, target_arg, collusion_threshold=threshold)
    else:
        design = complete_design(ids, target_arg, collusion_threshold=threshold)
    return design, targets


@st.composite
def _any_design(draw: st.DrawFn) -> Design:
    choice = draw(st.sampled_from(["pairwise", "explicit", "cape"]))
    if choice == "pairwise":
        return draw(_pairwise_designs())[0]
    k = draw(st.integers(min_value=2, max_value=7))
    ids = _ids(k)
    if choice == "cape":
        return cape_design(ids, draw(_targets))
    pairs: dict[tuple[str, str], float] = {}
    for i, j in itertools.combinations(range(k), 2):
        if draw(st.booleans()):
            pairs[(ids[i], ids[j])] = draw(_targets)
    for i in range(k):  # guarantee every node a partner
        a, b = sorted((ids[i], ids[(i + 1) % k]))
        pairs.setdefault((a, b), draw(_targets))
    return explicit_design(ids, pairs)


@settings(max_examples=150, deadline=None)
@given(design=_any_design())
def test_every_design_is_a_zero_sum_psd_covariance(design: Design) -> None:
    _laplacian_ok(design.covariance())
    w = design.pair_variances
    assert np.array_equal(w, w.T)
    for a, b in itertools.combinations(design.node_ids, 2):
        assert design.pair_std(a, b) == design.pair_std(b, a)


@settings(max_examples=150, deadline=None)
@given(case=_pairwise_designs())
def test_targets_survive_every_coalition_of_threshold_size(
    case: tuple[Design, dict[str, float]],
) -> None:
    design, targets = case
    for coalition in itertools.combinations(design.node_ids, design.collusion_threshold):
        left = remaining_variance(design, coalition)
        assert set(left) == set(design.node_ids) - set(coalition)
        for node, variance in left.items():
            assert variance >= targets[node] * (1 - 1e-12)


@settings(max_examples=60, deadline=None)
@given(design=_any_design(), data=st.data())
def test_conditional_covariance_is_psd_and_matches_remaining(
    design: Design, data: st.DataObject
) -> None:
    size = data.draw(st.integers(min_value=0, max_value=len(design.node_ids) - 1))
    coalition = data.draw(st.permutations(design.node_ids)).__getitem__(slice(size))
    honest, sigma = conditional_covariance(design, coalition, 0.0)
    assert np.array_equal(sigma, sigma.T)
    scale = max(float(np.abs(sigma).max()), 1e-300)
    assert float(np.linalg.eigvalsh(sigma).min()) >= -1e-12 * scale * len(honest)
    left = remaining_variance(design, coalition)
    assert list(left) == list(honest)
    assert np.allclose(list(left.values()), np.diag(sigma), rtol=1e-15, atol=0)
