"""Keyed AES-128-CTR streams: the keystream really is AES-CTR, and the draws are N(0, 1)."""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st
from randomgen import AESCounter
from scipy import stats

from noise.errors import KeyFormatError
from noise.stream import (
    NATIVE_KEYSTREAM,
    STREAM_CHECK_DRAWS,
    Keystream,
    add_uniform_uint64,
    aes_counter,
    keyed_generator,
    os_generator,
    standard_normal,
    stream_fingerprint,
    uniform_uint64,
)

KEY = hashlib.sha256(b"fixed stream key").digest()
# Counters that exercise the carry from the low into the high 64 bits and the
# wrap of the whole 128-bit counter inside a stretch.
WRAPS = [0, 12345, (1 << 64) - 3, (7 << 64) + (1 << 64) - 1, (1 << 128) - 2]
# Both ways of making the words: the compiled pass (the default where it is
# built) and OpenSSL's AES over counter blocks.
PATHS = pytest.mark.parametrize("native", [True, False], ids=["compiled", "openssl"])


def _aes_ctr_words(aes_key: bytes, counter: int, blocks: int) -> list[int]:
    """AES-128-ECB of the little-endian counter blocks, split into little-endian uint64 words."""
    encryptor = Cipher(algorithms.AES(aes_key), modes.ECB()).encryptor()
    plaintext = b"".join(((counter + b) % 2**128).to_bytes(16, "little") for b in range(blocks))
    ciphertext = encryptor.update(plaintext) + encryptor.finalize()
    return [int.from_bytes(ciphertext[i : i + 8], "little") for i in range(0, len(ciphertext), 8)]


@pytest.mark.parametrize(
    "counter",
    [
        0,
        int.from_bytes(KEY[16:], "little"),
        2**64 - 2,  # carry from the low into the high 64 bits of the counter
        2**128 - 3,  # wrap-around of the 128-bit counter
    ],
)
def test_bare_aes_counter_is_aes128_in_counter_mode(counter: int) -> None:
    aes_key = KEY[:16]
    bare = AESCounter(key=int.from_bytes(aes_key, "little"), counter=counter)
    blocks = 10  # more than randomgen's 4-block buffer, so refills are covered
    raw = [int(word) for word in bare.random_raw(2 * blocks)]
    assert raw == _aes_ctr_words(aes_key, counter, blocks)


def test_stream_key_layout_is_aes_key_then_counter() -> None:
    expected = _aes_ctr_words(KEY[:16], int.from_bytes(KEY[16:], "little"), 6)
    assert [int(w) for w in aes_counter(KEY).random_raw(12)] == expected
    assert uniform_uint64(KEY, 12).tolist() == expected
    assert uniform_uint64(KEY, (3, 4)).reshape(-1).tolist() == expected


def test_software_aes_gives_the_same_stream() -> None:
    # Nodes with and without AES-NI must draw identical masks.
    hardware, software = aes_counter(KEY), aes_counter(KEY)
    assert isinstance(software, AESCounter)
    software.use_aesni = False
    np.testing.assert_array_equal(hardware.random_raw(40), software.random_raw(40))


def test_same_key_same_stream() -> None:
    first = keyed_generator(KEY).standard_normal(1000)
    again = keyed_generator(KEY).standard_normal(1000)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(standard_normal(KEY, 1000), first)


@pytest.mark.parametrize("position", [0, 15, 16, 31])
def test_every_key_byte_changes_the_stream(position: int) -> None:
    changed = bytearray(KEY)
    changed[position] ^= 0x01
    base = standard_normal(KEY, 64)
    other = standard_normal(bytes(changed), 64)
    assert not np.any(base == other)


def test_draws_are_standard_normal() -> None:
    n = 200_000
    draws = standard_normal(KEY, n)
    assert draws.dtype == np.float64
    assert draws.shape == (n,)
    # Standard errors at n = 2e5: mean 0.0022, variance 0.0032, skew 0.0055,
    # excess kurtosis 0.011; the tolerances are about five of them.
    assert abs(draws.mean()) < 0.012
    assert abs(draws.var() - 1.0) < 0.016
    assert abs(stats.skew(draws)) < 0.03
    assert abs(stats.kurtosis(draws)) < 0.06
    assert stats.kstest(draws, "norm").pvalue > 1e-3


def test_uniform_words_are_uniform() -> None:
    words = uniform_uint64(KEY, 100_000)
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 64).mean(axis=0)
    # Each bit is Bernoulli(1/2); sd of its mean is 0.0016 at n = 1e5.
    assert np.max(np.abs(bits - 0.5)) < 0.01
    assert stats.kstest(words[:20_000] / 2.0**64, "uniform").pvalue > 1e-3


