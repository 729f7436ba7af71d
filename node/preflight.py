"""Checks a node makes of its own installation before it contacts anyone.

Masks cancel only if every node draws the same keyed Gaussian streams from the
same keys: numpy's ziggurat sampler over randomgen's AES-128 counter-mode
generator, and the maths library beneath them. ``federation init`` pins the
SHA-256 of a reference stream (``noise.stream.stream_fingerprint``) in the
config as ``stream_check``; :func:`check_stream` refuses an installation that
draws differently, naming its numpy and randomgen versions.
"""

from __future__ import annotations

from importlib.metadata import version

from noise.stream import stream_fingerprint
from proto.federation import ConfigError, FederationConfig

__all__ = ["check_stream"]


def check_stream(config: FederationConfig) -> None:
    """Raise ConfigError when this installation's reference stream differs from the pinned one.

    Does nothing when the config pins no ``stream_check``.
    """
    if config.stream_check is None:
        return
    local = stream_fingerprint()
    if local != config.stream_check:
        raise ConfigError(
            "stream_check",
            config.stream_check,
            f"differs from this installation's reference stream {local[:16]}… "
            f"(numpy {version('numpy')}, randomgen {version('randomgen')}): masks drawn here "
            "would not cancel with the other nodes' masks; install the numpy and randomgen "
            "versions the federation was made with",
        )
