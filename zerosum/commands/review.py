"""`zerosum review`: an output checker inspects one egress bundle and signs a decision.

A node run with ``--approve manual`` sends nothing until
``OUT/egress/round-<r>/approval.json`` holds a signed decision on that exact
bundle (node/approval.py), signed with one of the output checker keys that
the federation config pins for that node. This command is the checker's side
of the gate: without a decision it verifies the bundle's checksums and prints
what would leave (per tensor: shape, noise σ, sensitivity; the DP receipt per
observer; the SDC evidence); with ``--approve`` or ``--reject`` it verifies
the bundle again, refuses a key that is not a checker key of the bundle's
node before signing anything, and writes the signed decision. A valid
decision is final; an ``approval.json`` the node refuses (another key, a bad
signature, another bundle) may be replaced with ``--replace``. The node's ``values.csv`` and ACRO's
``results.json`` (for the SACRO viewer) lie in the same folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from node.egress import EgressBundle
    from node.review.decision import DecisionState

DESCRIPTION = """\
Inspect one egress bundle (OUT/egress/round-<r>/ of a node run with
--approve manual) and, with --approve or --reject, sign the decision into its
approval.json with an output checker key of the bundle's node (pinned in
federation.toml; `zerosum federation init` writes checkers/<id>/checker.pem).
Without a decision it only verifies and prints what would leave: each
tensor's shape, noise σ and sensitivity, the DP receipt per observer and the
SDC evidence. A valid decision is never overwritten; an approval.json the
node refuses can be replaced with --replace.
"""

EPILOG = """\
exit status: 0 printed or signed; 2 the bundle, key or arguments are bad, the
key is not a checker key of the bundle's node, or the folder already holds a
valid decision.

examples:
  zerosum review fed/nodes/site-a/out/egress/round-0
  zerosum review fed/nodes/site-a/out/egress/round-0 --approve \\
      --key fed/checkers/site-a/checker.pem --reviewer "J. Smith" --comment "checked"
  zerosum review fed/nodes/site-a/out/egress/round-1 --reject \\
      --key fed/checkers/site-a/checker.pem --reviewer "J. Smith" --comment "N too small"
  zerosum review fed/nodes/site-a/out/egress/round-0 --approve --replace \\
      --key fed/checkers/site-a/checker.pem --reviewer "J. Smith"
