"""The root of the errors simulations/ raises."""

from __future__ import annotations

__all__ = ["SimulationError"]


class SimulationError(Exception):
    """Base class of every error raised by simulations/."""
