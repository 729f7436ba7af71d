"""What fresh memory costs on this machine, and what the payload writer saves of it.

The round's figures depend on more than the code: on a virtual machine whose
balloon device hands freed memory back to its host (free page reporting), a
page the guest touches for the first time after that is faulted in by the
host first, and costs many times an ordinary copy (docs/how-it-works.md,
"Fresh memory on this machine"). These figures say how much that is on the
machine that ran ``make bench``, so its other figures can be read; each is a
median over ``repeats`` runs of CPU time (``time.thread_time``) in this
process:

* ``fresh_memory_fill_ms_per_8mb``: filling 8 MB of newly allocated memory
  that the process keeps (every run a new vector, all kept to the end);
* ``reused_memory_fill_ms_per_8mb``: filling the same 8 MB again, and
  ``fresh_memory_fill_ratio`` the first over the second (near 1 where fresh
  pages cost nothing extra);
* ``page_cache_write_ms_per_8mib``: writing 8 MiB in 1 MiB pieces to a new
  file that is kept with the coordinator's payload writer told not to use
  direct I/O (``coordinator.store.payloads.PayloadWriter``: through the page
  cache, hashing and fsyncing it)
  (each run writes ten such files, as a round of ten uploads does, so the
  page cache grows past the pages other work just freed);
* ``payload_writer_ms_per_8mib``: the same bytes written by the same writer
  as the coordinator runs it (direct I/O where the file system takes it),
  and ``payload_writer_ratio_vs_page_cache``;
* ``payload_writer_direct``: 1 where the benchmark's temporary folder took
  direct I/O, 0 where the writer fell back to the page cache.

The figures move with the machine's state as well as its kind: right after
other work has freed much memory that the host has not yet taken back,
fresh pages cost little (a fill ratio of 3 was seen here then, 16 at other
times, 45 on a machine just booted); on a machine with no such balloon,
both ratios stay near 1.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from coordinator.store.payloads import PayloadWriter

__all__ = ["run"]

_WORDS = 10**6
_CHUNK = 1 << 20
_CHUNKS = 8
_FILES = 10  # a run writes as many payload files as a round of ten nodes


def _cpu_ms(work: Callable[[], object]) -> float:
    start = time.thread_time()
    work()
    return 1000.0 * (time.thread_time() - start)


def _memory_figures(repeats: int) -> dict[str, float]:
    kept: list[NDArray[np.uint64]] = []
    reused = np.empty(_WORDS, dtype=np.uint64)
    reused.fill(0)
    fresh_ms: list[float] = []
    reused_ms: list[float] = []
    for _ in range(repeats):
        vector = np.empty(_WORDS, dtype=np.uint64)
        fresh_ms.append(_cpu_ms(partial(vector.fill, 1)))
        kept.append(vector)
        reused_ms.append(_cpu_ms(partial(reused.fill, 1)))
    fresh, again = statistics.median(fresh_ms), statistics.median(reused_ms)
    return {
        "fresh_memory_fill_ms_per_8mb": fresh,
        "reused_memory_fill_ms_per_8mb": again,
        "fresh_memory_fill_ratio": fresh / again,
    }


def _write_kept(folder: Path, chunks: list[bytes], *, direct: bool) -> bool:
    """One payload file as the coordinator writes it, kept; whether direct I/O was used."""
    writer = PayloadWriter(folder, direct=direct)
    for chunk in chunks:
        writer.write(chunk)
    writer.finish()
    writer.rename(f"kept-{writer.path.name}")  # kept, as a placed payload is
    return writer.direct


def _file_figures(repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    chunks = [rng.bytes(_CHUNK) for _ in range(_CHUNKS)]
    cache_ms: list[float] = []
    writer_ms: list[float] = []
    direct: list[bool] = []
    with tempfile.TemporaryDirectory(prefix="zerosum-memory-bench-") as name:
        folder = Path(name)
        for _ in range(repeats):
            start = time.thread_time()
            for _ in range(_FILES):
                _write_kept(folder, chunks, direct=False)
            cache_ms.append(1000.0 * (time.thread_time() - start) / _FILES)
            start = time.thread_time()
            direct.extend(_write_kept(folder, chunks, direct=True) for _ in range(_FILES))
            writer_ms.append(1000.0 * (time.thread_time() - start) / _FILES)
    cache, writer = statistics.median(cache_ms), statistics.median(writer_ms)
    return {
        "page_cache_write_ms_per_8mib": cache,
        "payload_writer_ms_per_8mib": writer,
        "payload_writer_ratio_vs_page_cache": writer / cache,
        "payload_writer_direct": float(all(direct)),
    }


def run(repeats: int) -> dict[str, float]:
    return _memory_figures(repeats) | _file_figures(repeats)


if __name__ == "__main__":
    import json

    print(json.dumps(run(5), indent=2, sort_keys=True))
