"""Deterministic linear algebra for the PCA step: eigendecompositions, signs, packing.

Smith et al. (2019, NeuroImage 200:528-539) replace the standardised feature
matrix Z by its top eigenvectors U, with Z = U S Vᵀ. The right singular vectors
V and singular values S are the eigenvectors and square-rooted eigenvalues of
the scatter ZᵀZ, which is a sum over subjects and therefore federates exactly.
For an in-memory fit with more features than subjects the N×N Gram matrix ZZᵀ
has the same non-zero eigenvalues and is much cheaper; V is recovered as
ZᵀW S⁻¹. Both routes use LAPACK's symmetric divide-and-conquer solver (no
randomised SVD), and each eigenvector's sign is fixed so that its
largest-magnitude entry is positive — the same input always yields the same
basis, bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]

# Eigenvalues of a scatter matrix are accurate only to about eps·λ_max, so
# anything below this fraction of the largest is treated as zero (rank deficit).
RANK_RTOL = 1e-10


def _row_starts(p: int) -> list[int]:
    """Offset of row i's first entry (column i) in the packed upper triangle."""
    return [i * p - i * (i - 1) // 2 for i in range(p + 1)]


def pack_symmetric(matrix: FloatArray) -> FloatArray:
    """Upper triangle (diagonal included) of a symmetric matrix, row by row: P(P+1)/2 values.

    Copied row by row into the output: no index arrays of the triangle's size.
    """
    p = matrix.shape[0]
    packed: FloatArray = np.empty(packed_size(p), dtype=matrix.dtype)
    starts = _row_starts(p)
    for i in range(p):
        packed[starts[i] : starts[i + 1]] = matrix[i, i:]
    return packed


def packed_size(p: int) -> int:
    return p * (p + 1) // 2


def _check_packed(packed: FloatArray, p: int) -> None:
    if packed.shape != (packed_size(p),):
        raise ValueError(
            f"a packed symmetric {p}x{p} matrix has {packed_size(p)} entries; got shape "
            f"{packed.shape}."
        )


def unpack_symmetric(packed: FloatArray, p: int) -> FloatArray:
    """Inverse of :func:`pack_symmetric`; the result is exactly symmetric."""
    _check_packed(packed, p)
    matrix = np.empty((p, p))
    starts = _row_starts(p)
    for i in range(p):
        row = packed[starts[i] : starts[i + 1]]
        matrix[i, i:] = row
        matrix[i:, i] = row
    return matrix


def packed_diagonal(packed: FloatArray, p: int) -> FloatArray:
    """The diagonal of the matrix :func:`pack_symmetric` packed, without unpacking it."""
    _check_packed(packed, p)
    diagonal: FloatArray = np.asarray(packed, dtype=np.float64)[_row_starts(p)[:p]]
    return diagonal


def symmetrise(matrix: FloatArray, block: int = 256) -> FloatArray:
    """``(matrix + matrix.T) / 2`` in place, block by block; returns ``matrix``.

    Each pair of entries becomes (m_ij + m_ji) / 2, the same float as the
    out-of-place expression gives (addition commutes exactly), so the result
    is exactly symmetric; only two blocks are copied at a time.
    """
    p = matrix.shape[0]
    for i in range(0, p, block):
        rows = slice(i, min(i + block, p))
        for j in range(i, p, block):
            cols = slice(j, min(j + block, p))
            mean = matrix[rows, cols] + matrix[cols, rows].T
            mean /= 2.0
            matrix[rows, cols] = mean
            matrix[cols, rows] = mean.T
    return matrix


def fix_signs(vectors: FloatArray) -> FloatArray:
    """Flip columns so that each one's largest-magnitude entry (first on ties) is positive."""
    if vectors.shape[1] == 0:
        return vectors
    pivots = np.argmax(np.abs(vectors), axis=0)
    signs = np.sign(vectors[pivots, np.arange(vectors.shape[1])])
    signs[signs == 0] = 1.0
    fixed: FloatArray = vectors * signs
    return fixed


def eigh_descending(matrix: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Eigenvalues (descending) and eigenvectors of a symmetric matrix."""
    values, vectors = np.linalg.eigh(matrix)
    return values[::-1].copy(), np.ascontiguousarray(vectors[:, ::-1])


def numerical_rank(eigenvalues: FloatArray) -> int:
    """Number of eigenvalues above ``RANK_RTOL`` times the largest (0 if none is positive)."""
    if eigenvalues.size == 0 or eigenvalues[0] <= 0.0:
        return 0
    return int(np.count_nonzero(eigenvalues > RANK_RTOL * eigenvalues[0]))


def right_vectors_from_gram(
    z: FloatArray, gram_values: FloatArray, gram_vectors: FloatArray, k: int
) -> FloatArray:
    """Top-k right singular vectors V = Zᵀ W S⁻¹ from the eigenpairs (S², W) of Z Zᵀ."""
    scale = 1.0 / np.sqrt(gram_values[:k])
    vectors: FloatArray = (z.T @ gram_vectors[:, :k]) * scale
    return vectors


def proportion_to_count(proportion: float, n_features: int) -> int:
    """``max(1, floor(proportion · P))``, robust to the binary representation of the product."""
    return max(1, math.floor(proportion * n_features + 1e-9))


def variance_count(eigenvalues: FloatArray, total: float, fraction: float, rank: int) -> int:
    """Smallest k whose leading eigenvalues explain at least ``fraction`` of ``total``."""
    cumulative = np.cumsum(eigenvalues[:rank]) / total
    reached = np.flatnonzero(cumulative >= fraction - 1e-12)
    return int(reached[0]) + 1 if reached.size else rank


def kaiser_guttman_count(eigenvalues: FloatArray, total: float, n_features: int, rank: int) -> int:
    """Components whose eigenvalue exceeds the average eigenvalue ``total / P``.

    For standardised features the average eigenvalue of the correlation matrix
    is 1, which is the classic Kaiser-Guttman rule (Kaiser 1960, Educ. Psychol.
    Meas. 20:141-151); after confounds are regressed out the average falls below
    1 and the rule keeps its meaning as "more than an average feature's worth".
    """
    threshold = total / n_features
    return max(1, int(np.count_nonzero(eigenvalues[:rank] > threshold)))
