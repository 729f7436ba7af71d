"""MaskPrefetch: masks drawn ahead of their round equal the masks drawn in it, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest

from node.plans.interface import TensorSensitivity
from node.protocol.masking import MaskPrefetch, mask_key, pairwise_masks
from noise.layout import Layout
from tests.support.made_up_federation import (
    CODEC,
    SENSITIVITIES,
    _config,
    _seeds,
    _tensors,
    release_for,
)

IDS = ["a", "b", "c", "d"]


def _setup(me: str = "b") -> tuple:
    config = _config(IDS)
    seeds = _seeds(IDS)[me]
    layout = Layout.of_tensors(_tensors(0))
    noise = release_for(config, IDS, me, SENSITIVITIES)
    return config, seeds, layout, noise


def test_a_prefetched_mask_is_the_mask_drawn_on_the_spot() -> None:
    _, seeds, layout, noise = _setup()
    expected = pairwise_masks(noise, seeds, layout, round_index=3, codec=CODEC)
    with MaskPrefetch(seeds, CODEC) as prefetch:
        prefetch.start(noise, layout, round_index=3)
        prefetch.start(noise, layout, round_index=3)  # the same start twice is one draw
        got = prefetch.take(noise, layout, round_index=3)
        assert (prefetch.hits, prefetch.misses) == (1, 0)
    assert np.array_equal(got, expected)


def test_a_changed_round_or_participant_set_is_drawn_afresh() -> None:
    config, seeds, layout, noise = _setup()
    with MaskPrefetch(seeds, CODEC) as prefetch:
        prefetch.start(noise, layout, round_index=1)
        other_round = prefetch.take(noise, layout, round_index=2)
        assert (prefetch.hits, prefetch.misses) == (0, 1)
        assert np.array_equal(
            other_round, pairwise_masks(noise, seeds, layout, round_index=2, codec=CODEC)
        )
        # After a dropout the design among the survivors differs: the stale draw is not used.
        prefetch.start(noise, layout, round_index=4)
        survivors = ["a", "b", "d"]
        fewer = release_for(config, survivors, "b", SENSITIVITIES)
        assert mask_key(fewer, layout, round_index=4) != mask_key(noise, layout, round_index=4)
        got = prefetch.take(fewer, layout, round_index=4)
        assert (prefetch.hits, prefetch.misses) == (0, 2)
    assert np.array_equal(got, pairwise_masks(fewer, seeds, layout, round_index=4, codec=CODEC))


def test_the_key_names_every_slot_and_pair_weight() -> None:
    _, _, layout, noise = _setup()
    round_index, slots = mask_key(noise, layout, round_index=7)
    assert round_index == 7
    assert [slot.name for slot, _ in slots] == ["n", "sum_x", "sum_xx"]
    for slot, pairs in slots:
        assert [peer for peer, _ in pairs] == ["a", "c", "d"]
        assert all(
            variance == noise.pair_variances(slot.name)[peer] > 0 for peer, variance in pairs
        )
    rescaled = release_for(
        _config(IDS),
        IDS,
        "b",
        (*SENSITIVITIES[:2], TensorSensitivity("sum_xx", 8.0, "a larger bound")),
    )
    assert mask_key(rescaled, layout, round_index=7) != mask_key(noise, layout, round_index=7)


def test_an_error_while_drawing_reaches_the_caller() -> None:
    _, seeds, layout, noise = _setup()
    del seeds["c"]
    with MaskPrefetch(seeds, CODEC) as prefetch:
        prefetch.start(noise, layout, round_index=0)
        with pytest.raises(KeyError, match="no pairwise seed for peer 'c'"):
            prefetch.take(noise, layout, round_index=0)
