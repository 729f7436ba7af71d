"""Checking an aggregate without trusting its sender: secret linear tags, summed blind.

The coordinator publishes A = Σ_S w_k (mod 2^64), where w_k is node k's
unmasked contribution. Read as two's-complement integers, the honest
contributions and their sum do not overflow (the fixed-point headroom rule),
so over the integers Σ_S signed(w_k) = signed(A) exactly. Every node checks it
against secret random vectors ρ^(1..L) that the coordinator does not know:

    T_k^(ℓ) = ⟨ρ^(ℓ), signed(w_k)⟩  (an exact integer)

Each node sends its T_k blinded by pairwise pads that cancel over S
(mod 2^128), so the coordinator learns only Σ_k T_k^(ℓ), the tag of the true
aggregate, never a node's own; each node then checks

    Σ_k blinded_k^(ℓ) ≡ ⟨ρ^(ℓ), signed(A)⟩   (mod 2^128)  for ℓ = 1..L.

A forged A' ≠ A differs by a non-zero integer vector δ fixed without knowing
ρ; for ρ uniform on {0, …, 2^b − 1}^d, ⟨ρ, δ⟩ = 0 for at most one value of any
ρ_i with δ_i ≠ 0 given the others, so one check fails to catch it with
probability at most 2^-b (the Schwartz–Zippel argument for a linear form), and
L independent checks with at most 2^-bL. Here b = 16 and L = 4: 2^-64. The four
vectors are the four 16-bit quarters of one keystream of uint64 words.

Exactness with floating point. Each word is split into four 16-bit limbs
with the sign folded into the top one, signed(w) = u_0 + 2^16·u_1 + 2^32·u_2
+ 2^48·s_3 (u_l unsigned, s_3 the top limb read as a signed 16-bit number),
so every limb and every ρ_i lies in (−2^16, 2^16), each product below 2^32;
over a block of 2^14 entries every partial sum of ⟨ρ, limb⟩ stays below 2^46
(anything under 2^53 would do), so one float64 matrix product per block
computes all sixteen exactly (:func:`numpy_tags`); the block sums are added
as Python integers. Where it is built, a compiled pass (noise/_tag_sums.c)
gives the same integers from 32-bit halves in 64-bit integer lanes instead,
without a cast (:func:`tags`).

The secret ρ of a round comes from a challenge key κ = SHA-256 over the
contributions of every survivor of the round (:func:`challenge_key`). Each
node's contribution c_k is derived from its session key
(:func:`challenge_contribution`, so a restart gives the same c_k) under a
label of its own, independent of the self-mask seed it reveals later, and
travels in its upload header sealed for each other participant with AES-GCM
under a key expanded from their pairwise seed (:func:`seal_contribution`,
bound to config, session, round, sender and recipient). The coordinator
relays the sealed contributions but cannot read or alter them, so it never
learns ρ; a node colluding with it could (a stated limit).

The blinded tags travel the same way: each survivor seals its four blinded
tags for every other survivor (:func:`seal_tags`, bound to the survivor-set
hash as well), so the coordinator never sees one, nor their sum ⟨ρ, A⟩, and
cannot solve for ρ however short the layout. Every node opens the tags sealed
for it and checks the sum itself. The sealed messages a sender makes in one
call are also signed by it, once over their digests
(``noise.transcript.sealed_set_message``): the relay cannot alter one, and a
signed message that does not open names its sender.

Soundness over the ring (docs/design.md §4.5). The payloads live in Z/2^64,
whose zero divisors would break a check computed there: for δ_i = 2^63,
ρ_i·δ_i ≡ 0 (mod 2^64) for every even ρ_i, so a check mod 2^64 would miss such
a forgery half the time. The check is therefore made over the integers: every
word is lifted to its two's-complement representative in [−2^63, 2^63), a
forged A' ≠ A (mod 2^64) lifts to δ = signed(A') − signed(A), a non-zero
integer vector with |δ_i| < 2^64, and |⟨ρ, δ⟩| < d·2^80 ≤ 2^127 for d ≤ 2^47,
so ⟨ρ, δ⟩ ≡ 0 (mod 2^128) only if ⟨ρ, δ⟩ = 0 over Z, where 2^-16 per vector
holds (:func:`check_tags` refuses longer vectors).
"""

from __future__ import annotations

import hashlib
import struct
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from numpy.typing import NDArray

from noise.keys import CONFIG_HASH_BYTES, EphemeralKey, length_prefixed, require_bytes
from noise.seeds import SEED_BYTES, stream_key
from noise.stream import uniform_uint64

