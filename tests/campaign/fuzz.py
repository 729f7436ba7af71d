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
The mutations are seeded; the keys, and so the signed bytes, are fresh per
run. :func:`run_campaign` sends each case to a live coordinator and checks the
four properties of the campaign: it answers within :data:`CALL_BOUND_SECONDS`,
it is still alive, its status code is one the RPC may give
(:data:`ALLOWED`), and a refused case left its state digest unchanged.
"""

from __future__ import annotations

import math
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
# Per RPC: OK and the refusals it may give. INTERNAL is allowed only for bytes
# that do not parse as the request type: that is gRPC's own answer
# ("Exception deserializing request!") before the servicer runs.
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


# ---------------------------------------------------------------- value pools

_INT_EXTREMES = {
    "int32": (0, 1, -1, 2**31 - 1, -(2**31)),
    "int64": (0, 1, -1, 2**63 - 1, -(2**63), 2**31, 10**15),
    "uint32": (0, 1, 2, 2**31, 2**32 - 1),
    "uint64": (0, 1, 2**31, 2**32, 2**53 + 1, 2**63, 2**64 - 1),
}
_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
_DOUBLES = (0.0, -0.0, -1.0, 1e-9, 1e308, -1e308, math.inf, -math.inf, math.nan)
_STRINGS = (
    "",
    "a",
    "b",
    "c",
    "d",
    "zed",
    "moments",
    "scatter",
    "cape-sum/moments",
    "\x1b[31mred\x1b[0m",
    "a\x00b",
    "../../etc/passwd",
    '=HYPERLINK("x")',
    "é" * 40,
    "\U0001f600",
)


def _int_kind(fd: Any) -> str | None:
    return {
        fd.TYPE_INT32: "int32",
        fd.TYPE_SINT32: "int32",
        fd.TYPE_INT64: "int64",
        fd.TYPE_SINT64: "int64",
        fd.TYPE_UINT32: "uint32",
        fd.TYPE_UINT64: "uint64",
        fd.TYPE_ENUM: "int32",
    }.get(fd.type)


def _rand_bytes(rng: np.random.Generator, n: int) -> bytes:
    return rng.integers(0, 256, n, dtype=np.uint8).tobytes()


def _flip_bits(data: bytes, rng: np.random.Generator, flips: int) -> bytes:
    if not data:
        return bytes([1 << int(rng.integers(8))])
    out = bytearray(data)
    for _ in range(flips):
        position = int(rng.integers(len(out) * 8))
        out[position // 8] ^= 1 << (position % 8)
    return bytes(out)


def _new_bytes(old: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    choice = int(rng.integers(7))
    if choice == 0:
        return _flip_bits(old, rng, int(rng.integers(1, 4))), "bit flips"
    if choice == 1:
        return old[: int(rng.integers(len(old) + 1))], "truncated"
    if choice == 2:
        return old + _rand_bytes(rng, int(rng.integers(1, 40))), "extended"
    if choice == 3:
        return b"", "emptied"
    if choice == 4:
        return _rand_bytes(rng, len(old)), "random, same length"
    if choice == 5:
        return _rand_bytes(rng, int(rng.integers(0, 100))), "random length"
    return bytes(len(old)), "zeroed"


def _new_string(old: str, rng: np.random.Generator) -> tuple[str, str]:
    choice = int(rng.integers(6))
    if choice <= 1:
        value = _STRINGS[int(rng.integers(len(_STRINGS)))]
        return value, f"set to {value[:20]!r}"
    if choice == 2:
        return old[: int(rng.integers(len(old) + 1))], "truncated"
    if choice == 3:
        cut = int(rng.integers(len(old) + 1))
        return old[:cut] + chr(int(rng.integers(32, 0x2FF))) + old[cut:], "a character inserted"
    if choice == 4:
        size = int(rng.choice([1001, 70_000, 70_000, 3 << 20]))
        return "x" * size, f"{size} characters"
    return old.upper() + " ", "changed case, trailing space"


def _new_int(old: int, kind: str, rng: np.random.Generator) -> tuple[int, str]:
    low, high = _INT_RANGES[kind]
    choice = int(rng.integers(3))
    if choice == 0:
        pool = _INT_EXTREMES[kind]
        value = int(pool[int(rng.integers(len(pool)))])
    elif choice == 1:
        value = min(high, max(low, old + int(rng.choice([-1, 1]))))
    else:
        # Uniform over the type's range, drawn as a float and clipped: coverage, not precision.
        value = min(high, max(low, int(rng.uniform(float(low), float(high)))))
    return value, f"set to {value}"


# ---------------------------------------------------------------- field-level mutation


def _locations(message: Message, path: str = "") -> list[tuple[Message, Any, str]]:
    """Every field of ``message`` and of its set sub-messages: (parent, descriptor, path)."""
    found: list[tuple[Message, Any, str]] = []
    for fd in message.DESCRIPTOR.fields:
        where = f"{path}.{fd.name}" if path else fd.name
        found.append((message, fd, where))
        if fd.type != fd.TYPE_MESSAGE:
            continue
        if fd.is_repeated:
            for i, item in enumerate(getattr(message, fd.name)):
                found.extend(_locations(item, f"{where}[{i}]"))
        elif message.HasField(fd.name):
            found.extend(_locations(getattr(message, fd.name), where))
    return found


def _mutate_repeated(parent: Message, fd: Any, rng: np.random.Generator) -> str:
    values = getattr(parent, fd.name)
    items = list(values)
    choice = int(rng.integers(5))
    if choice == 0 or not items:
        if fd.type == fd.TYPE_MESSAGE:
            values.add()
            return "an empty element appended"
        filler: Any = b"" if fd.type == fd.TYPE_BYTES else "" if fd.type == fd.TYPE_STRING else 0
        values.append(items[0] if items else filler)
        return "an element appended"
    if choice == 1:
        del values[int(rng.integers(len(items)))]
        return "an element removed"
    if choice == 2:
        parent.ClearField(fd.name)
        return "cleared"
    if choice == 3:
        if fd.type == fd.TYPE_MESSAGE:
            values.add().CopyFrom(items[int(rng.integers(len(items)))])
        else:
            values.append(items[int(rng.integers(len(items)))])
        return "an element duplicated"
    order = rng.permutation(len(items))
    parent.ClearField(fd.name)
    for i in order:
        if fd.type == fd.TYPE_MESSAGE:
            values.add().CopyFrom(items[int(i)])
        else:
            values.append(items[int(i)])
    return "elements reordered"


def _mutate_field(message: Message, rng: np.random.Generator) -> str:
    """Change one field somewhere in ``message`` (in place); what was done."""
    locations = _locations(message)
    parent, fd, where = locations[int(rng.integers(len(locations)))]
    if fd.is_repeated and (fd.type == fd.TYPE_MESSAGE or rng.random() < 0.5):
        return f"{where}: {_mutate_repeated(parent, fd, rng)}"
    if fd.is_repeated:
        values = getattr(parent, fd.name)
        if not values:
            return f"{where}: {_mutate_repeated(parent, fd, rng)}"
        i = int(rng.integers(len(values)))
        old = values[i]
        new, what = _new_scalar(fd, old, rng)
        values[i] = new
        return f"{where}[{i}]: {what}"
    if fd.type == fd.TYPE_MESSAGE:
        if parent.HasField(fd.name) and rng.random() < 0.5:
            parent.ClearField(fd.name)
            return f"{where}: cleared"
        getattr(parent, fd.name).SetInParent()
        return f"{where}: set (empty)"
    new, what = _new_scalar(fd, getattr(parent, fd.name), rng)
    setattr(parent, fd.name, new)
    return f"{where}: {what}"


def _new_scalar(fd: Any, old: Any, rng: np.random.Generator) -> tuple[Any, str]:
    if fd.type == fd.TYPE_BYTES:
        return _new_bytes(bytes(old), rng)
    if fd.type == fd.TYPE_STRING:
        return _new_string(str(old), rng)
    if fd.type == fd.TYPE_BOOL:
        return (not old), "flipped"
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        value = _DOUBLES[int(rng.integers(len(_DOUBLES)))]
        return value, f"set to {value}"
    kind = _int_kind(fd)
    assert kind is not None, f"no mutation for field type {fd.type}"
    return _new_int(int(old), kind, rng)


def _random_message(cls: type[Message], rng: np.random.Generator, depth: int = 0) -> Message:
    """A message of type ``cls`` with random values in a random half of its fields."""
    message = cls()
    for fd in cls.DESCRIPTOR.fields:
        if rng.random() < 0.5:
            continue
        if fd.type == fd.TYPE_MESSAGE:
            if depth >= 3:
                continue
            child_cls = type(getattr(message, fd.name)) if not fd.is_repeated else None
            if fd.is_repeated:
                for _ in range(int(rng.integers(1, 4))):
                    item = getattr(message, fd.name).add()
                    item.CopyFrom(_random_message(type(item), rng, depth + 1))
            else:
                assert child_cls is not None
                getattr(message, fd.name).CopyFrom(_random_message(child_cls, rng, depth + 1))
            continue
        count = int(rng.integers(1, 4)) if fd.is_repeated else 1
        for _ in range(count):
            value, _ = _new_scalar(fd, fd.default_value if not fd.is_repeated else _zero(fd), rng)
            if fd.is_repeated:
                getattr(message, fd.name).append(value)
            else:
                setattr(message, fd.name, value)
    return message


def _zero(fd: Any) -> Any:
    if fd.type == fd.TYPE_BYTES:
        return b""
    if fd.type == fd.TYPE_STRING:
        return ""
    if fd.type == fd.TYPE_BOOL:
        return False
    if fd.type in (fd.TYPE_DOUBLE, fd.TYPE_FLOAT):
        return 0.0
    return 0


# ---------------------------------------------------------------- wire-level mutation


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, position: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("bad varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _fields(data: bytes) -> list[tuple[int, int, bytes]]:
    """Top-level (field number, wire type, raw value) of a well-formed message."""
    fields, position = [], 0
    while position < len(data):
        tag, position = _read_varint(data, position)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            start = position
            _, position = _read_varint(data, position)
            value = data[start:position]
        elif wire == 2:
            length, position = _read_varint(data, position)
            value = data[position : position + length]
            position += length
        elif wire == 1:
            value, position = data[position : position + 8], position + 8
        elif wire == 5:
            value, position = data[position : position + 4], position + 4
        else:
            raise ValueError("unsupported wire type")
        fields.append((number, wire, value))
    return fields


def _encode(fields: list[tuple[int, int, bytes]]) -> bytes:
    out = bytearray()
    for number, wire, value in fields:
        out += _varint(number << 3 | wire)
        out += _varint(len(value)) + value if wire == 2 else value
    return bytes(out)


def _mutate_wire(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    choice = int(rng.integers(6))
    if choice == 0:
        flips = int(rng.integers(1, 9))
        return _flip_bits(data, rng, flips), f"wire: {flips} bit flips"
    if choice == 1:
        cut = int(rng.integers(len(data) + 1))
        return data[:cut], f"wire: truncated to {cut} of {len(data)} bytes"
    if choice == 2:
        at = int(rng.integers(len(data) + 1))
        return data[:at] + _rand_bytes(rng, int(rng.integers(1, 9))) + data[
            at:
        ], "wire: bytes inserted"
    if choice == 3:
        number = int(rng.choice([15, 999, 536_870_911]))
        return data + _encode([(number, 0, _varint(7))]), f"wire: unknown field {number}"
    try:
        fields = _fields(data)
    except ValueError:
        return data, "wire: unchanged (not parsable)"
    if not fields:
        return data + _encode([(1, 0, _varint(1))]), "wire: field 1 added as a varint"
    i = int(rng.integers(len(fields)))
    number, wire, value = fields[i]
    if choice == 4:
        # Another wire type for the same field number: a wrong type on the wire.
        if wire == 2:
            fields[i] = (number, 0, _varint(len(value)))
        else:
            fields[i] = (number, 2, value)
        return _encode(fields), f"wire: field {number} re-encoded with another wire type"
    fields.insert(i, (number, wire, value))
    return _encode(fields), f"wire: field {number} repeated"


# ---------------------------------------------------------------- cases


def _mutate_stream(messages: list[bytes], rng: np.random.Generator, cls: type[Message]) -> str:
    choice = int(rng.integers(6))
    if choice == 0 and messages:
        del messages[int(rng.integers(len(messages)))]
        return "stream: a message dropped"
    if choice == 1 and messages:
        i = int(rng.integers(len(messages)))
        messages.insert(i, messages[i])
        return "stream: a message repeated"
    if choice == 2 and len(messages) > 1:
        messages.reverse()
        return "stream: order reversed"
    if choice == 3:
        messages.clear()
        return "stream: empty"
    if choice == 4 and messages:
        messages.append(messages[0])
        return "stream: the header again at the end"
    chunk = cls()
    offset = int(rng.choice([0, 8, 288, 2**63, int(rng.integers(0, 4096))]))
    chunk.data.offset = offset  # type: ignore[attr-defined]
    chunk.data.data = _rand_bytes(rng, int(rng.choice([0, 1, 8, 288, 3000])))  # type: ignore[attr-defined]
    messages.append(chunk.SerializeToString())
    return f"stream: a data chunk at offset {offset} appended"


def make_cases(spec: RpcSpec, valid: list[Message], count: int, seed: int) -> list[Case]:
    """``count`` cases of ``spec``'s RPC from its valid request(s), from the stream ``seed``."""
    rng = np.random.default_rng([seed, sorted(RPCS).index(spec.name)])
    cases = []
    for _ in range(count):
        caller = "c" if rng.random() < 0.9 else "a"
        draw = rng.random()
        if draw < 0.05:
            raw = [_rand_bytes(rng, int(rng.integers(0, 200)))]
            cases.append(Case(spec.name, caller, tuple(raw), ("random bytes",)))
            continue
        if draw < 0.15:
            random_message = _random_message(spec.request, rng)
            cases.append(
                Case(spec.name, caller, (random_message.SerializeToString(),), ("random message",))
            )
            continue
        messages = [type(m)() for m in valid]
        for copy, original in zip(messages, valid, strict=True):
            copy.CopyFrom(original)
        steps: list[str] = []
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(len(messages)))
            steps.append(f"message {i}: {_mutate_field(messages[i], rng)}")
        raw = [m.SerializeToString() for m in messages]
        if rng.random() < 0.25:
            i = int(rng.integers(len(raw)))
            raw[i], what = _mutate_wire(raw[i], rng)
            steps.append(f"message {i}: {what}")
        if spec.kind == "client_stream" and rng.random() < 0.3:
            steps.append(_mutate_stream(raw, rng, spec.request))
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

    gRPC answers a request it cannot parse (INTERNAL) as soon as parsing
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
            allowed = allowed | {S.INTERNAL}
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
