"""Seeds for every cell and repetition, derived from the sweep seed with ``SeedSequence``.

No global RNG and no truncated seeds: a cell's root is

    SeedSequence(entropy=(sweep seed, int(SHA-256(cell description), 16)))

— the full 256-bit digest of the cell's kind and parameters enters the entropy
pool — and repetition r is its child with spawn key (r,). A utility cell draws
its noise from that root and its federations from a second root built the same
way from the data parameters alone (K, N, P, site effects, holdout size; the
``data_cell`` column), so cells that differ only in ε or δ see the same data. Children are derived
explicitly (never with ``SeedSequence.spawn``, which counts its calls), so the
same cell gets the same streams whichever process runs it and in whatever order.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

import numpy as np

__all__ = ["cell_digest", "cell_seed", "child", "generator"]


def child(seed: np.random.SeedSequence, index: int) -> np.random.SeedSequence:
    """The ``index``-th child of ``seed`` (spawn key extended by ``index``)."""
    return np.random.SeedSequence(
        entropy=seed.entropy,
        spawn_key=(*seed.spawn_key, index),
        pool_size=seed.pool_size,
    )


def generator(seed: np.random.SeedSequence) -> np.random.Generator:
    """A PCG64 generator for ``seed``."""
    return np.random.Generator(np.random.PCG64(seed))


def cell_digest(description: Mapping[str, object]) -> str:
    """SHA-256 (hex) of the canonical JSON of a cell's description."""
    text = json.dumps(description, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def cell_seed(sweep_seed: int, digest: str) -> np.random.SeedSequence:
    """The root seed of a cell: the sweep seed and the cell's full digest as entropy."""
    return np.random.SeedSequence(entropy=(sweep_seed, int(digest, 16)))
