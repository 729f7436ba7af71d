"""Identity keys, per-session ephemeral keys and signed key bundles.

Two kinds of key, with different lifetimes (docs/design.md §4.1–§4.3):

* an **identity key** (Ed25519; Bernstein, Duif, Lange, Schwabe & Yang 2012,
  "High-speed high-security signatures", J. Cryptographic Engineering) lives as
  long as the node's membership of the federation; its public half is pinned in
  the federation config, so the coordinator cannot substitute keys;
* an **ephemeral key** (X25519; Bernstein 2006, "Curve25519: new Diffie-Hellman
  speed records", PKC) lives for one session and is used only to agree on the
  pairwise seeds (noise/seeds.py); it is never written to disk.

A node joins a session with a :class:`KeyBundle`: its ephemeral public key
signed with its identity key over

    b"zerosum/v1/key-bundle" ‖ config_hash ‖ lp(session_id) ‖ lp(node_id) ‖ public_key

where ``lp(s)`` is the UTF-8 encoding of ``s`` preceded by its length as an
unsigned 16-bit big-endian integer. The length prefixes make the encoding
injective (no two different (session, node) pairs sign the same bytes); binding
the config hash, the session id and the node id means a bundle cannot be moved
to another federation, replayed in another session, or claimed by another node.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)
from cryptography.hazmat.primitives.asymmetric.x25519 import (
    X25519PrivateKey,
    X25519PublicKey,
)

from noise.errors import KeyFormatError, SignatureError

__all__ = [
    "BUNDLE_LABEL",
    "CONFIG_HASH_BYTES",
    "PRIVATE_KEY_BYTES",
    "PUBLIC_KEY_BYTES",
    "SIGNATURE_BYTES",
    "EphemeralKey",
    "IdentityKey",
    "KeyBundle",
    "key_fingerprint",
    "length_prefixed",
    "require_bytes",
    "sign_key_bundle",
    "verify_key_bundle",
]

BUNDLE_LABEL = b"zerosum/v1/key-bundle"
PUBLIC_KEY_BYTES = 32
PRIVATE_KEY_BYTES = 32
SIGNATURE_BYTES = 64
CONFIG_HASH_BYTES = 32
_MAX_LP_BYTES = 0xFFFF


def require_bytes(value: object, length: int, what: str) -> bytes:
    """Return ``value`` as ``bytes`` if it is a bytes-like object of ``length`` bytes.

    Raises :class:`KeyFormatError` worded as "<what> must be N bytes; got M bytes."
    """
    if not isinstance(value, bytes | bytearray | memoryview):
        raise KeyFormatError(what, f"{length} bytes", f"a {type(value).__name__}")
    raw = bytes(value)
    if len(raw) != length:
        raise KeyFormatError(what, f"{length} bytes", f"{len(raw)} bytes")
    return raw


def length_prefixed(text: str, what: str) -> bytes:
    """``lp(text)``: UTF-8 bytes of a non-empty identifier preceded by a u16 big-endian length.

    Used in every signed message and key-derivation label so that concatenated
    fields can be split in exactly one way.
    """
    if not isinstance(text, str):
        raise KeyFormatError(what, "a string", f"a {type(text).__name__}")
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise KeyFormatError(what, "encodable as UTF-8", f"{text!r} ({exc.reason})") from None
    if not raw or len(raw) > _MAX_LP_BYTES:
        raise KeyFormatError(
            what, f"a non-empty string of at most {_MAX_LP_BYTES} UTF-8 bytes", repr(text)
        )
    return struct.pack(">H", len(raw)) + raw


def key_fingerprint(public_key: bytes) -> str:
    """Short hex fingerprint (first 16 hex digits of SHA-256) for messages and logs."""
    return hashlib.sha256(public_key).hexdigest()[:16]


class IdentityKey:
    """A node's long-term Ed25519 identity key (its public half is pinned in the config)."""

    __slots__ = ("_private",)

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private = private_key

    @classmethod
    def generate(cls) -> IdentityKey:
        """A fresh identity key from the operating system's CSPRNG."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> IdentityKey:
        """Load the 32-byte raw Ed25519 private key (RFC 8032 seed)."""
        data = require_bytes(raw, PRIVATE_KEY_BYTES, "Ed25519 private key")
        return cls(Ed25519PrivateKey.from_private_bytes(data))

    @classmethod
    def from_pem(cls, data: bytes) -> IdentityKey:
        """Load an unencrypted PKCS#8 PEM Ed25519 private key."""
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise KeyFormatError(
                "identity key PEM", "an unencrypted PKCS#8 Ed25519 private key", str(exc)
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFormatError(
                "identity key PEM", "an Ed25519 private key", f"a {type(key).__name__}"
            )
        return cls(key)

    def to_pem(self) -> bytes:
        """Unencrypted PKCS#8 PEM; store it readable by the node's user only (mode 0600)."""
        return self._private.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def write_pem(self, path: Path) -> None:
        """Write :meth:`to_pem` to ``path`` with mode 0600 (created or replaced)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # The mode given to open() only applies to new files; tighten an old one too.
            os.fchmod(fd, 0o600)
            os.write(fd, self.to_pem())
        finally:
            os.close(fd)

    @classmethod
    def read_pem(cls, path: Path) -> IdentityKey:
        """Load an identity key written by :meth:`write_pem`.

        Trusted paths only (tests, tools): a node or a checker reads its key with
        ``bounded.files.read_secret`` (bounded, regular files, private modes) and
        passes the bytes to :meth:`from_pem`; noise imports no project package.
        """
        return cls.from_pem(Path(path).read_bytes())

    def public_bytes(self) -> bytes:
        """The 32-byte raw public key (the value pinned in the federation config)."""
        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def sign(self, message: bytes) -> bytes:
        """64-byte Ed25519 signature of ``message``."""
        return self._private.sign(bytes(message))

    def __repr__(self) -> str:
        return f"IdentityKey(public={key_fingerprint(self.public_bytes())})"


class EphemeralKey:
    """A per-session X25519 key; its only use is Diffie-Hellman for the pairwise seeds."""

    __slots__ = ("_private",)

    def __init__(self, private_key: X25519PrivateKey) -> None:
        self._private = private_key

    @classmethod
    def generate(cls) -> EphemeralKey:
        """A fresh ephemeral key from the operating system's CSPRNG."""
        return cls(X25519PrivateKey.generate())

    @classmethod
    def from_private_bytes(cls, raw: bytes) -> EphemeralKey:
        """Load a 32-byte raw X25519 private key (clamped as RFC 7748 prescribes)."""
        data = require_bytes(raw, PRIVATE_KEY_BYTES, "X25519 private key")
        return cls(X25519PrivateKey.from_private_bytes(data))

    def private_bytes(self) -> bytes:
        """The 32-byte raw private key (tests, simulations, and a node's saved session key).

        A node keeps it only in its private output folder, mode 0600, until the
        session ends (node/records/session_state.py), so a restarted node can rejoin.
        """
        return self._private.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )

    def public_bytes(self) -> bytes:
        """The 32-byte raw public key sent (signed) to the other nodes."""
        return self._private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def exchange(self, peer_public: bytes) -> bytes:
        """X25519(sk_own, pk_peer): the 32-byte shared secret.

        A low-order peer key would force an all-zero secret that anybody can
        compute (RFC 7748 §6.1); it is rejected, never used.
        """
        raw = require_bytes(peer_public, PUBLIC_KEY_BYTES, "X25519 public key")
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(raw))
        except ValueError:
            shared = bytes(PUBLIC_KEY_BYTES)
        if shared == bytes(PUBLIC_KEY_BYTES):
            raise KeyFormatError(
                "X25519 public key",
                "a point that gives a non-zero shared secret",
                f"a low-order point {raw.hex()} (the shared secret would be all zero)",
            )
        return shared

    def __repr__(self) -> str:
        return f"EphemeralKey(public={key_fingerprint(self.public_bytes())})"


