"""Payload files written with direct I/O: every byte in the file when a write returns."""

from __future__ import annotations

import os
import random
from pathlib import Path

import blake3
import numpy as np
import pytest

from coordinator.aggregate import RoundSum
from coordinator.store.payloads import PayloadWriter

# Chunk sizes around the 4 KiB block and the 1 MiB staging buffer, one larger than it.
SIZES = (1 << 20, 7, 4089, 1 << 20, (1 << 20) + 5, 3 << 20, 0, 1, 4096, 12_345, 1 << 20)


def direct_io_works(folder: Path) -> bool:
    """Whether this file system takes O_DIRECT writes (older tmpfs and some others do not)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = folder / "probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | flag, 0o600)
    except OSError:
        return False
    os.close(fd)
    probe.unlink()
    return True


@pytest.mark.parametrize("direct", [True, False])
def test_every_byte_is_in_the_file_when_write_returns(tmp_path: Path, direct: bool) -> None:
    rng = random.Random(7)
    for _ in range(3):  # staging buffers are handed back and reused by the next writer
        writer = PayloadWriter(tmp_path, direct=direct)
        written = bytearray()
        for size in SIZES:
            data = rng.randbytes(size)
            writer.write(memoryview(data) if size % 2 else data)
            written += data
            assert writer.path.read_bytes() == written
            assert writer.size == len(written)
        assert writer.finish() == blake3.blake3(written).digest()
        assert writer.path.read_bytes() == written
        writer.discard()
    assert not any(tmp_path.iterdir())


def test_direct_io_is_used_where_the_file_system_takes_it(tmp_path: Path) -> None:
    writer = PayloadWriter(tmp_path)
    writer.write(bytes(1 << 20))
    assert writer.direct == direct_io_works(tmp_path)
    assert not PayloadWriter(tmp_path, direct=False).direct
    writer.discard()


def test_a_direct_write_at_an_unaligned_offset_still_lands(tmp_path: Path) -> None:
    """Some file systems refuse it (EINVAL: the writer goes on through the page cache),
    others take it through their own buffered path; either way the bytes are there."""
    if not direct_io_works(tmp_path):
        pytest.skip("this file system does not take direct I/O")
    writer = PayloadWriter(tmp_path)
    writer.write(b"\x01" * 8192)
    assert writer.direct
    writer._put(memoryview(b"\x02" * 4096), 3, direct=True)
    assert writer.path.read_bytes() == b"\x01" * 3 + b"\x02" * 4096 + b"\x01" * (8192 - 4099)
    writer.write(b"\x03" * 5000)
    assert writer.path.read_bytes()[8192:] == b"\x03" * 5000
    writer.discard()


def test_a_withdrawal_reads_back_every_word_fed_after_an_unaligned_chunk(tmp_path: Path) -> None:
    n_words = 3000
    words = np.arange(1, n_words + 1, dtype="<u8").tobytes()
    running = RoundSum(n_words)
    writer = PayloadWriter(tmp_path)
    contribution = running.begin("a", writer.path)
    for start, stop in ((0, 4093), (4093, 4096), (4096, 17_000)):  # tails under one block
        writer.write(words[start:stop])
        running.feed(contribution, words[start:stop])
    assert running.words()[:2].tolist() == [1, 2]
    running.withdraw(contribution)
    assert not running.words().any()
    writer.discard()


def test_staging_buffers_made_ahead_are_the_ones_uploads_take(tmp_path: Path) -> None:
    from coordinator.store.payloads import _KEEP_STAGES, _STAGE_BYTES, _StagingBuffers

    stages = _StagingBuffers()
    stages.prepare(3)
    ready = list(stages._free)
    assert len(ready) == 3 and all(len(b) == _STAGE_BYTES for b in ready)
    stages.prepare(2)  # enough are ready: none is made
    assert stages._free == ready
    taken = [stages.take() for _ in range(3)]
    assert {id(b) for b in taken} == {id(b) for b in ready} and stages._free == []
    for buffer in taken:
        buffer[:4] = b"data"  # writable, as a stage must be
        stages.give(buffer)
    stages.prepare(10 * _KEEP_STAGES)  # never more than are kept
    assert len(stages._free) == _KEEP_STAGES


@pytest.mark.parametrize("direct", [True, False])
def test_bytes_hashed_aside_give_the_same_file_and_digest(tmp_path: Path, direct: bool) -> None:
    """hash_aside: the SHA-256 is taken in a helper thread, in order, of the same bytes."""
    rng = random.Random(11)
    writer = PayloadWriter(tmp_path, direct=direct)
    written = bytearray()
    for index, size in enumerate(SIZES):
        data = rng.randbytes(size)
        view = memoryview(bytearray(data))
        writer.write(view, hash_aside=index % 3 != 1)  # hashed aside or not, interleaved
        view[:] = bytes(size)  # the caller may reuse its buffer once write returns
        written += data
        assert writer.size == len(written)
    assert writer.finish() == blake3.blake3(written).digest()
    assert writer.path.read_bytes() == written


def test_a_write_that_fails_while_hashed_aside_raises_and_leaves_the_writer_usable_to_discard(
    tmp_path: Path,
) -> None:
    writer = PayloadWriter(tmp_path, direct=False)
    writer.write(b"abc", hash_aside=True)
    assert writer._fd is not None
    os.close(writer._fd)  # the file's descriptor goes away under the writer
    with pytest.raises(OSError):
        writer.write(b"defg" * 1000, hash_aside=True)
    writer._fd = None
    writer.discard()
    assert not writer.path.exists()
