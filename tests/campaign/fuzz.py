"""A seeded fuzzer of every RPC of the Coordinator service (proto/zerosum/v1/session.proto).

A case starts from a valid request, made by :mod:`tests.campaign.harness`
with the nodes' real identity keys so that its signatures verify, and
applies one to three mutations drawn from a ``numpy.random.Generator``:

* field level, anywhere in the message tree, set or unset: bit flips,
  truncation and extension of bytes and strings, other node ids, session ids
  and round names, terminal escapes, extreme integers (0, 2^31, 2^32 − 1,
  2^63, 2^64 − 1, −2^63), infinities and NaN, cleared or duplicated or
  reordered repeated fields, cleared or newly set sub-messages;
* wire level, on the serialized bytes: bit flips, truncation, inserted bytes,
  unknown fields, a field re-encoded with another wire type or repeated;
* stream level (client streams): chunks dropped, repeated, swapped, a second
  header, stray data chunks at random offsets, an empty stream;

or is a random message (random fields of the right types, or random bytes).
The mutations themselves are in tests/campaign/mutations.py.
The mutations are seeded; the keys, and so the signed bytes, are fresh per
run. :func:`run_campaign` sends each case to a live coordinator and checks the
four properties of the campaign: it answers within :data:`CALL_BOUND_SECONDS`,
it is still alive, its status code is one the RPC may give
(:data:`ALLOWED`), and a refused case left its state digest unchanged.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message

from proto.zerosum.v1 import session_pb2 as pb
from tests.campaign.digest import state_digest
from tests.campaign.harness import Coordinator
from tests.campaign.mutations import (
    mutate_field,
    mutate_stream,
    mutate_wire,
    rand_bytes,
    random_message,
)

__all__ = [
    "ALLOWED",
    "CALL_BOUND_SECONDS",
    "RPCS",
    "CampaignReport",
    "Case",
    "RpcSpec",
    "make_cases",
    "run_campaign",
]

CALL_BOUND_SECONDS = 15.0
S = grpc.StatusCode

# The codes the coordinator gives for a refused message (coordinator/errors.py)
# plus gRPC's RESOURCE_EXHAUSTED for a message above the 2 MiB limit.
_REFUSALS = {
    S.INVALID_ARGUMENT,
    S.FAILED_PRECONDITION,
    S.PERMISSION_DENIED,
    S.UNAUTHENTICATED,
    S.NOT_FOUND,
    S.RESOURCE_EXHAUSTED,
}
# Per RPC: OK and the refusals it may give. Bytes that do not parse as the
# request type must be INVALID_ARGUMENT (the call guard's answer, in place of
# gRPC's own INTERNAL "Exception deserializing request!").
ALLOWED: dict[str, frozenset[grpc.StatusCode]] = {
    "Join": frozenset({S.OK, S.ALREADY_EXISTS, *_REFUSALS}),
    "GetRoster": frozenset({S.OK, *_REFUSALS}),
    "UploadEgress": frozenset({S.OK, *_REFUSALS}),
    "GetResult": frozenset({S.OK, *_REFUSALS}),
    "GetUnmaskRequest": frozenset({S.OK, *_REFUSALS}),
    "AttestSurvivors": frozenset({S.OK, S.ALREADY_EXISTS, *_REFUSALS}),
    "SubmitUnmask": frozenset({S.OK, *_REFUSALS}),
    "GetStatus": frozenset({S.OK, *_REFUSALS}),
    "Withdraw": frozenset({S.OK, *_REFUSALS}),
}


@dataclass(frozen=True)
class RpcSpec:
    """One RPC: how it is called, its request type, the stage it is fuzzed at, a valid request."""

    name: str
    kind: str  # "unary", "client_stream" or "server_stream"
    request: type[Message]
    stage: str
    valid: Callable[[Coordinator, str], list[Message]]


RPCS: dict[str, RpcSpec] = {
    spec.name: spec
    for spec in (
        RpcSpec("Join", "unary", pb.JoinRequest, "joining", lambda t, n: [t.join_request(n)]),
        RpcSpec(
            "GetRoster",
            "unary",
            pb.GetRosterRequest,
            "uploading",
            lambda t, n: [pb.GetRosterRequest(session_id=t.session_id, node_id=n)],
        ),
        RpcSpec(
            "UploadEgress",
            "client_stream",
            pb.UploadChunk,
            "uploading",
            lambda t, n: list(t.upload_messages(n)),
        ),
        RpcSpec(
            "GetResult",
            "server_stream",
            pb.GetResultRequest,
            "ready",
            lambda t, n: [t.result_request(n)],
        ),
        RpcSpec(
            "GetUnmaskRequest",
            "unary",
            pb.GetUnmaskRequestRequest,
            "attesting",
            lambda t, n: [
                pb.GetUnmaskRequestRequest(session_id=t.session_id, round_index=0, node_id=n)
            ],
        ),
        RpcSpec(
            "AttestSurvivors",
            "unary",
            pb.SurvivorAttestation,
            "attesting",
            lambda t, n: [t.attestation(n)],
        ),
        RpcSpec(
            "SubmitUnmask",
            "client_stream",
            pb.UnmaskChunk,
            "answering",
            lambda t, n: list(t.answer_messages(n)),
        ),
        RpcSpec(
            "GetStatus",
            "unary",
            pb.GetStatusRequest,
            "uploading",
            lambda t, n: [pb.GetStatusRequest(session_id=t.session_id)],
        ),
        RpcSpec(
            "Withdraw",
            "unary",
            pb.WithdrawRequest,
            "uploading",
            lambda t, n: [t.withdraw_request(n)],
        ),
    )
}


@dataclass(frozen=True)
class Case:
    """Serialized request(s) of one call, the certificate it goes out with, and what was done."""

    rpc: str
    caller: str
    messages: tuple[bytes, ...]
    steps: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.rpc} as {self.caller!r}: " + "; ".join(self.steps)


# ---------------------------------------------------------------- cases


def make_cases(spec: RpcSpec, valid: list[Message], count: int, seed: int) -> list[Case]:
    """``count`` cases of ``spec``'s RPC from its valid request(s), from the stream ``seed``."""
    rng = np.random.default_rng([seed, sorted(RPCS).index(spec.name)])
    cases = []
    for _ in range(count):
        caller = "c" if rng.random() < 0.9 else "a"
        draw = rng.random()
        if draw < 0.05:
            raw = [rand_bytes(rng, int(rng.integers(0, 200)))]
            cases.append(Case(spec.name, caller, tuple(raw), ("random bytes",)))
            continue
        if draw < 0.15:
            drawn = random_message(spec.request, rng)
            cases.append(Case(spec.name, caller, (drawn.SerializeToString(),), ("random message",)))
            continue
        messages = [type(m)() for m in valid]
        for copy, original in zip(messages, valid, strict=True):
            copy.CopyFrom(original)
        steps: list[str] = []
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(messages)))
            steps.append(f"message {i}: {mutate_field(messages[i], rng)}")
        raw = [m.SerializeToString() for m in messages]
        if rng.random() < 0.25:
            i = int(rng.integers(len(raw)))
            raw[i], what = mutate_wire(raw[i], rng)
            steps.append(f"message {i}: {what}")
        if spec.kind == "client_stream" and rng.random() < 0.3:
            steps.append(mutate_stream(raw, rng, spec.request))
        if spec.kind != "client_stream" and not raw:
            raw = [b""]
        if spec.kind != "client_stream":
            raw = raw[:1]
        cases.append(Case(spec.name, caller, tuple(raw), tuple(steps)))
    return cases


