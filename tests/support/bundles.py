"""Egress bundles made the way a node makes them, for the tests of `zerosum review` and the airlock.

Real pairwise masks from real seeds, the receipt from the release's noise
plan and the audit record of the un-noised values, under a federation config
with one round ('scatter') of 1641 values; ``noise_*`` arguments skew the node.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from node.egress.audit import AuditRecord, write_audit
from node.egress.bundle import EgressBundle
from node.egress.receipt import SDCEvidence
from node.plans.interface import TensorSensitivity
from node.protocol.masking import pairwise_masks
from noise.layout import Layout
from proto.federation import (
    FederationConfig,
    PlanSpec,
    RoundSpec,
    config_hash,
    dump_federation,
)
from tests.support.made_up_federation import CODEC, SESSION, _config, _seeds, release_for

IDS = ["a", "b", "c"]
P = 40
SENSITIVITIES = (
    TensorSensitivity("n", 1.0, "one subject changes n by 1"),
    TensorSensitivity("sum_x", float(np.sqrt(P)), "‖x‖ ≤ √P after pre-scaling to [-1, 1]"),
    TensorSensitivity("sum_xx", float(P), "‖x xᵀ‖_F ≤ P after pre-scaling to [-1, 1]"),
)


def tensors(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, size=(150, P))
    return {"n": np.array(150.0), "sum_x": x.sum(axis=0), "sum_xx": x.T @ x}


LAYOUT = Layout.of_tensors(tensors())


def federation(epsilon: float = 1.0) -> FederationConfig:
    config = _config(IDS)
    return dataclasses.replace(
        config,
        plan=PlanSpec("test-plan", "1", (RoundSpec("scatter", LAYOUT),)),
        privacy=dataclasses.replace(config.privacy, epsilon=epsilon),
    )


def make_bundle(
    root: Path,
    *,
    noise_epsilon: float = 1.0,
    noise_scale: float = 1.0,
    n_subjects: int = 150,
) -> Path:
    """A node's egress of round 1 under the config in ``root``; ``noise_*`` skew the node."""
    config = federation()
    (root / "federation.toml").write_text(dump_federation(config))
    noise = release_for(federation(noise_epsilon), IDS, "a", SENSITIVITIES)
    clean = LAYOUT.encode(tensors(), CODEC)
    mask = pairwise_masks(noise, _seeds(IDS)["a"], LAYOUT, round_index=1, codec=CODEC)
    if noise_scale != 1.0:
        mask = CODEC.encode(noise_scale * CODEC.decode(mask))
    bundle = EgressBundle(
        session_id=SESSION,
        round_index=1,
        round_name="scatter",
        node_id="a",
        fixed_point_bits=32,
        tensors=noise.entries(LAYOUT.shapes),
        masking=noise.masking_facts(residual_dp=False),
        dp=noise.receipt(noise.receipt_rows(), 1),
        sdc=SDCEvidence(n_subjects, n_subjects - P - 1),
        payload=clean + mask,
        config_hash=config_hash(config).hex(),
    )
    out = root / "out"
    folder = bundle.write(out)
    write_audit(
        out,
        AuditRecord(
            session_id=SESSION,
            round_index=1,
            round_name="scatter",
            node_id="a",
            fixed_point_bits=32,
            tensors=bundle.tensors,
            payload=clean,
            clipped={"total": 0},
            egress_payload_sha256=bundle.payload_sha256,
        ),
    )
    return folder


def review(folder: Path, *extra: str) -> list[str]:
    return ["review", str(folder), "--audit", str(folder.parents[1] / "audit" / "round-1"), *extra]