"""

_PREFIX = "zerosum review"
CONFIG_NAME = "federation.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("folder", type=Path, help="the egress folder OUT/egress/round-<r>/")
    decision = parser.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="sign an approval")
    decision.add_argument("--reject", action="store_true", help="sign a rejection")
    parser.add_argument(
        "--key", type=Path, default=None, metavar="PEM", help="the reviewer's Ed25519 key (PEM)"
    )
    parser.add_argument(
        "--reviewer", default=None, help="who decides (a name; required with a decision)"
    )
    parser.add_argument("--comment", default="", help="why (stays inside the TRE)")
    parser.add_argument(
        "--replace",
        action="store_true",
        help="replace an approval.json the node refuses (wrong key, bad signature, other bundle)",
    )
    parser.add_argument(
        "--federation",
        type=Path,
        default=None,
        metavar="TOML",
        help=f"the federation config (default: the first {CONFIG_NAME} above the folder)",
    )


def _fail(message: str) -> int:
    print(f"{_PREFIX}: {message}", file=sys.stderr)
    return 2


def _summary(folder: Path, bundle: EgressBundle) -> str:
    lines = [
        f"{folder}: session {bundle.session_id}, round {bundle.round_index} "
        f"({bundle.round_name!r}), node {bundle.node_id}; checksums verified",
        f"  {bundle.payload.size} values in fixed point with {bundle.fixed_point_bits} "
        f"fraction bits; masking: {bundle.masking.construction} ({bundle.masking.graph}), "
        f"{bundle.masking.n_nodes} nodes, collusion threshold "
        f"{bundle.masking.collusion_threshold}, residual noise "
        f"{'on' if bundle.masking.residual_dp else 'off'}",
        f"  SDC: {bundle.sdc.n_subjects} subjects"
        + (
            f", residual degrees of freedom {bundle.sdc.residual_degrees_of_freedom}"
            if bundle.sdc.residual_degrees_of_freedom is not None
            else ""
        ),
        "",
        f"  {'tensor':<12} {'shape':<14} {'noise σ':>12} {'sensitivity':>12}",
    ]
    for t in bundle.tensors:
        shape = "×".join(str(n) for n in t.shape) or "scalar"
        lines.append(f"  {t.name:<12} {shape:<14} {t.sigma:>12.4g} {t.sensitivity:>12.4g}")
    lines += ["", f"  DP receipt ({bundle.dp.mechanism}, δ = {bundle.dp.delta:g}):"]
    totals = {(t.observer, t.coalition_size): t for t in bundle.dp.cumulative}
    for release in bundle.dp.release:
        who = release.observer + (f" + {release.coalition_size}" if release.coalition_size else "")
        line = f"    {who:<24} this release ε = {release.epsilon:.4g}"
        total = totals.get((release.observer, release.coalition_size))
        if total is not None:
            line += (
                f"; with the ledger's {bundle.dp.releases_in_ledger} release(s) "
                f"ε = {total.epsilon:.4g}"
            )
        lines.append(line)
    for note in bundle.sdc.notes:
        lines.append(f"  note: {note}")
    return "\n".join(lines) + "\n"


def _decide(
    args: argparse.Namespace,
    folder: Path,
    bundle: EgressBundle,
    keys: dict[bytes, str],
    state: DecisionState,
) -> int:
    """Sign and write the decision; every refusal happens before anything is signed."""
    from node.approval import sign_approval, write_approval
    from node.egress import EgressBundle
    from noise.errors import NoiseError
    from noise.keys import IdentityKey, key_fingerprint

    if args.key is None or not args.reviewer:
        return _fail("a decision needs --key (the checker's Ed25519 PEM) and --reviewer (a name)")
    try:
        identity = IdentityKey.read_pem(args.key)
    except (NoiseError, ValueError, OSError) as error:
        return _fail(f"cannot read the key {args.key}: {error}")
    if identity.public_bytes() not in keys:
        listed = ", ".join(key_fingerprint(k) for k in keys) or "none"
        return _fail(
            f"the key {args.key} (fingerprint {key_fingerprint(identity.public_bytes())}) is not "
            f"an output checker key of node {bundle.node_id!r} (its checker keys: {listed}); "
            "nothing was signed"
        )
    if state.state == "refused" and not args.replace:
        return _fail(
            f"{folder}/approval.json is not a valid decision ({state.reason}); add --replace "
            "to replace it with your signed decision"
        )
    decision: Literal["approve", "reject"] = "approve" if args.approve else "reject"
    approval = sign_approval(
        identity,
        EgressBundle.manifest_sha256(folder),
        decision,
        reviewer=args.reviewer,
        comment=args.comment,
    )
    path = write_approval(folder, approval)
    replaced = " (replacing the refused file)" if state.state == "refused" else ""
    print(f"  {decision} signed by {args.reviewer}{replaced} → {path}")
    return 0


def run(args: argparse.Namespace) -> int:
    from node.egress import EgressBundle, EgressError, EgressIntegrityError
    from node.review.decision import (
        ReviewKeyError,
        checker_keys,
        current_decision,
        federation_for,
    )

    folder: Path = args.folder
    deciding = bool(args.approve or args.reject)
    if not (folder / "manifest.json").is_file():
        return _fail(f"{folder} holds no manifest.json; it is not an egress folder")
    try:
        bundle = EgressBundle.verify(folder)
    except (EgressError, EgressIntegrityError, ValueError, OSError) as error:
        return _fail(f"{folder} does not verify, so nothing may be signed for it: {error}")
    print(_summary(folder, bundle), end="")
    try:
        found = federation_for(folder, bundle, args.federation)
    except ReviewKeyError as error:
        return _fail(str(error))
    if found is None:
        if deciding:
            return _fail(
                f"no {CONFIG_NAME} found above {folder}; pass the federation config with "
                "--federation so the node's checker keys are known"
            )
        print(f"  no {CONFIG_NAME} found: checker keys and ε caps not checked (see --federation)")
        return 0
    config, _ = found
    keys = checker_keys(config, bundle.node_id)
    state = current_decision(folder, keys)
    if state.state == "valid" and state.approval is not None:
        existing = state.approval
        print(
            f"  decided already: {existing.decision} by {existing.reviewer} at {existing.timestamp}"
        )
        if deciding:
            return _fail(f"{folder} already holds a valid decision; it is final and is left alone")
        return 0
    if state.state == "refused":
        print(
            f"  approval.json is refused: {state.reason}; the node will not act on it — an "
            "output checker of this node may replace it (--approve|--reject --replace)"
        )
    if not deciding:
        if state.state == "none":
            print("  no decision yet: add --approve or --reject with --key and --reviewer")
        return 0
    return _decide(args, folder, bundle, keys, state)
