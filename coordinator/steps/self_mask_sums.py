"""Σ of the self-masks revealed in a round's unmask step, summed as the answers arrive.

A round's aggregate is Σ_S uploads − Σ_S self-masks − Σ_S corrections
(docs/design.md §4.6), and each self-mask b_k is K words of AES-CTR keystream
expanded from the seed β_k in k's answer. Expanding all K of them only once
the last answer is in would put K expansions on the round's critical path,
under the session lock. Here each is expanded as its answer is stored, in one
background thread (outside the session lock; one thread also keeps the
allocator from holding a vector's worth of memory in every gRPC thread), and
the last answer waits only for what is still pending. Each mask after the
first is added into the sum as its words are made (``noise.self_mask.add_self_mask``),
a stretch at a time.

The sum is a cache, not state: it lives in memory for the latest unmask
attempt only (one vector of the round's size), and :meth:`total` recomputes
from the stored seeds whatever it does not hold — after a restart, or when an
answer it counted is not among those given. The vector :meth:`total` hands
over may be given back (:meth:`recycle`) once its caller has read it: the
next round's sum is made in it rather than in new memory, whose pages the
first expansion of a round would otherwise fault in on the path the round's
answers wait on. So one vector of the round's size is held between rounds.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
from numpy.typing import NDArray

from noise.layout import Layout
from noise.self_mask import add_self_mask, self_mask

__all__ = ["SelfMaskSums"]

U64 = NDArray[np.uint64]


class SelfMaskSums:
    """The running Σ b_k of one (round, attempt), keyed by the answering nodes."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._nodes: dict[str, bytes] = {}
        self._sum: U64 | None = None
        self._spare: U64 | None = None  # a vector given back, for the next sum
        self._lock = threading.Lock()  # the sum, whose masks it holds, and the spare
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zerosum-self-masks")
        # Its own lock, so a gRPC thread handing over an answer never waits on an expansion.
        self._pending_lock = threading.Lock()
        self._pending: list[Future[None]] = []

    def add(
        self, round_index: int, attempt: int, node_id: str, seed: bytes, layout: Layout
    ) -> None:
        """Count ``node_id``'s self-mask (once) in the sum of (``round_index``, ``attempt``).

        Returns at once; the expansion runs in the background thread.
        """
        future = self._executor.submit(self._add, round_index, attempt, node_id, seed, layout)
        with self._pending_lock:
            self._pending = [f for f in self._pending if not f.done()] + [future]

    def _add(
        self, round_index: int, attempt: int, node_id: str, seed: bytes, layout: Layout
    ) -> None:
        with self._lock:
            if self._key != (round_index, attempt):
                self._key, self._nodes, self._sum = (round_index, attempt), {}, None
            if node_id in self._nodes:
                return
            if self._sum is None:
                self._sum = self_mask(
                    seed, layout, round_index=round_index, out=self._take_spare(layout.size)
                )
            else:
                # Added as it is expanded, in place: one pass over the sum, no
                # fresh 8 MB pad per answer (total() hands the sum over). Should
                # that stop part way, the sum is dropped, never left half-added:
                # total() recomputes it from the stored seeds.
                try:
                    add_self_mask(self._sum, seed, layout, round_index=round_index)
                except BaseException:
                    self._key, self._nodes, self._sum = None, {}, None
                    raise
            self._nodes[node_id] = seed

    def _drain(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        for future in pending:
            # An expansion that failed is simply not held: total() recomputes it.
            future.exception()

    def total(
        self, round_index: int, attempt: int, seeds: Mapping[str, bytes], layout: Layout
    ) -> U64:
        """Σ_k b_k over ``seeds`` (node → revealed seed), reusing what was summed already.

        The vector returned is the caller's own: a sum that matched is handed
        over and no longer held.
        """
        self._drain()
        held: dict[str, bytes] = {}
        total: U64 | None = None
        with self._lock:
            if (
                self._key == (round_index, attempt)
                and self._sum is not None
                and all(seeds.get(n) == s for n, s in self._nodes.items())
            ):
                # Handed over, not copied: the sum is this call's to finish, and
                # the cache starts again empty (a later total recomputes it from
                # the seeds). At the round's last answer a copy would be 8 MB of
                # fresh memory on the path every node is waiting on.
                held, total = dict(self._nodes), self._sum
                self._key, self._nodes, self._sum = None, {}, None
        for node_id, seed in sorted(seeds.items()):
            if node_id in held:
                continue
            if total is None:
                with self._lock:
                    spare = self._take_spare(layout.size)
                total = self_mask(seed, layout, round_index=round_index, out=spare)
            else:  # total was handed over or is a fresh pad: ours to add into
                add_self_mask(total, seed, layout, round_index=round_index)
        if total is None:
            return np.zeros(layout.size, dtype=np.uint64)
        return total

    def _take_spare(self, size: int) -> U64 | None:
        """The vector given back, if it has ``size`` words (no longer held); under the lock."""
        spare, self._spare = self._spare, None
        return spare if spare is not None and spare.shape == (size,) else None

    def recycle(self, vector: U64) -> None:
        """Give back a vector :meth:`total` returned, once its caller no longer reads it."""
        with self._lock:
            self._spare = vector

    def forget(self) -> None:
        """Drop the sum (the round completed, failed or moved to another attempt)."""
        self._drain()
        with self._lock:
            self._key, self._nodes, self._sum = None, {}, None
