"""`zerosum review`: an output checker re-checks one egress bundle and signs a decision.

A node run with ``--approve manual`` sends nothing until
``OUT/egress/round-<r>/approval.json`` holds a signed decision on that exact
bundle (node/egress/approval.py), signed with one of the output checker keys that
the federation config pins for that node. This command is the checker's side
of the gate. Without a decision it is read-only: it runs every check of
``node.review`` (files and checksums, schema against the config, SDC
thresholds, ε recomputed from σ and sensitivity against the receipt and the
caps, and with ``--audit`` a χ² test that the declared noise is there), prints
them with the bundle's figures (or ``--json``, and ``--html FILE``), and
exits 0 (pass), 1 (needs a human look) or 2 (fail). With ``--approve`` or
``--reject`` it also refuses a key that is not a checker key of the bundle's
node before signing anything, never approves a bundle that fails, and writes
the signed decision. A valid decision is final; an ``approval.json`` the node
refuses (another key, a bad signature, another bundle) may be replaced with
``--replace``. For a checker under another account or on another machine,
``--export DIR`` (the node's operator) copies the verified bundle to a folder
others can read, and ``--import-decision FILE`` takes the decision the
checker signed on that copy back in, verified against the node's own bundle.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from node.plans.deltab.summary_review import SummaryReview
    from node.review.decision import DecisionState
    from node.review.report import Review

DESCRIPTION = """\
Re-check one egress bundle (OUT/egress/round-<r>/ of a node run with
--approve manual): every listed file and its SHA-256 (and no unlisted file),
the manifest and results.json schema against federation.toml, N and the
residual degrees of freedom against ACRO's SDC thresholds (or --sdc), every ε
recomputed from σ and sensitivity against the DP receipt and the config's
caps, and with --audit a χ² test per tensor that the egress carries noise of
the declared scale. Read-only unless --approve or --reject: then it signs the
decision into approval.json with an output checker key of the bundle's node
(pinned in federation.toml; `zerosum federation init` writes
checkers/<id>/checker.pem). A valid decision is never overwritten; an
approval.json the node refuses can be replaced with --replace.
"""

EPILOG = """\
With --approve, --reject, --export or --import-decision it prints the
review's verdict in one line, what it did, and last "decision: ... (exit N)"
with the command's exit status.

exit status: 0 every check passes (or the decision was signed, the bundle
exported, the decision imported); 1 something needs a human look (the reason
is named); 2 a check fails, or the bundle, key or arguments are bad, the key
is not a checker key of the bundle's node, or the folder already holds a
valid decision.

