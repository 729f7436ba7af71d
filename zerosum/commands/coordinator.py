"""`zerosum coordinator`: run the federation's coordinator for one session.

Starts (or resumes) the session kept in the state file, serves the nodes over
mutual TLS and prints one progress line per transition to stderr. The exit
status says how the session ended: 0 completed, 1 failed (the reason is
printed), 2 bad arguments or files; on SIGINT/SIGTERM the server stops cleanly
and the exit status is 128 + the signal number. Starting again with the same
arguments resumes the same session from the state file; a state file whose
session has ended (completed or failed) is refused unless ``--new-session``
moves it aside for the record. The listening address is tried before the state
file is opened, so a port in use leaves no state behind.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from zerosum.errors import CommandError

if TYPE_CHECKING:
    from coordinator.config import SessionConfig
    from coordinator.limits import ServerLimits
    from coordinator.logs import CoordinatorLog
    from coordinator.server import ServerTLS
    from coordinator.session import Session
    from coordinator.store import Store
    from proto.federation import FederationConfig

DESCRIPTION = """\
Run the coordinator of a federation for one session: accept the nodes' signed
keys, publish the roster, sum each round's masked uploads (exactly, modulo
2^64), handle dropouts by asking the survivors for unmask corrections, and
serve the results. State lives in a SQLite file (default: coordinator/state.sqlite
next to the federation file); a restart with the same arguments resumes the
same session, keeping every upload and result already stored. Once its session
has ended the state file is not started again: for the next session pass
--new-session (the ended session's files are renamed <state>-<session id>.sqlite
and .payloads, kept for the record) or a new --state.
"""

EPILOG = """\
TLS files are read from the federation folder: ca/ca.pem (or the config's
ca_certificate) and coordinator/server.pem + coordinator/server.key.

exit status: 0 session completed, 1 session failed (reason printed),
2 bad arguments or unreadable files, an ended session's state file without
--new-session, or the address in use (nothing written), 128+N stopped by
signal N (resumable).

examples:
  zerosum coordinator --federation fed/federation.toml
  zerosum coordinator --federation fed/federation.toml --listen 0.0.0.0:50051
  zerosum coordinator --federation fed/federation.toml --listen 127.0.0.1:0   # any free port
  zerosum coordinator --federation fed/federation.toml --status               # who is where
  zerosum coordinator --federation fed/federation.toml --new-session          # the next session
  zerosum coordinator --federation fed/federation.toml --log-format json      # for a collector

limits: each node (by its client certificate) has at most --calls-per-node calls
in progress (more are refused with RESOURCE_EXHAUSTED); a stream's first message
must arrive within --first-message-seconds and each later one within
--message-gap-seconds, or it is ended with DEADLINE_EXCEEDED.

health: the server answers grpc.health.v1.Health (SERVING while the session
runs, NOT_SERVING once it has ended) and server reflection, under the same
mutual TLS, e.g.
  grpcurl -cacert fed/ca/ca.pem -cert fed/nodes/A/client.pem -key fed/nodes/A/client.key \
      HOST:PORT grpc.health.v1.Health/Check