def test_out_buffer_receives_the_same_draws() -> None:
    out = np.empty((20, 50), dtype=np.float64)
    result = standard_normal(KEY, (20, 50), out=out)
    assert result is out
    np.testing.assert_array_equal(out.reshape(-1), standard_normal(KEY, 1000))
    numpy_size = np.int64(5)
    from_numpy_size = standard_normal(KEY, numpy_size)  # type: ignore[arg-type]
    np.testing.assert_array_equal(from_numpy_size, standard_normal(KEY, 5))


@pytest.mark.parametrize(
    ("out", "size"),
    [
        (np.empty(10, dtype=np.float64), 11),
        (np.empty(10, dtype=np.float32), 10),
        (np.empty((4, 5), dtype=np.float64).T, (5, 4)),
    ],
)
def test_bad_out_buffer_is_refused(out: np.ndarray, size: int | tuple[int, ...]) -> None:
    with pytest.raises(ValueError, match="out must be a C-contiguous float64 array of shape"):
        standard_normal(KEY, size, out=out)


@pytest.mark.parametrize(
    ("key", "got"), [(KEY[:31], "31 bytes"), (KEY + b"\x00", "33 bytes"), (KEY.hex(), "a str")]
)
def test_keys_must_be_32_bytes(key: Any, got: str) -> None:
    for make in (keyed_generator, lambda k: standard_normal(k, 3), lambda k: uniform_uint64(k, 3)):
        with pytest.raises(KeyFormatError) as info:
            make(key)
        assert str(info.value) == f"stream key must be 32 bytes; got {got}."


def test_os_generators_are_independent_aes_streams() -> None:
    first, second = os_generator(), os_generator()
    assert isinstance(first.bit_generator, AESCounter)
    assert not np.any(first.standard_normal(64) == second.standard_normal(64))


def test_stream_fingerprint_is_a_known_answer() -> None:
    # A different value here means this installation draws different masks from
    # the same keys than the one this project is tested with (see noise.stream).
    assert stream_fingerprint() == (
        "59de48dec663de93f17dcd8e15d98f5120862bd20a1eadeea5166188f7211acc"
    )
    assert STREAM_CHECK_DRAWS == 1 << 17


def _randomgen_words(key: bytes, counter: int, count: int) -> np.ndarray:
    bare = AESCounter(key=int.from_bytes(key[:16], "little"), counter=counter)
    words: np.ndarray = bare.random_raw(count)
    return words


@PATHS
@pytest.mark.parametrize("counter", WRAPS)
@pytest.mark.parametrize(("first", "count"), [(0, 2), (0, 17), (1, 16), (5, 9), (40, 3)])
def test_keystream_matches_randomgen(counter: int, first: int, count: int, native: bool) -> None:
    """The words are randomgen's AESCounter words, at any offset and across wraps."""
    stream = Keystream(KEY[:16], counter, 64, native=native)
    reference = _randomgen_words(KEY, counter, first + count)
    got = stream.words_at(first, count, np.empty(count + 4, dtype=np.uint64))
    assert np.array_equal(got, reference[first:])


@PATHS
@pytest.mark.parametrize("counter", WRAPS)
@pytest.mark.parametrize("most_words", [1, 2, 3, 8, 13])
@pytest.mark.parametrize(
    ("first", "count"),
    [(0, 0), (0, 1), (3, 1), (0, 3), (0, 4), (1, 4), (0, 5), (7, 26), (2, 27), (1, 40)],
)
def test_keystream_fill_matches_randomgen(
    counter: int, most_words: int, first: int, count: int, native: bool
) -> None:
    """fill() goes through any stretch in calls of most_words, writing nothing past ``out``."""
    stream = Keystream(KEY[:16], counter, most_words, native=native)
    reference = _randomgen_words(KEY, counter, first + count)
    around = np.full(count + 6, 0xA5A5_A5A5_A5A5_A5A5, dtype=np.uint64)
    out = around[3 : 3 + count]
    assert stream.fill(out, first) is out
    assert np.array_equal(out, reference[first:])
    assert np.all(around[:3] == 0xA5A5_A5A5_A5A5_A5A5)
    assert np.all(around[3 + count :] == 0xA5A5_A5A5_A5A5_A5A5)


# One stretch of uniform_uint64 is 2^15 words.
@pytest.mark.parametrize(
    "size", [0, 1, 2, 3, 5, (1 << 15) - 1, 1 << 15, (1 << 15) + 1, (1 << 15) + 3, 3 * (1 << 15) + 1]
)
@PATHS
def test_uniform_words_are_the_randomgen_words(size: int, native: bool) -> None:
    reference = aes_counter(KEY).random_raw(size)
    words = uniform_uint64(KEY, size, native=native)
    assert words.dtype == np.uint64 and words.shape == (size,)
    assert np.array_equal(words, reference)