_TagSums = Callable[[NDArray[np.uint64], NDArray[np.uint64], NDArray[np.uint64]], None]
_tag_sums: _TagSums | None
try:  # the compiled pass (noise/_tag_sums.c); absent where it was installed without a compiler
    from noise._tag_sums import tag_sums as _tag_sums
except ImportError:  # pragma: no cover - the development install builds it
    _tag_sums = None

__all__ = [
    "CHALLENGE_BITS",
    "CHALLENGE_VECTORS",
    "MAX_CHECKED_ENTRIES",
    "NATIVE_TAGS",
    "SEALED_BYTES",
    "SEALED_TAGS_BYTES",
    "TAG_BYTES",
    "TAG_MODULUS",
    "blinded_tags",
    "challenge_contribution",
    "challenge_key",
    "challenge_rows",
    "challenge_vectors",
    "check_tags",
    "numpy_tags",
    "open_contribution",
    "open_tags",
    "seal_contribution",
    "seal_tags",
    "tags",
    "tags_from_bytes",
    "tags_to_bytes",
]

CHALLENGE_BITS = 16
CHALLENGE_VECTORS = 4
TAG_MODULUS = 1 << 128
TAG_BYTES = 16
SEALED_BYTES = SEED_BYTES + 16  # the contribution and AES-GCM's tag
SEALED_TAGS_BYTES = CHALLENGE_VECTORS * TAG_BYTES + 16  # four tags and AES-GCM's tag
# Above 2^47 entries a tag difference could wrap modulo 2^128 (module docstring).
MAX_CHECKED_ENTRIES = 1 << 47
# Entries per block of tags(): small enough that a block's unpacked limbs and
# challenge rows (2 × 512 KiB of float64) stay in cache, which matters when
# many node processes share a machine; the exactness bound allows up to 2^21.
_BLOCK = 1 << 14
_LIMBS = 4
# Blocks of tags() whose products are added in float64 before they become
# Python integers: each entry is below 2^45, so 64 of them stay below 2^51.
_FLUSH = 64
_LABEL = b"zerosum/v1/aggregate-challenge"
# Whether tags() takes the compiled pass: it reads the words in the machine's
# byte order, which must be the payloads' little-endian one.
NATIVE_TAGS = _tag_sums is not None and sys.byteorder == "little"
_CONTRIBUTION_LABEL = b"zerosum/v1/aggregate-challenge-contribution"
_SEAL_LABEL = b"zerosum/v1/aggregate-challenge-seal"
_TAG_SEAL_LABEL = b"zerosum/v1/aggregate-tags-seal"
# Every sealing key is used for one message only, so a constant nonce is safe.
_NONCE = bytes(12)


def _round(round_index: int) -> bytes:
    if isinstance(round_index, bool) or not 0 <= int(round_index) < 2**64:
        raise ValueError(f"round_index must be a whole number in [0, 2^64); got {round_index!r}")
    return struct.pack(">Q", int(round_index))


def challenge_contribution(
    key: EphemeralKey, *, config_hash: bytes, session_id: str, node_id: str, round_index: int
) -> bytes:
    """c_k of one round: 32 bytes from the session key, under a label of their own."""
    require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    info = _CONTRIBUTION_LABEL + config_hash + length_prefixed(node_id, "node id")
    return HKDF(
        algorithm=hashes.SHA256(),
        length=SEED_BYTES,
        salt=session_id.encode("utf-8"),
        info=info + _round(round_index),
    ).derive(key.private_bytes())


def _seal_context(
    pair_seed: bytes,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    sender: str,
    recipient: str,
    label: bytes = _SEAL_LABEL,
    binding: bytes = b"",
) -> tuple[AESGCM, bytes]:
    require_bytes(pair_seed, SEED_BYTES, "pairwise seed")
    require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    context = b"".join(
        (
            label,
            config_hash,
            binding,
            length_prefixed(session_id, "session id"),
            _round(round_index),
            length_prefixed(sender, "sender"),
            length_prefixed(recipient, "recipient"),
        )
    )
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=context).derive(pair_seed)
    return AESGCM(key), context


def seal_contribution(
    contribution: bytes,
    pair_seed: bytes,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    sender: str,
    recipient: str,
) -> bytes:
    """``contribution`` sealed for ``recipient`` (AES-256-GCM; 48 bytes)."""
    require_bytes(contribution, SEED_BYTES, "challenge contribution")
    cipher, context = _seal_context(
        pair_seed,
        config_hash=config_hash,
        session_id=session_id,
        round_index=round_index,
        sender=sender,
        recipient=recipient,
    )
    return cipher.encrypt(_NONCE, contribution, context)