the airlock, when the checker works under another account or on another
machine (docs/output-checking.md):
  (node's operator)  zerosum review OUT/egress/round-0 --export /exchange/round-0
  (checker)          cp -r /exchange/round-0 round-0
                     zerosum review round-0 --federation kit/federation.toml --approve \\
                         --key kit/checkers/site-a/checker.pem --reviewer "J. Smith"
  (node's operator)  zerosum review OUT/egress/round-0 --import-decision round-0/approval.json

examples:
  zerosum review fed/nodes/site-a/out/egress/round-0
  zerosum review fed/nodes/site-a/out/egress/round-0 --audit fed/nodes/site-a/out/audit/round-0
  zerosum review fed/nodes/site-a/out/egress/round-0 --json --html review.html
  zerosum review fed/nodes/site-a/out/egress/round-0 --approve \\
      --key fed/checkers/site-a/checker.pem --reviewer "J. Smith" --comment "checked"
  zerosum review fed/nodes/site-a/out/egress/round-1 --reject \\
      --key fed/checkers/site-a/checker.pem --reviewer "J. Smith" --comment "N too small"
  zerosum review fed/nodes/site-a/out/egress/round-0 --approve --replace \\
      --key fed/checkers/site-a/checker.pem --reviewer "J. Smith"
"""

_PREFIX = "zerosum review"
CONFIG_NAME = "federation.toml"
_INTEGRITY = ("files", "integrity")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument("folder", type=Path, help="the egress folder OUT/egress/round-<r>/")
    decision = parser.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="sign an approval")
    decision.add_argument("--reject", action="store_true", help="sign a rejection")
    decision.add_argument(
        "--export",
        type=Path,
        default=None,
        metavar="DIR",
        help="(the node's operator) copy the verified bundle, without approval.json, to a new "
        "folder DIR readable by others, for an output checker to take away",
    )
    decision.add_argument(
        "--import-decision",
        type=Path,
        default=None,
        metavar="FILE",
        help="(the node's operator) take in an approval.json the checker signed on a copy: "
        "verified against this bundle and the node's checker keys, then written into it",
    )
    parser.add_argument(
        "--key",
        type=Path,
        default=None,
        metavar="PEM",
        help="the output checker's Ed25519 key (PEM, e.g. checkers/<id>/checker.pem)",
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
        "--audit",
        type=Path,
        default=None,
        metavar="DIR",
        help="the node's audit record (OUT/audit/round-<r>/, or OUT): test that the declared "
        "noise is really there",
    )
    parser.add_argument(
        "--sdc",
        type=Path,
        default=None,
        metavar="FILE",
        help="SDC thresholds in ACRO's format (safe_threshold, safe_dof_threshold; "
        "default ACRO's own)",
    )
    parser.add_argument("--json", action="store_true", help="print the review as JSON")
    parser.add_argument(
        "--values", action="store_true", help="print every released value (default: 3 a tensor)"
    )
    parser.add_argument(
        "--html", type=Path, default=None, metavar="FILE", help="also write the review as HTML"
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


def _decide(
    args: argparse.Namespace,
    folder: Path,
    node_id: str,
    keys: dict[bytes, str],
    state: DecisionState,
) -> int:
    """Sign and write the decision; every refusal happens before anything is signed."""
    from bounded.files import KIB, read_secret
    from node.egress.approval import sign_approval, write_approval
    from node.egress.bundle import EgressBundle
    from noise.errors import NoiseError
    from noise.keys import IdentityKey, key_fingerprint

    if args.key is None or not args.reviewer:
        return _refuse(
            args, "a decision needs --key (the checker's Ed25519 PEM) and --reviewer (a name)"
        )
    try:
        identity = IdentityKey.from_pem(read_secret(args.key, 16 * KIB, what="checker key"))
    except (NoiseError, OSError) as error:  # KeyFormatError; LocalFileError
        return _refuse(args, f"cannot read the key {args.key}: {error}")
    if identity.public_bytes() not in keys:
        listed = ", ".join(key_fingerprint(k) for k in keys) or "none"
        return _refuse(
            args,
            f"the key {args.key} (fingerprint {key_fingerprint(identity.public_bytes())}) is not "
            f"an output checker key of node {node_id!r} (its checker keys: {listed}); "
            "nothing was signed",
        )
    if state.state == "refused" and not args.replace:
        return _refuse(
            args,
            f"{folder}/approval.json is not a valid decision ({state.reason}); add --replace "
            "to replace it with your signed decision",
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
    _say(args, f"  {decision} signed by {args.reviewer}{replaced} → {path}")
    _say(args, f"decision: {decision} written (exit 0)")
    return 0


def _show(args: argparse.Namespace, review: Review, *, full: bool) -> None:
    from node.review.render import review_html, review_json, review_text

    if args.json:
        print(json.dumps(review_json(review), indent=2, ensure_ascii=False))
    elif full:
        print(review_text(review, all_values=args.values), end="")
    if args.html is not None:
        args.html.write_text(review_html(review), encoding="utf-8")
        _say(args, f"  report written to {args.html}")


def _say(args: argparse.Namespace, line: str) -> None:
    """Decision messages: on stdout, or on stderr when stdout carries JSON."""
    print(line, file=sys.stderr if args.json else sys.stdout)


def run(args: argparse.Namespace) -> int:
    from node.plans.deltab.summary_bundle import SummaryBundle
    from node.review.report import review_bundle
    from node.review.sdc import ACRO_DEFAULTS, SDCFileError, read_sdc_file

    folder: Path = args.folder
    deciding = bool(args.approve or args.reject)
    acting = deciding or args.export is not None or args.import_decision is not None
    problem = _folder_problem(folder)
    if problem is not None:
        return _fail(problem)
    try:
        thresholds = ACRO_DEFAULTS if args.sdc is None else read_sdc_file(args.sdc)
    except SDCFileError as error:
        return _fail(str(error))
    review: Review | SummaryReview
    if SummaryBundle.is_summary(folder):
        review = _show_summary(args, folder, thresholds, full=not acting)
    else:
        review = review_bundle(
            folder, federation=args.federation, thresholds=thresholds, audit=args.audit
        )
        _show(args, review, full=not acting)
    if not acting:
        return review.exit_code
    return _act(args, folder, review)


def _folder_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be reviewed here (unreadable, or no egress folder), or None."""
    try:
        is_bundle = (folder / "manifest.json").is_file()
    except PermissionError:
        return (
            f"{folder} is not readable from this account (the node's files are private to its "
            "own); the node's operator can export a copy for review with "
            f"`zerosum review {folder} --export DIR`"
        )
    return None if is_bundle else f"{folder} holds no manifest.json; it is not an egress folder"


def _act(args: argparse.Namespace, folder: Path, review: Review | SummaryReview) -> int:
    """--export, --import-decision, --approve or --reject, once the review has been made."""
    # Acting: the full report is what the read-only review is for; here one line of it,
    # what was done, and a last line whose exit status is the command's.
    _say(
        args,
        f"{folder}: review verdict {review.verdict} (the full report: run without this option)",
    )
    if args.export is not None:
        return _export(args, folder, review)
    refusal = _why_no_decision(args, folder, review)
    if refusal is not None:
        return _refuse(args, refusal)
    if args.import_decision is not None:
        return _import(args, folder, review, review.decision)
    assert review.bundle is not None  # _why_no_decision refuses an unreadable bundle
    return _decide(args, folder, review.bundle.node_id, dict(review.keys), review.decision)


def _why_no_decision(
    args: argparse.Namespace, folder: Path, review: Review | SummaryReview
) -> str | None:
    """Why no decision may be signed or imported for ``folder``, or None when one may."""
    broken = [f for f in review.findings if f.level == "fail" and f.check in _INTEGRITY]
    if review.bundle is None or broken:
        reason = broken[0].message if broken else "it cannot be read"
        return f"{folder} does not verify, so nothing may be signed for it: {reason}"
    if review.config is None:
        config_fault = [
            f.message for f in review.findings if f.check == "config" and f.level == "fail"
        ]
        if config_fault:
            return config_fault[0]
        return (
            f"no {CONFIG_NAME} found above {folder}; pass the federation config with "
            "--federation so the node's checker keys are known"
        )
    if review.decision.state == "valid":
        return f"{folder} already holds a valid decision; it is final and is left alone"
    if args.import_decision is None and args.approve and review.exit_code == 2:
        failed = next(f for f in review.findings if f.level == "fail")
        return (
            f"{folder} fails the review ({failed.check}: {failed.message}); an approval is not "
            "signed (a rejection may be)"
        )
    return None


def _refuse(args: argparse.Namespace, message: str) -> int:
    """A refused action: the reason on stderr, and the last line saying nothing was written."""
    _fail(message)
    _say(args, "decision: none written (exit 2)")
    return 2


def _export(args: argparse.Namespace, folder: Path, review: Review | SummaryReview) -> int:
    """Copy a verified bundle (without approval.json) to a new folder its checker can take away.

    The node's own files are private to its account (mode 0600); the copy is
    readable by others (files 0644, folders 0755) so that an output checker
    under another account, or on another machine, can read it. It holds
    exactly what would leave the TRE, never the audit record.
    """
    import os
    import shutil

    from node.egress.bundle import APPROVAL

    target: Path = args.export
    broken = [f for f in review.findings if f.level == "fail" and f.check in _INTEGRITY]
    if review.bundle is None or broken:
        reason = broken[0].message if broken else "it cannot be read"
        return _refuse(args, f"{folder} does not verify, so it is not exported: {reason}")
    if target.exists():
        return _refuse(args, f"{target} exists already; export into a new folder")
    try:
        shutil.copytree(
            folder, target, ignore=shutil.ignore_patterns(APPROVAL), copy_function=shutil.copyfile
        )
        for root, _folders, files in os.walk(target):
            os.chmod(root, 0o755)
            for name in files:
                os.chmod(Path(root) / name, 0o644)
    except OSError as error:
        return _refuse(args, f"cannot export {folder} to {target}: {error}")
    _say(
        args,
        f"  exported for review → {target} (the checker reviews and signs it there, then returns "
        f"{target.name}/{APPROVAL}; import it with --import-decision)",
    )
    _say(args, "decision: none yet; bundle exported (exit 0)")
    return 0


def _import(
    args: argparse.Namespace, folder: Path, review: Review | SummaryReview, state: DecisionState
) -> int:
    """Take in a decision a checker signed elsewhere: verified against this bundle, then written.

    An approval is taken in only for a bundle that passes this side's review
    too, as ``--approve`` signs none for a failing one.
    """
    from node.egress.approval import read_approval_file, verify_approval, write_approval
    from node.egress.bundle import EgressBundle
    from node.errors import ApprovalError

    source: Path = args.import_decision
    try:
        approval = read_approval_file(source)
        verify_approval(
            approval,
            manifest_sha256=EgressBundle.manifest_sha256(folder),
            accepted_keys=dict(review.keys),
        )
    except (ApprovalError, OSError) as error:
        return _refuse(args, f"{source} is not a valid decision for {folder}: {error}")
    if approval.decision == "approve" and review.exit_code == 2:
        failed = next(f for f in review.findings if f.level == "fail")
        return _refuse(
            args,
            f"{folder} fails the review here ({failed.check}: {failed.message}), so the "
            f"approval in {source} is not imported",
        )
    path = write_approval(folder, approval)
    replaced = " (replacing the refused file)" if state.state == "refused" else ""
    _say(
        args,
        f"  {approval.decision} by {approval.reviewer} at {approval.timestamp}, verified and "
        f"imported{replaced} → {path}",
    )
    _say(args, f"decision: {approval.decision} imported (exit 0)")
    return 0


def _show_summary(
    args: argparse.Namespace, folder: Path, thresholds: object, *, full: bool
) -> SummaryReview:
    """The review of a delta-summary bundle (node.plans.deltab), shown like a round's."""
    from node.plans.deltab.summary_review import review_summary, summary_text
    from node.review.sdc import SDCThresholds

    assert isinstance(thresholds, SDCThresholds)
    review = review_summary(
        folder, federation=args.federation, thresholds=thresholds, audit=args.audit
    )
    if args.json:
        print(json.dumps(_summary_json(review), indent=2, ensure_ascii=False))
    elif full:
        print(summary_text(review), end="")
    if args.html is not None:
        import html

        page = (
            "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<title>zerosum review: {html.escape(str(folder))}</title>"
            "<style>pre { white-space: pre-wrap; overflow-wrap: anywhere; }</style></head><body>"
            f"<pre>{html.escape(summary_text(review))}</pre></body></html>\n"
        )
        args.html.write_text(page, encoding="utf-8")
        _say(args, f"  report written to {args.html}")
    return review


def _summary_json(review: SummaryReview) -> dict[str, object]:
    bundle = review.bundle
    return {
        "folder": str(review.folder),
        "kind": "delta-summary",
        "verdict": review.verdict,
        "exit_code": review.exit_code,
        "findings": [f.to_json() for f in review.findings],
        "manifest": dict(bundle.manifest) if bundle is not None else None,
        "exact": dict(review.audit["exact"]) if review.audit is not None else None,
    }
