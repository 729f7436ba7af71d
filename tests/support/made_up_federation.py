"""A made-up federation for unit tests: fixed keys, a pinned small config, seeds and tensors."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import replace

import numpy as np

from node.egress.pinned_noise import pin_noise
from node.egress.release import ReleaseNoise, plan_release
from node.plans.deltab.plan import deltab_plan_spec
from node.plans.deltab.settings import DeltabSettings
from node.plans.interface import TensorSensitivity
from noise.accounting import gaussian_mu
from noise.fixed_point import FixedPointCodec
from noise.keys import EphemeralKey, IdentityKey
from noise.layout import Layout
from noise.seeds import pairwise_seed
from proto.federation import (
    FederationConfig,
    NodeEntry,
    NoiseDesignSpec,
    PrivacyPolicy,
)
from proto.federation.schema import RoundSpec

SESSION = "0123456789abcdef0123456789abcdef"
CODEC = FixedPointCodec(32)
SENSITIVITIES = (
    TensorSensitivity("n", 1.0, "one subject changes N by 1"),
    TensorSensitivity("sum_x", 2.0, "‖x'‖ ≤ √4 after pre-scaling to [-1, 1]"),
    TensorSensitivity("sum_xx", 4.0, "‖x' x'ᵀ‖_F ≤ ‖x'‖² = 4"),
)


def _identities(ids: list[str]) -> dict[str, IdentityKey]:
    return {n: IdentityKey.from_private_bytes(bytes([i + 1]) * 32) for i, n in enumerate(ids)}


def _checkers(ids: list[str]) -> dict[str, IdentityKey]:
    """Each node's output checker key (apart from every identity key)."""
    return {n: IdentityKey.from_private_bytes(bytes([60 + i]) * 32) for i, n in enumerate(ids)}


def _config(
    ids: list[str],
    *,
    threshold: int = 1,
    residual_dp: bool = False,
    construction: str = "pairwise",
    min_nodes: int = 2,
) -> FederationConfig:
    keys = _identities(ids)
    checkers = _checkers(ids)
    config = FederationConfig(
        federation_id="test-fed",
        coordinator_address="127.0.0.1:50051",
        ca_certificate="ca/ca.pem",
        nodes=tuple(
            NodeEntry(n, keys[n].public_bytes(), (checkers[n].public_bytes(),)) for n in ids
        ),
        plan=deltab_plan_spec(
            DeltabSettings.from_tables(
                {
                    "model": {"n_features": 4, "n_components": 2},
                    "clipping": {
                        "age_low": 45.0,
                        "age_high": 80.0,
                        "feature_names": ["x1", "x2", "x3", "x4"],
                        "feature_low": -4.0,
                        "feature_high": 4.0,
                    },
                }
            )
        ),
        privacy=PrivacyPolicy(
            epsilon=1.0,
            delta=1e-6,
            residual_dp=residual_dp,
            collusion_threshold=threshold,
            noise_design=NoiseDesignSpec(construction=construction),  # type: ignore[arg-type]
        ),
        min_nodes=min_nodes,
    )
    return pin_noise(config)


def _seeds(ids: list[str]) -> dict[str, dict[str, bytes]]:
    ephemeral = {
        n: EphemeralKey.from_private_bytes(bytes([40 + i]) * 32) for i, n in enumerate(ids)
    }
    digest = bytes(32)
    return {
        me: {
            peer: pairwise_seed(
                ephemeral[me],
                ephemeral[peer].public_bytes(),
                own_id=me,
                peer_id=peer,
                session_id=SESSION,
                config_hash=digest,
            )
            for peer in ids
            if peer != me
        }
        for me in ids
    }


def _tensors(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(150, 4))
    return {"n": np.array(150.0), "sum_x": x.sum(axis=0), "sum_xx": x.T @ x}


def with_rounds(
    config: FederationConfig,
    names: Sequence[str],
    sensitivities: Sequence[TensorSensitivity] = SENSITIVITIES,
) -> FederationConfig:
    """``config`` whose plan has rounds ``names`` of made-up tensors, pinned as init would."""
    shapes = {"n": (), "sum_x": (4,), "sum_xx": (4, 4)}
    layout = Layout.of({t.name: shapes[t.name] for t in sensitivities})
    m = len(sensitivities)
    mu_star = gaussian_mu(config.privacy.epsilon, config.privacy.delta)
    bits = config.fixed_point_bits
    stds = {}
    for t in sensitivities:
        size = next(slot.size for slot in layout if slot.name == t.name)
        grid = t.sensitivity + math.sqrt(size) * 2.0**-bits
        stds[t.name] = math.ceil(math.ldexp(grid * math.sqrt(m) / mu_star, bits))
    rounds = tuple(RoundSpec(name, layout, stds) for name in names)
    return replace(config, plan=replace(config.plan, rounds=rounds))


def release_for(
    config: FederationConfig,
    ids: Collection[str],
    me: str,
    sensitivities: Sequence[TensorSensitivity] = SENSITIVITIES,
) -> ReleaseNoise:
    """plan_release for made-up tensors: a round of them, pinned as federation init would."""
    made_up = with_rounds(config, ["made-up"], sensitivities)
    return plan_release(made_up, ids, me, sensitivities, "made-up")
