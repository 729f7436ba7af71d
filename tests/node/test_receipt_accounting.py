"""Receipts and ledger totals of a real session, against a recomputation from noise.accounting.

Four node runners and the real coordinator session (in process, real SQLite)
run the two-round plan (``means``, ``sums``) with residual noise on, so every
observer class is bounded, under the pairwise and the CAPE construction with
collusion threshold T = 1. For node a the test rebuilds each release's μ per
observer class from the unit design (``noise.policy.plan_noise``) with
``noise.accounting.privacy_report`` (outsider, coordinator, coordinator with
one colluder) and ``noise.designs.remaining_variance`` over every single
colluder (an outsider with one colluder), composes the two releases with
``noise.accounting.compose_mu`` and converts with ``gaussian_epsilon``; the
egress receipts and the state folder's ledger must say the same.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from coordinator.config import SessionConfig
from coordinator.session import Session
from coordinator.store import Store
from node.egress.bundle import EgressBundle
from node.plans.deltab.plan import public_sensitivities
from node.protocol.gateway import CoordinatorGateway
from node.runner import NodeOptions, NodeRunner, RunOutcome
from node.session.setup import LocalSetup
from noise.accounting import compose_mu, gaussian_epsilon, privacy_report
from noise.designs import remaining_variance
from noise.policy import plan_noise
from proto.federation import config_hash, load_federation
from tests.support.runner_threads import run_side_by_side
from tests.support.synthetic_init import init_synthetic
from zerosum.inprocess import InProcessGateway, Ticker

NODES = "abcd"
LABELS = ("outsider", "colluders:1", "coordinator", "coalition:1")


def _federation(out: Path, construction: str) -> Path:
    return init_synthetic(
        out,
        NODES,
        seed=3,
        n_features=5,
        n_components=2,
        cohort_sizes="120,130,140,150",
        options=[
            "--construction",
            construction,
            "--residual-dp",
            "--collusion-threshold",
            "1",
            "--nan-policy",
            "mean",
            # Weak privacy keeps the noisy fit well posed on these small cohorts.
            "--epsilon",
            "300",
            "--epsilon-budget",
            "3000",
            "--round-deadline",
            "30",
        ],
    )


@pytest.fixture(params=["pairwise", "cape"])
def finished(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """The federation folder after one completed session of the given construction."""
    fed = _federation(tmp_path / "fed", request.param)
    config = load_federation(fed / "federation.toml")
    session = Session(
        Store(tmp_path / "state.sqlite"), SessionConfig.from_federation(config, config_hash(config))
    )
    ticker = Ticker(session)
    ticker.start()

    def gateway(
        setup: LocalSetup, options: NodeOptions, say: Callable[[str], None]
    ) -> CoordinatorGateway:
        return InProcessGateway(session, setup.node_id)

    def runner_for(node: str) -> NodeRunner:
        return NodeRunner(
            fed,
            node,
            options=NodeOptions(approve="auto", poll_seconds=0.02),
            progress=lambda _line: None,
            gateway=gateway,
        )

    outcomes = run_side_by_side(NODES, runner_for, timeout=120)
    ticker.stop()
    session.store.close()
    for node in NODES:
        assert isinstance(outcomes[node], RunOutcome), outcomes[node]
    yield fed


def _independent_mu(fed: Path, round_name: str) -> dict[str, float]:
    """Node a's μ per observer class for one release of ``round_name``, rebuilt from noise/."""
    config = load_federation(fed / "federation.toml")
    privacy = config.privacy
    unit = plan_noise(
        list(config.node_ids),
        epsilon=privacy.epsilon,
        delta=privacy.delta,
        sensitivity=1.0,
        construction=privacy.noise_design.construction,
        collusion_threshold=privacy.collusion_threshold,
        residual_dp=privacy.residual_dp,
    )
    rows = {
        (row.observer, row.coalition_size): row.mu
        for row in privacy_report(
            unit.design,
            residual_variance=unit.residual_variance,
            sensitivity=1.0,
            delta=privacy.delta,
            coalition_sizes=[1],
        )
        if row.node_id == "a"
    }
    left = min(
        remaining_variance(unit.design, [other], unit.residual_variance)["a"]
        for other in config.node_ids
        if other != "a"
    )
    # Tensor t carries the config's pinned S_t grid units, σ_t = S_t·2^-F, i.e. the
    # unit design scaled by s_t = σ_t·√(unit target); the released values are
    # rounded to the grid, so Δ_t gains √d_t·2^-F. The release's μ is the unit μ
    # times sqrt(Σ_t (Δ_t/s_t)²).
    spec = config.plan.round(round_name)
    bits = config.fixed_point_bits
    sizes = {slot.name: slot.size for slot in spec.layout}
    terms = []
    for t in public_sensitivities(config, round_name):
        grid = t.sensitivity + math.sqrt(sizes[t.name]) * 2.0**-bits
        scale = spec.noise_std[t.name] * 2.0**-bits / math.sqrt(unit.target_variance)
        terms.append((grid / scale) ** 2)
    ratio = math.sqrt(sum(terms))
    return {
        "outsider": rows[("outsider", 0)] * ratio,
        "colluders:1": ratio / math.sqrt(left),
        "coordinator": rows[("coordinator", 0)] * ratio,
        "coalition:1": rows[("coalition", 1)] * ratio,
    }