@dataclass(frozen=True)
class KeyBundle:
    """An ephemeral public key signed by a node's identity key for one session.

    Field lengths are checked on construction, so a malformed bundle from the
    wire fails before anything else looks at it.
    """

    config_hash: bytes
    session_id: str
    node_id: str
    public_key: bytes
    signature: bytes

    def __post_init__(self) -> None:
        who = self.node_id if isinstance(self.node_id, str) else repr(self.node_id)
        length_prefixed(self.node_id, "node id")
        length_prefixed(self.session_id, f"session id in the key bundle of node {who!r}")
        require_bytes(
            self.config_hash, CONFIG_HASH_BYTES, f"config hash in the key bundle of node {who!r}"
        )
        require_bytes(self.public_key, PUBLIC_KEY_BYTES, f"X25519 public key of node {who!r}")
        require_bytes(self.signature, SIGNATURE_BYTES, f"Ed25519 signature of node {who!r}")

    def signed_message(self) -> bytes:
        """The exact bytes the identity key signs (see the module docstring)."""
        return _bundle_message(self.config_hash, self.session_id, self.node_id, self.public_key)


def _bundle_message(config_hash: bytes, session_id: str, node_id: str, public_key: bytes) -> bytes:
    return b"".join(
        (
            BUNDLE_LABEL,
            bytes(config_hash),
            length_prefixed(session_id, "session id"),
            length_prefixed(node_id, "node id"),
            bytes(public_key),
        )
    )


