"""`zerosum demo`: a complete local multi-TRE session on synthetic cohorts."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zerosum.commands._demo_summary import print_summaries, read_summaries
from zerosum.errors import CommandError

DESCRIPTION = """\
Run a whole federated brain-age session on this machine, the way TREs would run
it: `zerosum federation init --synthetic` writes a federation (config, CA and
mutual-TLS certificates, identity keys, one synthetic cohort per node and a
holdout), then the coordinator and every node start as separate processes
talking gRPC over mutual TLS on 127.0.0.1.

When the session ends the demo checks and prints:
  - per node: subjects N, the noise std σ on its egress and the ε an outsider
    (or the reviewer) faces for one release;
  - that the federated model equals a pooled fit on the concatenated cohorts
    (maximum relative difference of the holdout predictions);
  - that Σ of the nodes' noised payloads == Σ of their un-noised audit payloads,
    bit for bit, every round (without residual noise);
  - on the holdout, against the synthetic truth, for the federated model, the
    pooled exact fit and chronological age itself (δ̂ = 0): the correlation of
    estimated with true delta (the headline), and the error in years against
    the true brain age and against chronological age, which a model that loses
    the delta would improve, so they are shown beside the no-model column;
  - how many values were clipped to the public bounds (none, by default).
"""

EPILOG = """\
examples:
  zerosum demo                       # 3 nodes, no residual noise
  zerosum demo --nodes 5 --json
  zerosum demo --residual-dp         # the aggregate is (ε, δ)-DP too, so it is no longer exact
  zerosum demo --delta-summary 1     # each node also releases a DP summary of its deltas

