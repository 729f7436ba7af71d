"""The coordinator's errors: one root, and the refusals of a message, each with a status category.

Everything the coordinator raises on purpose is a :class:`CoordinatorFailure`.
Below it, :class:`CoordinatorError` is a refused message (mapped to a gRPC
status by the server); :class:`StateFileError` a state file that cannot be
used (mapped to an exit status by ``zerosum coordinator``); the limits'
:class:`coordinator.limits.LimitsError` and the running sum's
:class:`coordinator.aggregate.ContributionWithdrawn` sit under the root too.

The session state machine (coordinator/session.py) knows nothing of gRPC; it
raises one of these classes, whose ``status`` names the gRPC status code the
servicer sends back (coordinator/server.py maps the name to
``grpc.StatusCode``). The message is a sentence a node operator can act on,
naming the field and the bad value. A refused message never changes the
session's state: every check runs before anything is written.

Categories follow the gRPC status code guidance (grpc.io, "Status codes and
their use in gRPC"):

* ``INVALID_ARGUMENT``: the message itself is malformed, whatever the state
  (wrong session id, unknown round, layout or size mismatch, bad checksum);
* ``FAILED_PRECONDITION``: a well-formed message the session's state does
  not allow: it arrives at the wrong time (join after the deadline, upload to
  a round that is not open, a dropped node), contradicts what is already
  recorded (a conflicting upload or correction), or was made against
  another roster than the session's;
* ``ALREADY_EXISTS``: a join for a node that joined already with another key;
* ``PERMISSION_DENIED``: the caller is not allowed to speak for that node
  (certificate of one node, message of another; a node outside the federation);
* ``UNAUTHENTICATED``: a signature does not verify, or was made for another
  federation or session (a replay);
* ``NOT_FOUND``: a result or request that does not exist (yet);
* ``UNAVAILABLE``: a transient conflict the node should retry (the same node
  already streaming the same upload).
"""

from __future__ import annotations

from typing import ClassVar

__all__ = [
    "AlreadyExists",
    "CoordinatorError",
    "CoordinatorFailure",
    "EmptyStateFile",
    "FailedPrecondition",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "RetryLater",
    "StateFileError",
    "TransitionRefused",
    "Unauthenticated",
]


class CoordinatorFailure(Exception):
    """The root of every error the coordinator raises on purpose; the message is one sentence."""


class CoordinatorError(CoordinatorFailure):
    """A refused message: ``status`` is the gRPC status code name, ``str(self)`` the sentence."""

    status: ClassVar[str] = "UNKNOWN"

    def __init__(self, sentence: str) -> None:
        self.sentence = sentence
        super().__init__(sentence)


class InvalidArgument(CoordinatorError):
    """The message is malformed or names something that does not exist in this session."""

    status = "INVALID_ARGUMENT"


class FailedPrecondition(CoordinatorError):
    """The message is well formed but the session is not in a state that accepts it."""

    status = "FAILED_PRECONDITION"


class AlreadyExists(CoordinatorError):
    """A join for a node the session already holds under another key."""

    status = "ALREADY_EXISTS"


class TransitionRefused(FailedPrecondition):
    """A status change the session's current state does not allow (coordinator/transitions.py).

    The steps check their preconditions first, so a node sees this only when
    two messages raced; nothing is written.
    """


class PermissionDenied(CoordinatorError):
    """The caller may not act for the node the message names."""

    status = "PERMISSION_DENIED"


class Unauthenticated(CoordinatorError):
    """A signature is invalid or bound to another federation or session."""

    status = "UNAUTHENTICATED"


class NotFound(CoordinatorError):
    """The requested round, result or request does not exist."""

    status = "NOT_FOUND"


class RetryLater(CoordinatorError):
    """A transient conflict; the same message sent again later will be handled."""

    status = "UNAVAILABLE"


class StateFileError(CoordinatorFailure):
    """The state file cannot be used with this federation (raised at startup, not per message)."""


class EmptyStateFile(StateFileError):
    """The state file exists but holds no session: a start that stopped before its first commit."""