@PATHS
@pytest.mark.parametrize(("offset", "size"), [(0, 1), (1, 1), (3, 2), (5, 7), (1, (1 << 15) + 5)])
def test_uniform_words_written_into_a_slot_of_a_larger_vector(
    offset: int, size: int, native: bool
) -> None:
    vector = np.full(offset + size + 3, 7, dtype=np.uint64)
    slot = vector[offset : offset + size]
    assert uniform_uint64(KEY, size, out=slot, native=native) is slot
    assert np.array_equal(slot, aes_counter(KEY).random_raw(size))
    assert np.all(vector[:offset] == 7) and np.all(vector[offset + size :] == 7)
    shaped = uniform_uint64(KEY, (1, size), out=np.empty(size, dtype=np.uint64))
    assert shaped.shape == (1, size) and np.array_equal(shaped[0], slot)


@pytest.mark.parametrize(
    ("out", "got"),
    [
        (np.empty(11, dtype=np.uint64), "shape (11,)"),
        (np.empty(10, dtype=np.int64), "int64 array"),
        (np.empty(10, dtype=">u8"), ">u8 array"),
        (np.empty((2, 5), dtype=np.uint64), "shape (2, 5)"),
        (np.empty(20, dtype=np.uint64)[::2], "a non-contiguous uint64"),
        (np.frombuffer(bytes(80), dtype=np.uint64), "a read-only uint64"),
        ([0] * 10, "got list"),
    ],
)
def test_a_bad_out_for_uniform_words_is_refused(out: Any, got: str) -> None:
    with pytest.raises(ValueError, match="out must be a writable C-contiguous") as info:
        uniform_uint64(KEY, 10, out=out)
    assert "of 10 words (size 10)" in str(info.value)
    assert got in str(info.value)


def test_a_negative_size_is_refused() -> None:
    with pytest.raises(ValueError, match=r"size must hold a whole number of words >= 0; got -1"):
        uniform_uint64(KEY, -1)
    with pytest.raises(ValueError, match=r"got \(2, -3\)"):
        uniform_uint64(KEY, (2, -3))


@PATHS
@pytest.mark.parametrize("size", [0, 1, 2, 5, 1 << 15, (1 << 15) + 1, 3 * (1 << 15) + 7])
@pytest.mark.parametrize("subtract", [False, True])
def test_words_added_in_place_equal_the_words_expanded_then_added(
    size: int, subtract: bool, native: bool
) -> None:
    base = np.random.default_rng(size).integers(0, 1 << 64, size, dtype=np.uint64, endpoint=False)
    words = uniform_uint64(KEY, size)
    expected = base - words if subtract else base + words  # numpy wraps mod 2^64
    vector = np.full(size + 3, 9, dtype=np.uint64)
    target = vector[1 : 1 + size]
    target[:] = base
    assert add_uniform_uint64(KEY, target, subtract=subtract, native=native) is target
    assert np.array_equal(target, expected)
    assert vector[0] == 9 and np.all(vector[1 + size :] == 9)  # nothing outside the slot


@pytest.mark.parametrize(
    ("target", "got"),
    [
        (np.empty(10, dtype=np.int64), "int64 array"),
        (np.empty((2, 5), dtype=np.uint64), "shape (2, 5)"),
        (np.empty(20, dtype=np.uint64)[::2], "a non-contiguous uint64"),
        (np.frombuffer(bytes(80), dtype=np.uint64), "a read-only uint64"),
    ],
)
@PATHS
def test_a_bad_target_for_added_words_is_refused_untouched(
    target: Any, got: str, native: bool
) -> None:
    before = np.array(target, copy=True)
    with pytest.raises(ValueError, match="out must be a writable C-contiguous") as info:
        add_uniform_uint64(KEY, target, native=native)
    assert got in str(info.value)
    assert np.array_equal(np.asarray(target), before)


def test_the_development_install_has_the_compiled_keystream() -> None:
    # make test builds noise/_keystream.c (setup.py); without a compiler, or on
    # a CPU without AES instructions, every test above takes OpenSSL's path only.
    assert NATIVE_KEYSTREAM


def test_the_compiled_cipher_is_aes128_by_its_published_known_answer() -> None:
    """FIPS-197 appendix C.1: the key 00 01 … 0f encrypts 00 11 … ff to 69 c4 … 5a."""
    from noise._keystream import keystream

    # The plaintext block is the counter's little-endian bytes: the key's second half.
    key = bytes(range(16)) + bytes.fromhex("00112233445566778899aabbccddeeff")
    out = np.zeros(2, dtype=np.uint64)
    keystream(key, 0, out, 0)
    assert out.tobytes().hex() == "69c4e0d86a7b0430d8cdb78070b4c55a"