"""

_PREFIX = "zerosum coordinator"
# The C core's level for this command (zerosum.cli): it reports a refused TLS
# handshake only at INFO, and coordinator.logs.CoreLogRelay makes it a log line.
GRPC_VERBOSITY = "INFO"
# The limits' defaults, for --help without importing the coordinator package.
DEFAULT_CALLS_PER_NODE = 4
DEFAULT_FIRST_MESSAGE_SECONDS = 5.0
DEFAULT_MESSAGE_GAP_SECONDS = 30.0
TOTAL_MARGIN = 8


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    parser.add_argument(
        "--federation", required=True, type=Path, metavar="F", help="the federation.toml file"
    )
    parser.add_argument(
        "--state",
        type=Path,
        default=None,
        metavar="PATH",
        help="SQLite state file (default: coordinator/state.sqlite next to the federation file)",
    )
    parser.add_argument(
        "--new-session",
        action="store_true",
        help="start a new session when the state file's session has ended: its files are "
        "renamed <state>-<session id>.sqlite and .payloads (kept for the record); refused "
        "while that session is still running",
    )
    parser.add_argument(
        "--listen",
        default=None,
        metavar="HOST:PORT",
        help="address to serve on (default: the config's coordinator_address; port 0 = any)",
    )
    parser.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="folder with server.pem and server.key (default: coordinator/ next to the "
        "federation file)",
    )
    parser.add_argument(
        "--linger",
        type=float,
        default=None,
        metavar="SECONDS",
        help="after the session ends, keep serving until every node has fetched the outcome "
        "or this long (default: the round deadline)",
    )
    parser.add_argument(
        "--status",
        action="store_true",
        help="print the session's state from the state file and exit: who joined, who was "
        "dropped and why, each round's submissions and deadline, when the state was last "
        "written and whether a coordinator process is running on it (read-only; works beside "
        "a running coordinator)",
    )
    parser.add_argument(
        "--json", action="store_true", help="with --status: print it as JSON instead"
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="log lines on stderr: text (default) or one JSON object per line with time, "
        "level, event, session, node and message",
    )
    parser.add_argument(
        "--calls-per-node",
        type=int,
        default=DEFAULT_CALLS_PER_NODE,
        metavar="N",
        help=f"calls one node may have in progress at once (default {DEFAULT_CALLS_PER_NODE})",
    )
    parser.add_argument(
        "--max-concurrent-rpcs",
        type=int,
        default=None,
        metavar="N",
        help="calls in progress at once over all callers (default: calls-per-node x "
        f"(nodes + 1) + {TOTAL_MARGIN})",
    )
    parser.add_argument(
        "--first-message-seconds",
        type=float,
        default=DEFAULT_FIRST_MESSAGE_SECONDS,
        metavar="S",
        help="a stream's first message must arrive within S seconds "
        f"(default {DEFAULT_FIRST_MESSAGE_SECONDS:g})",
    )
    parser.add_argument(
        "--message-gap-seconds",
        type=float,
        default=DEFAULT_MESSAGE_GAP_SECONDS,
        metavar="S",
        help="each later message of a stream must arrive within S seconds of the server "
        f"asking for it (default {DEFAULT_MESSAGE_GAP_SECONDS:g})",
    )


def _print_status(state: Path, node_ids: tuple[str, ...], *, as_json: bool) -> int:
    import json

    from coordinator.errors import StateFileError
    from coordinator.status_view import read_status, render_status

    try:
        status = read_status(state, node_ids)
    except StateFileError as error:
        print(f"{_PREFIX}: {error}", file=sys.stderr)
        return 2
    print(json.dumps(status, indent=2) if as_json else render_status(status), end="")
    if as_json:
        print()
    return 0


def _server_tls(tls_dir: Path, ca_path: Path, revoked: tuple[str, ...]) -> ServerTLS:
    """The coordinator's TLS files, read bounded and checked before the port is opened.

    The key must be private to its owner; the certificate must match it, be
    issued directly by the federation CA, be meant for serverAuth, be valid
    now and not be revoked (``proto.tls.check_server_credentials``). Raises
    a LocalFileError (OSError) or CertificateError (ValueError) in one sentence.
    """
    from bounded.files import KIB, read_limited, read_secret
    from coordinator.server import ServerTLS
    from proto.tls import CertificateError, check_server_credentials

    limit = 64 * KIB  # certificates and keys are a few kilobytes
    certificate_path = tls_dir / "server.pem"
    certificate = read_limited(certificate_path, limit, what="server certificate")
    key = read_secret(tls_dir / "server.key", limit, what="server key")
    ca = read_limited(ca_path, limit, what="CA certificate")
    try:
        check_server_credentials(ca, certificate, key, revoked=revoked)
    except CertificateError as error:
        raise type(error)(f"{certificate_path}: {error}") from None
    return ServerTLS(certificate=certificate, private_key=key, ca_certificate=ca, revoked=revoked)


def _check_listen(listen: str) -> None:
    """Bind ``listen`` once and let go, so an address in use fails before any state is written.

    gRPC binds only after the session exists; this try, with the same
    SO_REUSEADDR gRPC sets, turns "address in use" into an error before the
    state file is opened. Port 0 (any free port) cannot be in use. Raises
    OSError in one sentence.
    """
    import socket

    host, _, port_text = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    try:
        port = int(port_text)
    except ValueError:
        raise OSError(f"the port {port_text!r} is not a number") from None
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise OSError(f"the host {host!r} cannot be resolved ({error.strerror})") from None
    family, kind, proto, _, address = found[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            import errno

            if error.errno != errno.EADDRINUSE:
                raise OSError(f"{error.strerror or error}") from None
            if not _someone_listens(family, address):
                # Only connections of a process that just exited (a coordinator killed
                # and restarted) hold the port; gRPC, with SO_REUSEPORT, binds it.
                return
            raise OSError(
                f"port {port} is in use by another process (another coordinator?); stop "
                "it or pass --listen HOST:PORT with a free port"
            ) from None


def _someone_listens(family: int, address: tuple[Any, ...]) -> bool:
    """Whether a process accepts TCP connections at ``address`` (a wildcard host as loopback)."""
    import socket

    host = address[0]
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if family == socket.AF_INET else "::1"
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect((host, *address[1:]))
        except OSError:
            return False
    return True


def _ended_session(state_path: Path) -> tuple[str, str, str] | None:
    """(session id, state, reason) of the state file's session if it is over, else None.

    A completed session whose final result some live node has not fetched yet
    is not over: a coordinator killed while it lingered is started again with
    the same arguments to hand it out.
    """
    from coordinator.errors import EmptyStateFile
    from coordinator.store import Store

    if not state_path.exists():
        return None
    try:
        store = Store(state_path, read_only=True)
    except EmptyStateFile:
        return None  # a start that stopped before writing anything (a full disk, say)
    try:
        row = store.session()
        if row is None or row.state not in ("completed", "failed"):
            return None
        if row.state == "completed" and row.current_round is not None:
            undelivered = store.live_node_ids() - store.deliveries(row.current_round)
            if undelivered:
                return None
    finally:
        store.close()
    return row.session_id, row.state, row.reason


def _set_aside(state_path: Path, session_id: str) -> Path:
    """Rename an ended session's state file (and its WAL files, payloads) for the record."""
    from coordinator.store import payload_dir_for

    archive = state_path.with_name(f"{state_path.stem}-{session_id}{state_path.suffix}")
    if archive.exists():
        raise OSError(f"{archive} exists already; move it away first")
    for suffix in ("-wal", "-shm"):
        side = state_path.with_name(state_path.name + suffix)
        if side.exists():
            side.rename(archive.with_name(archive.name + suffix))
    payloads = payload_dir_for(state_path)
    if payloads.exists():
        payloads.rename(payload_dir_for(archive))
    state_path.rename(archive)
    return archive