The federation and all outputs stay in --out (default demo-out/): look at
nodes/<id>/out/egress/round-<r>/ for what a TRE output checker would review.
"""

MARKER = ".zerosum-demo"
COHORT_SIZES = (400, 250, 600, 300, 500)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--nodes", type=int, default=3, help="number of TREs (default 3)")
    parser.add_argument(
        "--out", type=Path, default=Path("demo-out"), help="folder for the federation and outputs"
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--residual-dp",
        action="store_true",
        help="add CAPE-split residual noise (aggregate DP; the result is then not exact)",
    )
    parser.add_argument(
        "--construction",
        choices=["pairwise", "cape"],
        default="pairwise",
        help="(default pairwise)",
    )
    parser.add_argument(
        "--delta-summary",
        type=float,
        nargs="?",
        const=1.0,
        default=None,
        metavar="EPS",
        help="each node also releases a Laplace-noised summary of its deltas (mean, SD, "
        "quantiles) at ε = EPS (default 1.0 when given without a value)",
    )
    parser.add_argument(
        "--plan",
        choices=["deltab", "logreg"],
        default="deltab",
        help="deltab: the brain-age model on synthetic cohorts (default); logreg: a logistic "
        "regression by --rounds of federated gradient descent on scikit-learn's bundled "
        "breast-cancer table split non-IID across the nodes",
    )
    parser.add_argument(
        "--rounds", type=int, default=20, help="gradient steps for --plan logreg (default 20)"
    )
    parser.add_argument("--seed", type=int, default=2019, help="synthetic data seed (default 2019)")
    parser.add_argument("--n-features", type=int, default=40, help="features P (default 40)")
    parser.add_argument("--n-components", type=int, default=10, help="components J (default 10)")
    parser.add_argument(
        "--timeout", type=float, default=180.0, help="give up after this many seconds (default 180)"
    )


class DemoError(CommandError):
    """The demo could not run or its session failed; the message says why."""


@dataclass(frozen=True)
class NodeSummary:
    node_id: str
    n_subjects: int
    egress_sigma: dict[str, float]
    outsider_epsilon: float
    clipped: int


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _prepare_out(out: Path) -> None:
    if out.exists():
        if not (out / MARKER).exists() and any(out.iterdir()):
            raise DemoError(
                f"{out} exists and was not made by `zerosum demo`; choose another --out "
                "or remove it"
            )
        shutil.rmtree(out)
    out.mkdir(parents=True)
    (out / MARKER).write_text("made by zerosum demo; removed by the next demo run\n")


def _init_federation(args: argparse.Namespace, node_ids: list[str], port: int) -> Path:
    from zerosum.cli import main

    sizes = ",".join(str(COHORT_SIZES[i % len(COHORT_SIZES)]) for i in range(len(node_ids)))
    argv = [
        "federation",
        "init",
        "--nodes",
        ",".join(node_ids),
        "--out",
        str(args.out),
        "--synthetic",
        "--seed",
        str(args.seed),
        "--cohort-sizes",
        sizes,
        "--coordinator",
        f"127.0.0.1:{port}",
        "--construction",
        args.construction,
        "--n-features",
        str(args.n_features),
        "--n-components",
        str(args.n_components),
        "--join-deadline",
        "60",
        "--round-deadline",
        "60",
        "--force",
    ]
    if args.residual_dp:
        argv.append("--residual-dp")
    if args.plan == "logreg":
        # T + 1 releases compose; this budget admits the default 20 steps at ε = 1 each
        # when no step may be rerun (a demo's shortcut: a real federation keeps the
        # default cap, and its budget check charges every attempt the cap allows).
        argv += ["--plan", "logreg", "--rounds", str(args.rounds), "--epsilon-budget", "8"]
        argv += ["--max-reruns", "0"]
    if args.delta_summary is not None:
        argv += ["--delta-summary", repr(args.delta_summary)]
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
        code = main(argv)
    if code != 0:
        raise DemoError(f"federation init failed: {captured.getvalue().strip()}")
    return Path(args.out) / "federation.toml"


def child_argv(*argv: str) -> list[str]:
    """``python -P -m zerosum.cli ARGV``: a ``zerosum`` child that ignores the current folder.

    ``python -m`` puts the current directory first on ``sys.path``, so a folder
    named ``zerosum``, ``node``, ``noise`` or ``coordinator`` where the demo is
    started (a checkout, a backup, an output folder) would be imported instead
    of the installed packages. ``-P`` (Python 3.11+) leaves it out.
    """
    return [sys.executable, "-P", "-m", "zerosum.cli", *argv]


def child_environment() -> dict[str, str]:
    """The environment of a child: this one, unbuffered, and able to import this zerosum.

    When this process found ``zerosum`` through its own first ``sys.path``
    entry (``python -m zerosum.cli`` run from an uninstalled checkout), ``-P``
    would hide it from the child, so that folder is put on ``PYTHONPATH``;
    an installed ``zerosum`` needs nothing.
    """
    import zerosum

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    root = Path(zerosum.__file__).resolve().parent.parent
    first = Path(sys.path[0] or os.getcwd()).resolve() if sys.path else None
    if not sys.flags.safe_path and first == root:
        inherited = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(root), *inherited])
    return env


def spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ``zerosum ARGV`` as a child process, its output (both streams) in ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    handle = log.open("wb")
    try:
        return subprocess.Popen(
            child_argv(*argv),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=child_environment(),
        )
    finally:
        handle.close()


def _tail(log: Path, lines: int = 6) -> str:
    try:
        text = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return "\n".join("    " + line for line in text[-lines:])


def _run_session(federation: Path, node_ids: list[str], out: Path, timeout: float) -> float:
    logs = out / "logs"
    started = time.monotonic()
    coordinator = spawn(["coordinator", "--federation", str(federation)], logs / "coordinator.log")
    nodes = {
        # The demo has no output checkers: it asks for automatic release explicitly.
        n: spawn(
            ["node", "--federation", str(federation), "--node-id", n, "--approve", "auto"],
            logs / f"{n}.log",
        )
        for n in node_ids
    }
    everyone: dict[str, subprocess.Popen[bytes]] = {"coordinator": coordinator, **nodes}
    done: dict[str, int] = {}
    try:
        while len(done) < len(everyone):
            for name, proc in everyone.items():
                if name not in done and proc.poll() is not None:
                    done[name] = proc.returncode
                    elapsed = time.monotonic() - started
                    print(
                        f"[demo] {name} finished (exit {proc.returncode}) after {elapsed:.1f} s",
                        file=sys.stderr,
                    )
            failed = {n: c for n, c in done.items() if c != 0}
            if failed:
                name = next(iter(failed))
                raise DemoError(
                    f"{name} exited with status {failed[name]}; last lines of its log:\n"
                    + _tail(logs / f"{name}.log")
                )
            if time.monotonic() - started > timeout:
                waiting = sorted(set(everyone) - set(done))
                raise DemoError(
                    f"the session did not finish within {timeout:.0f} s (still running: "
                    f"{', '.join(waiting)}); logs are in {logs}"
                )
            time.sleep(0.1)
    finally:
        for proc in everyone.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in everyone.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return time.monotonic() - started


def _exact_sums(out: Path, node_ids: list[str]) -> tuple[bool, int]:
    """Σ of egress payloads == Σ of audit payloads, bitwise, for every data round."""
    import numpy as np

    from noise.fixed_point import wrapping_sum

    rounds = sorted(
        p.name for p in (out / "nodes" / node_ids[0] / "out" / "egress").glob("round-*")
    )
    checked = 0
    for name in rounds:
        egress, audit = [], []
        for n in node_ids:
            base = out / "nodes" / n / "out"
            e = base / "egress" / name / "payload.npy"
            a = base / "audit" / name / "payload.npy"
            if not (e.exists() and a.exists()):
                break
            egress.append(np.load(e, allow_pickle=False))
            audit.append(np.load(a, allow_pickle=False))
        else:
            if not np.array_equal(wrapping_sum(egress), wrapping_sum(audit)):
                return False, checked
            checked += 1
    return True, checked


def _node_summary(out: Path, node_id: str) -> NodeSummary:
    base = out / "nodes" / node_id / "out"
    # Egress bundles only: a CAPE secure-sum folder holds a note, no manifest.
    manifests = sorted(
        (base / "egress").glob("round-*/manifest.json"),
        key=lambda p: int(p.parent.name.split("-")[1]),
    )
    sigma: dict[str, float] = {}
    outsider = 0.0
    n_subjects = 0
    for path in manifests:
        manifest = json.loads(path.read_text())
        for t in manifest.get("tensors", []):
            sigma[f"{manifest['round_name']}.{t['name']}"] = float(t["sigma"])
        n_subjects = int(manifest.get("sdc", {}).get("n_subjects", n_subjects))
    ledger = json.loads((base / "ledger.json").read_text())
    totals = ledger.get("totals", {})
    for key, value in totals.items():
        if key.startswith("outsider") and isinstance(value, dict):
            outsider = float(value.get("epsilon", outsider))
    clipped = 0
    for folder in (base / "audit").glob("round-*"):
        audit = json.loads((folder / "audit.json").read_text())
        # "total" is the sum of the per-column counts beside it.
        clipped = max(clipped, int(audit.get("clipped", {}).get("total", 0)))
    return NodeSummary(node_id, n_subjects, sigma, outsider, clipped)


def _evaluate(args: argparse.Namespace, node_ids: list[str]) -> dict[str, Any]:
    import numpy as np

    from node.deltab import load_model
    from node.deltab.io import read_table
    from node.deltab.synthetic import make_federation_cohorts

    out: Path = args.out
    models = [load_model(out / "nodes" / n / "out" / "model.json") for n in node_ids]
    holdout = read_table(out / "holdout.csv")
    fed = models[0]
    fed_age = fed.predict_age(holdout.features, _ages(holdout))
    spread = max(
        float(np.max(np.abs(m.predict_age(holdout.features, _ages(holdout)) - fed_age)))
        for m in models
    )
    # Pooled reference: the ordinary estimator fitted in one place on the
    # concatenated cohorts — what a single TRE holding everyone would get.
    from node.deltab import BrainAgeModel
    from node.plans.deltab.plan import plan_settings
    from proto.federation import load_federation

    settings = plan_settings(load_federation(out / "federation.toml"))
    cohorts = [read_table(out / "nodes" / n / "data.csv") for n in node_ids]
    pooled = BrainAgeModel(
        settings.model, n_components=settings.n_components, nan_policy=settings.nan_policy
    ).fit(
        np.vstack([c.features for c in cohorts]),
        np.concatenate([_ages(c) for c in cohorts]),
    )
    pooled_age = pooled.predict_age(holdout.features, _ages(holdout))
    rel = float(np.max(np.abs(fed_age - pooled_age)) / np.max(np.abs(pooled_age)))
    sizes = [COHORT_SIZES[i % len(COHORT_SIZES)] for i in range(len(node_ids))]
    truth = make_federation_cohorts(sizes, args.n_features, args.seed, holdout_size=500).holdout
    ages = _ages(holdout)

    def quality(predicted_age: Any) -> dict[str, float | None]:
        # The delta is what a brain-age model is for, so its correlation with the
        # true delta (which the synthetic truth knows) is the headline. Errors in
        # years cannot judge a model alone: "predicting" chronological age itself
        # (δ̂ = 0) has error 0 against age and only mean |δ| against the true
        # brain age, better than any real fit here, so it is printed beside them.
        delta = predicted_age - ages
        spread = float(np.std(delta))
        return {
            "delta_correlation": (
                float(np.corrcoef(delta, truth.true_delta)[0, 1]) if spread > 0 else None
            ),
            "brain_age_error_years": float(np.mean(np.abs(predicted_age - truth.brain_age))),
            "mae_vs_chronological_age_years": float(np.mean(np.abs(delta))),
        }

    federated = quality(fed_age)
    return {
        "max_relative_difference_vs_pooled": rel,
        "max_difference_between_nodes_years": spread,
        "holdout_subjects": int(ages.size),
        "holdout_federated": federated,
        "holdout_pooled_exact": quality(pooled_age),
        "holdout_chronological_age": quality(ages),
        # Kept under their earlier names for scripts that read them.
        "holdout_mae_years": federated["mae_vs_chronological_age_years"],
        "holdout_delta_correlation": federated["delta_correlation"],
    }


def _ages(table: Any) -> Any:
    if table.age is None:
        raise DemoError(f"{table.path} has no age column")
    return table.age


def run(args: argparse.Namespace) -> int:
    if not 2 <= args.nodes <= 50:
        print(
            f"zerosum demo: error: --nodes must be between 2 and 50; got {args.nodes}",
            file=sys.stderr,
        )
        return 2
    width = len(str(args.nodes))
    node_ids = [f"tre{i + 1:0{width}d}" for i in range(args.nodes)]
    try:
        _prepare_out(args.out)
        port = _free_port()
        print(f"[demo] writing the federation to {args.out}/", file=sys.stderr)
        federation = _init_federation(args, node_ids, port)
        print(
            f"[demo] starting the coordinator on 127.0.0.1:{port} and {args.nodes} nodes "
            "(mutual TLS)",
            file=sys.stderr,
        )
        seconds = _run_session(federation, node_ids, args.out, args.timeout)
        summaries = [_node_summary(args.out, n) for n in node_ids]
        exact, rounds_checked = _exact_sums(args.out, node_ids)
        if args.plan == "logreg":
            return _logreg_result(args, node_ids, seconds, exact, rounds_checked)
        quality = _evaluate(args, node_ids)
        delta_summaries = read_summaries(args.out, node_ids)
    except DemoError as error:
        print(f"zerosum demo: error: {error}", file=sys.stderr)
        return 1
    result: dict[str, Any] = {
        "nodes": [
            {
                "node_id": s.node_id,
                "n_subjects": s.n_subjects,
                "egress_sigma_min": min(s.egress_sigma.values()) if s.egress_sigma else 0.0,
                "egress_sigma_max": max(s.egress_sigma.values()) if s.egress_sigma else 0.0,
                "outsider_epsilon": s.outsider_epsilon,
                "clipped_values": s.clipped,
            }
            for s in summaries
        ],
        "construction": args.construction,
        "residual_dp": args.residual_dp,
        "session_seconds": seconds,
        "payload_sums_equal_audit_sums": exact if not args.residual_dp else None,
        "rounds_checked": rounds_checked,
        **quality,
        "delta_summaries": delta_summaries,
        "out": str(args.out),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_table(result)
    ok = quality["max_relative_difference_vs_pooled"] <= 1e-9 and (args.residual_dp or exact)
    return 0 if ok or args.residual_dp else 1


def _logreg_result(
    args: argparse.Namespace, node_ids: list[str], seconds: float, exact: bool, rounds: int
) -> int:
    from zerosum.commands._demo_logreg import evaluate, print_result

    result = evaluate(args.out, node_ids)
    result |= {
        "session_seconds": seconds,
        "payload_sums_equal_audit_sums": exact if not args.residual_dp else None,
        "rounds_checked": rounds,
        "out": str(args.out),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result, seconds, len(node_ids))
        if not args.residual_dp:
            verdict = "yes" if exact else "NO"
            print(f"Σ noised payloads == Σ un-noised audit payloads, bitwise: {verdict} ({rounds})")
        print(f"outputs: {result['out']}/")
    ok = args.residual_dp or (exact and result["weights_identical_to_nonprivate_fedavg"])
    return 0 if ok else 1


def _print_table(result: dict[str, Any]) -> None:
    print(
        f"zerosum demo: {len(result['nodes'])} TREs, {result['construction']} zero-sum noise, "
        f"residual DP {'on' if result['residual_dp'] else 'off'}; session took "
        f"{result['session_seconds']:.1f} s"
    )
    print()
    print(f"{'node':>8}  {'N':>6}  {'egress σ (min..max)':>22}  {'outsider ε':>10}  {'clipped':>7}")
    for n in result["nodes"]:
        sig = f"{n['egress_sigma_min']:.3g}..{n['egress_sigma_max']:.3g}"
        eps = n["outsider_epsilon"]
        eps_text = "inf" if math.isinf(eps) else f"{eps:.3f}"
        clipped = n["clipped_values"]
        print(f"{n['node_id']:>8}  {n['n_subjects']:>6}  {sig:>22}  {eps_text:>10}  {clipped:>7}")
    print()
    exact = result["payload_sums_equal_audit_sums"]
    if exact is not None:
        verdict = "yes" if exact else "NO"
        print(
            f"Σ noised payloads == Σ un-noised audit payloads, bitwise: {verdict} "
            f"({result['rounds_checked']} round{'s' if result['rounds_checked'] != 1 else ''})"
        )
    rel = result["max_relative_difference_vs_pooled"]
    print(f"federated vs pooled fit, max relative difference: {rel:.2e}")
    columns = (
        result["holdout_federated"],
        result["holdout_pooled_exact"],
        result["holdout_chronological_age"],
    )
    print()
    print(f"holdout ({result['holdout_subjects']} subjects), against the synthetic truth:")
    print(f"  {'':<36}{'federated':>10}{'pooled exact':>14}{'age itself':>12}")
    rows = (
        ("corr(estimated delta, true delta)", "delta_correlation", ".3f"),
        ("|Ŷ − true brain age| (years)", "brain_age_error_years", ".2f"),
        ("|Ŷ − chronological age| (years)", "mae_vs_chronological_age_years", ".2f"),
    )
    for label, key, spec in rows:
        cells = ["—" if c[key] is None else format(c[key], spec) for c in columns]
        print(f"  {label:<36}{cells[0]:>10}{cells[1]:>14}{cells[2]:>12}")
    print(
        "  Only the first row measures the delta. 'age itself' (δ̂ = 0, no model) scores\n"
        "  best in years: a model that loses the delta looks better there, not worse."
    )
    if result["residual_dp"]:
        print(
            "  With residual DP the federated model is noised on purpose; 'pooled exact'\n"
            "  is the fit the same data would give without that noise."
        )
    print_summaries(result["delta_summaries"])
    print(f"outputs: {result['out']}/ (egress bundles under nodes/<id>/out/egress/)")