def open_contribution(
    sealed: bytes,
    pair_seed: bytes,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    sender: str,
    recipient: str,
) -> bytes:
    """The contribution ``sender`` sealed for ``recipient``; ValueError if it was altered."""
    if len(sealed) != SEALED_BYTES:
        raise ValueError(f"a sealed contribution has {SEALED_BYTES} bytes; got {len(sealed)}")
    cipher, context = _seal_context(
        pair_seed,
        config_hash=config_hash,
        session_id=session_id,
        round_index=round_index,
        sender=sender,
        recipient=recipient,
    )
    try:
        return cipher.decrypt(_NONCE, sealed, context)
    except InvalidTag:
        raise ValueError(
            f"the contribution of {sender!r} for {recipient!r} in round {round_index} does not "
            "open under their pairwise key: it was altered or made for another round"
        ) from None


def seal_tags(
    blinded: Sequence[int],
    pair_seed: bytes,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    survivor_hash: bytes,
    sender: str,
    recipient: str,
) -> bytes:
    """``blinded`` (the L tags mod 2^128) sealed for ``recipient`` (AES-256-GCM; 80 bytes).

    Bound to the survivor set as well as to config, session, round, sender
    and recipient: tags made for one survivor set never open under another.
    """
    cipher, context = _seal_context(
        pair_seed,
        config_hash=config_hash,
        session_id=session_id,
        round_index=round_index,
        sender=sender,
        recipient=recipient,
        label=_TAG_SEAL_LABEL,
        binding=require_bytes(survivor_hash, 32, "survivor hash"),
    )
    return cipher.encrypt(_NONCE, b"".join(tags_to_bytes(blinded)), context)


def open_tags(
    sealed: bytes,
    pair_seed: bytes,
    *,
    config_hash: bytes,
    session_id: str,
    round_index: int,
    survivor_hash: bytes,
    sender: str,
    recipient: str,
) -> tuple[int, ...]:
    """The blinded tags ``sender`` sealed for ``recipient``; ValueError if they do not open."""
    if len(sealed) != SEALED_TAGS_BYTES:
        raise ValueError(
            f"the tags of {sender!r} for {recipient!r} are sealed in {len(sealed)} bytes; "
            f"sealed tags have {SEALED_TAGS_BYTES}"
        )
    cipher, context = _seal_context(
        pair_seed,
        config_hash=config_hash,
        session_id=session_id,
        round_index=round_index,
        sender=sender,
        recipient=recipient,
        label=_TAG_SEAL_LABEL,
        binding=require_bytes(survivor_hash, 32, "survivor hash"),
    )
    try:
        plain = cipher.decrypt(_NONCE, sealed, context)
    except InvalidTag:
        raise ValueError(
            f"the tags of {sender!r} for {recipient!r} in round {round_index} do not open under "
            "their pairwise key for this survivor set"
        ) from None
    return tags_from_bytes([plain[i : i + TAG_BYTES] for i in range(0, len(plain), TAG_BYTES)])


def tags_to_bytes(values: Sequence[int]) -> list[bytes]:
    """Tags mod 2^128 as 16-byte big-endian strings (as they travel)."""
    return [(int(v) % TAG_MODULUS).to_bytes(TAG_BYTES, "big") for v in values]


def tags_from_bytes(values: Sequence[bytes]) -> tuple[int, ...]:
    """The inverse of :func:`tags_to_bytes`; ValueError unless L tags of 16 bytes."""
    if len(values) != CHALLENGE_VECTORS or any(len(v) != TAG_BYTES for v in values):
        raise ValueError(
            f"an aggregate check has {CHALLENGE_VECTORS} tags of {TAG_BYTES} bytes; got "
            f"{[len(v) for v in values]}"
        )
    return tuple(int.from_bytes(v, "big") for v in values)


def challenge_key(contributions: Mapping[str, bytes], *, round_index: int) -> bytes:
    """κ of a round: SHA-256 over every participant's 32-byte contribution, in node order."""
    digest = hashlib.sha256(_LABEL + struct.pack(">Q", round_index))
    for node_id in sorted(contributions):
        digest.update(length_prefixed(node_id, "node id"))
        digest.update(require_bytes(contributions[node_id], SEED_BYTES, "challenge contribution"))
    return digest.digest()


