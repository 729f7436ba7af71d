"""Runner pieces that need no network: layout, masking, audit consistency, unmask refusals."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest

from node.egress.audit import AuditRecord, noise_evidence, read_audit, write_audit
from node.egress.bundle import EgressBundle
from node.egress.receipt import SDCEvidence
from node.egress.release import ReleaseNoise
from node.protocol.masking import (
    add_residual_noise,
    cape_draws,
    cape_masks,
    cape_sum_payload,
    pairwise_masks,
    unmask_corrections,
)
from node.protocol.unmask import (
    Attestation,
    UnmaskRequest,
    attestation_signature,
    check_attestations,
    check_request,
    missing_attestations,
)
from noise.accounting import gaussian_mu
from noise.fixed_point import wrapping_sum
from noise.layout import Layout
from noise.transcript import survivor_set_hash
from proto.federation import (
    FederationConfig,
)
from tests.support.made_up_federation import (
    CODEC,
    SENSITIVITIES,
    SESSION,
    _config,
    _identities,
    _seeds,
    _tensors,
    release_for,
)


def _noise(config: FederationConfig, ids: list[str], me: str) -> ReleaseNoise:
    return release_for(config, ids, me)


def test_layout_follows_mapping_order_back_to_back() -> None:
    layout = Layout.of_tensors(_tensors(0))
    assert [(s.name, s.shape, s.offset, s.size) for s in layout] == [
        ("n", (), 0, 1),
        ("sum_x", (4,), 1, 4),
        ("sum_xx", (4, 4), 5, 16),
    ]
    encoded = layout.encode(_tensors(0), CODEC)
    assert encoded.dtype == np.uint64 and encoded.size == 21
    assert CODEC.decode(encoded)[0] == 150.0


def test_encode_rejects_a_tensor_of_the_wrong_shape() -> None:
    layout = Layout.of_tensors(_tensors(0))
    bad = _tensors(0) | {"sum_x": np.zeros(3)}
    with pytest.raises(ValueError, match=r"tensor 'sum_x' has shape \(3,\)"):
        layout.encode(bad, CODEC)


def test_sum_of_egress_equals_sum_of_audit_bit_for_bit(tmp_path: Path) -> None:
    ids = ["a", "b", "c"]
    config = _config(ids)
    seeds = _seeds(ids)
    egress, audit = [], []
    for i, me in enumerate(ids):
        tensors = _tensors(i)
        layout = Layout.of_tensors(tensors)
        noise = _noise(config, ids, me)
        clean = layout.encode(tensors, CODEC)
        masked = clean + pairwise_masks(noise, seeds[me], layout, round_index=1, codec=CODEC)
        assert not np.array_equal(masked, clean)
        # Write both records the way the runner does and read them back.
        shapes = {s.name: s.shape for s in layout}
        bundle = EgressBundle(
            session_id=SESSION,
            round_index=1,
            round_name="scatter",
            node_id=me,
            fixed_point_bits=32,
            tensors=noise.entries(shapes),
            masking=noise.masking_facts(residual_dp=False),
            dp=noise.receipt((), 0),
            sdc=SDCEvidence(150),
            payload=masked,
        )
        out = tmp_path / me
        bundle.write(out)
        write_audit(
            out,
            AuditRecord(SESSION, 1, "scatter", me, 32, bundle.tensors, clean, {"features": 0}),
        )
        egress.append(EgressBundle.verify(out / "egress" / "round-1").payload)
        audit.append(read_audit(out, 1).payload)
    assert np.array_equal(wrapping_sum(egress), wrapping_sum(audit))


def test_egress_noise_has_the_declared_scale() -> None:
    ids = ["a", "b", "c", "d"]
    config = _config(ids, residual_dp=True)
    seeds = _seeds(ids)
    noise = _noise(config, ids, "b")
    rng = np.random.default_rng(11)
    tensors = {"n": np.array(500.0), "sum_xx": rng.uniform(-1, 1, size=(200, 200))}
    layout = Layout.of_tensors(tensors)
    clean = layout.encode(tensors, CODEC)
    masked = clean + pairwise_masks(noise, seeds["b"], layout, round_index=0, codec=CODEC)
    egress = add_residual_noise(masked, noise, layout, seed=bytes([92]) * 32, round_index=0)
    entries = noise.entries({s.name: s.shape for s in layout})
    bundle = EgressBundle(
        session_id=SESSION,
        round_index=0,
        round_name="moments",
        node_id="b",
        fixed_point_bits=32,
        tensors=entries,
        masking=noise.masking_facts(residual_dp=True),
        dp=noise.receipt((), 0),
        sdc=SDCEvidence(500),
        payload=egress,
    )
    record = AuditRecord(SESSION, 0, "moments", "b", 32, entries, clean)
    rows, pooled = noise_evidence(bundle, record)
    assert rows[1].entries == 40_000
    assert rows[1].ratio == pytest.approx(1.0, abs=0.03)
    assert pooled == pytest.approx(1.0, abs=0.03)
    # An egress that claims noise but carries none is exposed.
    _, none = noise_evidence(dataclasses.replace(bundle, payload=clean), record)
    assert none < 1e-6


def test_calibrated_release_meets_epsilon_against_an_outsider() -> None:
    ids = ["a", "b", "c"]
    noise = _noise(_config(ids, threshold=0), ids, "a")
    outsider = next(r for r in noise.receipt_rows() if r.observer == "outsider")
    # Complete graph without collusion margin: the outsider sees exactly the target.
    assert outsider.epsilon == pytest.approx(1.0, rel=1e-6)
    assert outsider.delta == 1e-6
    coordinator = next(r for r in noise.receipt_rows() if r.observer == "coordinator")
    assert coordinator.mu == math.inf  # exact aggregate without residual DP
    mu_star = gaussian_mu(1.0, 1e-6)
    for t in SENSITIVITIES:
        # Every tensor takes an equal share: σ_t = Δ_t·√M/μ* with M = 3 tensors.
        assert noise.sigma(t.name) == pytest.approx(t.sensitivity * math.sqrt(3) / mu_star)


def test_residual_noise_makes_the_coordinator_bounded() -> None:
    ids = ["a", "b", "c"]
    noise = _noise(_config(ids, residual_dp=True), ids, "a")
    mu = noise.mu()
    assert math.isfinite(mu["coordinator"])
    assert mu["outsider"] <= mu["coordinator"] <= mu["coalition:1"]
    layout = Layout.of_tensors(_tensors(0))
    clean = layout.encode(_tensors(0), CODEC)
    noisy = add_residual_noise(clean, noise, layout, seed=bytes([93]) * 32, round_index=0)
    assert not np.array_equal(noisy, clean)


def test_unmask_corrections_recover_the_survivors_exact_sum() -> None:
    ids = ["a", "b", "c", "d"]
    config = _config(ids)
    seeds = _seeds(ids)
    layout = Layout.of_tensors(_tensors(0))
    survivors, dropped = ["a", "b", "d"], ["c"]
    total_egress, total_audit, corrections = [], [], []
    for i, me in enumerate(survivors):
        noise = _noise(config, ids, me)
        clean = layout.encode(_tensors(i), CODEC)
        total_audit.append(clean)
        total_egress.append(
            clean + pairwise_masks(noise, seeds[me], layout, round_index=2, codec=CODEC)
        )
        corrections.append(
            unmask_corrections(noise, seeds[me], layout, dropped, round_index=2, codec=CODEC)
        )
    recovered = wrapping_sum(total_egress) - wrapping_sum(corrections)
    assert np.array_equal(recovered, wrapping_sum(total_audit))


def test_cape_masks_cancel_exactly() -> None:
    ids = ["a", "b", "c"]
    config = _config(ids, threshold=0, construction="cape")
    seeds = _seeds(ids)
    layout = Layout.of_tensors(_tensors(0))
    draws = {
        me: cape_draws(_noise(config, ids, me), layout, seed=bytes([90 + i]) * 32, round_index=0)
        for i, me in enumerate(ids)
    }
    blinded = [cape_sum_payload(draws[me], ids, me, seeds[me], layout, round_index=0) for me in ids]
    total = wrapping_sum(blinded)
    assert np.array_equal(total, wrapping_sum(draws.values()))
    masks = [cape_masks(draws[me], total, ids, me) for me in ids]
    assert not np.any(wrapping_sum(masks))


# ---------------------------------------------------------------- unmask refusals


def _ask(survivors: list[str], dropped: list[str], **changes: object) -> UnmaskRequest:
    ask = UnmaskRequest(
        session_id=SESSION,
        round_index=1,
        round_name="scatter",
        dropped=tuple(dropped),
        survivors=tuple(survivors),
        survivor_hash=survivor_set_hash(bytes(32), SESSION, 1, survivors, dropped),
        attestations=(),
        min_survivors=2,
    )
    return dataclasses.replace(ask, **changes)  # type: ignore[arg-type]


def _check(ask: UnmaskRequest, *, me: str = "a", min_nodes: int = 2) -> str | None:
    return check_request(
        ask,
        node_id=me,
        session_id=SESSION,
        round_index=1,
        participants={"a", "b", "c"},
        config_hash=bytes(32),
        min_nodes=min_nodes,
    )


def test_a_consistent_request_passes() -> None:
    assert _check(_ask(["a", "b"], ["c"])) is None


def test_a_request_with_nobody_dropped_passes() -> None:
    # Every round has an unmask step: with nobody dropped it asks for the self-mask seed.
    assert _check(_ask(["a", "b", "c"], [])) is None


@pytest.mark.parametrize(
    ("ask", "reason"),
    [
        (_ask(["a"], ["b", "c"]), "survivor set of 1 is below the federation minimum of 2"),
        (_ask(["b", "c"], ["a"]), "I am not in the survivor set"),
        (_ask(["a", "b"], []), "survivor set inconsistent"),
        (_ask(["a", "b"], ["d"]), "survivor set inconsistent"),
        (_ask(["a", "b"], ["c"], round_index=0), "concerns round 0, but I am awaiting"),
        (_ask(["a", "b"], ["c"], session_id="f" * 32), "concerns session"),
        (
            _ask(["a", "b"], ["c"], survivor_hash=bytes(32)),
            "survivor-set hash in the request does not match",
        ),
    ],
)
def test_inconsistent_requests_are_refused_with_a_reason(ask: UnmaskRequest, reason: str) -> None:
    got = _check(ask)
    assert got is not None and reason in got


def test_attestations_must_all_agree_and_verify() -> None:
    keys = _identities(["a", "b", "c"])
    pinned = {n: k.public_bytes() for n, k in keys.items()}
    ask = _ask(["a", "b"], ["c"])

    def attest(node: str, survivor_hash: bytes, signer: str | None = None) -> Attestation:
        signature = attestation_signature(
            keys[signer or node],
            config_hash=bytes(32),
            session_id=SESSION,
            round_index=1,
            survivor_hash=survivor_hash,
        )
        return Attestation(node, survivor_hash, signature)

    partial = dataclasses.replace(ask, attestations=(attest("a", ask.survivor_hash),))
    assert check_attestations(partial, config_hash=bytes(32), identity_keys=pinned) == (False, None)
    assert missing_attestations(partial) == ["b"]

    full = dataclasses.replace(
        ask, attestations=(attest("a", ask.survivor_hash), attest("b", ask.survivor_hash))
    )
    assert check_attestations(full, config_hash=bytes(32), identity_keys=pinned) == (True, None)

    other_hash = survivor_set_hash(bytes(32), SESSION, 1, ["a", "b", "c"], ["d"])
    split = dataclasses.replace(
        ask, attestations=(attest("a", ask.survivor_hash), attest("b", other_hash))
    )
    complete, reason = check_attestations(split, config_hash=bytes(32), identity_keys=pinned)
    assert not complete
    assert reason is not None
    assert "survivor set inconsistent: node 'b' acknowledged a different survivor set" in reason
    assert "{a, b}" in reason

    forged = dataclasses.replace(
        ask, attestations=(attest("a", ask.survivor_hash), attest("b", ask.survivor_hash, "c"))
    )
    _, reason = check_attestations(forged, config_hash=bytes(32), identity_keys=pinned)
    assert reason == "the attestation of node 'b' does not verify against its pinned identity key"

    outsider = dataclasses.replace(ask, attestations=(attest("c", ask.survivor_hash),))
    _, reason = check_attestations(outsider, config_hash=bytes(32), identity_keys=pinned)
    assert reason is not None and "node 'c' attested but is not among the survivors" in reason


def test_noise_floor_refuses_when_too_many_pair_terms_would_be_revealed() -> None:
    ids = ["a", "b", "c", "d"]
    noise = _noise(_config(ids, threshold=1), ids, "a")
    assert noise.floor_shortfall(["d"]) is None  # one dropout: within the collusion threshold
    reason = noise.floor_shortfall(["c", "d"])
    assert reason is not None
    assert reason.startswith("noise left on my egress would fall to σ = ")
    assert "below my floor of" in reason


def test_unmask_raises_the_recorded_cost_against_the_coordinator() -> None:
    ids = ["a", "b", "c", "d"]
    noise = _noise(_config(ids, threshold=1, residual_dp=True), ids, "a")
    before = noise.mu()
    after = noise.mu_after_unmask(["d"])
    assert after["outsider"] == before["outsider"]
    assert after["coordinator"] > before["coordinator"]
    assert after["coalition:1"] >= before["coalition:1"]
