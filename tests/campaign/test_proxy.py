"""The faulty proxy does what it says: each fault, on a plain echo server over 127.0.0.1."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.campaign.proxy import Fault, FaultSchedule, FaultyProxy

MESSAGE = b"x" * 50_000


@pytest.fixture
def echo_port() -> Iterator[int]:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(timeout=5)
    server.close()


def _exchange(port: int, timeout: float = 5.0) -> tuple[bytes, BaseException | None, float]:
    """Send MESSAGE, read until EOF, an error or a timeout: (received, error, seconds)."""
    started = time.monotonic()
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(MESSAGE)
            while len(received) < len(MESSAGE):
                data = sock.recv(65536)
                if not data:
                    break
                received += data
        except OSError as error:
            return received, error, time.monotonic() - started
    return received, None, time.monotonic() - started


def _through(port: int, fault: Fault) -> tuple[bytes, BaseException | None, float, FaultyProxy]:
    proxy = FaultyProxy(port, FaultSchedule(0, script=[fault]))
    try:
        return (*_exchange(proxy.port), proxy)
    finally:
        proxy.close()


def test_pass_forwards_everything(echo_port: int) -> None:
    received, error, _, proxy = _through(echo_port, Fault("pass"))
    assert error is None and received == MESSAGE
    assert proxy.faults()["pass"] == 1


def test_delay_slows_every_chunk(echo_port: int) -> None:
    received, error, seconds, _ = _through(echo_port, Fault("delay", delay_seconds=0.2))
    assert error is None and received == MESSAGE
    assert seconds >= 0.4  # at least one chunk each way


def test_drop_forwards_nothing_and_closes_after_the_hold(echo_port: int) -> None:
    received, error, seconds, _ = _through(echo_port, Fault("drop", hold_seconds=0.5))
    assert received == b""
    assert error is None or isinstance(error, ConnectionResetError)
    assert 0.4 <= seconds < 4.0


def test_truncate_closes_in_mid_stream(echo_port: int) -> None:
    received, error, _, proxy = _through(echo_port, Fault("truncate", after_bytes=20_000))
    # The bytes forwarded stop at the mark; the client then sees the end of the stream.
    assert len(received) < len(MESSAGE)
    assert error is None or isinstance(error, ConnectionResetError)
    assert proxy.records[0].forwarded == 20_000
    assert proxy.faults()["truncate"] == 1


def test_reset_ends_with_a_tcp_reset(echo_port: int) -> None:
    received, error, _, proxy = _through(echo_port, Fault("reset", after_bytes=20_000))
    assert len(received) < len(MESSAGE)
    assert isinstance(error, ConnectionResetError)
    assert proxy.records[0].forwarded == 20_000
    assert proxy.faults()["reset"] == 1


def test_the_schedule_is_seeded() -> None:
    first = [FaultSchedule(7).next() for _ in range(1)]
    again = [FaultSchedule(7).next() for _ in range(1)]
    assert first == again
    drawn = FaultSchedule(7, rate=1.0, faulty_connections=20)
    kinds = {drawn.next().kind for _ in range(20)}
    assert kinds == {"delay", "drop", "truncate", "reset"}
    assert drawn.next().kind == "pass"