_COUNTERS = st.one_of(
    st.integers(0, 2**128 - 1),
    st.integers(0, 40).map(lambda k: 2**128 - 1 - k),  # the 128-bit wrap
    st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 40)).map(
        lambda hk: (hk[0] << 64) | (2**64 - 1 - hk[1])  # the carry into the high word
    ),
)


@settings(max_examples=200, deadline=None)
@given(
    aes_key=st.binary(min_size=16, max_size=16),
    counter=_COUNTERS,
    first=st.integers(0, 70),
    count=st.integers(0, 90),
    mode=st.sampled_from([0, 1, 2]),
)
def test_the_compiled_words_are_the_openssl_words_at_any_place(
    aes_key: bytes, counter: int, first: int, count: int, mode: int
) -> None:
    """Stored, added or subtracted, at odd and even places, short and across eight blocks."""
    from noise._keystream import keystream

    key = aes_key + counter.to_bytes(16, "little")
    reference = uniform_uint64(key, first + count, native=False)[first:]
    base = np.random.default_rng(count).integers(0, 1 << 64, count, dtype=np.uint64)
    around = np.full(count + 2, 0x5A5A_5A5A_5A5A_5A5A, dtype=np.uint64)
    out = around[1 : 1 + count]
    out[:] = base
    keystream(key, first, out, mode)
    expected = (reference, base + reference, base - reference)[mode]
    assert np.array_equal(out, expected)
    assert around[0] == around[-1] == 0x5A5A_5A5A_5A5A_5A5A  # nothing outside ``out``


def test_the_compiled_pass_refuses_what_it_cannot_use() -> None:
    from noise._keystream import keystream

    words = np.zeros(8, dtype=np.uint64)
    with pytest.raises(ValueError, match="32 bytes; got 16"):
        keystream(KEY[:16], 0, words, 0)
    with pytest.raises(ValueError, match="mode must be 0"):
        keystream(KEY, 0, words, 3)
    with pytest.raises(ValueError, match="whole uint64 words"):
        keystream(KEY, 0, words.view(np.uint8)[:12], 0)
    with pytest.raises(ValueError, match="aligned"):
        keystream(KEY, 0, words.view(np.uint8)[4:60], 0)
    with pytest.raises(ValueError, match="passes the end"):
        keystream(KEY, 2**64 - 4, words, 0)
    with pytest.raises(TypeError):
        keystream(KEY, 0, bytes(64), 0)  # the words must be writable
    with pytest.raises(OverflowError):
        keystream(KEY, -1, words, 0)
    with pytest.raises(TypeError):
        keystream(KEY, 1.0, words, 0)
    assert not words.any()  # nothing written by a refused call


def test_the_compiled_pass_reaches_the_last_word_of_the_stream() -> None:
    from noise._keystream import keystream

    # Block 2^63 - 1 is the stream's last: its words are 2^64 - 2 and 2^64 - 1.
    last = np.zeros(2, dtype=np.uint64)
    keystream(KEY, np.uint64(2**64 - 2), last, 0)  # numpy integers are places too
    blocks = _aes_ctr_words(KEY[:16], int.from_bytes(KEY[16:], "little") + 2**63 - 1, 1)
    assert [int(w) for w in last] == blocks


@PATHS
def test_a_keystream_call_it_cannot_fill_is_refused(native: bool) -> None:
    stream = Keystream(KEY[:16], 0, 8, native=native)
    if native:  # no limit on the count, but the words go into uint64 room
        with pytest.raises(ValueError, match="little-endian uint64 out"):
            stream.words_at(0, 4, np.empty(44, dtype=np.uint8))
        with pytest.raises(ValueError, match="at least as many"):
            stream.words_at(0, 12, np.empty(10, dtype=np.uint64))
    else:  # never words the cipher did not write
        with pytest.raises(ValueError, match="at most 9 words a call"):
            stream.words_at(0, 40, np.empty(44, dtype=np.uint64))


def test_asking_for_the_compiled_pass_where_it_is_absent_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import noise.stream

    monkeypatch.setattr(noise.stream, "NATIVE_KEYSTREAM", False)
    with pytest.raises(RuntimeError, match="does not have"):
        uniform_uint64(KEY, 4, native=True)
    # Left to choose, the words come from OpenSSL, the same words.
    assert np.array_equal(uniform_uint64(KEY, 40), aes_counter(KEY).random_raw(40))
