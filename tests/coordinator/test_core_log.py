"""gRPC C-core lines become the coordinator's own log events (coordinator.logs.core_line_event)."""

from __future__ import annotations

from coordinator.logs import core_line_event

_VERIFY = (
    "I1201 22:01:22.569776   10914 ssl_transport_security.cc:2563] Handshake failed with error "
    "SSL_ERROR_SSL: error:1000007d:SSL routines:OPENSSL_internal:CERTIFICATE_VERIFY_FAILED: "
    "unable to get local issuer certificate"
)
_ENDED = (
    "I1201 22:01:14.640652   10735 ssl_transport_security.cc:2563] Handshake failed with error "
    "SSL_ERROR_SSL: error:10000070:SSL routines:OPENSSL_internal:BAD_PACKET_LENGTH: Invalid "
    "certificate verification context"
)


def test_a_refused_client_certificate_is_named_without_file_or_thread() -> None:
    event, level, sentence = core_line_event(_VERIFY) or ("", "", "")
    assert (event, level) == ("tls-refused", "warning")
    assert sentence.startswith(
        "refused a TLS handshake: the client's certificate was not issued by this federation's CA"
    )
    assert "CERTIFICATE_VERIFY_FAILED: unable to get local issuer certificate" in sentence
    assert ".cc" not in sentence and "10914" not in sentence


def test_a_client_that_ends_the_handshake_is_logged_too() -> None:
    found = core_line_event(_ENDED)
    assert found is not None and found[0] == "tls-refused"
    assert "does not trust this coordinator's certificate" in found[2]


def test_other_core_lines_become_one_grpc_line_or_are_dropped() -> None:
    warning = "W1201 22:01:22.000001   7 chttp2_server.cc:1] Failed to bind: address in use"
    assert core_line_event(warning) == ("grpc", "warning", "gRPC: Failed to bind: address in use")
    error = "E1201 22:01:22.000001   7 server.cc:10] something broke"
    assert core_line_event(error) == ("grpc", "error", "gRPC: something broke")
    info = "I1201 22:01:22.000001   7 server.cc:10] a note"
    assert core_line_event(info) is None
    assert core_line_event(info, keep_info=True) == ("grpc", "info", "gRPC: a note")
    chosen = (
        "W1201 22:10:03.000001   7 log.cc:1] Log level INFO is not suitable for production. "
        "Prefer WARNING or ERROR."
    )
    assert core_line_event(chosen) is None
    assert core_line_event("Traceback (most recent call last):") is None
