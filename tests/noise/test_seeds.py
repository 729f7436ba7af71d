"""Pairwise seeds and stream keys: agreement, separation and input checks."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from noise.errors import KeyFormatError
from noise.keys import EphemeralKey
from noise.seeds import PROTOCOL_LABEL, pairwise_seed, stream_key
from noise.stream import standard_normal
from tests.support.strategies import key_bytes, node_ids

CONFIG = hashlib.sha256(b"federation A").digest()


def _key(label: str) -> EphemeralKey:
    return EphemeralKey.from_private_bytes(hashlib.sha256(label.encode()).digest())


A, B, C = _key("a"), _key("b"), _key("c")


def _seed(
    own: EphemeralKey = A,
    peer: EphemeralKey = B,
    *,
    own_id: str = "a",
    peer_id: str = "b",
    session_id: str = "s1",
    config_hash: bytes = CONFIG,
) -> bytes:
    return pairwise_seed(
        own,
        peer.public_bytes(),
        own_id=own_id,
        peer_id=peer_id,
        session_id=session_id,
        config_hash=config_hash,
    )


@settings(max_examples=40)
@given(
    keys=st.tuples(key_bytes(), key_bytes()),
    ids=st.tuples(node_ids(), node_ids()),
    session=st.text(min_size=1, max_size=40),
    config=key_bytes(),
)
def test_both_ends_derive_the_same_seed(
    keys: tuple[bytes, bytes], ids: tuple[str, str], session: str, config: bytes
) -> None:
    id_i, id_j = ids
    assume(id_i != id_j)
    node_i = EphemeralKey.from_private_bytes(keys[0])
    node_j = EphemeralKey.from_private_bytes(keys[1])
    s_ij = _seed(node_i, node_j, own_id=id_i, peer_id=id_j, session_id=session, config_hash=config)
    s_ji = _seed(node_j, node_i, own_id=id_j, peer_id=id_i, session_id=session, config_hash=config)
    assert s_ij == s_ji
    assert len(s_ij) == 32
    for round_index, tensor in [(0, "w"), (7, "sxx")]:
        assert stream_key(s_ij, round_index=round_index, tensor=tensor) == stream_key(
            s_ji, round_index=round_index, tensor=tensor
        )


def test_seed_is_deterministic() -> None:
    assert _seed() == _seed()
    assert PROTOCOL_LABEL == b"zerosum/v1"


def test_every_context_gives_a_distinct_seed() -> None:
    seeds = {
        "base": _seed(),
        "other pair": _seed(A, C, own_id="a", peer_id="c"),
        "other peer key, same ids": _seed(A, C, own_id="a", peer_id="b"),
        "other ids, same keys": _seed(A, B, own_id="a", peer_id="z"),
        "other session": _seed(session_id="s2"),
        "other federation": _seed(config_hash=hashlib.sha256(b"federation B").digest()),
    }
    assert len(set(seeds.values())) == len(seeds)


def test_every_stream_context_gives_a_distinct_key() -> None:
    seed = _seed()
    keys = {
        stream_key(seed, round_index=r, tensor=t, purpose=p)
        for r, t, p in itertools.product(
            [0, 1, 2**32, 2**64 - 1], ["w", "sxx", "sxy"], ["mask", "cape-blind"]
        )
    }
    assert len(keys) == 4 * 3 * 2
    assert stream_key(_seed(session_id="s2"), round_index=0, tensor="w") not in keys


def test_length_prefixes_keep_purpose_and_tensor_apart() -> None:
    seed = _seed()
    assert stream_key(seed, round_index=0, tensor="ab", purpose="x") != stream_key(
        seed, round_index=0, tensor="b", purpose="xa"
    )


def test_streams_of_different_contexts_are_uncorrelated() -> None:
    seed = _seed()
    keys = [
        stream_key(seed, round_index=0, tensor="w"),
        stream_key(seed, round_index=1, tensor="w"),
        stream_key(seed, round_index=0, tensor="sxx"),
        stream_key(seed, round_index=0, tensor="w", purpose="cape-blind"),
        stream_key(_seed(A, C, own_id="a", peer_id="c"), round_index=0, tensor="w"),
        stream_key(_seed(session_id="s2"), round_index=0, tensor="w"),
        stream_key(_seed(config_hash=bytes(32)), round_index=0, tensor="w"),
    ]
    n = 50_000
    draws = np.stack([standard_normal(k, n) for k in keys])
    corr = np.asarray(np.corrcoef(draws))
    off_diagonal = corr[~np.eye(len(keys), dtype=bool)]
    # Independent streams: each r ~ N(0, 1/n), sd 0.0045; 0.03 is over 6 sd.
    assert np.max(np.abs(off_diagonal)) < 0.03


def test_stream_key_accepts_numpy_integers() -> None:
    seed = _seed()
    assert stream_key(seed, round_index=np.uint64(3), tensor="w") == stream_key(  # type: ignore[arg-type]
        seed, round_index=3, tensor="w"
    )


# --- bad input ------------------------------------------------------------------------


def test_seed_with_oneself_is_refused() -> None:
    with pytest.raises(KeyFormatError, match="peer node id must be different from this node's"):
        _seed(A, B, own_id="a", peer_id="a")


def test_wrong_length_peer_key_names_the_peer() -> None:
    with pytest.raises(KeyFormatError) as info:
        pairwise_seed(
            A, B.public_bytes()[:31], own_id="a", peer_id="b", session_id="s", config_hash=CONFIG
        )
    assert str(info.value) == "X25519 public key of node 'b' must be 32 bytes; got 31 bytes."


def test_low_order_peer_key_names_the_peer() -> None:
    with pytest.raises(KeyFormatError, match=r"^X25519 public key of node 'b' must be a point"):
        pairwise_seed(A, bytes(32), own_id="a", peer_id="b", session_id="s", config_hash=CONFIG)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"config_hash": bytes(31)}, "config hash must be 32 bytes; got 31 bytes."),
        ({"session_id": ""}, "session id must be a non-empty string"),
        ({"own_id": ""}, "own node id must be a non-empty string"),
        ({"peer_id": 3}, "peer node id must be a string; got a int."),
    ],
)
def test_bad_seed_inputs_are_named(kwargs: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "own_id": "a",
        "peer_id": "b",
        "session_id": "s",
        "config_hash": CONFIG,
    }
    arguments.update(kwargs)
    with pytest.raises(KeyFormatError) as info:
        pairwise_seed(A, B.public_bytes(), **arguments)  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize("round_index", [-1, 2**64, True, 1.0, "3", None])
def test_bad_round_index_is_refused(round_index: object) -> None:
    with pytest.raises(KeyFormatError, match=r"^round index must be an integer in \[0, 2\*\*64\)"):
        stream_key(_seed(), round_index=round_index, tensor="w")  # type: ignore[arg-type]


def test_bad_stream_key_inputs_are_named() -> None:
    with pytest.raises(KeyFormatError, match=r"pairwise seed must be 32 bytes; got 16 bytes\."):
        stream_key(bytes(16), round_index=0, tensor="w")
    with pytest.raises(KeyFormatError, match="tensor name must be a non-empty string"):
        stream_key(_seed(), round_index=0, tensor="")
    with pytest.raises(KeyFormatError, match="stream purpose must be a non-empty string"):
        stream_key(_seed(), round_index=0, tensor="w", purpose="")
