"""The coordinator's running Σ of revealed self-masks equals the sum expanded from scratch."""

from __future__ import annotations

import numpy as np

from coordinator.steps.self_mask_sums import SelfMaskSums
from noise.fixed_point import wrapping_sum
from noise.layout import Layout
from noise.self_mask import self_mask

LAYOUT = Layout.of({"n": (), "sum_x": (5,)})
SEEDS = {node: bytes([i + 1]) * 32 for i, node in enumerate("abcd")}


def _direct(seeds: dict[str, bytes], round_index: int) -> np.ndarray:
    return wrapping_sum([self_mask(s, LAYOUT, round_index=round_index) for s in seeds.values()])


def test_answers_summed_as_they_arrive_give_the_direct_sum() -> None:
    sums = SelfMaskSums()
    for node in "abc":
        sums.add(3, 1, node, SEEDS[node], LAYOUT)
    sums.add(3, 1, "a", SEEDS["a"], LAYOUT)  # a repeated answer counts once
    assert np.array_equal(sums.total(3, 1, SEEDS, LAYOUT), _direct(SEEDS, 3))


def test_what_the_cache_does_not_match_is_recomputed() -> None:
    sums = SelfMaskSums()
    sums.add(3, 1, "a", b"\x09" * 32, LAYOUT)  # not the seed finally given for a
    assert np.array_equal(sums.total(3, 1, SEEDS, LAYOUT), _direct(SEEDS, 3))
    # Another attempt (a superseded round's rerun) starts afresh.
    sums.add(3, 1, "b", SEEDS["b"], LAYOUT)
    sums.add(4, 2, "c", SEEDS["c"], LAYOUT)
    assert np.array_equal(sums.total(3, 1, SEEDS, LAYOUT), _direct(SEEDS, 3))
    assert np.array_equal(sums.total(4, 2, SEEDS, LAYOUT), _direct(SEEDS, 4))
    # A node counted but not among the answers given is not subtracted.
    fewer = {n: SEEDS[n] for n in "ab"}
    assert np.array_equal(sums.total(4, 2, fewer, LAYOUT), _direct(fewer, 4))
    sums.forget()
    assert np.array_equal(sums.total(4, 2, {}, LAYOUT), np.zeros(LAYOUT.size, dtype=np.uint64))


def test_a_total_handed_out_is_not_changed_by_a_later_answer() -> None:
    """The running sum is added into in place; what total() returned is the caller's own."""
    sums = SelfMaskSums()
    two = {n: SEEDS[n] for n in "ab"}
    for node in "ab":
        sums.add(5, 1, node, SEEDS[node], LAYOUT)
    first = sums.total(5, 1, two, LAYOUT)
    kept = first.copy()
    for node in "cd":
        sums.add(5, 1, node, SEEDS[node], LAYOUT)
    assert np.array_equal(sums.total(5, 1, SEEDS, LAYOUT), _direct(SEEDS, 5))
    assert np.array_equal(first, kept)
    # And a later total does not move when the caller changes the one it holds.
    first += np.uint64(1)
    assert np.array_equal(sums.total(5, 1, two, LAYOUT), _direct(two, 5))


def test_an_answer_whose_mask_cannot_be_added_is_not_counted_and_the_total_stays_exact() -> None:
    """An expansion that fails is not held; total() recomputes what the cache lacks."""
    sums = SelfMaskSums()
    for node in "ab":
        sums.add(6, 1, node, SEEDS[node], LAYOUT)
    other = Layout.of({"n": (), "sum_x": (7,)})  # not the length of the sum held
    sums.add(6, 1, "c", SEEDS["c"], other)
    sums.add(6, 1, "d", SEEDS["d"], LAYOUT)  # starts a fresh sum after the drop
    assert np.array_equal(sums.total(6, 1, SEEDS, LAYOUT), _direct(SEEDS, 6))


def test_masks_of_a_long_layout_summed_across_stretches() -> None:
    """Slots longer than one keystream stretch (2^15 words) add exactly."""
    layout = Layout.of({"n": (), "v": (3 * (1 << 15) + 11,)})
    sums = SelfMaskSums()
    for node in "abcd":
        sums.add(2, 1, node, SEEDS[node], layout)
    direct = wrapping_sum([self_mask(s, layout, round_index=2) for s in SEEDS.values()])
    assert np.array_equal(sums.total(2, 1, SEEDS, layout), direct)


def test_a_vector_given_back_holds_the_next_rounds_sum() -> None:
    """recycle(): the next sum is made in the same memory, and is still exact."""
    layout = Layout.of({"n": (), "v": (2 * (1 << 15) + 3,)})
    sums = SelfMaskSums()
    for node in "abcd":
        sums.add(1, 1, node, SEEDS[node], layout)
    first = sums.total(1, 1, SEEDS, layout)
    assert np.array_equal(
        first, wrapping_sum([self_mask(s, layout, round_index=1) for s in SEEDS.values()])
    )
    sums.recycle(first)
    for node in "abc":
        sums.add(2, 1, node, SEEDS[node], layout)
    second = sums.total(2, 1, SEEDS, layout)  # d's mask added here
    assert second is first
    assert np.array_equal(
        second, wrapping_sum([self_mask(s, layout, round_index=2) for s in SEEDS.values()])
    )
    # A vector of another length is not reused; neither is one when nothing is held.
    sums.recycle(np.zeros(3, dtype=np.uint64))
    sums.add(3, 1, "a", SEEDS["a"], layout)
    assert np.array_equal(
        sums.total(3, 1, {"a": SEEDS["a"]}, layout), self_mask(SEEDS["a"], layout, round_index=3)
    )


def test_sums_stay_exact_whatever_the_order_of_answers_and_totals() -> None:
    layout = Layout.of({"a": (1,), "b": (2,), "c": (4,)})
    sums = SelfMaskSums()
    order = "dbca"
    for node in order[:2]:
        sums.add(7, 1, node, SEEDS[node], layout)
    partial = {n: SEEDS[n] for n in order[:2]}
    assert np.array_equal(
        sums.total(7, 1, partial, layout),
        wrapping_sum([self_mask(s, layout, round_index=7) for s in partial.values()]),
    )
    for node in order:
        sums.add(7, 1, node, SEEDS[node], layout)
    assert np.array_equal(
        sums.total(7, 1, SEEDS, layout),
        wrapping_sum([self_mask(s, layout, round_index=7) for s in SEEDS.values()]),
    )
