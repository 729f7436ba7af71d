"""The approval gate: nothing leaves the TRE until a reviewer has signed off its manifest.

Before each upload the node waits for ``OUT/egress/round-<r>/approval.json``
(docs/design.md §4.4, §8). The file records a reviewer's decision on one exact
bundle, signed with Ed25519 (RFC 8032):

    {"format": "zerosum-approval", "version": 1,
     "manifest_sha256": "<hex SHA-256 of manifest.json as stored>",
     "decision": "approve" | "reject",
     "reviewer": "<name>", "comment": "<free text>", "timestamp": "<ISO 8601>",
     "public_key": "<hex, 32 bytes>", "signature": "<hex, 64 bytes>"}

The signature covers ``b"zerosum/v1/egress-approval" ‖ lp(decision) ‖
manifest digest (32 raw bytes)``, lp = u16 big-endian length ‖ UTF-8. Binding
the decision means an approval can never be replayed as a rejection or the
other way round, and binding the manifest digest (which itself holds the
SHA-256 of the payload, values and results files) ties it to exactly the
numbers that will be sent.

Accepted reviewer keys. Each ``[[nodes]]`` entry of the federation config
lists its output checkers' Ed25519 public keys (``checker_public_keys``,
written by ``zerosum federation init``); in ``manual`` mode the gate accepts a
decision signed by one of those keys only — never the node's own identity
key, which lives next to the node and so proves nothing about a human review.

Modes: ``auto`` signs an approval with the node's identity key at once
(reviewer "automatic", for demos and simulations; only then is the identity
key accepted); ``manual`` polls until the file appears, then verifies it. A
valid rejection stops the node at once (:class:`ApprovalRejected`). A file
that is malformed, signed by a key that is not a checker key of this node, or
made for another manifest is refused and reported; a listed checker may
replace it (``zerosum review … --replace``) and the gate takes the
replacement, but when no valid decision appears within ``replace_seconds``
of the refusal the gate gives up with an :class:`ApprovalError`, so the node
withdraws from the round instead of holding the session to its deadline.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bounded.files import LocalFileError, read_limited_text
from bounded.nesting import NestingError, parse_json
from node.egress.bundle import APPROVAL, EgressBundle
from node.errors import ApprovalError, ApprovalRejected, SetupError
from node.records.atomic import atomic_write_json
from noise.keys import IdentityKey, key_fingerprint, length_prefixed
from proto.federation import FederationConfig

# An approval is a signed decision of a few hundred bytes.
_APPROVAL_BYTES = 1 << 20

__all__ = [
    "APPROVAL_FORMAT",
    "REPLACE_SECONDS",
    "Approval",
    "ApprovalError",
    "ApprovalGate",
    "ApprovalRejected",
    "Decision",
    "approval_message",
    "check_checker_keys",
    "read_approval",
    "read_approval_file",
    "sign_approval",
    "verify_approval",
    "write_approval",
]

APPROVAL_FORMAT = "zerosum-approval"
APPROVAL_VERSION = 1
_LABEL = b"zerosum/v1/egress-approval"
_UNREADABLE_POLLS = 3
# How long a refused approval.json may stay before the node gives up: time for
# a checker to read the node's message and sign again with a listed key.
REPLACE_SECONDS = 120.0

Decision = Literal["approve", "reject"]
ApprovalMode = Literal["auto", "manual"]


def approval_message(manifest_sha256: str, decision: str) -> bytes:
    """The exact bytes a reviewer signs for ``decision`` on the manifest with this digest."""
    if decision not in ("approve", "reject"):
        raise ApprovalError(f"decision must be 'approve' or 'reject'; got {decision!r}")
    try:
        digest = bytes.fromhex(manifest_sha256)
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise ApprovalError(
            f"manifest_sha256 must be 64 hex digits (a SHA-256); got {manifest_sha256!r}"
        )
    return _LABEL + length_prefixed(decision, "decision") + digest


def check_checker_keys(config: FederationConfig, node_id: str, mode: str) -> None:
    """Refuse, before any contact, a manual gate no decision could ever open.

    With ``--approve manual`` only a checker key pinned in the node's
    ``[[nodes]]`` entry can release its egress; without one the node would
    compute, write its first bundle and then withdraw.
    """
    if mode == "manual" and not config.node(node_id).checker_public_keys:
        raise SetupError(
            f"--approve manual needs an output checker key for node {node_id!r}, and the "
            "federation config lists none (checker_public_keys in its [[nodes]] entry; "
            "zerosum federation init writes one per node)"
        )


@dataclass(frozen=True)
class Approval:
    """A reviewer's signed decision on one egress manifest."""

    manifest_sha256: str
    decision: Decision
    reviewer: str
    public_key: bytes
    signature: bytes
    comment: str = ""
    timestamp: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": APPROVAL_FORMAT,
            "version": APPROVAL_VERSION,
            "manifest_sha256": self.manifest_sha256,
            "decision": self.decision,
            "reviewer": self.reviewer,
            "comment": self.comment,
            "timestamp": self.timestamp,
            "public_key": self.public_key.hex(),
            "signature": self.signature.hex(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Approval:
        if data.get("format") != APPROVAL_FORMAT or data.get("version") != APPROVAL_VERSION:
            raise ApprovalError(
                f"not a {APPROVAL_FORMAT} version {APPROVAL_VERSION} file "
                f"(format={data.get('format')!r}, version={data.get('version')!r})"
            )
        decision = data.get("decision")
        if decision not in ("approve", "reject"):
            raise ApprovalError(f"decision must be 'approve' or 'reject'; got {decision!r}")
        try:
            public_key = bytes.fromhex(str(data["public_key"]))
            signature = bytes.fromhex(str(data["signature"]))
            return cls(
                manifest_sha256=str(data["manifest_sha256"]),
                decision=decision,
                reviewer=str(data.get("reviewer", "")),
                public_key=public_key,
                signature=signature,
                comment=str(data.get("comment", "")),
                timestamp=str(data.get("timestamp", "")),
            )
        except KeyError as exc:
            raise ApprovalError(f"the approval lacks the field {exc.args[0]!r}") from exc
        except ValueError as exc:
            raise ApprovalError(f"public_key and signature must be hex strings: {exc}") from exc


def sign_approval(
    identity: IdentityKey,
    manifest_sha256: str,
    decision: Decision,
    *,
    reviewer: str,
    comment: str = "",
) -> Approval:
    """Sign ``decision`` on the manifest with digest ``manifest_sha256``."""
    message = approval_message(manifest_sha256, decision)
    return Approval(
        manifest_sha256=manifest_sha256,
        decision=decision,
        reviewer=reviewer,
        public_key=identity.public_bytes(),
        signature=identity.sign(message),
        comment=comment,
        timestamp=datetime.now(UTC).isoformat(),
    )


def write_approval(folder: Path, approval: Approval) -> Path:
    """Write ``approval.json`` into an egress folder atomically; returns its path."""
    path = Path(folder) / APPROVAL
    atomic_write_json(path, approval.to_json())
    return path


def read_approval(folder: Path) -> Approval | None:
    """The approval in an egress folder, or None when there is none yet."""
    try:
        return read_approval_file(Path(folder) / APPROVAL)
    except FileNotFoundError:
        return None


def read_approval_file(path: Path) -> Approval:
    """The approval in ``path`` (FileNotFoundError when there is none); not yet verified."""
    try:
        # Written by the TRE's output checkers, not by the node: bounded and depth-checked.
        text = read_limited_text(path, _APPROVAL_BYTES, what="approval")
    except FileNotFoundError:
        raise
    except LocalFileError as exc:
        raise ApprovalError(str(exc)) from None
    try:
        data = parse_json(text, what=f"approval {path}")
    except NestingError as exc:
        raise ApprovalError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ApprovalError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ApprovalError(f"{path} must hold a JSON object")
    try:
        return Approval.from_json(data)
    except ApprovalError as exc:
        raise ApprovalError(f"{path}: {exc}") from exc


def verify_approval(
    approval: Approval, *, manifest_sha256: str, accepted_keys: Mapping[bytes, str]
) -> None:
    """Check that ``approval`` is for this manifest and validly signed by an accepted key."""
    if approval.manifest_sha256 != manifest_sha256:
        raise ApprovalError(
            f"the approval is for manifest {approval.manifest_sha256[:16]}…, but the manifest "
            f"on disk has SHA-256 {manifest_sha256[:16]}… (the bundle changed after review, or "
            "the approval belongs to another bundle)"
        )
    if approval.public_key not in accepted_keys:
        shown = key_fingerprint(approval.public_key) if len(approval.public_key) == 32 else "?"
        listed = ", ".join(key_fingerprint(k) for k in accepted_keys) or "none"
        raise ApprovalError(
            f"the approval by {approval.reviewer!r} is signed with key {shown}, which is not an "
            f"accepted reviewer key for this node (accepted: {listed})"
        )
    message = approval_message(approval.manifest_sha256, approval.decision)
    try:
        Ed25519PublicKey.from_public_bytes(approval.public_key).verify(approval.signature, message)
    except (InvalidSignature, ValueError) as exc:
        raise ApprovalError(
            f"the signature of the approval by {approval.reviewer!r} "
            f"({accepted_keys[approval.public_key]}) does not verify"
        ) from exc


class ApprovalGate:
    """Waits for, checks and records the approval of each egress bundle before upload.

    ``checker_keys`` maps each public key of this node's output checkers (the
    federation config's ``checker_public_keys``) to a label for messages.
    """

    def __init__(
        self,
        mode: ApprovalMode,
        *,
        identity: IdentityKey,
        checker_keys: Mapping[bytes, str] | None = None,
        poll_seconds: float = 1.0,
        timeout_seconds: float | None = None,
        replace_seconds: float | None = None,
        progress: Callable[[str], None] | None = None,
        interrupt: Callable[[], None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in ("auto", "manual"):
            raise ValueError(f"approval mode must be 'auto' or 'manual'; got {mode!r}")
        self.mode = mode
        self.identity = identity
        keys = dict(checker_keys or {})
        if identity.public_bytes() in keys:
            raise ApprovalError(
                "the node's identity key is listed as one of its checker keys; an output "
                "checker needs a key of its own"
            )
        if mode == "auto":
            # The node approves its own egress; no human review is claimed.
            keys[identity.public_bytes()] = "this node (automatic approval)"
        self.accepted_keys = keys
        self.poll_seconds = poll_seconds
        self.timeout_seconds = timeout_seconds
        self.replace_seconds = REPLACE_SECONDS if replace_seconds is None else replace_seconds
        self._progress = progress or (lambda _line: None)
        # Called once per poll while waiting; raises to abandon the wait (the
        # runner uses it to stop when the session ends or drops this node).
        self._interrupt = interrupt or (lambda: None)
        self._sleep = sleep
        self._clock = clock

    def check(self, folder: Path, found: Approval) -> Approval:
        """``found`` if it is a valid approval of the bundle in ``folder``; raise otherwise."""
        verify_approval(
            found,
            manifest_sha256=EgressBundle.manifest_sha256(folder),
            accepted_keys=self.accepted_keys,
        )
        if found.decision == "reject":
            raise ApprovalRejected(folder, found.reviewer, found.comment)
        return found

    def wait(self, folder: Path) -> Approval:
        """Return the valid approval of the bundle in ``folder``; raise if rejected or invalid."""
        folder = Path(folder)
        digest = EgressBundle.manifest_sha256(folder)
        if self.mode == "auto":
            return self._approve_automatically(folder, digest)
        if not self.accepted_keys:
            raise ApprovalError(
                "the federation config lists no output checker key for this node "
                "(checker_public_keys in its [[nodes]] entry), so no decision on "
                f"{folder} could ever be accepted; run with --approve auto or pin a checker key"
            )
        started = self._clock()
        announced = False
        unreadable = 0
        refused_at: float | None = None
        refused_reason = ""
        while True:
            try:
                found = read_approval(folder)
                unreadable = 0
            except ApprovalError as error:
                # A reviewer's editor may still be writing the file; give it a
                # few polls before treating it as malformed.
                unreadable += 1
                if unreadable > _UNREADABLE_POLLS:
                    refused_at, refused_reason = self._refuse(
                        folder, str(error), refused_at, refused_reason
                    )
                found = None
            if found is not None:
                try:
                    return self.check(folder, found)
                except ApprovalRejected:
                    raise
                except ApprovalError as error:
                    refused_at, refused_reason = self._refuse(
                        folder, str(error), refused_at, refused_reason
                    )
            elif unreadable == 0:
                refused_at, refused_reason = None, ""
            if not announced:
                self._progress(
                    f"waiting for a reviewer to approve {folder} "
                    f"(manifest sha256 {digest}); write {APPROVAL} there to continue"
                )
                announced = True
            self._check_waited(folder, started, refused_at, refused_reason)
            self._interrupt()
            self._sleep(self.poll_seconds)

    def _approve_automatically(self, folder: Path, digest: str) -> Approval:
        """``--approve auto``: the node signs the approval itself, with no human review."""
        signed = sign_approval(
            self.identity,
            digest,
            "approve",
            reviewer="automatic (--approve auto)",
            comment="approved automatically by the node; no human review",
        )
        write_approval(folder, signed)
        return signed

    def _check_waited(
        self, folder: Path, started: float, refused_at: float | None, refused_reason: str
    ) -> None:
        """Raise once a refused file went unreplaced, or no decision came, for too long."""
        now = self._clock()
        if refused_at is not None and now - refused_at >= self.replace_seconds:
            raise ApprovalError(
                f"{folder / APPROVAL} was refused ({refused_reason}) and no valid decision "
                f"replaced it within {self.replace_seconds:g} s"
            )
        if self.timeout_seconds is not None and now - started >= self.timeout_seconds:
            raise ApprovalError(
                f"no approval appeared in {folder} within {self.timeout_seconds:g} s"
            )

    def _refuse(
        self, folder: Path, reason: str, since: float | None, previous: str
    ) -> tuple[float, str]:
        """Report a refused approval file once per reason; when the refusal started."""
        if reason != previous:
            self._progress(
                f"refusing {folder / APPROVAL}: {reason}. An output checker of this node may "
                f"replace it: zerosum review {folder} --approve|--reject --replace --key "
                f"CHECKER.pem --reviewer NAME (waiting {self.replace_seconds:g} s)"
            )
        return (self._clock() if since is None else since), reason