def challenge_vectors(key: bytes, size: int, *, round_index: int) -> NDArray[np.uint64]:
    """ρ^(1..L), packed: ``size`` uint64 words whose four 16-bit quarters are the L = 4 vectors.

    Word i holds ρ^(1)_i in its low 16 bits, ρ^(4)_i in its high 16 bits
    (:func:`challenge_rows` unpacks them). Kept packed, ρ takes 8 bytes per
    entry instead of 32, and :func:`tags` unpacks it a cache-sized block at a
    time. The words are ``noise.stream.uniform_uint64``'s (OpenSSL's AES).
    """
    words: NDArray[np.uint64] = uniform_uint64(
        stream_key(key, round_index=round_index, tensor="rho", purpose="challenge"), size
    )
    return words


def challenge_rows(rho: NDArray[np.uint64]) -> NDArray[np.float64]:
    """The L × size array of the packed ``rho``: integers uniform on [0, 2^16)."""
    quarters = np.ascontiguousarray(rho, dtype="<u8").view("<u2").reshape(-1, CHALLENGE_VECTORS)
    rows: NDArray[np.float64] = np.ascontiguousarray(quarters.T, dtype=np.float64)
    return rows


def tags(words: NDArray[np.uint64], rho: NDArray[np.uint64]) -> tuple[int, ...]:
    """⟨ρ^(ℓ), signed(words)⟩ for every ℓ, as exact Python integers (``rho`` packed).

    One compiled pass over the words and ρ (noise/_tag_sums.c) where it was
    built (:data:`NATIVE_TAGS`), :func:`numpy_tags` otherwise; the two give
    the same integers. The compiled pass splits each word into its unsigned
    32-bit halves lo, hi and its sign bit s, signed(w) = lo + 2^32·hi − 2^64·s,
    and adds the products of every 16-bit quarter of ρ with lo, hi and s in
    unsigned 64-bit lanes over blocks of 2^16 entries (each product below
    2^48, so a block's sum stays below 2^64), then each block's three sums
    into a signed 128-bit total (|tag| < d·2^80, below 2^127 for the lengths
    :func:`check_tags` accepts). It reads 16 bytes an entry once, where the
    numpy path casts every limb and quarter to float64 first: four to five
    times faster here, and it leaves the interpreter lock while it runs.
    """
    if words.ndim != 1 or rho.ndim != 1 or rho.shape != words.shape:
        raise ValueError(
            f"tags need a vector and a packed challenge of its length; got {words.shape} and "
            f"{rho.shape}"
        )
    if not NATIVE_TAGS or words.shape[0] >= MAX_CHECKED_ENTRIES:
        return numpy_tags(words, rho)
    assert _tag_sums is not None
    halves = np.zeros(2 * CHALLENGE_VECTORS, dtype=np.uint64)
    _tag_sums(
        np.ascontiguousarray(words, dtype="<u8"), np.ascontiguousarray(rho, dtype="<u8"), halves
    )
    totals = []
    for row in range(CHALLENGE_VECTORS):
        bits = int(halves[2 * row]) | (int(halves[2 * row + 1]) << 64)
        totals.append(bits - TAG_MODULUS if bits >> 127 else bits)  # two's complement
    return tuple(totals)


