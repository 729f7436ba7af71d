"""What every call to the coordinator's server passes through, whatever its service.

:class:`CallGuard` is a gRPC server interceptor; it wraps each method handler
so that, for every call of every service (the session protocol, health,
reflection):

1. the caller is the node id of its client certificate (UNAUTHENTICATED if it
   names none); on the session protocol a caller outside the federation is
   refused with PERMISSION_DENIED before anything else is read;
2. the caller takes one of its call slots (coordinator/limits.py), or the
   call is refused at once with RESOURCE_EXHAUSTED naming the limit; the
   slot is given back when the call ends, however it ends;
3. a stream from the caller is read under the first-message and
   message-gap deadlines: a stream that stays silent is ended with
   DEADLINE_EXCEEDED and its slot is free again;
4. request bytes that do not decode as the method's message are answered
   INVALID_ARGUMENT with a sentence naming the method and the message type
   (gRPC itself would answer INTERNAL, as if the coordinator had failed);
5. an exception no step meant (anything but a refusal already sent) is
   logged with its traceback and answered INTERNAL with a sentence, never
   gRPC's UNKNOWN — except a full or failing disk, answered UNAVAILABLE (the
   call kept nothing, and nodes retry UNAVAILABLE, so the session resumes
   once the disk has room).

Ending a silent stream from the watchdog's thread: the handler's thread is
blocked waiting for a message, so the status is sent by cancelling the call
with that status (gRPC core's ``grpc_call_cancel_with_status``, reached
through the servicer context's call object); the blocked read then raises
and the handler unwinds. Where that is unavailable the call is cancelled
(CANCELLED) instead.
"""

from __future__ import annotations

import errno
import importlib
import sqlite3
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import grpc

from coordinator.limits import CallSlots, ServerLimits, Watchdog
from proto.tls import CertificateError, node_id_from_auth_context

__all__ = [
    "COORDINATOR_SERVICE",
    "NON_MEMBERS",
    "CallGuard",
    "internal_sentence",
    "storage_failure",
    "storage_sentence",
]

COORDINATOR_SERVICE = "zerosum.v1.Coordinator"
# The one slot account shared by every caller outside the federation.
NON_MEMBERS = "(callers outside the federation)"

Log = Callable[..., None]

if TYPE_CHECKING:
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


def internal_sentence(method: str, error: BaseException) -> str:
    """The INTERNAL status sentence: which call failed and how, without internal detail."""
    return (
        f"the coordinator failed unexpectedly while handling {method} "
        f"({type(error).__name__}); the error is in the coordinator's log and this call "
        "had no effect the session relies on: retrying it is safe."
    )


# errno values of a disk that is full or failing.
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT, errno.EIO, errno.EROFS})


def storage_failure(error: BaseException) -> bool:
    """True for a full or failing disk: an OSError of that kind, or SQLite's report of one."""
    if isinstance(error, OSError) and error.errno in _STORAGE_ERRNOS:
        return True
    if isinstance(error, sqlite3.OperationalError):
        text = str(error).lower()
        return "disk i/o error" in text or "disk is full" in text or "readonly" in text
    return False


def storage_sentence(method: str, error: BaseException) -> str:
    return (
        f"the coordinator cannot store {method} now (its disk is full or failing: "
        f"{type(error).__name__}); nothing of this call was kept; retry later."
    )


def _aborted(context: grpc.ServicerContext, error: Exception) -> bool:
    """True when ``error`` is ``context.abort``'s own (the status is already set)."""
    state = getattr(context, "_state", None)
    if state is not None and hasattr(state, "aborted"):
        return bool(state.aborted)
    return type(error) is Exception and not error.args


