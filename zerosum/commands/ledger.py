"""`zerosum ledger`: what a node's data has disclosed so far, and what its budget leaves.

Reads a node's privacy ledger (node/records/ledger.py, through ``PrivacyLedger``'s
public API only) without changing it, and prints every release (μ and ε per
observer class), every unmask answer (what was revealed to whom, and the
release's μ afterwards), every refusal, then per observer class the composed
μ-GDP total (μ = √Σ μ_r², Dong, Roth & Su 2022, Corollary 3.3) and its ε at
the federation's δ (Balle & Wang 2018), beside the caps of the federation
config: ``privacy.epsilon`` per release and ``privacy.epsilon_budget`` for
the total, which a node checks before each session against every observer
class the policy bounds (``node.egress.budget.checked``): for each of them the ε
used and what is left, and which class binds (the least left; the one a next
session's refusal would name).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from node.records.ledger import LedgerEntry, PrivacyLedger
    from proto.federation import FederationConfig

DESCRIPTION = """\
Print a node's privacy ledger: its releases, unmask answers and refusals, and
per observer class the composed ε, with the federation's caps (ε per release,
the ε budget) and, for every class the budget holds, ε used and left; the class
with the least left binds. Read-only.
"""

EPILOG = """\
exit status: 0 printed; 2 the config or the ledger cannot be read.

examples:
  zerosum ledger --federation fed/federation.toml --node-id site-a
  zerosum ledger --federation fed/federation.toml --node-id site-a --ledger out-a/ledger.json --json
