"""The running uint64 sum: exact modulo 2^64 for any chunking, and withdrawable."""

from __future__ import annotations

import itertools
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.aggregate import ContributionWithdrawn, RoundSum, iter_file_words


def write(path: Path, words: np.ndarray) -> Path:
    path.write_bytes(words.astype("<u8").tobytes())
    return path


def feed_in_chunks(total: RoundSum, path: Path, cuts: list[int]) -> None:
    data = path.read_bytes()
    contribution = total.begin(path.name, path)
    edges = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    for start, end in itertools.pairwise(edges):
        total.feed(contribution, data[start:end])
    total.close(contribution)


@settings(max_examples=60, deadline=None)
@given(
    n_words=st.integers(min_value=1, max_value=40),
    cuts=st.lists(
        st.lists(st.integers(min_value=0, max_value=400), max_size=12), min_size=1, max_size=4
    ),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_any_chunking_gives_the_wrapping_sum(
    tmp_path_factory: pytest.TempPathFactory, n_words: int, cuts: list[list[int]], seed: int
) -> None:
    folder = tmp_path_factory.mktemp("chunks")
    rng = np.random.default_rng(seed)
    vectors = [rng.integers(0, 2**64 - 1, n_words, dtype=np.uint64, endpoint=True) for _ in cuts]
    total = RoundSum(n_words)
    for index, (vector, cut) in enumerate(zip(vectors, cuts, strict=True)):
        feed_in_chunks(total, write(folder / f"p{index}", vector), cut)
    expected = np.zeros(n_words, dtype=np.uint64)
    for vector in vectors:
        np.add(expected, vector, out=expected)
    np.testing.assert_array_equal(total.words(), expected)


def test_sums_wrap_around_2_to_the_64_without_warnings(tmp_path: Path) -> None:
    top = np.full(5, 2**64 - 1, dtype=np.uint64)
    total = RoundSum(5)
    total.add_file(write(tmp_path / "a", top))
    total.add_file(write(tmp_path / "b", np.full(5, 3, dtype=np.uint64)))
    np.testing.assert_array_equal(total.words(), np.full(5, 2, dtype=np.uint64))
    total.subtract_file(write(tmp_path / "c", np.full(5, 4, dtype=np.uint64)))
    np.testing.assert_array_equal(total.words(), np.full(5, 2**64 - 2, dtype=np.uint64))


def test_withdrawing_a_partial_contribution_restores_the_sum(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    kept = rng.integers(0, 2**64 - 1, 100, dtype=np.uint64, endpoint=True)
    partial = rng.integers(0, 2**64 - 1, 100, dtype=np.uint64, endpoint=True)
    total = RoundSum(100)
    total.add_file(write(tmp_path / "kept", kept))
    source = tmp_path / "partial"
    raw = partial.astype("<u8").tobytes()
    source.write_bytes(raw[:413])  # what the receiver has written so far
    contribution = total.begin("partial", source)
    total.feed(contribution, raw[:200])
    total.feed(contribution, raw[200:413])
    assert contribution.added_words == 51 and total.open_contributions == 1
    total.withdraw(contribution)
    total.withdraw(contribution)  # idempotent
    np.testing.assert_array_equal(total.words(), kept)
    assert total.open_contributions == 0
    with pytest.raises(ContributionWithdrawn):
        total.feed(contribution, raw[413:420])
    with pytest.raises(ContributionWithdrawn):
        total.close(contribution)


def test_a_payload_must_be_complete_and_no_longer_than_announced(tmp_path: Path) -> None:
    total = RoundSum(2)
    contribution = total.begin("p", tmp_path / "p")
    total.feed(contribution, b"\x01" * 10)
    with pytest.raises(ValueError, match="received 10 of 16 bytes"):
        total.close(contribution)
    with pytest.raises(ValueError, match="exceed the payload size of 16 bytes"):
        total.feed(contribution, b"\x01" * 7)


def test_stored_files_are_streamed_in_blocks(tmp_path: Path) -> None:
    n_words = (5 << 20) // 8 + 3  # more than one 4 MiB block
    vector = np.arange(n_words, dtype=np.uint64)
    path = write(tmp_path / "big", vector)
    blocks = [block.shape[0] for block in iter_file_words(path)]
    assert len(blocks) == 2 and sum(blocks) == n_words
    total = RoundSum(n_words)
    total.add_file(path)
    total.add_file(path)
    np.testing.assert_array_equal(total.words(), vector * np.uint64(2))
    written: list[bytes] = []
    total.write_to(lambda block: written.append(bytes(block)))
    assert [len(block) for block in written] == [4 << 20, n_words * 8 - (4 << 20)]
    assert b"".join(written) == (vector * np.uint64(2)).astype("<u8").tobytes()


def test_a_file_ending_inside_a_word_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd"
    path.write_bytes(b"\x00" * 12)
    with pytest.raises(ValueError, match="ends inside a uint64 word"):
        list(iter_file_words(path))
    short = tmp_path / "short"
    short.write_bytes(b"\x00" * 16)
    with pytest.raises(ValueError, match="1 word"):
        RoundSum(3).add_file(short)


def test_concurrent_streams_add_up_exactly(tmp_path: Path) -> None:
    n_words, nodes = 50_000, 6
    rng = np.random.default_rng(2)
    vectors = [
        rng.integers(0, 2**64 - 1, n_words, dtype=np.uint64, endpoint=True) for _ in range(nodes)
    ]
    total = RoundSum(n_words)
    paths = [write(tmp_path / f"n{i}", v) for i, v in enumerate(vectors)]
    threads = [
        threading.Thread(target=feed_in_chunks, args=(total, p, list(range(7, 400_000, 9_973))))
        for p in paths
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = np.zeros(n_words, dtype=np.uint64)
    for vector in vectors:
        np.add(expected, vector, out=expected)
    np.testing.assert_array_equal(total.words(), expected)
