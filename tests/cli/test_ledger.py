"""`zerosum ledger` prints a node's releases, unmask answers and composed ε against its caps."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from node.records.ledger import PrivacyLedger
from noise.accounting import compose_mu, gaussian_epsilon
from proto.federation import dump_federation
from tests.support.ledger_entries import refusal, release, unmask
from tests.support.made_up_federation import _config
from zerosum.cli import main

IDS = ["a", "b", "c"]

# Costs under which the outsider with one colluding node binds.
COLLUDER_BINDS = {"outsider": 0.1, "colluders:1": 0.4, "coordinator": math.inf}


@pytest.fixture
def federation(tmp_path: Path) -> Path:
    path = tmp_path / "federation.toml"
    path.write_text(dump_federation(_config(IDS)))
    return path


def _ledger(path: Path) -> PrivacyLedger:
    ledger = PrivacyLedger.open(path, "a", 1e-6)
    for round_index, mu in ((0, 0.2), (1, 0.3)):
        release(
            ledger,
            ("s1", round_index, "sums"),
            {"outsider": mu, "coordinator": math.inf},
            "0" * 64,
            f"{round_index + 1:064x}",
        )
    unmask(ledger, ("s1", 1, "sums"), ["c"], ["a", "b"], {"outsider": 0.4, "coordinator": math.inf})
    refusal(ledger, ("s1", 1, "sums"), ["b", "c"], ["a"], "the noise floor would not hold")
    return ledger


def test_the_ledger_is_printed_with_its_totals_and_what_is_left(
    federation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nodes" / "a" / "state" / "ledger.json"
    path.parent.mkdir(parents=True)
    _ledger(path)
    before = path.read_bytes()
    assert main(["ledger", "--federation", str(federation), "--node-id", "a"]) == 0
    out = capsys.readouterr().out
    # The unmask raised round 1's outsider μ to 0.4; releases compose in μ-GDP.
    epsilon = gaussian_epsilon(compose_mu([0.2, 0.4]), 1e-6)
    assert f"outsider       2 release(s)  μ   {compose_mu([0.2, 0.4]):.4g}" in out
    assert f"of the budget 4: {4 - epsilon:.4g} left" in out
    assert "pair terms revealed (dropped c; survivors a, b)" in out
    assert (
        "refusal  session s1 round 1 ('sums') (dropped b, c; survivors a): the noise floor" in out
    )
    assert "caps: ε ≤ 1 per release; ε budget 4 against every observer class it holds" in out
    assert "coordinator" in out and "no budget applies" in out
    assert path.read_bytes() == before  # read-only

    assert main(["ledger", "--federation", str(federation), "--node-id", "a", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    outsider = next(t for t in document["totals"] if t["observer"] == "outsider")
    assert outsider["epsilon"] == pytest.approx(epsilon)
    assert outsider["left"] == pytest.approx(4 - epsilon)
    assert [e["kind"] for e in document["events"]] == ["release", "release", "unmask", "refusal"]


def test_used_and_left_are_shown_for_every_class_and_the_binding_one_is_named(
    federation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The outsider sees little, an outsider with one colluding node more: that class binds.
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger.open(path, "a", 1e-6)
    for round_index in (0, 1):
        release(
            ledger, ("s1", round_index, "sums"), COLLUDER_BINDS, "0" * 64, f"{round_index + 1:064x}"
        )
    argv = ["ledger", "--federation", str(federation), "--node-id", "a", "--ledger", str(path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    used = {label: gaussian_epsilon(compose_mu([m, m]), 1e-6) for label, m in
            (("outsider", 0.1), ("colluders:1", 0.4))}  # fmt: skip
    for label, epsilon in used.items():
        line = next(row for row in out.splitlines() if row.strip().startswith(label))
        assert f"used {epsilon:.4g} of the budget 4: {4 - epsilon:.4g} left" in line
        assert line.endswith("<- binds") == (label == "colluders:1")
    assert (
        "the budget binds against an outsider with 1 colluding node (colluders:1): "
        f"{4 - used['colluders:1']:.4g} of 4 left"
    ) in out
    coordinator = next(row for row in out.splitlines() if row.strip().startswith("coordinator"))
    assert "no budget applies" in coordinator and "left" not in coordinator

    assert main([*argv, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["binding_class"] == "colluders:1"
    rows = {t["observer"]: t for t in document["totals"]}
    for label, epsilon in used.items():
        assert rows[label]["used"] == pytest.approx(epsilon)
        assert rows[label]["left"] == pytest.approx(4 - epsilon)
        assert rows[label]["binds"] == (label == "colluders:1")
    assert "left" not in rows["coordinator"]


def test_a_missing_ledger_or_unknown_node_is_named(
    federation: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["ledger", "--federation", str(federation), "--node-id", "z"]) == 2
    assert "node 'z' is not part of federation" in capsys.readouterr().err
    argv = ["ledger", "--federation", str(federation), "--node-id", "a"]
    assert main([*argv, "--ledger", str(tmp_path / "none.json")]) == 2
    assert "no ledger at" in capsys.readouterr().err
    other = tmp_path / "b.json"
    PrivacyLedger.open(other, "b", 1e-6).record_release(
        session_id="s", round_index=0, round_name="sums", mu={"outsider": 0.1},
        manifest_sha256="0" * 64, payload_sha256="1" * 64,
    )  # fmt: skip
    assert main([*argv, "--ledger", str(other)]) == 2
    assert "belongs to node 'b'" in capsys.readouterr().err