def _remove_state(state_path: Path) -> None:
    """Remove a state file this run created and never served (with its WAL and payloads)."""
    import contextlib
    import shutil

    from coordinator.store import lock_path_for, payload_dir_for

    for path in (
        state_path,
        state_path.with_name(state_path.name + "-wal"),
        state_path.with_name(state_path.name + "-shm"),
        lock_path_for(state_path),
    ):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    shutil.rmtree(payload_dir_for(state_path), ignore_errors=True)


class _StartRefused(CommandError):
    """The coordinator cannot start; the sentence says why (exit status 2)."""


def run(args: argparse.Namespace) -> int:
    from coordinator.config import SessionConfig
    from coordinator.logs import CoordinatorLog
    from proto.federation import config_hash

    try:
        federation = _federation(args.federation)
        base = federation.base_dir or args.federation.resolve().parent
        state_path: Path = args.state or base / "coordinator" / "state.sqlite"
        if args.status:
            return _print_status(state_path, federation.node_ids, as_json=args.json)
        if args.json:
            raise _StartRefused("--json goes with --status")
        limits = _limits(args)
        log = CoordinatorLog(args.log_format, prefix=_PREFIX)
        _check_linger(args.linger)
        tls = _tls(args.tls_dir or base / "coordinator", federation)
        listen = args.listen or federation.coordinator_address
        _check_listen_or_refuse(listen)
        opened = _open_session(
            state_path,
            SessionConfig.from_federation(federation, config_hash(federation)),
            log,
            new_session=args.new_session,
        )
    except _StartRefused as refusal:
        print(f"{_PREFIX}: {refusal}", file=sys.stderr)
        return 2
    log.session = opened.session.session_id
    verb = "resumed" if opened.session.resumed else "started"
    config = opened.session.config
    log.event(
        f"session-{verb}",
        f"{verb} session {opened.session.session_id} of federation "
        f"{federation.federation_id!r} ({len(config.node_ids)} nodes, at least "
        f"{config.min_nodes}; state {state_path})",
    )
    return _serve(opened, tls, listen, limits, log, linger=args.linger)


def _federation(path: Path) -> FederationConfig:
    from proto.federation import ConfigError, load_federation

    try:
        return load_federation(path)
    except (ConfigError, OSError) as error:
        raise _StartRefused(f"cannot read {path}: {error}") from None


def _limits(args: argparse.Namespace) -> ServerLimits:
    from coordinator.limits import LimitsError, ServerLimits

    try:
        return ServerLimits(
            calls_per_node=args.calls_per_node,
            max_concurrent_rpcs=args.max_concurrent_rpcs,
            first_message_seconds=args.first_message_seconds,
            message_gap_seconds=args.message_gap_seconds,
        )
    except LimitsError as error:
        raise _StartRefused(str(error)) from None


def _check_linger(linger: float | None) -> None:
    from proto.federation.schema import MAX_DEADLINE_SECONDS

    if linger is not None and not 0.0 <= linger <= MAX_DEADLINE_SECONDS:
        raise _StartRefused(
            f"--linger = {linger!r}: must be between 0 and "
            f"{MAX_DEADLINE_SECONDS:g} seconds (30 days)"
        )


def _tls(tls_dir: Path, federation: FederationConfig) -> ServerTLS:
    from proto.tls import CertificateError

    try:
        return _server_tls(tls_dir, federation.ca_certificate_path, federation.revoked)
    except (OSError, CertificateError) as error:
        raise _StartRefused(f"cannot use the TLS files: {error}") from None


