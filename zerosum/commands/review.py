"""`zerosum review`: an output checker inspects one egress bundle and signs a decision.

A node run with ``--approve manual`` sends nothing until
``OUT/egress/round-<r>/approval.json`` holds a signed decision on that exact
bundle (node/approval.py). This command is the checker's side of the gate:
without a decision it verifies the bundle's checksums and prints what would
leave (per tensor: shape, noise σ, sensitivity; the DP receipt per observer;
the SDC evidence); with ``--approve`` or ``--reject`` it verifies the bundle
again and writes the signed decision. A decision is final: a folder that
already holds one is left alone. The node's ``values.csv`` and ACRO's
``results.json`` (for the SACRO viewer) lie in the same folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from node.egress import EgressBundle

DESCRIPTION = """\
Inspect one egress bundle (OUT/egress/round-<r>/ of a node run with
--approve manual) and, with --approve or --reject, sign the decision into its
approval.json with a reviewer key the node accepts (today: the node's identity
key, nodes/<id>/identity.pem). Without a decision it only verifies and prints
what would leave: each tensor's shape, noise σ and sensitivity, the DP receipt
per observer and the SDC evidence. A folder that already holds a decision is
never overwritten.
"""

EPILOG = """\
exit status: 0 printed or signed; 2 the bundle, key or arguments are bad, or
the folder already holds a decision.

examples:
  zerosum review fed/nodes/site-a/out/egress/round-0
  zerosum review fed/nodes/site-a/out/egress/round-0 --approve \\
      --key fed/nodes/site-a/identity.pem --reviewer "J. Smith" --comment "checked"
  zerosum review fed/nodes/site-a/out/egress/round-1 --reject \\
      --key fed/nodes/site-a/identity.pem --reviewer "J. Smith" --comment "N too small"
"""

_PREFIX = "zerosum review"


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


def run(args: argparse.Namespace) -> int:
    from node.approval import read_approval, sign_approval, write_approval
    from node.egress import EgressBundle, EgressError, EgressIntegrityError
    from noise.errors import NoiseError
    from noise.keys import IdentityKey

    folder: Path = args.folder
    if not (folder / "manifest.json").is_file():
        return _fail(f"{folder} holds no manifest.json; it is not an egress folder")
    try:
        summary = _summary(folder, EgressBundle.verify(folder))
    except (EgressError, EgressIntegrityError, ValueError, OSError) as error:
        return _fail(f"{folder} does not verify, so nothing may be signed for it: {error}")
    print(summary, end="")
    try:
        existing = read_approval(folder)
    except ValueError as error:
        return _fail(f"{folder}/approval.json cannot be read: {error}")
    if existing is not None:
        print(
            f"  decided already: {existing.decision} by {existing.reviewer} at {existing.timestamp}"
        )
        if args.approve or args.reject:
            return _fail(f"{folder} already holds a decision; it is final and is left alone")
        return 0
    if not (args.approve or args.reject):
        print("  no decision yet: add --approve or --reject with --key and --reviewer")
        return 0
    if args.key is None or not args.reviewer:
        return _fail("a decision needs --key (the reviewer's Ed25519 PEM) and --reviewer (a name)")
    try:
        identity = IdentityKey.read_pem(args.key)
    except (NoiseError, ValueError, OSError) as error:
        return _fail(f"cannot read the key {args.key}: {error}")
    decision: Literal["approve", "reject"] = "approve" if args.approve else "reject"
    approval = sign_approval(
        identity,
        EgressBundle.manifest_sha256(folder),
        decision,
        reviewer=args.reviewer,
        comment=args.comment,
    )
    path = write_approval(folder, approval)
    print(f"  {decision} signed by {args.reviewer} → {path}")
    return 0
