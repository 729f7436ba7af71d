"""Real-unit cohorts with bounds that fit them: a real session completes, nothing clipped.

Issue 20's must-show, from the other side of tests/node/test_bounds_preflight.py
(where the same cohorts against −10..10 are refused before joining): with
bounds fitted to volumes in mm³ and thickness in mm, a coordinator and two
nodes — real processes over mutual TLS on 127.0.0.1 — complete the session;
node a was asked for manual approval, node b was given no --approve at all
(the default waits for its checker too); each checker reviews with the audit
record, and the review shows 0 % clipped for age and every feature by name,
the approval mode, and labels the released values with the feature names. A
copy of the audit record that counts every value of one feature as clipped
makes the same review fail, naming the feature and the share.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest

from proto.federation import load_federation
from tests.node.real_cohorts import NAMES, real_federation
from tests.support.processes import Federation, Processes, wait_until
from tests.support.sessions import SessionRun
from zerosum.cli import main as zerosum_main

pytestmark = pytest.mark.integration


def _review(*argv: object) -> tuple[int, str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        code = zerosum_main(["review", *(str(a) for a in argv)])
    return code, printed.getvalue()


def test_fitted_bounds_complete_a_session_and_the_review_shows_nothing_clipped(
    tmp_path: Path, processes: Processes
) -> None:
    root = real_federation(tmp_path / "fed", fitted=True)
    federation = Federation(root, load_federation(root / "federation.toml"))
    run = SessionRun(federation, tmp_path / "run", processes)
    run.start_coordinator()
    run.start_node("a", approve="manual")
    # Node b as an operator would start it: no --approve, so it waits for its checker.
    run.nodes["b"] = processes.zerosum(
        "run-b", "node", "--federation", str(federation.toml), "--node-id", "b",
        "--out", str(run.out("b")), "--state", str(run.state_folder("b")),
        "--coordinator", run.address,
    )  # fmt: skip
    for node_id in ("a", "b"):
        run.at_gate(node_id, 0)
    # Held at the gate: nothing uploaded before a checker signs.
    wait_until(run.state.roster_final, what="the roster", alive=run.everyone())
    assert run.state.uploads(0) == set()
    for node_id in ("a", "b"):
        run.approve(node_id, 0)  # review --audit --approve: every check must pass to sign
    codes = run.wait_all()
    assert codes == {"coordinator": 0, "a": 0, "b": 0}, run.describe()

    for node_id, n in (("a", 120), ("b", 130)):
        log = run.nodes[node_id].stderr()
        assert f"pre-flight of {federation.data(node_id)}: {n} subjects read, {n} used" in log
        assert f"all {len(NAMES) + 1} columns: 0 % clipped" in log, log
        manifest = json.loads((run.egress(node_id, 0) / "manifest.json").read_text())
        assert manifest["approval_mode"] == "manual"

    folder, audit = run.egress("a", 0), run.out("a") / "audit" / "round-0"
    code, text = _review(folder, "--federation", federation.toml, "--audit", audit)
    assert "clipped to the public bounds (audit record, share of 120 subjects" in text
    assert ": 0 % for age and every feature" in text
    assert "[ok  ] clipping: clipped to the public bounds: 0 % for age and every feature" in text
    assert "approval mode: manual" in text
    assert "lh_hippocampus_mm3 × age" in text  # values labelled by the bounds' names
    assert "feature 0" not in text
    assert code == 0, text
    code, document = _review(folder, "--federation", federation.toml, "--audit", audit, "--json")
    clipping = json.loads(document)["bundle"]["clipping"]
    assert [c["name"] for c in clipping["columns"]] == ["age", *NAMES]
    assert all(c["fraction"] == 0.0 for c in clipping["columns"])
    html_path = tmp_path / "review.html"
    code, _ = _review(folder, "--federation", federation.toml, "--audit", audit,
                      "--html", html_path)  # fmt: skip
    page = html_path.read_text()
    assert "clipping" in page and "0 % for age and every feature" in page

    # The node's predictions of its own subjects are in years, not centuries.
    rows = (run.out("a") / "predictions.csv").read_text().splitlines()[1:]
    deltas = [float(row.split(",")[3]) for row in rows]
    assert len(deltas) == 120 and max(abs(d) for d in deltas) < 40.0

    # The same review fails once the record counts a feature clipped for every subject.
    copy = tmp_path / "copy"
    shutil.copytree(run.out("a"), copy)
    record_path = copy / "audit" / "round-0" / "audit.json"
    record = json.loads(record_path.read_text())
    record["clipped"]["feature:total_grey_mm3"] = 120
    record_path.write_text(json.dumps(record))
    code, text = _review(copy / "egress" / "round-0", "--federation", federation.toml,
                         "--audit", copy / "audit" / "round-0")  # fmt: skip
    assert code == 2, text
    assert (
        "[FAIL] clipping: 'total_grey_mm3' was clipped to the public bounds for 100.0% of the "
        "120 subjects (120 values), more than plan.clipping.max_clipped_fraction = 0.05"
    ) in text
    (row,) = [line for line in text.splitlines() if line.strip().startswith("total_grey_mm3 ")]
    assert row.endswith("100.0% (120 values)  FAIL"), row
