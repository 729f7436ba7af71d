"""Self-masks: deterministic from the session key, distinct per round, node and session."""

from __future__ import annotations

import numpy as np
import pytest

from noise.keys import EphemeralKey
from noise.layout import Layout
from noise.seeds import stream_key
from noise.self_mask import add_self_mask, self_mask, self_mask_commitment, self_mask_seed
from noise.stream import aes_counter

KEY = EphemeralKey.from_private_bytes(bytes(range(32)))
LAYOUT = Layout.of({"n": (), "v": (3,)})


def _seed(**changes: object) -> bytes:
    args: dict[str, object] = {
        "config_hash": bytes(32),
        "session_id": "s" * 32,
        "node_id": "a",
        "round_index": 3,
    }
    args.update(changes)
    return self_mask_seed(KEY, **args)  # type: ignore[arg-type]


def test_known_answer() -> None:
    seed = _seed()
    assert seed.hex() == "1b3f3ae263a38bbdf6af303684f0eb82a4818080216c1bb4a2609bf2d8b6cb8c"
    words = self_mask(seed, LAYOUT, round_index=3)
    assert [int(w) for w in words] == [
        0x35DEDE6014EAE467,
        0x5E5A8684FB77B2B8,
        0x240EE83FA17E4E8E,
        0x91F48F6AC9EBEFF1,
    ]


def test_a_restart_derives_the_same_seed_and_mask() -> None:
    again = EphemeralKey.from_private_bytes(KEY.private_bytes())
    assert (
        self_mask_seed(
            again, config_hash=bytes(32), session_id="s" * 32, node_id="a", round_index=3
        )
        == _seed()
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"round_index": 4},
        {"node_id": "b"},
        {"session_id": "t" * 32},
        {"config_hash": b"\x01" * 32},
    ],
)
def test_every_context_gets_its_own_seed(changes: dict[str, object]) -> None:
    assert _seed(**changes) != _seed()


def test_the_mask_is_removed_exactly_and_hides_the_values() -> None:
    seed = _seed()
    values = np.array([7, 2**64 - 1, 0, 12345], dtype=np.uint64)
    mask = self_mask(seed, LAYOUT, round_index=3)
    sent = values + mask
    assert not np.array_equal(sent, values)
    assert np.array_equal(sent - self_mask(seed, LAYOUT, round_index=3), values)
    # A large mask's words are spread over the whole range (an AES keystream).
    big = self_mask(seed, Layout.of({"w": (100_000,)}), round_index=3)
    assert 0.49 < float(np.mean(big >> np.uint64(63))) < 0.51


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="round_index"):
        _seed(round_index=-1)
    with pytest.raises(ValueError, match="config hash"):
        _seed(config_hash=b"short")
    with pytest.raises(ValueError, match="self-mask seed"):
        self_mask(b"x", LAYOUT, round_index=0)


def test_the_commitment_binds_the_seed_and_refuses_a_short_one() -> None:
    seed = _seed()
    other = bytes(a ^ b for a, b in zip(seed, b"\x01" + bytes(31), strict=True))
    assert len(self_mask_commitment(seed)) == 32
    assert self_mask_commitment(seed) == self_mask_commitment(bytes(seed))
    assert self_mask_commitment(seed) != self_mask_commitment(other)
    with pytest.raises(ValueError, match="self-mask seed"):
        self_mask_commitment(seed[:31])


def test_each_tensor_is_its_own_stream_written_into_its_slot() -> None:
    # Awkward sizes: an empty tensor, odd sizes, one across a 2^15-word stretch.
    layout = Layout.of({"n": (), "none": (0,), "v": (3,), "m": (5, 7), "w": ((1 << 15) + 3,)})
    seed = _seed()
    mask = self_mask(seed, layout, round_index=3)
    assert mask.dtype == np.uint64 and mask.shape == (layout.size,)
    for slot in layout:
        key = stream_key(seed, round_index=3, tensor=slot.name, purpose="self-mask")
        expected = aes_counter(key).random_raw(slot.size)
        assert np.array_equal(mask[slot.offset : slot.offset + slot.size], expected), slot.name


@pytest.mark.parametrize("subtract", [False, True])
def test_the_mask_added_in_place_is_the_mask_expanded_then_added(subtract: bool) -> None:
    layout = Layout.of({"n": (), "none": (0,), "v": (3,), "w": (2 * (1 << 15) + 5,)})
    seed = _seed()
    base = np.random.default_rng(7).integers(0, 1 << 63, layout.size, dtype=np.uint64)
    mask = self_mask(seed, layout, round_index=3)
    target = base.copy()
    assert add_self_mask(target, seed, layout, round_index=3, subtract=subtract) is target
    assert np.array_equal(target, base - mask if subtract else base + mask)


def test_a_target_of_another_length_is_refused_before_a_word_changes() -> None:
    seed = _seed()
    short = np.zeros(LAYOUT.size - 1, dtype=np.uint64)
    with pytest.raises(ValueError, match=r"layout of 4 words .* got \(3,\)"):
        add_self_mask(short, seed, LAYOUT, round_index=3)
    assert not short.any()
    signed = np.zeros(LAYOUT.size, dtype=np.int64)
    with pytest.raises(ValueError, match="int64 array"):
        add_self_mask(signed, seed, LAYOUT, round_index=3)
    assert not signed.any()
    with pytest.raises(ValueError, match="self-mask seed"):
        add_self_mask(np.zeros(LAYOUT.size, dtype=np.uint64), b"short", LAYOUT, round_index=3)


def test_the_mask_written_into_a_given_vector_is_the_same_mask() -> None:
    layout = Layout.of({"n": (), "w": ((1 << 15) + 3,)})
    seed = _seed()
    out = np.full(layout.size, 5, dtype=np.uint64)
    assert self_mask(seed, layout, round_index=3, out=out) is out
    assert np.array_equal(out, self_mask(seed, layout, round_index=3))
    short = np.zeros(layout.size - 1, dtype=np.uint64)
    with pytest.raises(ValueError, match=r"goes into a vector of that length; got \(32771,\)"):
        self_mask(seed, layout, round_index=3, out=short)
    assert not short.any()