def _check_listen_or_refuse(listen: str) -> None:
    try:
        _check_listen(listen)
    except OSError as error:
        raise _StartRefused(f"cannot listen on {listen}: {error}; nothing was written") from None


@dataclass(frozen=True)
class _Opened:
    """The session a start resumed or began, its store, and whether this run made the file."""

    session: Session
    store: Store
    state_path: Path
    fresh: bool


def _open_session(
    state_path: Path, config: SessionConfig, log: CoordinatorLog, *, new_session: bool
) -> _Opened:
    """Resume the state file's session, or begin one; an ended session is set aside or refused."""
    from coordinator.errors import StateFileError
    from coordinator.session import Session
    from coordinator.store import Store

    fresh = not state_path.exists()
    try:
        ended = _ended_session(state_path)
        if ended is not None and not new_session:
            ended_id, ended_state, ended_reason = ended
            why = f" ({ended_reason})" if ended_state == "failed" and ended_reason else ""
            raise _StartRefused(
                f"the state file {state_path} holds session {ended_id}, which "
                f"{ended_state}{why}; an ended session is not started again. For the next "
                "session pass --new-session (the ended session's files are kept beside it) "
                "or a new --state"
            )
        if ended is not None:
            archive = _set_aside(state_path, ended[0])
            fresh = True
            log.event(
                "state-set-aside",
                f"session {ended[0]} had {ended[1]}; its state file is kept as {archive}",
            )
        elif new_session and not fresh:
            raise _StartRefused(
                f"--new-session: the session in {state_path} has not ended; run "
                "without --new-session to resume it, or pass a new --state"
            )
        store = Store(state_path)
        session = Session(store, config, log=log)
    except (StateFileError, OSError) as error:
        raise _StartRefused(str(error)) from None
    return _Opened(session, store, state_path, fresh)


def _serve(
    opened: _Opened,
    tls: ServerTLS,
    listen: str,
    limits: ServerLimits,
    log: CoordinatorLog,
    *,
    linger: float | None,
) -> int:
    """Serve the session until it has ended and been handed out, or a signal stops it."""
    from coordinator.logs import CoreLogRelay
    from coordinator.server import start_server

    session, store, config = opened.session, opened.store, opened.session.config
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    relay = CoreLogRelay(log, keep_info="GRPC_TRACE" in os.environ)
    relay.start()
    # Everything made so far (modules, the config, the opened state) lives as long
    # as the process: the garbage collector need not walk it again on each of its
    # full passes while the session runs (about 4 % of the coordinator's CPU in
    # the round benchmark; docs/how-it-works.md). Undone when serving ends.
    gc.collect()
    gc.freeze()
    try:
        try:
            server = start_server(session, tls, listen=listen, limits=limits, log=log)
        except (OSError, RuntimeError) as error:
            # Taken in the moment since the check: a state file made by this run goes.
            store.close()
            if opened.fresh:
                _remove_state(opened.state_path)
            print(f"{_PREFIX}: cannot listen on {listen}: {error}", file=sys.stderr)
            return 2
        host = listen.rpartition(":")[0] or "0.0.0.0"
        log.event(
            "listening",
            f"listening on {host}:{server.port} (at most {limits.calls_per_node} calls at once "
            f"per node, {limits.total_calls(len(config.node_ids))} in total; first message "
            f"within {limits.first_message_seconds:g} s; health and reflection served)",
        )
        linger_s = linger if linger is not None else config.round_timeout_ms / 1000
        try:
            _wait_until_handed_out(session, stop, linger_s)
        finally:
            server.stop(grace=2.0)
        state, reason, session_id = session.state(), session.reason(), session.session_id
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()
        relay.stop()
        gc.unfreeze()
    return _exit_status(state, reason, session_id, received, log)


def _wait_until_handed_out(session: Session, stop: threading.Event, linger_s: float) -> None:
    """Return once the session has ended and every node was told (or ``linger_s`` passed)."""
    ended_at: float | None = None
    while not stop.wait(0.1):
        if not session.ended():
            continue
        if ended_at is None:
            ended_at = time.monotonic()
        if session.everyone_informed() or time.monotonic() - ended_at >= linger_s:
            return


def _exit_status(
    state: str, reason: str | None, session_id: str, received: list[int], log: CoordinatorLog
) -> int:
    if state == "completed":
        log.event("exit", f"session {session_id} completed")
        return 0
    if state == "failed":
        log.event("exit", f"session {session_id} failed: {reason}", level="error")
        return 1
    name = signal.Signals(received[0]).name if received else "a signal"
    log.event(
        "exit",
        f"stopped by {name}; start again with the same arguments to resume the session",
        level="warning",
    )
    return 128 + (received[0] if received else signal.SIGTERM)
