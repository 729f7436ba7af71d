"""A bare gRPC sum service: the transport baseline of the session benchmark.

The session benchmark (benchmarks/session_bench.py) compares a round through
the coordinator with the least any gRPC aggregation over the same network
path could do: the same node processes send the same bytes, in the same 1 MiB
chunks, over mutual TLS with the same certificates, to a server that only adds
them into one uint64 vector and streams the sum back. It has no protocol
around the bytes: no protobuf framing (messages are raw bytes), no header,
checksum, state file, idempotence, deadlines or polling — a download simply
blocks until every expected upload has ended.

Server side: :class:`PlainSumServer` (``reset`` before each round, then K
``Upload`` client streams and K ``Download`` server streams). Client side:
:func:`plain_round`, one node's upload followed by its download.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import numpy as np
from numpy.typing import NDArray

__all__ = ["CHUNK_BYTES", "PlainSumServer", "plain_channel", "plain_round"]

CHUNK_BYTES = 1 << 20
_SERVICE = "zerosum.bench.PlainSum"
_UPLOAD = f"/{_SERVICE}/Upload"
_DOWNLOAD = f"/{_SERVICE}/Download"
_WORD = np.dtype("<u8")


class PlainSumServer:
    """Adds K raw uint64 streams into one vector and serves the sum to every caller.

    Serves on 127.0.0.1 with mutual TLS: ``certificate``/``private_key`` are
    the server's PEM files, clients must present a certificate signed by
    ``ca_certificate``.
    """

    def __init__(
        self,
        *,
        certificate: bytes,
        private_key: bytes,
        ca_certificate: bytes,
        max_workers: int,
        wait_seconds: float = 120.0,
    ) -> None:
        self._lock = threading.Lock()
        self._complete = threading.Condition(self._lock)
        self._sum: NDArray[np.uint64] = np.zeros(0, dtype=_WORD)
        self._expected = 0
        self._finished = 0
        self._wait_seconds = wait_seconds
        handler = grpc.method_handlers_generic_handler(
            _SERVICE,
            {
                "Upload": grpc.stream_unary_rpc_method_handler(self._upload),
                "Download": grpc.unary_stream_rpc_method_handler(self._download),
            },
        )
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers))
        self._server.add_generic_rpc_handlers((handler,))
        credentials = grpc.ssl_server_credentials(
            [(private_key, certificate)],
            root_certificates=ca_certificate,
            require_client_auth=True,
        )
        self.port = self._server.add_secure_port("127.0.0.1:0", credentials)
        if self.port == 0:
            raise OSError("the plain gRPC baseline server could not bind a port on 127.0.0.1.")
        self._server.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def reset(self, n_nodes: int, n_words: int) -> None:
        """Start a new round expecting ``n_nodes`` uploads of ``n_words`` words each."""
        with self._lock:
            self._sum = np.zeros(n_words, dtype=_WORD)
            self._expected = n_nodes
            self._finished = 0

    def stop(self) -> None:
        self._server.stop(grace=1.0).wait()

    def _upload(self, chunks: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        start = 0
        for chunk in chunks:
            words = np.frombuffer(chunk, dtype=_WORD)
            with self._lock:
                target = self._sum[start : start + words.shape[0]]
                np.add(target, words, out=target)
            start += int(words.shape[0])
        with self._lock:
            self._finished += 1
            if self._finished >= self._expected:
                self._complete.notify_all()
        return b""

    def _download(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        with self._lock:
            ready = self._complete.wait_for(
                lambda: self._finished >= self._expected, timeout=self._wait_seconds
            )
            data = self._sum.tobytes()
        if not ready:
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"only {self._finished} of {self._expected} uploads arrived in time.",
            )
        view = memoryview(data)
        for start in range(0, len(data), CHUNK_BYTES):
            yield bytes(view[start : start + CHUNK_BYTES])


def plain_channel(
    address: str, *, root_certificate: bytes, certificate_chain: bytes, private_key: bytes
) -> grpc.Channel:
    """A mutual-TLS channel to the baseline server."""
    credentials = grpc.ssl_channel_credentials(
        root_certificates=root_certificate,
        private_key=private_key,
        certificate_chain=certificate_chain,
    )
    return grpc.secure_channel(address, credentials)


def plain_round(
    channel: grpc.Channel, payload: NDArray[np.uint64], *, timeout: float
) -> tuple[float, NDArray[np.uint64]]:
    """Upload ``payload`` in 1 MiB chunks, then download the sum.

    Returns the ``time.monotonic()`` at which the upload was acknowledged and the sum.
    """
    data = np.ascontiguousarray(payload, dtype=_WORD).view(np.uint8)

    def chunks() -> Iterator[bytes]:
        for start in range(0, data.size, CHUNK_BYTES):
            yield data[start : start + CHUNK_BYTES].tobytes()

    channel.stream_unary(_UPLOAD, None, None)(chunks(), timeout=timeout)
    uploaded = time.monotonic()
    parts = list(channel.unary_stream(_DOWNLOAD, None, None)(b"", timeout=timeout))
    return uploaded, np.frombuffer(b"".join(parts), dtype=_WORD).astype(np.uint64)
