"""Every error the node reports, in one flat file, all under :class:`NodeError`.

Each is a small, specific class whose message is one sentence for the
operator. The command line catches :class:`NodeError` alone: a
:class:`SetupError` (bad local files or settings, found before any contact)
exits 2, anything else 1.
"""

from __future__ import annotations

from pathlib import Path

from noise.layout import LayoutError

__all__ = [
    "AlreadyJoined",
    "ApprovalError",
    "ApprovalRejected",
    "CapeStateError",
    "CoordinatorRefused",
    "CoordinatorUnreachable",
    "EgressError",
    "EgressIntegrityError",
    "ExposedFileError",
    "GatewayError",
    "LedgerError",
    "LocalDataError",
    "ModelFitError",
    "NodeError",
    "NodeRefused",
    "PreflightRefused",
    "RosterError",
    "SessionFailed",
    "SessionStateError",
    "SetupError",
    "StatementError",
    "TlsMismatch",
]


class NodeError(Exception):
    """Base of every error a node reports; the message is one sentence."""


class SetupError(NodeError):
    """The node's files or settings cannot be used; found before it contacts anyone."""


class LocalDataError(SetupError, ValueError):
    """The node's own cohort cannot be used; the message is one sentence saying why."""


class PreflightRefused(LocalDataError):
    """The cohort does not fit the federation's bounds or minimum; one sentence per problem."""

    def __init__(self, problems: tuple[str, ...]) -> None:
        super().__init__(" ".join(problems))
        self.problems = problems


class SessionFailed(NodeError):
    """The session could not be completed; the message says why."""


class ModelFitError(SessionFailed):
    """The aggregate is valid but cannot fit the configured model; says why."""


class NodeRefused(SessionFailed):
    """This node refused to go on (rejected egress, unmask refusal, budget); says why."""


# ---------------------------------------------------------------- the coordinator


class GatewayError(NodeError):
    """The coordinator could not be asked, or refused a request.

    ``method`` is the call, ``code`` the gRPC status name (``"FAILED_PRECONDITION"``)
    and ``details`` the coordinator's sentence.
    """

    def __init__(self, method: str, code: str, details: str) -> None:
        self.method = method
        self.code = code
        self.details = details
        super().__init__(f"{method}: {code}: {details}")


class CoordinatorRefused(GatewayError):
    """The coordinator answered with an error status (never retried)."""


class AlreadyJoined(CoordinatorRefused):
    """The coordinator holds another session key of this node for this session."""


class CoordinatorUnreachable(GatewayError):
    """The coordinator did not answer: retries ran out of time."""

    def __init__(self, method: str, code: str, details: str, attempts: int, seconds: float) -> None:
        super().__init__(method, code, details)
        self.attempts = attempts
        self.seconds = seconds
        self.args = (
            f"{method}: the coordinator did not answer after {attempts} attempts over "
            f"{seconds:.1f} s (last status {code}: {details})",
        )


class TlsMismatch(SessionFailed):
    """The TLS handshake with the coordinator fails on a certificate; names which (not retried)."""


class RosterError(NodeError):
    """A roster bundle failed verification; names the node and the reason."""

    def __init__(self, node_id: str, reason: str) -> None:
        self.node_id = node_id
        self.reason = reason
        super().__init__(f"roster entry of node {node_id!r} rejected: {reason}")


class StatementError(NodeError):
    """The upload statements returned with an aggregate do not add up; says how."""


# ---------------------------------------------------------------- local records


class LedgerError(NodeError, ValueError):
    """The privacy ledger is unreadable or would be made inconsistent."""


class SessionStateError(NodeError, ValueError):
    """The saved session key or record cannot be used; says which file and why."""


class CapeStateError(NodeError, ValueError):
    """Saved CAPE material is missing, damaged or belongs elsewhere; says which file."""


class ExposedFileError(NodeError):
    """A private file is readable by others; names it and its mode."""

    def __init__(self, path: Path, mode: int) -> None:
        self.path = path
        self.mode = mode
        super().__init__(f"{path} is accessible to other users (mode {mode:04o})")


class ApprovalError(NodeError, ValueError):
    """An approval file is malformed, unsigned or signed by a key that may not approve."""


class ApprovalRejected(NodeError):
    """The output checker signed a rejection of this egress."""

    def __init__(self, folder: Path, reviewer: str, comment: str) -> None:
        self.folder = folder
        self.reviewer = reviewer
        self.comment = comment
        why = f": {comment}" if comment else " (no reason given)"
        super().__init__(f"the egress in {folder} was rejected by reviewer {reviewer!r}{why}")


class EgressError(NodeError, LayoutError):
    """An egress bundle cannot be built or read because a field or file is wrong."""


class EgressIntegrityError(NodeError):
    """An egress folder on disk does not match its manifest; lists every problem found."""

    def __init__(self, folder: Path, problems: tuple[str, ...] | list[str]) -> None:
        self.folder = folder
        self.problems = tuple(problems)
        listing = "; ".join(self.problems)
        super().__init__(f"egress bundle {folder} failed verification: {listing}")
