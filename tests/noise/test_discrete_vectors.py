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
        [1, 0, 1, -1, 0, 0, 1, 0],
        "d6a7bef9ed0272bc13ba1614b7cc411a9260c53e791f7db7e4e5f3a8e80c9c49",
    ),
    (
        "alpha",
        "gaussian",
        3.0,
        [3, 0, -3, 4, 5, -4, 0, -2],
        "bcd2d6749aa757519ce17144d9e293cd19d99bb330273a0ae62357b1ab677dad",
    ),
    (
        "alpha",
        "gaussian",
        1e10,
        [
            11035997152,
            1619624121,
            -11061449974,
            -661464679,
            13875333100,
            18750276969,
            -406512799,
            -14449905049,
        ],
        "69fedc43d4bf4ac8e7233bb4f42aa24345ab88c188f939f310a36d2f2e14ab7f",
    ),
    (
        "alpha",
        "gaussian",
        1e14,
        [
            110198097972617,
            17666007317702,
            -110406607494246,
            -5418718652554,
            140055007827741,
            186587617763387,
            -5529176106126,
            -144761901230602,
        ],
        "5cc9210e15dcd1dab2b051b1b45e448caa01194c6f928ad60a17164708d9e30a",
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
        1e6,
        [1148719, 180774, -1133889, -56756, 1420323, 1914474, -57579, -1471776],
        "25d100a4a0777e2cad0616ef8d6d67548ac04ebe4fe2136ac356d20141b54826",
    ),
    (
        "beta",
        "gaussian",
        0.5,
        [-1, 0, 1, 0, 0, -1, 0, 0],
        "9f3ddf20652e12021b9dd8ff35689b81abd613d4fe89975292299b73d9df9dfa",
    ),
    (
        "beta",
        "gaussian",
        3.0,
        [-1, -4, 2, 3, 2, 1, -1, -5],
        "c51fb14043390fcf22119cd08963666ca1f2a19fa3e2cbf55396811d7ab385b6",
    ),
    (
        "beta",
        "gaussian",
        1e10,
        [
            -6322580266,
            -1066267376,
            -16100960043,
            7697396008,
            11488542758,
            8071501842,
            6242236524,
            -621507268,
        ],
        "deb55b085dc237f8993f99a991cdcaac2832835f9ebf23410c48938a86dda53d",
    ),
    (
        "beta",
        "gaussian",
        1e14,
        [
            -62789693822445,
            -10933885602661,
            -160486367000784,
            76251207635376,
            113905351581631,
            81514905881424,
            62131517886337,
            -7290410796761,
        ],
        "a1948a0cbb457b07192c79f415074f47ce86121db344391093210182bdbdc291",
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
        1e6,
        [2112513, -648043, -114231, -1638084, 781107, 1176341, 4342882, -215252],
        "d78df7917a90fd47819e8ade79534abc21925a827cc221675d5bb99b96ea2314",
    ),
    (
        "gamma",
        "gaussian",
        0.5,
        [0, 0, 1, 0, 0, 0, 0, 0],
        "6a4a219e87616a9a0a30f598e5967ce9fbe1023e177c1503b5af3ddeb0ae627f",
    ),
    (
        "gamma",
        "gaussian",
        3.0,
        [0, -2, 2, -3, -1, 3, -1, 0],
        "2c8ad098e7dbd8416c8f79cff943485cada1b06c919f80217b7d91847ef56d5e",
    ),
    (
        "gamma",
        "gaussian",
        1e10,
        [
            1202033087,
            -8674711451,
            7270511198,
            -10044530934,
            -4995822323,
            12741525419,
            -5230693256,
            1826742376,
        ],
        "d0b9667cf3361a4b685d5b60faabedbdfb1452c0cb76851e109d45ab4e2a197f",
    ),
    (
        "gamma",
        "gaussian",
        1e14,
        [
            12046078307482,
            -84257375742999,
            72754167275225,
            -99876983462897,
            -49721869499520,
            126368808790473,
            -53844955436940,
            17163696807631,
        ],
        "03ae49f7f8fce020359eb0f7d0c75b12321f3f90bb4b447f658c5a3840a2a0e7",
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
        1e6,
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
