"""`zerosum review` as a re-check: each fault in a bundle gives exit 2 with a message naming it.

Bundles are made the way a node makes them (real pairwise masks from real
seeds, the receipt from the release's noise plan, the audit record of the
un-noised values), under a federation config with a round of 1641 values, and
then damaged one way at a time.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from node.egress.bundle import EgressBundle
from tests.support.bundles import make_bundle, review
from zerosum.cli import main


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return make_bundle(tmp_path)


def test_a_clean_bundle_passes_every_check(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(review(folder)) == 0
    out = capsys.readouterr().out
    assert "verdict: pass (exit 0)" in out
    assert "[FAIL]" not in out and "[LOOK]" not in out
    for check in ("files", "integrity", "schema", "sdc", "privacy", "noise"):
        assert f"[ok  ] {check}:" in out, check
    assert "ACRO's defaults, acro/default.yaml" in out


def test_without_the_config_the_caps_need_a_human_look(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (folder.parents[2] / "federation.toml").unlink()
    assert main(review(folder)) == 1
    out = capsys.readouterr().out
    assert "[LOOK] config: no federation config" in out


def test_json_and_html_reports(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "review.html"
    assert main(review(folder, "--json", "--html", str(page))) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["verdict"] == "pass" and document["exit_code"] == 0
    assert {f["check"] for f in document["findings"]} >= {"files", "privacy", "noise"}
    assert document["epsilon"]["cap"] == 1.0
    assert document["epsilon"]["guarantee"] == pytest.approx(1.0, rel=1e-6)
    assert all(t["passed"] for t in document["noise_tests"]["tests"])
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "Verdict: <b>pass</b>" in text
    # Self-contained: no scripts, nothing fetched; one released-vs-local plot per tensor.
    assert "<script" not in text and "src=" not in text and "href=" not in text
    tensors = len(document["tensors"]) if "tensors" in document else None
    assert text.count("<svg") == (tensors or text.count("<figcaption>")) > 0
    assert "released vs local, band ±2σ" in text
    assert text.index("<h2>Checks</h2>") < text.index("<h2>Every value")


def _flip_payload_byte(folder: Path) -> None:
    path = folder / "payload.npy"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))


def _write_unlisted(folder: Path) -> None:
    (folder / "notes.txt").write_text("a table I forgot to remove")


@pytest.mark.parametrize(
    ("damage", "words"),
    [
        (_flip_payload_byte, "payload.npy has SHA-256"),
        (lambda f: (f / "values.csv").unlink(), "values.csv is missing"),
        (lambda f: (f / "checksums" / "results.json.txt").unlink(), "checksums/results.json.txt"),
        (_write_unlisted, "notes.txt is not part of the bundle"),
    ],
    ids=["flipped payload byte", "missing file", "missing checksum", "unlisted file"],
)
def test_a_damaged_bundle_fails_naming_the_fault(
    folder: Path, capsys: pytest.CaptureFixture[str], damage: object, words: str
) -> None:
    damage(folder)  # type: ignore[operator]
    assert main(review(folder)) == 2
    out = capsys.readouterr().out
    assert "verdict: fail (exit 2)" in out
    assert words in out


@pytest.mark.parametrize(
    ("made", "words"),
    [
        # The node noised for ε = 2 per release; the federation caps it at 1.
        ({"noise_epsilon": 2.0}, ["above the cap privacy.epsilon = 1 per release"]),
        (
            {"noise_scale": 0.0},
            ["sum_xx: the egress equals the audit record — released without noise"],
        ),
        (
            {"noise_scale": 0.5},
            [
                "all tensors: less noise than declared",
                "sum_xx: less noise than declared",
                "(ratio 0.49",  # half the declared σ: 0.493 with these draws
            ],
        ),
        (
            {"n_subjects": 8},
            [
                "N = 8 subjects is below safe_threshold 10",
                "N = 8 subjects is below the federation's min_cohort_size 100",
                "residual degrees of freedom -33 are below safe_dof_threshold 10",
            ],
        ),
    ],
    ids=[
        "noise for a larger epsilon than the cap",
        "a payload equal to the audit record",
        "half the declared noise",
        "n below the minimum",
    ],
)
def test_a_bundle_made_unsafe_fails_naming_the_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], made: dict[str, float], words: list[str]
) -> None:
    folder = make_bundle(tmp_path, **made)  # type: ignore[arg-type]
    assert main(review(folder)) == 2
    out = capsys.readouterr().out
    for needle in words:
        assert needle in out


def test_a_receipt_that_understates_epsilon_fails(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bundle = EgressBundle.read(folder)
    rows = tuple(
        dataclasses.replace(r, epsilon=r.epsilon / 2) if r.observer == "outsider" else r
        for r in bundle.dp.release
    )
    forged = dataclasses.replace(bundle, dp=dataclasses.replace(bundle.dp, release=rows))
    forged.write(folder.parents[1], overwrite=True)
    assert main(review(folder)) == 2
    assert "the receipt states outsider ε" in capsys.readouterr().out


def test_the_audit_record_of_another_egress_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = make_bundle(tmp_path)
    (tmp_path / "other").mkdir()
    other = make_bundle(tmp_path / "other", noise_scale=0.5)
    assert main(["review", str(folder), "--audit", str(other.parents[1])]) == 2
    assert "the audit record was written for another egress payload" in capsys.readouterr().out


def test_sdc_thresholds_from_an_acro_settings_file(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = tmp_path / "sdc.yaml"
    settings.write_text(
        "# stricter than ACRO's defaults\nsafe_threshold: 200\nsafe_dof_threshold: 10\n"
        "safe_nk_n: 2\nblocked_extensions:\n  - .svg\n"
    )
    assert main(review(folder, "--sdc", str(settings))) == 2
    out = capsys.readouterr().out
    assert f"N = 150 subjects is below safe_threshold 200 (thresholds: {settings})" in out
    settings.write_text("safe_threshold: ten\n")
    assert main(review(folder, "--sdc", str(settings))) == 2
    assert "safe_threshold = ' ten' must be a whole number" in capsys.readouterr().err
