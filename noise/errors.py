"""Exceptions raised by noise/: small, specific, and worded for a person.

Every exception carries the facts a user needs (which node, which tensor,
which index, which value) as attributes as well as in its message.
"""

from __future__ import annotations


class NoiseError(Exception):
    """Base class for every error raised by noise/."""


class KeyFormatError(NoiseError, ValueError):
    """A key, seed or signature has the wrong type or length."""

    def __init__(self, what: str, expected: str, got: str) -> None:
        self.what = what
        self.expected = expected
        self.got = got
        super().__init__(f"{what} must be {expected}; got {got}.")


class SignatureError(NoiseError):
    """A signed key bundle did not verify for a node, and why."""

    def __init__(self, node_id: str, reason: str) -> None:
        self.node_id = node_id
        self.reason = reason
        super().__init__(f"key bundle of node {node_id!r} rejected: {reason}")


class FixedPointError(NoiseError, ValueError):
    """A value cannot be encoded in fixed point (NaN, infinite, or out of range)."""

    def __init__(self, tensor: str, index: tuple[int, ...], value: float, reason: str) -> None:
        self.tensor = tensor
        self.index = index
        self.value = value
        self.reason = reason
        where = f"tensor {tensor!r} at index {index}"
        super().__init__(f"{where} holds {value!r}: {reason}")


class InfeasibleDesignError(NoiseError, ValueError):
    """A covariance design cannot meet a node's noise target, and why."""

    def __init__(self, node_id: str | None, reason: str) -> None:
        self.node_id = node_id
        self.reason = reason
        prefix = f"node {node_id!r}: " if node_id is not None else ""
        super().__init__(f"infeasible noise design: {prefix}{reason}")


class CalibrationError(NoiseError, ValueError):
    """A privacy parameter is outside the range where calibration is defined."""

    def __init__(self, parameter: str, value: float, reason: str) -> None:
        self.parameter = parameter
        self.value = value
        self.reason = reason
        super().__init__(f"{parameter}={value!r}: {reason}")


class ObserverError(NoiseError, ValueError):
    """An observer class that is not one of the four the accounting knows, and why."""

    def __init__(self, value: object, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"observer class {value!r} {reason}")


class DesignError(NoiseError, ValueError):
    """A noise design or one of its inputs is malformed; ``field`` names the input."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(reason)
