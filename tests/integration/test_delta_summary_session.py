"""The delta summary end to end: a real session, each node's bundle, review, ACRO, ledger."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from acro import record as acro_record

from node.plans.deltab.summary_bundle import SummaryBundle
from node.records.ledger import LaplaceRelease, PrivacyLedger
from proto.federation import load_federation

pytestmark = pytest.mark.integration


def _zerosum(*argv: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zerosum.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, object]]:
    out = tmp_path_factory.mktemp("summary") / "demo"
    finished = _zerosum("demo", "--delta-summary", "1.0", "--json", "--out", out, timeout=240)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return out, json.loads(finished.stdout)


def _folders(out: Path, node: str) -> tuple[Path, Path]:
    base = out / "nodes" / node / "out"
    return base / "egress" / "delta-summary", base / "audit" / "delta-summary"


def test_every_node_releases_a_reviewed_summary_recorded_in_its_ledger(
    demo: tuple[Path, dict[str, object]],
) -> None:
    out, summary = demo
    rows = summary["delta_summaries"]
    assert isinstance(rows, list) and [r["node_id"] for r in rows] == ["tre1", "tre2", "tre3"]
    config = load_federation(out / "federation.toml")
    for row in rows:
        node = row["node_id"]
        folder, audit = _folders(out, node)
        bundle = SummaryBundle.verify(folder)
        assert bundle.epsilon == 1.0 and (folder / "approval.json").is_file()
        assert {s["name"] for s in bundle.statistics} >= {"mean", "sd", "q5", "q50", "q95"}
        assert row["released"]["mean"] != row["exact"]["mean"]
        ledger = PrivacyLedger.open(
            out / "nodes" / node / "state" / "ledger.json", node, config.privacy.delta
        )
        (entry,) = [e for e in ledger.entries if isinstance(e, LaplaceRelease)]
        assert entry.epsilon == 1.0 and entry.payload_sha256 == bundle.values_sha256
        outsider = {t.label: t for t in ledger.totals()}["outsider"]
        model_only = [e for e in ledger.entries if e.kind == "release"]
        assert outsider.releases == len(model_only) + 1
        assert outsider.laplace_epsilon == 1.0
        # The receipt in the bundle is the ledger's total after the release.
        receipt = {r["observer"]: r for r in bundle.manifest["dp_receipt"]["totals_after"]}
        assert float(receipt["outsider"]["epsilon"]) == pytest.approx(outsider.epsilon)
        # Review with the audit record passes (the node approved it itself: a note).
        checked = _zerosum("review", folder, "--audit", audit, "--json")
        assert checked.returncode == 0, checked.stdout
        review = json.loads(checked.stdout)
        assert review["kind"] == "delta-summary"
        assert {f["check"] for f in review["findings"] if f["level"] == "pass"} >= {
            "files",
            "integrity",
            "config",
            "sdc",
            "privacy",
            "noise",
        }
        # ACRO's own reader loads it.
        records = acro_record.load_records(str(folder))
        assert set(records.results) == {"delta_summary", "release_manifest"}
    ledger_text = _zerosum("ledger", "--federation", out / "federation.toml", "--node-id", "tre1")
    assert ledger_text.returncode == 0, ledger_text.stderr
    assert "laplace  session" in ledger_text.stdout and "ε 1 (pure ε-DP" in ledger_text.stdout


def _copy(demo: tuple[Path, dict[str, object]], tmp_path: Path) -> tuple[Path, Path, Path]:
    out, _ = demo
    shutil.copytree(out, tmp_path / "fed", ignore=shutil.ignore_patterns("*.lock"))
    copy = tmp_path / "fed"
    return copy, *(_folders(copy, "tre2"))


def test_review_fails_a_tampered_unlisted_or_unnoised_summary(
    demo: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    _, folder, audit = _copy(demo, tmp_path)
    values = folder / "values.csv"
    original = values.read_bytes()

    values.write_bytes(original.replace(b"mean,", b"mean,9", 1))
    tampered = _zerosum("review", folder)
    assert tampered.returncode == 2 and "values.csv does not match its SHA-256" in tampered.stdout
    values.write_bytes(original)

    (folder / "extra.csv").write_text("id\n1\n")
    unlisted = _zerosum("review", folder)
    assert unlisted.returncode == 2 and "extra.csv is not part of the bundle" in unlisted.stdout
    (folder / "extra.csv").unlink()

    record = json.loads((audit / "audit.json").read_text())
    released = {s["name"]: s["value"] for s in SummaryBundle.verify(folder).statistics}
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "audit.json").write_text(json.dumps(record | {"exact": released}))
    unnoised = _zerosum("review", folder, "--audit", fake)
    assert unnoised.returncode == 2 and "equal the exact ones: no noise" in unnoised.stdout

    # A tenth of the declared noise on every draw.
    quiet = dict(record)
    exact = dict(record["exact"])
    for name in ("mean", "second_moment"):
        exact[name] = released[name] - 0.1 * (released[name] - record["exact"][name])
    quiet["exact"] = exact
    # The audit's exact histogram as if the released counts carried a tenth of the noise.
    quiet["exact_histogram"] = [
        n - 0.1 * (n - e)
        for n, e in zip(record["noised_histogram"], record["exact_histogram"], strict=True)
    ]
    (fake / "audit.json").write_text(json.dumps(quiet))
    low = _zerosum("review", folder, "--audit", fake)
    assert low.returncode == 2 and "less noise than declared" in low.stdout


def test_only_a_checker_key_of_the_node_may_decide(
    demo: tuple[Path, dict[str, object]], tmp_path: Path
) -> None:
    copy, folder, _ = _copy(demo, tmp_path)
    (folder / "approval.json").unlink()  # the node's own automatic approval
    foreign = _zerosum(
        "review", folder, "--approve", "--key", copy / "checkers" / "tre1" / "checker.pem",
        "--reviewer", "someone",
    )  # fmt: skip
    assert foreign.returncode == 2
    assert "is not an output checker key of node 'tre2'" in foreign.stderr
    assert not (folder / "approval.json").exists()
    own = _zerosum(
        "review", folder, "--approve", "--key", copy / "checkers" / "tre2" / "checker.pem",
        "--reviewer", "J. Smith",
    )  # fmt: skip
    assert own.returncode == 0, own.stderr
    assert (folder / "approval.json").is_file()
    again = _zerosum("review", folder)
    assert again.returncode == 0 and "decided already: approve by J. Smith" in again.stdout


def test_init_counts_the_summary_against_the_budget(tmp_path: Path) -> None:
    refused = _zerosum(
        "federation", "init", "--nodes", "a,b", "--out", tmp_path / "fed", "--synthetic",
        "--holdout-size", "40", "--delta-summary", "3.5",
    )  # fmt: skip
    assert refused.returncode != 0
    assert "--epsilon-budget 4 is below the cost of one session" in refused.stderr
    bad = _zerosum(
        "federation", "init", "--nodes", "a,b", "--out", tmp_path / "fed2", "--synthetic",
        "--delta-range", "5,1", "--delta-summary", "1",
    )  # fmt: skip
    assert bad.returncode != 0 and "plan.delta_summary.delta_high" in bad.stderr
