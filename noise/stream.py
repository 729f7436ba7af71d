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

Raw words (:func:`uniform_uint64`, :func:`add_uniform_uint64`, and the
discrete samplers of ``noise.discrete`` through :class:`Keystream`) are the
same words made otherwise. Where it is built (:data:`NATIVE_KEYSTREAM`), one
compiled pass with the CPU's AES instructions (noise/_keystream.c) encrypts
each counter block in registers and stores or adds it straight into the
caller's array, with the interpreter lock released; elsewhere OpenSSL does:
the counter blocks of a stretch of the stream are built in a reused numpy
buffer and encrypted in one AES-ECB call (ECB of counter blocks is counter
mode), written straight into the caller's array, about twice as fast as
``AESCounter.random_raw``. Tests compare all three word for word at odd
offsets and across the 2^64 and 2^128 counter wraps.

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
import sys
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from numpy.typing import NDArray

from noise.keys import require_bytes

_Native = Callable[[bytes, int, NDArray[np.uint64], int], None]
_native: _Native | None
try:  # the CPU's AES instructions (noise/_keystream.c); absent where built without a compiler
    from noise._keystream import AES_NI as _AES_NI
    from noise._keystream import keystream as _native
except ImportError:  # pragma: no cover - the development install builds it
    _native, _AES_NI = None, False

