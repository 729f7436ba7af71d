"""Gateways for tests: the real one with a fault injected at a chosen call.

A node whose TRE goes offline, or whose operator presses Ctrl-C, is played by
a real gRPC gateway that raises the chosen exception instead of uploading a
chosen round; everything else goes to the coordinator as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from node.protocol.gateway import CoordinatorGateway
from node.runner import GatewayFactory, grpc_gateway
from node.session.context import NodeOptions
from node.session.setup import LocalSetup
from proto.messages import U64, UploadHeader, UploadReceipt


class FaultyGateway:
    """Delegates to ``inner``; ``before_upload(round_name)`` runs (and may raise) first."""

    def __init__(self, inner: CoordinatorGateway, before_upload: Callable[[str], None]) -> None:
        self._inner = inner
        self._before_upload = before_upload

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def upload(self, header: UploadHeader, payload: U64) -> UploadReceipt:
        self._before_upload(header.round_name)
        return self._inner.upload(header, payload)


def failing_before_upload(fault: Callable[[str], None]) -> GatewayFactory:
    """A gateway factory whose gateway calls ``fault(round_name)`` before each upload."""

    def make(
        setup: LocalSetup, options: NodeOptions, say: Callable[[str], None]
    ) -> CoordinatorGateway:
        return FaultyGateway(grpc_gateway(setup, options, say), fault)  # type: ignore[return-value]

    return make
