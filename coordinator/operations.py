"""What a TRE operator's usual tools ask of a gRPC server: health and reflection.

The coordinator's server also serves

* the standard health service ``grpc.health.v1.Health`` (package
  grpcio-health-checking): ``Check`` and ``Watch`` for the server as a whole
  (service name "") and for ``zerosum.v1.Coordinator``, SERVING while the
  session runs and NOT_SERVING once it has ended or the server is stopping;
* server reflection ``grpc.reflection.v1alpha.ServerReflection`` (package
  grpcio-reflection), so ``grpcurl list`` and ``grpcurl describe`` work
  without the .proto files.

Both are behind the same mutual TLS as the session protocol: the client
needs a certificate issued by the federation CA (a node's, or one made for
the operator; a caller outside the federation may use these two services
but no call of the session protocol). They are behind the same call limits
too (coordinator/guard.py). They tell nothing about the session beyond
whether it still runs, and the public protocol schema.
"""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from coordinator.guard import COORDINATOR_SERVICE

__all__ = ["HEALTH_SERVICE", "REFLECTION_SERVICE", "Operations"]

HEALTH_SERVICE = health.SERVICE_NAME
REFLECTION_SERVICE = reflection.SERVICE_NAME


class Operations:
    """The health and reflection services of one server, and the health it reports."""

    def __init__(self, server: grpc.Server) -> None:
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection(
            (COORDINATOR_SERVICE, HEALTH_SERVICE, REFLECTION_SERVICE), server
        )
        self.serving = False

    def set_serving(self, serving: bool) -> None:
        """SERVING or NOT_SERVING, for the whole server and the session protocol."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", COORDINATOR_SERVICE):
            self._health.set(service, status)
        self.serving = serving

    def shut_down(self) -> None:
        """NOT_SERVING for good (the server is stopping); watchers hear it at once."""
        self.serving = False
        self._health.enter_graceful_shutdown()
