"""Independent residual noise: what keeps the aggregate itself private.

Correlated noise cancels in the sum, so the published aggregate is exact. A
node that also wants the aggregate to be differentially private adds
independent residual noise g_k ~ N_Z(0, σ_res²) (grid units², an exact
fraction of the pinned scale) drawn by :func:`residual_draw` from a stream only
this node can key: its *private noise seed*

    π_k = HKDF-SHA256(IKM  = the node's X25519 session private key,
                      salt = UTF-8(session_id),
                      info = b"zerosum/v2/private-noise" ‖ config_hash ‖ lp(node_id),
                      L    = 32),

expanded per round and tensor with ``noise.seeds.stream_key(π_k, purpose=...)``
("residual" here, "cape-draw" for CAPE's private draws). No other party holds
the session private key, so nobody else can regenerate or subtract the noise;
the session key is saved (0600) for restarts, so a restarted node redraws
nothing — it adds the very same integers again.

:func:`residual_noise` (continuous, explicit generator) is for simulation
studies only; nothing a node releases is drawn by it.

CAPE split (Imtiaz, Mohammadi & Sarwate, arXiv 1904.10059, 2019): if each of
K nodes adds residual variance σ²/K, the sum of the K residuals carries
exactly the variance σ² a trusted curator would have added centrally.
"""

from __future__ import annotations

import math
from numbers import Real

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from noise.discrete import discrete_gaussian_variance
from noise.errors import CalibrationError
from noise.keys import CONFIG_HASH_BYTES, EphemeralKey, length_prefixed, require_bytes
from noise.seeds import SEED_BYTES, stream_key

__all__ = [
    "PRIVATE_NOISE_LABEL",
    "cape_residual_variance",
    "private_noise_key",
    "private_noise_seed",
    "residual_draw",
    "residual_noise",
]

PRIVATE_NOISE_LABEL = b"zerosum/v2/private-noise"


def private_noise_seed(
    key: EphemeralKey, *, config_hash: bytes, session_id: str, node_id: str
) -> bytes:
    """π_k: the 32-byte seed of this node's private noise streams (module docstring)."""
    require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    info = PRIVATE_NOISE_LABEL + config_hash + length_prefixed(node_id, "node id")
    return HKDF(
        algorithm=hashes.SHA256(),
        length=SEED_BYTES,
        salt=session_id.encode("utf-8"),
        info=info,
    ).derive(key.private_bytes())


def private_noise_key(seed: bytes, *, purpose: str, round_index: int, tensor: str) -> bytes:
    """The stream key of one private draw: ``stream_key(π_k, purpose, round, tensor)``."""
    return stream_key(seed, round_index=round_index, tensor=tensor, purpose=purpose)


def residual_draw(key: bytes, variance: object, size: int) -> NDArray[np.uint64]:
    """g_k ~ N_Z(0, σ_res²) on the grid (σ_res² in grid units²) as uint64 words."""
    draws: NDArray[np.uint64] = discrete_gaussian_variance(key, variance, size).view(np.uint64)  # type: ignore[arg-type]
    return draws


def residual_noise(
    shape: int | tuple[int, ...], std: float, *, rng: np.random.Generator | None = None
) -> NDArray[np.float64]:
    """Independent continuous N(0, std²) noise of the given shape (simulations only).

    ``rng`` defaults to a fresh generator keyed from ``os.urandom``; pass an
    explicit generator only for reproducible tests and simulations.
    ``std = 0`` returns zeros (residual noise switched off).
    """
    if isinstance(std, bool) or not isinstance(std, Real):
        raise CalibrationError("std", std, "must be a real number")
    s = float(std)
    if not (math.isfinite(s) and s >= 0.0):
        raise CalibrationError("std", s, "must be finite and >= 0")
    dims = (shape,) if isinstance(shape, int | np.integer) else tuple(shape)
    if any(isinstance(d, bool) or not isinstance(d, int | np.integer) or d < 0 for d in dims):
        raise ValueError(f"shape must be non-negative integers; got {shape!r}")
    if rng is None:
        from noise.stream import os_generator  # loads randomgen only when noise is drawn

        rng = os_generator()
    out = rng.standard_normal(tuple(int(d) for d in dims), dtype=np.float64)
    out *= s
    return out


def cape_residual_variance(central_variance: float, n_nodes: int) -> float:
    """Per-node residual variance σ²/K, so the K residuals sum to variance σ².

    ``central_variance`` is the σ² a trusted curator would add to the sum.
    """
    if isinstance(central_variance, bool) or not isinstance(central_variance, Real):
        raise CalibrationError(
            "central_variance",
            central_variance,
            "must be a real number",
        )
    v = float(central_variance)
    if not (math.isfinite(v) and v >= 0.0):
        raise CalibrationError("central_variance", v, "must be finite and >= 0")
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 1:
        raise CalibrationError("n_nodes", n_nodes, "must be a whole number >= 1")
    return v / n_nodes
