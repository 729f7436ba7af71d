"""Ed25519 verdicts made ahead of the session lock (coordinator/context.py)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from coordinator.context import SignatureChecks


def _signed(message: bytes) -> tuple[bytes, bytes, bytes]:
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return public, key.sign(message), message


def test_a_verdict_made_ahead_is_the_verdict_of_the_check() -> None:
    checks = SignatureChecks()
    good = _signed(b"upload statement")
    forged = (good[0], bytes(64), good[2])
    other_message = (good[0], good[1], b"another statement")
    checks.verify_ahead([good, forged, other_message])
    assert checks.verify(*good)
    assert not checks.verify(*forged)
    assert not checks.verify(*other_message)
    assert not checks.verify(b"\x01" * 31, good[1], good[2])  # a malformed key: refused, no raise


def test_verdicts_are_bounded() -> None:
    checks = SignatureChecks()
    checks.LIMIT = 4
    items = [_signed(bytes([i])) for i in range(6)]
    checks.verify_ahead(items)
    assert len(checks._verdicts) == 4
    assert all(checks.verify(*item) for item in items)  # forgotten ones are verified again