__all__ = [
    "NATIVE_KEYSTREAM",
    "STREAM_CHECK_DRAWS",
    "STREAM_KEY_BYTES",
    "Keystream",
    "add_uniform_uint64",
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
# Words per OpenSSL call of uniform_uint64: the counter blocks of one stretch
# (256 KiB, which stay in cache with the words they become) are all it holds
# besides the output, whatever the output's size.
_STRETCH_WORDS = 1 << 15
_MASK64 = (1 << 64) - 1
_LE_U64 = np.dtype("<u8")
# Whether uniform_uint64, add_uniform_uint64 and Keystream take the compiled
# pass: it writes the words in the machine's byte order, which must be little-endian.
NATIVE_KEYSTREAM = _native is not None and _AES_NI and sys.byteorder == "little"
_STORE, _ADD, _SUBTRACT = 0, 1, 2


class Keystream:
    """The words of ``AESCounter(key, counter).random_raw``, made with the compiled pass or OpenSSL.

    randomgen's AESCounter encrypts the 128-bit little-endian counter blocks
    c, c + 1, … under the little-endian key and returns each 16-byte block as
    two little-endian 64-bit words. This builds the counter blocks of any
    stretch of that stream in a reused numpy buffer and encrypts them in one
    call (AES-ECB of counter blocks is counter mode), faster than randomgen's
    generator (about twice for long stretches of raw words, four times in the
    discrete samplers' batches); tests compare the two word for word. One call
    takes at most ``most_words`` words; :meth:`fill` goes through longer
    stretches in calls of that size. Where the compiled pass is built
    (:data:`NATIVE_KEYSTREAM`; ``native`` forces one way or the other) it
    makes the words instead, straight into ``out``: the same words again.
    """

    def __init__(
        self, key16: bytes, counter: int, most_words: int, *, native: bool | None = None
    ) -> None:
        self._most_words = most_words
        # The compiled pass makes the same words without counter blocks in memory.
        self._native = _use_native(native)
        if self._native is not None:
            self._native_key = require_bytes(key16, 16, "AES key") + (
                counter % (1 << 128)
            ).to_bytes(16, "little")
            return
        self._encrypt = Cipher(algorithms.AES(key16), modes.ECB()).encryptor()
        self._low = counter & _MASK64
        self._high = counter >> 64
        blocks = (max(most_words, 3) >> 1) + 1  # fill's last words may take two blocks
        self._counters = np.empty((blocks, 2), dtype=_LE_U64)
        self._steps = np.arange(blocks, dtype=_LE_U64)
        self._high_filled: int | None = None  # the high word every counter block holds, if one

    def words_at(self, first: int, count: int, out: NDArray[np.uint64]) -> NDArray[np.uint64]:
        """Words ``first`` … ``first + count − 1`` of the stream, in ``out`` (a view of it).

        ``count`` is at most ``most_words``, and ``out`` (C-contiguous) must
        hold at least ``count + 4`` words: the stretch is rounded out to whole
        blocks, and OpenSSL asks for room for a block past its input.
        """
        if self._native is not None:
            if out.dtype != _LE_U64 or not 0 <= count <= out.shape[0]:
                raise ValueError(
                    f"count = {count} words go into a little-endian uint64 out of at least as "
                    f"many; got {out.dtype} of {out.shape[0]}"
                )
            self._native(self._native_key, first, out[:count], _STORE)
            return out[:count]
        skip = first & 1
        first_block = first >> 1
        blocks = (skip + count + 1) >> 1
        if not 0 <= blocks <= self._counters.shape[0]:
            # Never hand back words the cipher did not write.
            raise ValueError(
                f"count = {count}: this stream makes at most {2 * self._counters.shape[0] - 1} "
                "words a call"
            )
        counters = self._counters[:blocks]
        start = self._low + first_block
        low = counters[:, 0]
        np.add(self._steps[:blocks], np.uint64(start & _MASK64), out=low)
        high = (self._high + (start >> 64)) & _MASK64
        if (start & _MASK64) + blocks <= _MASK64 + 1:  # no low word passes 2^64 here
            if self._high_filled != high:
                self._counters[:, 1] = high
                self._high_filled = high
        else:  # the low words that wrapped carry into the high word
            np.less(low, np.uint64(start & _MASK64), out=counters[:, 1], casting="unsafe")
            counters[:, 1] += np.uint64(high)
            self._high_filled = None
        self._encrypt.update_into(counters.data.cast("B"), out.data.cast("B"))
        return out[skip : skip + count]

    def fill(self, out: NDArray[np.uint64], first: int = 0) -> NDArray[np.uint64]:
        """Words ``first`` … ``first + len(out) − 1`` of the stream, written into ``out``.

        ``out`` is a C-contiguous little-endian uint64 vector of any length.
        Each call encrypts at most ``most_words`` words straight into ``out``
        and leaves at least two words after them, the room OpenSSL asks for;
        the last two or three words (and a first word at an odd position,
        whose block starts one word early) go through a small buffer.
        """
        count = out.shape[0]
        done = 0
        spare = np.empty(8, dtype=_LE_U64)
        if first & 1 and count:
            out[0] = self.words_at(first, 1, spare)[0]
            done = 1
        step = max(2, self._most_words & ~1)
        while count - done >= 4:  # from here on first + done is even: whole blocks
            words = min(step, (count - done - 2) & ~1)
            self.words_at(first + done, words, out[done:])
            done += words
        if done < count:
            out[done:] = self.words_at(first + done, count - done, spare)
        return out


def aes_counter(key: bytes) -> np.random.BitGenerator:
    """The bare AES-128-CTR bit generator for a 32-byte stream key (see module docstring)."""
    from randomgen import AESCounter  # loaded only where a Generator is wanted

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


def uniform_uint64(
    key: bytes,
    size: int | tuple[int, ...],
    *,
    out: NDArray[np.uint64] | None = None,
    native: bool | None = None,
) -> NDArray[np.uint64]:
    """The raw keystream of ``key`` as uniform uint64 words (each exactly uniform on [0, 2^64)).

    Word i is word i of ``aes_counter(key).random_raw`` (the module
    docstring). With ``out`` (a C-contiguous one-dimensional uint64 array of
    as many words as ``size`` holds, e.g. a tensor's slot in a payload
    vector) the words are written there and ``out`` is returned, shaped as
    ``size``. They are made by the compiled pass where it is built
    (:data:`NATIVE_KEYSTREAM`; ``native`` forces one way or the other), by
    :class:`Keystream` in stretches of 2^15 words otherwise: the same words.
    """
    raw = require_bytes(key, STREAM_KEY_BYTES, "stream key")
    compiled = _use_native(native)
    shape = (size,) if isinstance(size, int | np.integer) else tuple(size)
    count = int(np.prod(shape, dtype=np.int64))
    if count < 0 or any(int(n) < 0 for n in shape):
        raise ValueError(f"size must hold a whole number of words >= 0; got {size!r}")
    if out is None:
        out = np.empty(count, dtype=_LE_U64)
    else:
        _check_words(out, count, f"size {size!r}")
    if count and compiled is not None:
        compiled(raw, 0, out, _STORE)
    elif count:
        stream = Keystream(
            raw[:16], int.from_bytes(raw[16:32], "little"), min(count, _STRETCH_WORDS)
        )
        stream.fill(out)
    return out if out.shape == shape else out.reshape(shape)


def add_uniform_uint64(
    key: bytes,
    target: NDArray[np.uint64],
    *,
    subtract: bool = False,
    native: bool | None = None,
) -> NDArray[np.uint64]:
    """``target`` ± ``uniform_uint64(key, len(target))`` (mod 2^64), in place; returns ``target``.

    One pass over ``target`` and no vector of words, where expanding the
    words first and adding them after writes a fresh vector to memory and
    reads it back (the same words, so the same result, tested). The compiled
    pass (:data:`NATIVE_KEYSTREAM`; ``native`` as for :func:`uniform_uint64`)
    adds each block as the cipher makes it; otherwise the words are made a
    stretch (2^15 words, 256 KiB) at a time into one reused buffer, which
    stays in cache, and added to that stretch of ``target`` at once.
    """
    raw = require_bytes(key, STREAM_KEY_BYTES, "stream key")
    compiled = _use_native(native)
    count = target.shape[0] if isinstance(target, np.ndarray) and target.ndim == 1 else -1
    _check_words(target, count, "the target's length")
    if not count:
        return target
    if compiled is not None:
        compiled(raw, 0, target, _SUBTRACT if subtract else _ADD)
        return target
    most = min(count, _STRETCH_WORDS)
    stream = Keystream(raw[:16], int.from_bytes(raw[16:32], "little"), most)
    buffer = np.empty(most + 4, dtype=_LE_U64)  # the room words_at asks for
    combine = np.subtract if subtract else np.add
    for start in range(0, count, most):
        words = stream.words_at(start, min(most, count - start), buffer)
        part = target[start : start + words.shape[0]]
        combine(part, words, out=part)
    return target


def _use_native(native: bool | None) -> _Native | None:
    """The compiled pass if it is to be used (``native``: None for where it is built)."""
    if native is None:
        native = NATIVE_KEYSTREAM
    if not native:
        return None
    if not NATIVE_KEYSTREAM or _native is None:
        raise RuntimeError(
            "native=True asks for the compiled keystream (noise/_keystream.c), which this "
            "installation does not have (no C compiler at install, a CPU without AES "
            "instructions, or a big-endian machine)."
        )
    return _native


def _check_words(out: object, count: int, what: str) -> None:
    """Refuse ``out`` unless a writable C-contiguous little-endian uint64 vector of ``count``."""
    if (
        not isinstance(out, np.ndarray)
        or out.dtype != _LE_U64
        or out.ndim != 1
        or out.shape[0] != count
        or not out.flags.c_contiguous
        or not out.flags.writeable
    ):
        described = (
            f"a {'' if out.flags.c_contiguous else 'non-contiguous '}"
            f"{'' if out.flags.writeable else 'read-only '}{out.dtype} array of shape {out.shape}"
            if isinstance(out, np.ndarray)
            else f"{type(out).__name__}"
        )
        words = f"{count} words ({what})" if count >= 0 else f"words ({what})"
        raise ValueError(
            "out must be a writable C-contiguous one-dimensional little-endian uint64 array "
            f"of {words}; got {described}"
        )


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