def _end_with_status(context: grpc.ServicerContext, code: grpc.StatusCode, sentence: str) -> None:
    """End a call from another thread with ``code`` and ``sentence`` (see the module docstring)."""
    call: Any = getattr(getattr(context, "_rpc_event", None), "call", None)
    try:
        cygrpc: Any = importlib.import_module("grpc._cython.cygrpc")
        call.cancel(getattr(cygrpc.StatusCode, code.name.lower()), sentence)
    except Exception:
        context.cancel()  # type: ignore[no-untyped-call]


class _Undecodable:
    """What a request's bytes became when they do not decode as the method's message."""

    def __init__(self, size: int, error: Exception) -> None:
        self.size = size
        self.error = error


def _tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """``deserializer``, returning an :class:`_Undecodable` instead of raising.

    gRPC answers a deserializer's exception with INTERNAL before any handler
    runs; the handler refuses an :class:`_Undecodable` with INVALID_ARGUMENT.
    """
    if deserializer is None:
        return None

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as error:
            return _Undecodable(len(data), error)

    return decode


def _refuse_undecodable(context: grpc.ServicerContext, method: str, message: Any) -> None:
    if isinstance(message, _Undecodable):
        context.abort(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{method}: the request's {message.size} bytes do not decode as the method's "
            f"message ({type(message.error).__name__}: {str(message.error)[:200]}).",
        )


class _TimedMessages(Iterator[Any]):
    """A stream's incoming messages, each awaited under its deadline."""

    def __init__(
        self,
        messages: Iterator[Any],
        context: grpc.ServicerContext,
        guard: CallGuard,
        what: str,
    ) -> None:
        self._messages = messages
        self._context = context
        self._guard = guard
        self._what = what
        self._count = 0

    def __iter__(self) -> _TimedMessages:
        return self

    def __next__(self) -> Any:
        limits = self._guard.limits
        if self._count == 0:
            seconds = limits.first_message_seconds
            sentence = (
                f"{self._what}: no first message within {seconds:g} s of the call opening "
                "(the coordinator's first-message limit); the stream is closed."
            )
        else:
            seconds = limits.message_gap_seconds
            sentence = (
                f"{self._what}: message {self._count + 1} did not arrive within {seconds:g} s "
                "of the coordinator asking for it (its message-gap limit); the stream is closed."
            )

        def expire() -> None:
            self._guard.say("stream-deadline", sentence, level="warning")
            _end_with_status(self._context, grpc.StatusCode.DEADLINE_EXCEEDED, sentence)

        token = self._guard.watchdog.arm(seconds, expire)
        try:
            message = next(self._messages)
        finally:
            self._guard.watchdog.disarm(token)
        self._count += 1
        _refuse_undecodable(self._context, self._what, message)
        return message