def test_receipts_and_ledger_agree_with_noise_accounting(finished: Path) -> None:
    fed = finished
    config = load_federation(fed / "federation.toml")
    delta = config.privacy.delta
    out = fed / "nodes" / "a" / "out"
    rounds = sorted(
        # Under CAPE the secure-sum rounds' folders hold a share's note, no bundle.
        (EgressBundle.read(m.parent) for m in (out / "egress").glob("round-*/manifest.json")),
        key=lambda bundle: bundle.round_index,
    )
    assert [b.round_name for b in rounds] == ["means", "sums"]
    expected = {b.round_name: _independent_mu(fed, b.round_name) for b in rounds}
    for number, bundle in enumerate(rounds, start=1):
        # Both constructions report the config's threshold and its coalition rows.
        assert bundle.masking.collusion_threshold == config.privacy.collusion_threshold == 1
        assert len(bundle.masking.remaining_std_fraction) == 1
        assert all(len(t.coalition_sigma) == 1 for t in bundle.tensors)
        release = {row.label: row for row in bundle.dp.release}
        assert tuple(release) == LABELS
        for label in LABELS:
            want = expected[bundle.round_name][label]
            assert release[label].mu == pytest.approx(want, rel=1e-9), label
            assert release[label].epsilon == pytest.approx(gaussian_epsilon(want, delta), rel=1e-9)
        cumulative = {row.label: row for row in bundle.dp.cumulative}
        assert bundle.dp.releases_in_ledger == number
        for label in LABELS:
            so_far = compose_mu(expected[b.round_name][label] for b in rounds[:number])
            assert cumulative[label].mu == pytest.approx(so_far, rel=1e-9), label
    ledger = json.loads((fed / "nodes" / "a" / "state" / "ledger.json").read_text())
    assert list(ledger["totals"]) == list(LABELS)
    for label in LABELS:
        total = compose_mu(expected[name][label] for name in ("means", "sums"))
        assert ledger["totals"][label]["mu"] == pytest.approx(total, rel=1e-9), label
        assert ledger["totals"][label]["epsilon"] == pytest.approx(
            gaussian_epsilon(total, delta), rel=1e-9
        )
        assert ledger["totals"][label]["releases"] == 2
    releases = [e for e in ledger["entries"] if e["kind"] == "release"]
    for entry, bundle in zip(releases, rounds, strict=True):
        assert entry["details"]["payload_sha256"] == bundle.payload_sha256
        assert set(entry["mu"]) == set(LABELS)