# ---------------------------------------------------------------- running


def _parses(cls: type[Message], messages: tuple[bytes, ...]) -> bool:
    try:
        for data in messages:
            cls.FromString(data)
    except DecodeError:
        return False
    return True


def call(target: Coordinator, spec: RpcSpec, case: Case) -> tuple[grpc.StatusCode, str]:
    """Send one case; its status code and details (OK and '' when accepted)."""
    timeout = CALL_BOUND_SECONDS + 5
    try:
        if spec.kind == "unary":
            target.unary(case.caller, spec.name, case.messages[0], timeout)
        elif spec.kind == "client_stream":
            target.client_stream(case.caller, spec.name, list(case.messages), timeout)
        else:
            target.server_stream(case.caller, spec.name, case.messages[0], timeout)
    except grpc.RpcError as error:
        return error.code(), error.details() or ""  # type: ignore[attr-defined]
    return S.OK, ""


@dataclass
class CampaignReport:
    """What a fuzzing run saw: status codes, restorations, the slowest call and any failures."""

    rpc: str
    seed: int
    cases: int = 0
    codes: Counter[str] = field(default_factory=Counter)
    restored: int = 0
    slowest_seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "rpc": self.rpc,
            "seed": self.seed,
            "cases": self.cases,
            "codes": dict(sorted(self.codes.items())),
            "restored_after_acceptance": self.restored,
            "slowest_call_seconds": round(self.slowest_seconds, 3),
            "failures": len(self.failures),
        }


def _settled(target: Coordinator, before: str) -> str:
    """The state digest once a refused call's handler has finished (at most 2 s).

    The guard answers a request it cannot parse (INVALID_ARGUMENT) as soon as parsing
    fails, while the handler of a stream may still be removing the partial
    file of the upload it had begun: that file is no change, its staying is.
    """
    give_up = time.monotonic() + 2.0
    while (now := state_digest(target.state_path)) != before and time.monotonic() < give_up:
        time.sleep(0.02)
    return now


def run_campaign(target: Coordinator, spec: RpcSpec, count: int, seed: int) -> CampaignReport:
    """Send ``count`` cases to ``target`` (at ``spec.stage``) and check each one."""
    report = CampaignReport(spec.name, seed)
    cases = make_cases(spec, spec.valid(target, "c"), count, seed)
    before = state_digest(target.state_path)
    pristine = before
    for index, case in enumerate(cases):
        if index and state_digest(target.state_path) != before:
            report.failures.append(
                f"case {index - 1} ({cases[index - 1].describe()}): the state changed "
                "after the call had been answered"
            )
            before = state_digest(target.state_path)
        started = time.monotonic()
        code, details = call(target, spec, case)
        elapsed = time.monotonic() - started
        report.cases += 1
        report.codes[code.name] += 1
        report.slowest_seconds = max(report.slowest_seconds, elapsed)
        problems = []
        if elapsed > CALL_BOUND_SECONDS:
            problems.append(f"took {elapsed:.1f} s")
        allowed = ALLOWED[spec.name]
        if not _parses(spec.request, case.messages):
            allowed = allowed | {S.INVALID_ARGUMENT}
        if code not in allowed:
            problems.append(f"status {code.name} ({details!r})")
        if not target.alive():
            problems.append("the coordinator no longer answers")
        after = state_digest(target.state_path)
        if code != S.OK and after != before:
            after = _settled(target, before)
        if code != S.OK and after != before:
            problems.append(f"refused with {code.name} but the state changed")
        if problems:
            report.failures.append(f"case {index} ({case.describe()}): " + "; ".join(problems))
        if after != pristine:
            # An accepted case moved the session on: later cases start from the stage again.
            target.restore()
            report.restored += 1
            after = state_digest(target.state_path)
        before = after
    return report