class CallGuard(_Interceptor):
    """Identity, call slots, stream deadlines and INTERNAL for every call (module docstring).

    ``members`` are the federation's node ids; ``log(event, message, level=,
    node=)`` hears refusals at the limits and unexpected errors.
    """

    def __init__(
        self,
        limits: ServerLimits,
        members: tuple[str, ...],
        watchdog: Watchdog,
        log: Log | None = None,
        *,
        federation_id: str = "",
    ) -> None:
        self.limits = limits
        self.federation_id = federation_id
        self.members = frozenset(members)
        self.watchdog = watchdog
        self.slots = CallSlots(limits.calls_per_node)
        self._log = log

    def say(self, event: str, message: str, *, level: str = "info", node: str = "") -> None:
        if self._log is not None:
            self._log(event, message, level=level, node=node)

    # ------------------------------------------------------------ wrapping handlers

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler: Any = continuation(handler_call_details)
        if handler is None:
            return None
        method = str(handler_call_details.method)
        service, _, name = method.lstrip("/").rpartition("/")
        protocol = service == COORDINATOR_SERVICE
        if handler.request_streaming and handler.response_streaming:
            inner = handler.stream_stream
            return grpc.stream_stream_rpc_method_handler(
                self._streaming(inner, name, protocol, streaming_in=True),
                _tolerant(handler.request_deserializer),
                handler.response_serializer,
            )
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(
                self._unary(handler.stream_unary, name, protocol, streaming_in=True),
                _tolerant(handler.request_deserializer),
                handler.response_serializer,
            )
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._streaming(handler.unary_stream, name, protocol, streaming_in=False),
                _tolerant(handler.request_deserializer),
                handler.response_serializer,
            )
        return grpc.unary_unary_rpc_method_handler(
            self._unary(handler.unary_unary, name, protocol, streaming_in=False),
            _tolerant(handler.request_deserializer),
            handler.response_serializer,
        )

    def _admit(self, context: grpc.ServicerContext, method: str, protocol: bool) -> str:
        """The caller's slot account, its slot taken; or the call is refused."""
        try:
            caller = node_id_from_auth_context(context.auth_context())
        except CertificateError as error:
            context.abort(
                grpc.StatusCode.UNAUTHENTICATED, f"the client certificate names no node: {error}"
            )
        if caller not in self.members:
            if protocol:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"the client certificate names node {caller!r}; {caller!r} is not a member "
                    f"of federation {self.federation_id!r}, and {method} is for its members only.",
                )
            caller = NON_MEMBERS
        if not self.slots.try_take(caller):
            who = "callers outside the federation" if caller == NON_MEMBERS else f"node {caller!r}"
            sentence = (
                f"{method} refused: {who} already has {self.slots.limit} calls in progress, "
                f"the most this coordinator serves at once for one caller (calls_per_node = "
                f"{self.slots.limit}); wait for one to end."
            )
            self.say("call-limit", sentence, level="warning", node=caller)
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, sentence)
        return caller

    def _failed(self, context: grpc.ServicerContext, method: str, error: Exception) -> None:
        """Re-raise a status already set; otherwise log and answer UNAVAILABLE or INTERNAL.

        A storage failure (a full or failing disk) is UNAVAILABLE: nothing of the
        call was kept, and a node retries it, so a session resumes once the disk
        has room again (or the coordinator restarts on one that has).
        """
        if isinstance(error, grpc.RpcError) or _aborted(context, error):
            raise error
        if storage_failure(error):
            # A known condition, not a bug: one line, no traceback.
            self.say(
                "storage-error",
                f"{method} could not be stored: {type(error).__name__}: {error}",
                level="error",
            )
            context.abort(grpc.StatusCode.UNAVAILABLE, storage_sentence(method, error))
        detail = "".join(traceback.format_exception(error)).rstrip()
        self.say("internal-error", f"{method} failed unexpectedly: {detail}", level="error")
        context.abort(grpc.StatusCode.INTERNAL, internal_sentence(method, error))

    def _messages(
        self, request: Any, context: grpc.ServicerContext, method: str, caller: str
    ) -> Any:
        who = "a caller outside the federation" if caller == NON_MEMBERS else f"node {caller!r}"
        return _TimedMessages(request, context, self, f"{method} of {who}")

    def _unary(
        self, behaviour: Callable[..., Any], method: str, protocol: bool, *, streaming_in: bool
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def handle(request: Any, context: grpc.ServicerContext) -> Any:
            caller = self._admit(context, method, protocol)
            try:
                if streaming_in:
                    request = self._messages(request, context, method, caller)
                else:
                    _refuse_undecodable(context, method, request)
                return behaviour(request, context)
            except Exception as error:
                self._failed(context, method, error)
            finally:
                self.slots.give_back(caller)

        return handle

    def _streaming(
        self, behaviour: Callable[..., Any], method: str, protocol: bool, *, streaming_in: bool
    ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
        def handle(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            caller = self._admit(context, method, protocol)
            try:
                if streaming_in:
                    request = self._messages(request, context, method, caller)
                else:
                    _refuse_undecodable(context, method, request)
                responses = behaviour(request, context)
                if responses is not None:
                    yield from responses
            except Exception as error:
                self._failed(context, method, error)
            finally:
                self.slots.give_back(caller)

        return handle
