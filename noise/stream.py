"""Keyed, cryptographically secure random streams: AES-128 in counter mode.

Every mask value comes from a stream keyed with a 32-byte key derived by HKDF
(noise/seeds.py). The bit generator is randomgen's ``AESCounter``: block b of
the keystream is AES-128_K(c + b mod 2^128), where

* K = ``key[:16]`` (the AES key, passed to randomgen as a little-endian integer,
  which it stores byte for byte as the AES key), and
* c = ``int.from_bytes(key[16:32], "little")`` (the initial 128-bit counter,
  whose little-endian bytes form the plaintext block),

and each 16-byte ciphertext block yields two little-endian uint64 words.
``tests/noise/test_stream.py`` checks exactly this against AES-128-ECB from
the ``cryptography`` library. All 32 derived bytes are used. numpy's ziggurat
(``Generator.standard_normal``) turns the words into N(0, 1) draws.

Why AES-128-CTR:

* Security matches the key agreement: X25519 gives ~128-bit security, and
  AES-128 in counter mode is a pseudorandom function at the same level
  (Bellare, Desai, Jokipii & Rogaway 1997, "A concrete security treatment of
  symmetric encryption", FOCS). Someone who sees masked values but not the key
  cannot predict or reconstruct the masks.
* Speed: with AES-NI, ``AESCounter`` feeds the ziggurat about as fast as
  numpy's PCG64 (benchmarks/noise_bench.py measures the ratio), so the
  security costs nothing noticeable.
* Never MT19937 and never a 32-bit seed. Flower's SecAgg+ folds its pairwise
  seed to 32 bits and feeds MT19937, which can be brute-forced over 2^32 seeds
  and whose state is recoverable from 624 outputs (Matsumoto & Nishimura 1998,
  ACM TOMACS). Neither weakness exists here.

``os_generator()`` keys the same construction from ``os.urandom(32)`` for
noise that no other party must be able to regenerate (residual DP noise).

Exact cancellation needs both ends of a pair to draw *the same* integers.
The discrete samplers (``noise.discrete``) are integer algorithms whose
floating-point steps only choose between "decided" and "decide exactly", so
they draw the same integers on every correct installation; what can still
differ is the software itself (a changed sampler, randomgen's AES counter
layout). TREs install their own software, so :func:`stream_fingerprint`
digests a reference stream — raw words, discrete Gaussians at several scales
and discrete Laplace draws from a published key (the samplers' rare exact
paths are pinned by their known-answer tests, which force them).
``zerosum federation init`` pins it in ``federation.toml`` (``stream_check``)
and a node whose draws differ refuses to start, instead of producing an
aggregate that is silently wrong. numpy's ziggurat (:func:`standard_normal`)
is kept for simulation studies only; nothing a node releases is drawn by it.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np
from numpy.typing import NDArray
from randomgen import AESCounter

from noise.keys import require_bytes

__all__ = [
    "STREAM_CHECK_DRAWS",
    "STREAM_KEY_BYTES",
    "aes_counter",
    "keyed_generator",
    "os_generator",
    "standard_normal",
    "stream_fingerprint",
    "uniform_uint64",
]

STREAM_KEY_BYTES = 32
# 2^17 draws per scale: each scale's exact path (about 1e-7 of the proposals, more
# at small scales) is reached in expectation, and the check takes well under a second.
STREAM_CHECK_DRAWS = 1 << 17
_STREAM_CHECK_KEY = hashlib.sha256(b"zerosum/v2/stream-check").digest()
# Small scales, the demo's and the 2,641-feature scale.
_CHECK_SCALES = (0.5, 3.0, 5.4e10, 1.0e14)


def aes_counter(key: bytes) -> np.random.BitGenerator:
    """The bare AES-128-CTR bit generator for a 32-byte stream key (see module docstring)."""
    raw = require_bytes(key, STREAM_KEY_BYTES, "stream key")
    bit_generator: np.random.BitGenerator = AESCounter(
        key=int.from_bytes(raw[:16], "little"),
        counter=int.from_bytes(raw[16:32], "little"),
    )
    return bit_generator


def keyed_generator(key: bytes) -> np.random.Generator:
    """A numpy ``Generator`` over the AES-128-CTR stream of ``key`` (exactly 32 bytes)."""
    return np.random.Generator(aes_counter(key))


def standard_normal(
    key: bytes,
    size: int | tuple[int, ...],
    *,
    out: NDArray[np.float64] | None = None,
) -> NDArray[np.float64]:
    """Draw N(0, 1) values from the stream of ``key``; the same key gives the same values.

    With ``out`` (float64, C-contiguous, shape ``size``) the draws are written
    in place and ``out`` is returned, so hot loops need not allocate.
    """
    shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    generator = keyed_generator(key)
    if out is None:
        return generator.standard_normal(shape, dtype=np.float64)
    if out.dtype != np.float64 or out.shape != shape or not out.flags.c_contiguous:
        # C order fixes which draw lands at which index, so both ends of a pair agree.
        layout = "C-contiguous" if out.flags.c_contiguous else "non-contiguous or Fortran-order"
        raise ValueError(
            f"out must be a C-contiguous float64 array of shape {shape}; "
            f"got a {layout} {out.dtype} array of shape {out.shape}."
        )
    generator.standard_normal(dtype=np.float64, out=out)
    return out


def uniform_uint64(key: bytes, size: int | tuple[int, ...]) -> NDArray[np.uint64]:
    """The raw keystream of ``key`` as uniform uint64 words (each exactly uniform on [0, 2^64))."""
    shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    count = int(np.prod(shape, dtype=np.int64))
    words: NDArray[np.uint64] = np.asarray(aes_counter(key).random_raw(count), dtype=np.uint64)
    return words.reshape(shape)


def os_generator() -> np.random.Generator:
    """A ``Generator`` keyed from the operating system's CSPRNG (``os.urandom(32)``)."""
    return keyed_generator(os.urandom(STREAM_KEY_BYTES))


def stream_fingerprint() -> str:
    """Hex SHA-256 of this installation's reference stream (see the module docstring).

    The digest covers :data:`STREAM_CHECK_DRAWS` raw uint64 words and, for each
    of :data:`_CHECK_SCALES`, as many discrete-Gaussian draws and a tenth as
    many discrete-Laplace draws, all from streams keyed with
    SHA-256(b"zerosum/v2/stream-check"), as little-endian bytes. Two
    installations that agree on it draw the same masks from the same keys.
    """
    from noise.discrete import discrete_gaussian, discrete_laplace

    digest = hashlib.sha256(b"zerosum/v2/stream-check")
    digest.update(uniform_uint64(_STREAM_CHECK_KEY, STREAM_CHECK_DRAWS).astype("<u8").tobytes())
    for scale in _CHECK_SCALES:
        digest.update(
            discrete_gaussian(_STREAM_CHECK_KEY, scale, STREAM_CHECK_DRAWS).astype("<i8").tobytes()
        )
        digest.update(
            discrete_laplace(_STREAM_CHECK_KEY, scale, STREAM_CHECK_DRAWS // 10)
            .astype("<i8")
            .tobytes()
        )
    return digest.hexdigest()