"""

_PREFIX = "zerosum ledger"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("--federation", type=Path, required=True, help="federation.toml")
    parser.add_argument("--node-id", required=True, help="the node whose ledger this is")
    parser.add_argument(
        "--ledger",
        type=Path,
        default=None,
        metavar="FILE",
        help="the ledger file (default: nodes/<id>/state/ledger.json beside the config)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _num(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.4g}"


def _json_num(value: float) -> float | str:
    return "inf" if math.isinf(value) else value


def _mu_text(mu: dict[str, float], delta: float) -> str:
    from noise.accounting import gaussian_epsilon

    return ", ".join(
        f"{label} μ {_num(m)} (ε {_num(gaussian_epsilon(m, delta))})" for label, m in mu.items()
    )


def budget_left(
    ledger: PrivacyLedger, config: FederationConfig
) -> tuple[dict[str, float], str | None]:
    """ε left of the budget per observer class held to it, and the class that binds.

    The binding class is the one with the least left (None before any
    release: every class has the whole budget). Classes the policy does not
    bound (the coordinator without residual noise) have no entry.
    """
    from node.egress.budget import checked

    privacy = config.privacy
    left = {
        total.label: max(0.0, privacy.epsilon_budget - total.epsilon)
        for total in ledger.totals()
        if checked(total.label, privacy.residual_dp)
    }
    binding = min(left, key=lambda label: left[label]) if left else None
    return left, binding


def summary(ledger: PrivacyLedger, config: FederationConfig) -> dict[str, Any]:
    """The ledger's events and totals with the config's caps, as JSON-ready data."""
    privacy = config.privacy
    # Each event as the ledger file writes it (node.records.ledger_entry).
    events = [e.to_json() for e in ledger.entries]
    totals = []
    left, binding = budget_left(ledger, config)
    for total in ledger.totals():
        row: dict[str, Any] = {
            "observer": total.label,
            "releases": total.releases,
            "mu": _json_num(total.mu),
            "epsilon": _json_num(total.epsilon),
            "laplace_epsilon": total.laplace_epsilon,
            "delta": total.delta,
        }
        if total.label in left:
            row["budget"] = privacy.epsilon_budget
            row["used"] = _json_num(total.epsilon)
            row["left"] = left[total.label]
            row["binds"] = total.label == binding
        totals.append(row)
    return {
        "node_id": ledger.node_id,
        "ledger": str(ledger.path),
        "delta": ledger.delta,
        "epsilon_per_release_cap": privacy.epsilon,
        "epsilon_budget": privacy.epsilon_budget,
        "binding_class": binding,
        "events": events,
        "totals": totals,
    }


def _event_line(entry: LedgerEntry, delta: float) -> str:
    from node.records.ledger import LaplaceRelease, Release, SecureSumUnmask, UnmaskReveal

    where = f"session {entry.session_id} round {entry.round_index} ({entry.round_name!r})"
    if isinstance(entry, Release):
        return f"    release  {where} at {entry.timestamp}: {_mu_text(dict(entry.mu), delta)}"
    if isinstance(entry, LaplaceRelease):
        return (
            f"    laplace  {where} at {entry.timestamp}: ε {_num(entry.epsilon)} "
            "(pure ε-DP, seen by every observer class)"
        )
    revealed = (
        f"dropped {', '.join(entry.dropped) or '-'}; survivors {', '.join(entry.survivors) or '-'}"
    )
    if isinstance(entry, SecureSumUnmask):
        return f"    unmask   {where}: secure-sum pads revealed ({revealed}); no cost of its own"
    if isinstance(entry, UnmaskReveal):
        return f"    unmask   {where}: pair terms revealed ({revealed}); the release is now " + (
            _mu_text(dict(entry.mu), delta)
        )
    return f"    refusal  {where} ({revealed}): {entry.reason}"


def _text(ledger: PrivacyLedger, config: FederationConfig) -> str:
    privacy = config.privacy
    entries = ledger.entries
    lines = [
        f"privacy ledger of node {ledger.node_id!r}: {ledger.path} ({len(entries)} entries; "
        f"totals at δ = {ledger.delta:g})",
        f"  caps: ε ≤ {privacy.epsilon:g} per release; ε budget {privacy.epsilon_budget:g} "
        "against every observer class it holds (privacy.epsilon_budget)",
        "",
        "  events:",
    ]
    lines += [_event_line(e, ledger.delta) for e in entries] or ["    none yet"]
    lines += [
        "",
        f"  composed per observer class (μ-GDP, δ = {ledger.delta:g}; ε includes Σ ε of the "
        "Laplace releases):",
    ]
    totals = ledger.totals()
    left, binding = budget_left(ledger, config)
    for total in totals:
        line = (
            f"    {total.label:<14} {total.releases} release(s)  μ {_num(total.mu):>8}  "
            f"ε {_num(total.epsilon):>8}"
        )
        if total.label in left:
            line += (
                f"  used {_num(total.epsilon)} of the budget {privacy.epsilon_budget:g}: "
                f"{left[total.label]:.4g} left"
            )
            if total.label == binding:
                line += "  <- binds"
        elif math.isinf(total.mu):
            line += "  (unbounded: this observer learns an exact sum; no budget applies)"
        lines.append(line)
    if not totals:
        lines.append(
            f"    nothing released yet: the whole budget {privacy.epsilon_budget:g} is left"
        )
    elif binding is not None:
        from node.egress.budget import describe

        lines += [
            "",
            f"  the budget binds against {describe(binding)} ({binding}): "
            f"{left[binding]:.4g} of {privacy.epsilon_budget:g} left; a session costing more "
            "is refused before it releases anything",
        ]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    from node.errors import LedgerError
    from node.records.ledger import PrivacyLedger
    from proto.federation import ConfigError, load_federation

    try:
        config = load_federation(args.federation)
    except (ConfigError, OSError) as error:
        print(f"{_PREFIX}: cannot read {args.federation}: {error}", file=sys.stderr)
        return 2
    if args.node_id not in config.node_ids:
        print(
            f"{_PREFIX}: node {args.node_id!r} is not part of federation "
            f"{config.federation_id!r} ({', '.join(config.node_ids)})",
            file=sys.stderr,
        )
        return 2
    path = args.ledger
    if path is None:
        path = args.federation.parent / "nodes" / args.node_id / "state" / "ledger.json"
    if not path.is_file():
        print(f"{_PREFIX}: no ledger at {path} (pass --ledger FILE)", file=sys.stderr)
        return 2
    try:
        ledger = PrivacyLedger.open(path, args.node_id, config.privacy.delta)
    except (LedgerError, OSError) as error:
        print(f"{_PREFIX}: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary(ledger, config), indent=2, ensure_ascii=False))
    else:
        print(_text(ledger, config), end="")
    return 0