def sign_key_bundle(
    identity: IdentityKey,
    *,
    config_hash: bytes,
    session_id: str,
    node_id: str,
    public_key: bytes,
) -> KeyBundle:
    """Sign ``public_key`` for (federation, session, node) with the node's identity key."""
    config = require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    key = require_bytes(public_key, PUBLIC_KEY_BYTES, f"X25519 public key of node {node_id!r}")
    message = _bundle_message(config, session_id, node_id, key)
    return KeyBundle(
        config_hash=config,
        session_id=session_id,
        node_id=node_id,
        public_key=key,
        signature=identity.sign(message),
    )


def verify_key_bundle(
    bundle: KeyBundle,
    identity_public_key: bytes,
    *,
    config_hash: bytes,
    session_id: str,
    node_id: str | None = None,
) -> None:
    """Check that ``bundle`` was signed for this federation, session and node by the pinned key.

    The bound fields are compared before the signature so that the error says
    what is wrong with a genuine bundle used in the wrong place (another
    federation, a replay from another session, another node's slot); a bundle
    whose fields match but whose signature fails was forged or corrupted.
    Returns ``None`` on success and raises :class:`SignatureError` otherwise.
    """
    who = node_id if node_id is not None else bundle.node_id
    pinned = require_bytes(
        identity_public_key, PUBLIC_KEY_BYTES, f"Ed25519 identity public key of node {who!r}"
    )
    expected_config = require_bytes(config_hash, CONFIG_HASH_BYTES, "config hash")
    if bundle.config_hash != expected_config:
        raise SignatureError(
            who,
            "it was signed for another federation "
            f"(config hash {bundle.config_hash.hex()[:16]}…, "
            f"expected {expected_config.hex()[:16]}…).",
        )
    if bundle.session_id != session_id:
        raise SignatureError(
            who,
            f"it was signed for session {bundle.session_id!r}, not the current session "
            f"{session_id!r}; it is replayed from another session.",
        )
    if node_id is not None and bundle.node_id != node_id:
        raise SignatureError(
            who, f"it claims a different node id, {bundle.node_id!r}, than expected ({node_id!r})."
        )
    try:
        Ed25519PublicKey.from_public_bytes(pinned).verify(bundle.signature, bundle.signed_message())
    except (InvalidSignature, ValueError):
        raise SignatureError(
            who,
            "the signature does not verify against the pinned identity key "
            f"(fingerprint {key_fingerprint(pinned)}).",
        ) from None
