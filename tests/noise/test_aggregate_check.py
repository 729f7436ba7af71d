"""Secret linear tags catch a forged aggregate; blinded, they sum to the true aggregate's tag."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from noise.aggregate_check import (
    CHALLENGE_VECTORS,
    MAX_CHECKED_ENTRIES,
    NATIVE_TAGS,
    SEALED_BYTES,
    SEALED_TAGS_BYTES,
    TAG_MODULUS,
    blinded_tags,
    challenge_contribution,
    challenge_key,
    challenge_rows,
    challenge_vectors,
    check_tags,
    numpy_tags,
    open_contribution,
    open_tags,
    seal_contribution,
    seal_tags,
    tags,
    tags_from_bytes,
    tags_to_bytes,
)
from noise.keys import EphemeralKey

NODES = ("a", "b", "c", "d")
SEEDS = {
    (i, j): bytes([10 * n + m + 1]) * 32
    for n, i in enumerate(NODES)
    for m, j in enumerate(NODES)
    if i < j
}


def _seeds(me: str) -> dict[str, bytes]:
    return {peer: SEEDS[tuple(sorted((me, peer)))] for peer in NODES if peer != me}


def _signed(words: np.ndarray) -> list[int]:
    return [int(v) for v in words.view(np.int64)]


def test_tags_are_the_exact_integer_inner_products() -> None:
    rng = np.random.default_rng(1)
    words = rng.integers(0, 2**64, size=3000, dtype=np.uint64, endpoint=False)
    rho = challenge_vectors(bytes(32), words.size, round_index=2)
    rows = challenge_rows(rho)
    assert rho.shape == (3000,) and rows.shape == (CHALLENGE_VECTORS, 3000)
    assert rows.min() >= 0 and rows.max() < 2**16 and np.all(rows == np.floor(rows))
    # Row ℓ is the ℓ-th 16-bit quarter of each word, lowest first.
    assert np.array_equal(rows[3], (rho >> np.uint64(48)).astype(np.float64))
    expected = tuple(
        sum(int(r) * v for r, v in zip(row, _signed(words), strict=True)) for row in rows
    )
    assert tags(words, rho) == expected


def _reference_tags(words: np.ndarray, rho: np.ndarray) -> tuple[int, ...]:
    """The tags in Python integers only: Σ_i quarter_ℓ(ρ_i) · signed(w_i)."""
    totals = [0] * CHALLENGE_VECTORS
    for word, packed in zip(words.tolist(), rho.tolist(), strict=True):
        signed = word - (1 << 64) if word >> 63 else word
        for row in range(CHALLENGE_VECTORS):
            totals[row] += ((packed >> (16 * row)) & 0xFFFF) * signed
    return tuple(totals)


BLOCK = 1 << 14  # entries per block of numpy_tags()
NATIVE_BLOCK = 1 << 16  # entries per block of the compiled pass
ALL_ONES = 2**64 - 1
# Both ways of computing the tags: tags() takes the compiled pass where it is built.
TAGGERS = pytest.mark.parametrize("tagger", [tags, numpy_tags], ids=["tags", "numpy_tags"])


def test_the_development_install_has_the_compiled_tags() -> None:
    # make test installs the project with its C pass (setup.py); without a
    # compiler the install still succeeds and every tag below takes numpy's path.
    assert NATIVE_TAGS


@TAGGERS
@pytest.mark.parametrize(
    "size",
    [
        0,
        1,
        2,
        3,
        7,
        BLOCK - 1,
        BLOCK,
        BLOCK + 1,
        BLOCK + 2,
        2 * BLOCK - 1,
        2 * BLOCK + 5,
        NATIVE_BLOCK - 1,
        NATIVE_BLOCK,
        NATIVE_BLOCK + 1,
        2 * NATIVE_BLOCK + 3,
    ],
)
@pytest.mark.parametrize(
    ("words_kind", "rho_kind"),
    [
        ("random", "random"),
        ("all ones", "all 0xFFFF"),  # -1 everywhere, the largest ρ
        ("2^63", "all 0xFFFF"),  # the most negative word everywhere
        ("2^63 - 1", "all 0xFFFF"),  # the most positive word everywhere
        ("mixed extremes", "random"),
        ("random", "zero"),
    ],
)
def test_tags_match_python_integers(
    tagger: Callable[[np.ndarray, np.ndarray], tuple[int, ...]],
    size: int,
    words_kind: str,
    rho_kind: str,
) -> None:
    rng = np.random.default_rng(size)
    extremes = np.array(
        [0, 1, 2**63 - 1, 2**63, 2**63 + 1, ALL_ONES, 0x8000, 0xFFFF << 48], dtype=np.uint64
    )
    words = {
        "random": rng.integers(0, 2**64, size=size, dtype=np.uint64, endpoint=False),
        "all ones": np.full(size, ALL_ONES, dtype=np.uint64),
        "2^63": np.full(size, 2**63, dtype=np.uint64),
        "2^63 - 1": np.full(size, 2**63 - 1, dtype=np.uint64),
        "mixed extremes": rng.choice(extremes, size=size),
    }[words_kind]
    rho = {
        "random": rng.integers(0, 2**64, size=size, dtype=np.uint64, endpoint=False),
        "all 0xFFFF": np.full(size, ALL_ONES, dtype=np.uint64),
        "zero": np.zeros(size, dtype=np.uint64),
    }[rho_kind]
    assert tagger(words, rho) == _reference_tags(words, rho)


@TAGGERS
def test_tags_past_64_blocks_add_up_like_their_parts(
    tagger: Callable[[np.ndarray, np.ndarray], tuple[int, ...]],
) -> None:
    # 64 blocks' products are added in float64 before they become integers;
    # a vector of 65 blocks and 5 entries crosses that boundary, its parts at
    # other places, and each part's own tags are checked against Python ints.
    rng = np.random.default_rng(11)
    size = 65 * BLOCK + 5
    words = rng.integers(0, 2**64, size=size, dtype=np.uint64, endpoint=False)
    words[::7] = 2**63  # the most negative word, often
    rho = rng.integers(0, 2**64, size=size, dtype=np.uint64, endpoint=False)
    cut = 3 * BLOCK + 1
    head, tail = tagger(words[:cut], rho[:cut]), tagger(words[cut:], rho[cut:])
    assert tagger(words, rho) == tuple(a + b for a, b in zip(head, tail, strict=True))
    assert tagger(words[-7:], rho[-7:]) == _reference_tags(words[-7:], rho[-7:])
    assert tags(words, rho) == numpy_tags(words, rho)


@TAGGERS
def test_tags_of_views_and_other_integer_arrays_are_those_of_their_words(
    tagger: Callable[[np.ndarray, np.ndarray], tuple[int, ...]],
) -> None:
    rng = np.random.default_rng(9)
    words = rng.integers(0, 2**64, size=2 * BLOCK + 3, dtype=np.uint64, endpoint=False)
    rho = rng.integers(0, 2**64, size=2 * BLOCK + 3, dtype=np.uint64, endpoint=False)
    # Strided and offset views, and int64 words (read as their uint64 bit patterns).
    odd, even = words[1::2], rho[: words.size - 1 : 2]
    assert tagger(odd, even) == _reference_tags(odd, even)
    assert tagger(words[3:], rho[3:]) == _reference_tags(words[3:], rho[3:])
    assert tagger(words.view(np.int64), rho) == _reference_tags(words, rho)


_WORDS = st.one_of(
    st.integers(0, 2**64 - 1), st.sampled_from([0, 1, 2**63 - 1, 2**63, 2**63 + 1, ALL_ONES])
)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_WORDS, _WORDS), max_size=300))
def test_the_compiled_pass_and_numpy_give_the_same_integers(
    pairs: list[tuple[int, int]],
) -> None:
    words = np.array([w for w, _ in pairs], dtype=np.uint64)
    rho = np.array([r for _, r in pairs], dtype=np.uint64)
    assert tags(words, rho) == numpy_tags(words, rho) == _reference_tags(words, rho)


def test_the_compiled_pass_refuses_buffers_it_cannot_read_as_words() -> None:
    from noise._tag_sums import tag_sums

    words = np.zeros(8, dtype=np.uint64)
    out = np.zeros(2 * CHALLENGE_VECTORS, dtype=np.uint64)
    with pytest.raises(ValueError, match="one length"):
        tag_sums(words, words[:7], out)
    with pytest.raises(ValueError, match="whole uint64 words"):
        tag_sums(words.view(np.uint8)[:12], words.view(np.uint8)[:12], out)
    with pytest.raises(ValueError, match="writes 8 uint64 words"):
        tag_sums(words, words, out[:7])
    with pytest.raises(ValueError, match="aligned"):
        tag_sums(words.view(np.uint8)[4:60], words.view(np.uint8)[4:60], out)
    with pytest.raises(TypeError):
        tag_sums(words, words, bytes(64))  # the totals must be writable
    tag_sums(words, words, out)
    assert not out.any()


def _contributions(rng: np.random.Generator, size: int) -> dict[str, np.ndarray]:
    # Signed values far from the int64 limits: sums of them do not overflow.
    return {
        n: rng.integers(-(2**58), 2**58, size=size).astype(np.int64).view(np.uint64) for n in NODES
    }


def test_honest_blinded_tags_add_up_to_the_aggregate_tag() -> None:
    rng = np.random.default_rng(2)
    parts = _contributions(rng, 500)
    aggregate = sum(parts.values(), np.zeros(500, dtype=np.uint64))
    kappa = challenge_key({n: bytes([ord(n)]) * 32 for n in NODES}, round_index=5)
    rho = challenge_vectors(kappa, 500, round_index=5)
    blinded = {
        n: blinded_tags(tags(w, rho), n, NODES, _seeds(n), round_index=5) for n, w in parts.items()
    }
    assert check_tags(blinded, aggregate, rho) == []
    # A single node's blinded tag reveals nothing like its own tag.
    assert blinded["a"] != tuple(t % (1 << 128) for t in tags(parts["a"], rho))


@pytest.mark.parametrize(
    "forge",
    [
        lambda a: a + np.uint64(1) * (np.arange(a.size) == 7),
        lambda a: a + (np.uint64(1) << np.uint64(63)) * (np.arange(a.size) == 0),
        lambda a: a + (np.uint64(1) << np.uint64(62)),
        lambda a: a * np.uint64(3),
        lambda a: np.roll(a, 1),
    ],
    ids=["one-word", "sign-bit", "every-word-high-bits", "scaled", "shuffled"],
)
def test_a_forged_aggregate_is_caught(forge: object) -> None:
    rng = np.random.default_rng(3)
    parts = _contributions(rng, 400)
    aggregate = sum(parts.values(), np.zeros(400, dtype=np.uint64))
    rho = challenge_vectors(b"\x07" * 32, 400, round_index=1)
    blinded = {
        n: blinded_tags(tags(w, rho), n, NODES, _seeds(n), round_index=1) for n, w in parts.items()
    }
    forged = forge(aggregate)  # type: ignore[operator]
    assert not np.array_equal(forged, aggregate)
    assert check_tags(blinded, forged, rho) == list(range(CHALLENGE_VECTORS))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 399), st.integers(1, 2**64 - 1), st.integers(0, 2**32))
def test_any_change_of_one_word_is_caught(index: int, change: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    parts = _contributions(rng, 400)
    aggregate = sum(parts.values(), np.zeros(400, dtype=np.uint64))
    kappa = challenge_key({n: rng.bytes(32) for n in NODES}, round_index=0)
    rho = challenge_vectors(kappa, 400, round_index=0)
    blinded = {n: tags(w, rho) for n, w in parts.items()}
    forged = aggregate.copy()
    forged[index : index + 1] += np.array([change], dtype=np.uint64)
    # Each check misses with probability at most 2^-16, so all four catching
    # is what one expects; at least one must.
    assert check_tags(blinded, forged, rho)


def test_many_blocks_stay_exact() -> None:
    size = (1 << 20) + 3  # 33 blocks, the last of 3 entries
    words = np.full(size, np.uint64(2**64 - 1))  # -1 everywhere
    rho = challenge_vectors(b"\x01" * 32, size, round_index=0)
    assert tags(words, rho) == tuple(-int(row.sum()) for row in challenge_rows(rho))
    # The most negative word in every entry: each tag is -2^63 · Σ ρ.
    lowest = np.full(size, np.uint64(2**63))
    assert tags(lowest, rho) == tuple(-(2**63) * int(row.sum()) for row in challenge_rows(rho))


def test_the_challenge_key_depends_on_every_contribution_and_the_round() -> None:
    base = {n: bytes([ord(n)]) * 32 for n in NODES}
    key = challenge_key(base, round_index=3)
    assert challenge_key(dict(reversed(base.items())), round_index=3) == key
    assert challenge_key(base, round_index=4) != key
    assert challenge_key(base | {"b": b"\x00" * 32}, round_index=3) != key
    with pytest.raises(ValueError, match="challenge contribution"):
        challenge_key({"a": b"short"}, round_index=0)
    with pytest.raises(ValueError, match="packed challenge of its length"):
        tags(np.zeros(3, dtype=np.uint64), np.zeros(2, dtype=np.uint64))


CONFIG = bytes(range(32))


def _sealing(**changes: object) -> dict[str, object]:
    args: dict[str, object] = {
        "config_hash": CONFIG,
        "session_id": "s" * 32,
        "round_index": 3,
        "sender": "a",
        "recipient": "b",
    }
    args.update(changes)
    return args


def test_a_sealed_contribution_opens_only_in_its_own_context() -> None:
    contribution = bytes(range(100, 132))
    seed = SEEDS[("a", "b")]
    sealed = seal_contribution(contribution, seed, **_sealing())  # type: ignore[arg-type]
    assert len(sealed) == SEALED_BYTES and contribution not in sealed
    assert open_contribution(sealed, seed, **_sealing()) == contribution  # type: ignore[arg-type]
    for change in (
        {"round_index": 4},
        {"sender": "b", "recipient": "a"},
        {"session_id": "t" * 32},
        {"config_hash": bytes(32)},
    ):
        with pytest.raises(ValueError, match="does not open"):
            open_contribution(sealed, seed, **_sealing(**change))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not open"):
        open_contribution(sealed, SEEDS[("a", "c")], **_sealing())  # type: ignore[arg-type]
    tampered = bytes([sealed[0] ^ 1]) + sealed[1:]
    with pytest.raises(ValueError, match="does not open"):
        open_contribution(tampered, seed, **_sealing())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="48 bytes"):
        open_contribution(sealed[:-1], seed, **_sealing())  # type: ignore[arg-type]


def test_contributions_are_per_round_and_node_and_survive_a_restart() -> None:
    key = EphemeralKey.from_private_bytes(bytes(range(1, 33)))
    args = {"config_hash": CONFIG, "session_id": "s" * 32, "node_id": "a", "round_index": 0}
    first = challenge_contribution(key, **args)  # type: ignore[arg-type]
    assert len(first) == 32
    assert challenge_contribution(key, **args) == first  # type: ignore[arg-type]
    assert challenge_contribution(key, **{**args, "round_index": 1}) != first  # type: ignore[arg-type]
    assert challenge_contribution(key, **{**args, "node_id": "b"}) != first  # type: ignore[arg-type]


def test_tags_travel_as_sixteen_bytes_each() -> None:
    values = (0, 1, TAG_MODULUS - 1, -1)
    encoded = tags_to_bytes(values)
    assert [len(v) for v in encoded] == [16] * CHALLENGE_VECTORS
    assert tags_from_bytes(encoded) == (0, 1, TAG_MODULUS - 1, TAG_MODULUS - 1)
    with pytest.raises(ValueError, match="4 tags of 16 bytes"):
        tags_from_bytes(encoded[:3])


def _seal_tags_context(**changes: object) -> dict[str, object]:
    context: dict[str, object] = {
        "config_hash": bytes(range(32)),
        "session_id": "s1",
        "round_index": 3,
        "survivor_hash": bytes([9]) * 32,
        "sender": "a",
        "recipient": "b",
    }
    context.update(changes)
    return context


def test_sealed_tags_open_only_for_their_survivor_set_pair_and_round() -> None:
    blinded = (1, 2**127 + 5, 0, TAG_MODULUS - 1)
    sealed = seal_tags(blinded, SEEDS[("a", "b")], **_seal_tags_context())  # type: ignore[arg-type]
    assert len(sealed) == SEALED_TAGS_BYTES
    assert open_tags(sealed, SEEDS[("a", "b")], **_seal_tags_context()) == blinded  # type: ignore[arg-type]
    for change in (
        {"survivor_hash": bytes([8]) * 32},
        {"round_index": 4},
        {"sender": "c"},
        {"recipient": "c"},
        {"session_id": "s2"},
    ):
        with pytest.raises(ValueError, match="do not open under their pairwise key"):
            open_tags(sealed, SEEDS[("a", "b")], **_seal_tags_context(**change))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="do not open"):
        open_tags(sealed, SEEDS[("a", "c")], **_seal_tags_context())  # type: ignore[arg-type]
    flipped = bytes([sealed[0] ^ 1]) + sealed[1:]
    with pytest.raises(ValueError, match="do not open"):
        open_tags(flipped, SEEDS[("a", "b")], **_seal_tags_context())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sealed in 79 bytes; sealed tags have 80"):
        open_tags(sealed[:-1], SEEDS[("a", "b")], **_seal_tags_context())  # type: ignore[arg-type]


def test_a_check_modulo_2_64_would_miss_half_of_the_zero_divisor_forgeries() -> None:
    """Why the tags are exact integers: δ = 2^63 is a zero divisor of Z/2^64.

    For even ρ_i, ρ_i · 2^63 ≡ 0 (mod 2^64), so a check computed in the
    payload's own ring passes the forgery A + 2^63·e_i for half of all ρ.
    Lifted to the integers (two's complement) δ_i = −2^63 ≠ 0, and the tags
    mod 2^128 catch it whatever ρ is (unless ρ_i = 0 in all four vectors).
    """
    aggregate = np.arange(8, dtype=np.uint64)
    forged = aggregate.copy()
    forged[3] += np.uint64(1 << 63)
    missed_mod_2_64 = caught = 0
    for seed in range(64):
        rho = challenge_vectors(bytes([seed]) * 32, aggregate.size, round_index=0)
        rows = challenge_rows(rho).astype(np.uint64)
        # One vector's check computed in Z/2^64, as numpy's wrapping arithmetic does.
        if rows[0] @ aggregate == rows[0] @ forged:
            missed_mod_2_64 += 1
        honest = {"a": tags(aggregate, rho)}
        caught += check_tags(honest, forged, rho) != []
    assert caught == 64
    assert 16 <= missed_mod_2_64 <= 48  # ρ_3 even: half of the time


def test_the_check_refuses_layouts_longer_than_it_is_sound_for() -> None:
    big = np.zeros(1, dtype=np.uint64)
    too_long = np.lib.stride_tricks.as_strided(big, shape=(MAX_CHECKED_ENTRIES + 1,), strides=(0,))
    with pytest.raises(ValueError, match="above the 140737488355328 the check is sound for"):
        check_tags({}, too_long, big)