def numpy_tags(words: NDArray[np.uint64], rho: NDArray[np.uint64]) -> tuple[int, ...]:
    """:func:`tags` by float64 matrix products: the path where the compiled pass is absent.

    Block by block (2^14 entries), the words' 16-bit limbs and ρ's 16-bit
    quarters are cast once into two reused float64 buffers of shape
    (entries, 4), the top limb read as signed, and one matrix product gives
    the sixteen sums Σ_i ρ^(ℓ)_i·limb_l,i of the block. The product is taken
    over pairs of entries, (entries/2, 8)ᵀ·(entries/2, 8): its two diagonal
    4 × 4 blocks are the sums over the even and the odd entries (the rest is
    not used), a shape BLAS multiplies faster than (entries, 4)ᵀ·(entries, 4).

    Exactness: signed(w) = u_0 + 2^16·u_1 + 2^32·u_2 + 2^48·s_3 for the
    little-endian 16-bit limbs u_l of w and s_3 = u_3 − 2^16·[u_3 ≥ 2^15]
    (the top limb read as int16), because signed(w) = w − 2^64·[w ≥ 2^63]
    and w ≥ 2^63 exactly when u_3 ≥ 2^15. Every ρ_i lies in [0, 2^16 − 1] and
    every limb in [−2^15, 2^16 − 1], so each product has
    |ρ_i·limb| ≤ (2^16 − 1)^2 < 2^32, and the absolute values of the products
    any one entry of the matrix product adds (at most 2^13 of them) sum to
    less than 2^45. Whatever order and grouping BLAS adds them in (fused
    multiply-adds included), each partial sum is a sum of some of those
    products: an integer of magnitude below 2^45 < 2^53, so every float64
    product and sum is exact. The products of up to 64 blocks are added in
    float64 (below 64·2^45 = 2^51 in magnitude, exact in any order), then the
    two diagonal blocks (below 2^52) and the result goes to Python integers,
    ⟨ρ^(ℓ), signed(w)⟩ = Σ_l 2^16l·(sum ℓ, l).
    """
    if words.ndim != 1 or rho.ndim != 1 or rho.shape != words.shape:
        raise ValueError(
            f"tags need a vector and a packed challenge of its length; got {words.shape} and "
            f"{rho.shape}"
        )
    totals = [0] * CHALLENGE_VECTORS
    data = np.ascontiguousarray(words, dtype="<u8")
    packed = np.ascontiguousarray(rho, dtype="<u8")
    size = data.shape[0]
    limb_view = data.view("<u2").reshape(size, _LIMBS)
    top_view = data.view("<i2")[_LIMBS - 1 :: _LIMBS]
    rho_view = packed.view("<u2").reshape(size, CHALLENGE_VECTORS)
    room = min(size, _BLOCK) + (size & 1)  # an even number of rows
    limbs = np.empty((room, _LIMBS), dtype=np.float64)
    rows = np.empty((room, CHALLENGE_VECTORS), dtype=np.float64)
    blocks = -(-size // _BLOCK)
    pairs = np.empty((min(blocks, _FLUSH), 2 * CHALLENGE_VECTORS, 2 * _LIMBS), dtype=np.float64)
    for index, start in enumerate(range(0, size, _BLOCK)):
        entries = min(_BLOCK, size - start)
        if entries + (entries & 1) != limbs.shape[0]:  # the last, shorter block
            limbs, rows = limbs[: entries + (entries & 1)], rows[: entries + (entries & 1)]
        if entries & 1:  # only the last block can be odd: a zero row pads it and adds nothing
            limbs[entries] = 0.0
            rows[entries] = 0.0
        stop = start + entries
        np.copyto(limbs[:entries], limb_view[start:stop])
        np.copyto(limbs[:entries, _LIMBS - 1], top_view[start:stop])
        np.copyto(rows[:entries], rho_view[start:stop])
        slot = index % _FLUSH
        np.matmul(
            rows.reshape(-1, 2 * CHALLENGE_VECTORS).T,
            limbs.reshape(-1, 2 * _LIMBS),
            out=pairs[slot],
        )  # exact (docstring)
        if slot == _FLUSH - 1 or index == blocks - 1:
            added = pairs[: slot + 1].sum(axis=0)  # exact: below 2^51 (docstring)
            sums = (
                added[:CHALLENGE_VECTORS, :_LIMBS] + added[CHALLENGE_VECTORS:, _LIMBS:]
            ).tolist()
            for row, (low, second, third, top) in enumerate(sums):
                totals[row] += (
                    int(low) + (int(second) << 16) + (int(third) << 32) + (int(top) << 48)
                )
    return tuple(totals)


def blinded_tags(
    own: Sequence[int],
    node_id: str,
    participants: Iterable[str],
    seeds: Mapping[str, bytes],
    *,
    round_index: int,
) -> tuple[int, ...]:
    """``own`` tags plus pairwise pads that cancel over ``participants`` (mod 2^128).

    Node i adds pad_ij if i < j and subtracts it otherwise, pad_ij uniform on
    [0, 2^128) from the pair's seed, so the pads of all participants sum to 0.
    """
    out = [t % TAG_MODULUS for t in own]
    for peer in sorted(set(participants) - {node_id}):
        key = stream_key(seeds[peer], round_index=round_index, tensor="tags", purpose="tag-pad")
        words = uniform_uint64(key, 2 * len(out))
        for row in range(len(out)):
            pad = (int(words[2 * row]) << 64) | int(words[2 * row + 1])
            out[row] = (out[row] + (pad if node_id < peer else -pad)) % TAG_MODULUS
    return tuple(out)


def check_tags(
    blinded: Mapping[str, Sequence[int]], aggregate: NDArray[np.uint64], rho: NDArray[np.uint64]
) -> list[int]:
    """The checks ℓ where Σ of everyone's blinded tags differs from the aggregate's tag."""
    if aggregate.shape[0] > MAX_CHECKED_ENTRIES:
        raise ValueError(
            f"an aggregate of {aggregate.shape[0]} entries is above the {MAX_CHECKED_ENTRIES} "
            "the check is sound for"
        )
    expected = tags(aggregate, rho)
    failed = []
    for row, want in enumerate(expected):
        total = sum(int(values[row]) for values in blinded.values()) % TAG_MODULUS
        if total != want % TAG_MODULUS:
            failed.append(row)
    return failed
