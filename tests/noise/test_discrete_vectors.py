"""Known-answer vectors for noise.discrete: they pin the stream format of the integer samplers.

Both ends of a pair must draw the same integers from the same key, on every
installation and every software version a federation runs. These vectors fix
exactly what ``discrete_gaussian`` and ``discrete_laplace`` return for three
fixed keys (SHA-256 of fixed labels) and several scales: the first 8 values and
the SHA-256 of the int64 little-endian bytes of 100,000 draws. They were
computed from the module when it was written and are hard-coded on purpose:
any change to the sampler (keystream layout, block and batch sizes, the order
in which words are used, the proposal, the acceptance test, the exact path's
side bits) changes them, and must change them deliberately — together with
the federation's pinned ``stream_check`` (noise.stream.stream_fingerprint).
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from noise.discrete import discrete_gaussian, discrete_laplace

DRAWS = 100_000
KEYS = {
    name: hashlib.sha256(f"zerosum/tests/discrete-vectors/{name}".encode()).digest()
    for name in ("alpha", "beta", "gamma")
}

# (key, law, scale, first 8 values, SHA-256 of the 100,000 draws as '<i8' bytes)
VECTORS = [
    (
        "alpha",
        "gaussian",
        0.5,
        [0, 0, -1, 0, 0, 0, 0, 0],
        "750761cbadc3d03270db89654e30deed3b61cc788b89cbf941cb4a0988109da1",
    ),
    (
        "alpha",
        "gaussian",
        3.0,
        [-3, 0, -5, 1, -2, -3, -1, -3],
        "be0f1da7860f4543d5ea39c76acce70e1e37281833bc9a36664d3b5e8bc1bbd1",
    ),
    (
        "alpha",
        "gaussian",
        10000000000.0,
        [
            -15377423644,
            4350854090,
            -320642871,
            3848553809,
            -7759508742,
            -11507538824,
            -4684673993,
            -10827192783,
        ],
        "e645863714e939eafd3efa7dc78988cf3eba9fc03b49dff0aad049b9850950e0",
    ),
    (
        "alpha",
        "gaussian",
        100000000000000.0,
        [
            -125373393198364,
            36964155048906,
            -234669280632631,
            35683752494417,
            -73442036593926,
            -110570139753352,
            -43921530581961,
            -105093644540367,
        ],
        "dcad01b6626e36ffa3703382d491c3bd3722bd89827b851924f8783a017f131a",
    ),
    (
        "alpha",
        "laplace",
        3.0,
        [3, 0, -3, 4, 5, -4, 1, 8],
        "4b3cb0c72bf250780e3c76704c3b9bff8a4702d20b68c39268c29d40455f5ce5",
    ),
    (
        "alpha",
        "laplace",
        1000000.0,
        [1148719, 180774, -1133889, -56756, 1420323, 1914474, -57579, -1471776],
        "25d100a4a0777e2cad0616ef8d6d67548ac04ebe4fe2136ac356d20141b54826",
    ),
    (
        "beta",
        "gaussian",
        0.5,
        [-1, 0, 1, 0, 1, 0, 0, 0],
        "17d0dc921643d10ce806406ef12af29386538aef4ab587f45e310d39949e014c",
    ),
    (
        "beta",
        "gaussian",
        3.0,
        [-5, -1, 6, 3, 6, 2, 3, -2],
        "2abe1fe564c7fa12908d4fed9544780d1d397b06d08d463c00a5b2f7ebb278a8",
    ),
    (
        "beta",
        "gaussian",
        10000000000.0,
        [
            -14845722344,
            -5213910739,
            16691965549,
            17852193283,
            7388122912,
            10194771170,
            -9402791324,
            -18829534541,
        ],
        "a62a583915377e3baa703de2e5db8d82fa5eb7ddb166af105e31bf24006e3f21",
    ),
    (
        "beta",
        "gaussian",
        100000000000000.0,
        [
            -141884594831080,
            -49112796231379,
            161652685876845,
            94559032140844,
            170133990595075,
            68757466500896,
            95038493678818,
            -77068095403420,
        ],
        "603dcc16582ac7508e6abbc8ccc187e85ed10e0c26b01f1cea4909d443a635e2",
    ),
    (
        "beta",
        "laplace",
        3.0,
        [6, -1, 7, -4, 2, 3, 12, 2],
        "708d8981d52dc7738c8d1e082e43055633dc797b41418eaf788f446bf0950938",
    ),
    (
        "beta",
        "laplace",
        1000000.0,
        [2112513, -648043, -114231, -1638084, 781107, 1176341, 4342882, -215252],
        "d78df7917a90fd47819e8ade79534abc21925a827cc221675d5bb99b96ea2314",
    ),
    (
        "gamma",
        "gaussian",
        0.5,
        [0, 0, 0, 0, 0, 0, 0, 0],
        "f18d8fe516bc7b4724a1d8621072f34b11d8a8c2b10e63fc5862cb7608630247",
    ),
    (
        "gamma",
        "gaussian",
        3.0,
        [8, -1, 0, 2, 1, -2, 1, 1],
        "c4d25ed2e313edfebb79203cfa9b458f4c16e812a3c9a37cb5dc5981b6236e7b",
    ),
    (
        "gamma",
        "gaussian",
        10000000000.0,
        [
            843247553,
            -4244833980,
            -1806793319,
            11486151908,
            3364515547,
            -6177595181,
            3839173672,
            4130550759,
        ],
        "0fc33f84c01fdc306f032227dd41b466f19763455c0e82dba5f65df25faa8bda",
    ),
    (
        "gamma",
        "gaussian",
        100000000000000.0,
        [
            294350252863425,
            -37341737715388,
            -15075531389543,
            96685831275748,
            27960111951579,
            -58541481565997,
            35961305375784,
            37983721042919,
        ],
        "dbe99463c11a278eaafc2d7f928c5b3915313819fbf5dee17b8d8ac28f1c8d42",
    ),
    (
        "gamma",
        "laplace",
        3.0,
        [-10, 0, -2, 2, -3, -1, 3, -1],
        "dac6cf27a0362ac24acfdcd7affd29fc4de0bc106f6d20978ea8bab489abb3ce",
    ),
    (
        "gamma",
        "laplace",
        1000000.0,
        [-3526831, 122518, -873526, 738668, -1022669, -517912, 1301968, -548632],
        "5313749a2a904459e82c8fa04ff04cdf1bdf3ba7b178b1b7c5afab1deeebead1",
    ),
]


@pytest.mark.parametrize(("key", "law", "scale", "first", "digest"), VECTORS)
def test_known_answer(key: str, law: str, scale: float, first: list[int], digest: str) -> None:
    sampler = discrete_gaussian if law == "gaussian" else discrete_laplace
    draws = sampler(KEYS[key], scale, DRAWS)
    assert draws.dtype == np.int64
    assert draws.shape == (DRAWS,)
    assert draws[:8].tolist() == first
    assert hashlib.sha256(draws.astype("<i8").tobytes()).hexdigest() == digest


def test_vectors_cover_every_key_and_scale() -> None:
    seen = {(key, law, scale) for key, law, scale, _, _ in VECTORS}
    scales = {"gaussian": (0.5, 3.0, 1e10, 1e14), "laplace": (3.0, 1e6)}
    expected = {(k, law, s) for k in KEYS for law, ss in scales.items() for s in ss}
    assert seen == expected
