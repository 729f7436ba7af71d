"""`zerosum node`: run one TRE's side of a federated session."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.runner import NodeRunner

DESCRIPTION = """\
Run this TRE's node for one session: join the coordinator with a fresh signed
session key, verify every other node's key against the federation config, then
for each round compute the local sums, add the zero-sum noise, write the egress
bundle (OUT/egress/round-<r>/) and its un-noised audit record (OUT/audit/, never
sent), wait for approval, upload, and combine the exact aggregate. At the end it
writes OUT/model.json and OUT/predictions.csv (id, age, brain_age, delta of this
node's subjects).

The state folder STATE (--state; keep the same one for every session of this
node) outlives OUT: STATE/ledger.json is the node's one privacy ledger across all
its sessions, and privacy.epsilon_budget caps its total against every observer
class the policy bounds (an outsider; an outsider with up to T colluding nodes;
with residual noise also the coordinator and the coordinator with up to T
nodes). Before its first release in a session the node adds up the whole
session's cost and refuses to start (exit 1, nothing sent) if any class would
pass the budget. STATE/sessions.json records every session the node has taken
part in (id, config hash, session key, OUT, when, how far it got); a session id
recorded there is refused, since a coordinator that reuses one is replaying that
session, unless this node resumes it with the key saved in OUT. OUT/ledger.json
is a copy of the ledger for the session's record; a ledger kept in OUT by an
older version is imported into STATE once.

Before joining, the node runs its pre-flight inside the TRE: it prints how many
subjects it read and how many the missing-value policy leaves, and the share of
them clipped to the public bounds for age and every feature (by name); it
refuses to start (exit 2, one sentence per problem) when a feature is clipped
for more than plan.clipping.max_clipped_fraction of the subjects or fewer than
min_cohort_size are left. --check runs everything local (config, keys,
certificates, cohort and pre-flight, listing every feature), prints it and
stops: exit 0 when the node could start, 2 when it would refuse.

By default (--approve manual) the node waits for
OUT/egress/round-<r>/approval.json signed by one of this node's output checker
keys (pinned in its [[nodes]] entry) before anything is sent. --approve auto
releases each egress without a checker (for the demo and tests only); the mode
is written into every bundle's manifest and shown by `zerosum review`.

After a crash (kill, power loss, TRE VM restart) run the same command again: the
node rejoins the same session with the key it saved in OUT/session.key (mode
0600, deleted once the session is over), takes in the rounds aggregated
meanwhile, and resubmits the egress bundle already written for the current round
exactly as it is (after approval if it had none), never a recomputed one; the
ledger records each release once (the same payload of the same round is one
release; different bytes would be a second). Under the CAPE construction the node also
saved its private CAPE draws, the secure sums and its residual noise in
OUT/audit/cape-<round>/ (mode 0600, deleted with the session key), and sends
its CAPE-sum share again from them, checked against the digest noted in
OUT/egress/round-<r>/cape-sum.json; if that material is missing or damaged for
a round it already sent, it stops rather than draw afresh.

--status prints, from the state folder alone (no network, nothing written):
the sessions this node took part in and how far each got, its releases, per
observer class the ε used and left of privacy.epsilon_budget (and which class
binds), the last failure (STATE/last-failure.json, also one before joining),
and whether a node process runs on the folder now.

exit status: 0 success; 1 the session failed or this node refused (the reason is
printed); 2 bad local input (data, config or key files) found before contacting
anyone.
"""

# The gRPC C core's level (zerosum.cli): the node says what failed in its own words.
GRPC_VERBOSITY = "ERROR"
# Printed after "interrupted" on Ctrl-C (zerosum.cli).
RESUME_HINT = (
    "run the same command again to resume: the node rejoins its session with the key saved "
    "in OUT and sends nothing twice"
)

EPILOG = """\
examples:
  zerosum node --federation fed/federation.toml --node-id site-a --check
  zerosum node --federation fed/federation.toml --node-id site-a
  zerosum node --federation fed --node-id site-b --data site-b.csv --out out-b
  zerosum node --federation fed --node-id site-b --out runs/2026-03 --state /tre/zerosum-state
  zerosum node --federation fed --node-id site-b --state /tre/zerosum-state --status
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--federation",
        required=True,
        type=Path,
        metavar="F",
        help="the federation.toml file, or the folder holding it",
    )
    parser.add_argument("--node-id", required=True, help="this node's id in the federation")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="CSV",
        help="the cohort (id, age, features); default: the federation folder's nodes/<id>/data.csv",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output folder of this session; default: the federation folder's nodes/<id>/out",
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=None,
        metavar="DIR",
        help="the node's state folder, kept across sessions (its privacy ledger and the "
        "record of its sessions); default: the federation folder's nodes/<id>/state",
    )
    parser.add_argument(
        "--approve",
        choices=["auto", "manual"],
        default="manual",
        help="wait for an output checker's signed approval.json before each egress leaves "
        "(manual, the default), or release without one (auto: demo and tests only)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="check everything local (config, keys, certificates, the cohort against the "
        "bounds), print the pre-flight and stop: exit 0 if the node could start, 2 if not",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="print this node's sessions, releases, budget used and left per observer class "
        "and last failure from its state folder, and exit (offline, read-only)",
    )
    parser.add_argument("--json", action="store_true", help="with --status: print it as JSON")
    parser.add_argument(
        "--coordinator",
        default=None,
        metavar="HOST:PORT",
        help="connect here instead of the config's coordinator_address",
    )


def run(args: argparse.Namespace) -> int:
    prefix = f"zerosum node {args.node_id}"
    if args.status:  # offline: before anything that loads grpc
        return _status(args, prefix)
    if args.json:
        print(f"{prefix}: --json goes with --status", file=sys.stderr)
        return 2
    # Imported here so `zerosum --help` and --status never load grpc.
    from node.runner import NodeOptions, NodeRunner

    runner = NodeRunner(
        args.federation,
        args.node_id,
        data=args.data,
        out=args.out,
        state=args.state,
        options=NodeOptions(approve=args.approve, address=args.coordinator),
    )
    refused = _prepare(runner, prefix, verbose=args.check)
    if refused is not None:
        return refused
    if args.check:
        print(f"{prefix}: pre-flight passed; the node can join a session", file=sys.stderr)
        return 0
    return _session(runner, prefix)


def _prepare(runner: NodeRunner, prefix: str, *, verbose: bool) -> int | None:
    """The local checks before any contact: None when they pass, else the exit status (2)."""
    from node.errors import NodeError, PreflightRefused

    try:
        runner.prepare(verbose=verbose)
    except PreflightRefused as error:
        for problem in error.problems:
            print(f"{prefix}: refused: {problem}", file=sys.stderr)
        return 2
    except NodeError as error:
        print(f"{prefix}: {_sentence(error)}", file=sys.stderr)
        return 2
    return None


def _session(runner: NodeRunner, prefix: str) -> int:
    """Take part in the session: 0 completed, 1 stopped or failed, 2 bad local setup."""
    from node.errors import ApprovalRejected, NodeError, SetupError
    from noise.errors import NoiseError

    try:
        outcome = runner.run()
    except ApprovalRejected as error:
        print(f"{prefix}: stopped: {error}", file=sys.stderr)
        return 1
    except SetupError as error:
        print(f"{prefix}: {_sentence(error)}", file=sys.stderr)
        return 2
    except (NodeError, NoiseError, OSError) as error:
        print(f"{prefix}: failed: {_sentence(error)}", file=sys.stderr)
        return 1
    print(f"{prefix}: session {outcome.session_id} completed", file=sys.stderr)
    return 0


def _status(args: argparse.Namespace, prefix: str) -> int:
    """``--status``: read the state folder and print it (no grpc, no network)."""
    import json

    from node.errors import NodeError
    from proto.federation import ConfigError, load_federation
    from zerosum.commands._node_status import read_node_status, render_node_status

    path = args.federation / "federation.toml" if args.federation.is_dir() else args.federation
    try:
        config = load_federation(path)
        config.node(args.node_id)
    except (ConfigError, OSError, KeyError) as error:
        print(f"{prefix}: {_sentence(error)}", file=sys.stderr)
        return 2
    base = config.base_dir or path.resolve().parent
    state = args.state or base / "nodes" / args.node_id / "state"
    try:
        status = read_node_status(config, args.node_id, state)
    except (NodeError, OSError) as error:
        print(f"{prefix}: {_sentence(error)}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(status, indent=2, ensure_ascii=False))
    else:
        print(render_node_status(status), end="")
    return 0


def _sentence(error: BaseException) -> str:
    if isinstance(error, KeyError) and error.args:
        return str(error.args[0])
    if isinstance(error, FileNotFoundError) and error.filename:
        return f"{error.filename} does not exist"
    return str(error)
