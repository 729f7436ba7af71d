"""Shared hypothesis strategies: node ids, key bytes, array shapes and float arrays."""

from __future__ import annotations

import operator
import string

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from numpy.typing import NDArray

__all__ = [
    "float_arrays",
    "key_bytes",
    "node_id_lists",
    "node_ids",
    "shapes",
]


_FIRST = string.ascii_lowercase
_REST = string.ascii_lowercase + string.digits + "_-"


def node_ids() -> st.SearchStrategy[str]:
    """One node id: a short identifier as written in a federation config ([a-z][a-z0-9_-]{0,11}).

    Drawn from explicit alphabets rather than a regex: a regex's character
    classes make hypothesis build its Unicode table first (several seconds in
    a fresh checkout, once per test process).
    """
    return st.builds(
        operator.add, st.sampled_from(_FIRST), st.text(alphabet=_REST, min_size=0, max_size=11)
    )


def node_id_lists(min_size: int = 2, max_size: int = 8) -> st.SearchStrategy[list[str]]:
    """Distinct node ids, in no particular order."""
    return st.lists(node_ids(), min_size=min_size, max_size=max_size, unique=True)


def key_bytes(length: int = 32) -> st.SearchStrategy[bytes]:
    """Raw key material (X25519/Ed25519 private keys, seeds, stream keys)."""
    return st.binary(min_size=length, max_size=length)


def shapes(max_dims: int = 3, max_side: int = 6) -> st.SearchStrategy[tuple[int, ...]]:
    """Array shapes from scalars (``()``) up to ``max_dims`` axes, empty axes included."""
    return hnp.array_shapes(min_dims=0, max_dims=max_dims, min_side=0, max_side=max_side)


def float_arrays(
    bound: float = 1e6,
    shape: st.SearchStrategy[tuple[int, ...]] | tuple[int, ...] | int | None = None,
) -> st.SearchStrategy[NDArray[np.float64]]:
    """Finite float64 arrays with every |value| <= ``bound``."""
    elements = st.floats(-bound, bound, allow_nan=False, allow_infinity=False, width=64)
    return hnp.arrays(np.float64, shapes() if shape is None else shape, elements=elements)
