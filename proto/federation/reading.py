"""Reading ``federation.toml``: bounded, strict about unknown settings, one error per fault.

:func:`load_federation` reads the file with a size limit (it refuses FIFOs,
devices and anything larger than :data:`MAX_CONFIG_BYTES`), parses it with
the standard library's ``tomllib`` and builds the frozen dataclasses of
``proto.federation.schema``, which validate every value. Checks run in a fixed
order (unknown or misplaced settings, then the nodes, then each section, then
what relates several of them) and stop at the first problem, reported as a
:class:`~proto.federation.checks.ConfigError` naming the setting.
"""

from __future__ import annotations

import base64
import binascii
import tomllib
from pathlib import Path
from typing import Any, Final, cast

from bounded.files import MIB, read_limited_text
from bounded.nesting import NestingError, check_text_nesting, check_value_nesting
from noise.layout import Layout, LayoutError
from proto.federation.checks import MISSING, ConfigError
from proto.federation.schema import (
    CONFIG_FORMAT,
    OLD_FORMATS,
    FederationConfig,
    NodeEntry,
    NoiseDesignSpec,
    PlanSpec,
    PrivacyPolicy,
    RoundSpec,
    SessionTimings,
)

__all__ = ["MAX_CONFIG_BYTES", "load_federation", "parse_federation"]

# Thousands of nodes and of tensors take well under a mebibyte.
MAX_CONFIG_BYTES: Final = 4 * MIB

_TOP_KEYS: Final = (
    "format",
    "federation_id",
    "coordinator_address",
    "ca_certificate",
    "fixed_point_bits",
    "min_cohort_size",
    "min_nodes",
    "stream_check",
    "revoked",
    "privacy",
    "plan",
    "session",
    "nodes",
)
_PRIVACY_KEYS: Final = ("epsilon", "delta", "epsilon_budget", "residual_dp", "collusion_threshold")
_DESIGN_KEYS: Final = ("construction", "graph", "degree", "target_std")
_SESSION_KEYS: Final = ("join_deadline_seconds", "round_deadline_seconds", "max_reruns")
_ROUND_KEYS: Final = ("name", "tensors", "noise_std")


class _Table:
    """One TOML table: must be a table, and every key in it must be known (unless open)."""

    def __init__(
        self, data: object, name: str, known: tuple[str, ...], *, open_tables: bool = False
    ) -> None:
        if data is MISSING:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(name, data, "must be a table")
        if not open_tables:
            for key, value in data.items():
                if key not in known:
                    expected = ", ".join(known)
                    raise ConfigError(
                        self._join(name, key), value, f"unknown setting; expected one of {expected}"
                    )
        self._data: dict[str, object] = dict(data)
        self._name = name

    @staticmethod
    def _join(name: str, key: str) -> str:
        return f"{name}.{key}" if name else key

    def path(self, key: str) -> str:
        return self._join(self._name, key)

    def take(self, key: str) -> object:
        return self._data.pop(key, MISSING)

    def required(self, key: str, reason: str) -> object:
        value = self.take(key)
        if value is MISSING:
            raise ConfigError(self.path(key), MISSING, reason)
        return value

    def rest(self) -> dict[str, object]:
        """The keys not taken yet."""
        return dict(self._data)

    def arguments(self, required: tuple[str, ...], optional: tuple[str, ...]) -> dict[str, Any]:
        """Keyword arguments for a dataclass: required keys, and optional ones when present."""
        # Any: the dataclasses check every value's type themselves.
        found: dict[str, Any] = {key: self.required(key, "is required") for key in required}
        for key in optional:
            value = self.take(key)
            if value is not MISSING:
                found[key] = value
        return found


def _decode_key(name: str, value: object) -> bytes:
    rule = "must be a 32-byte Ed25519 public key written as 64 hex digits or in base64"
    if not isinstance(value, str):
        raise ConfigError(name, value, rule)
    text = value.strip()
    if len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text):
        return bytes.fromhex(text)
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(name, value, rule) from None
    if len(raw) != 32:
        raise ConfigError(name, value, rule)
    return raw


def _parse_nodes(value: object) -> tuple[NodeEntry, ...]:
    if value is MISSING:
        raise ConfigError("nodes", MISSING, "list each node in a [[nodes]] table")
    if not isinstance(value, list):
        raise ConfigError("nodes", value, "must be an array of [[nodes]] tables")
    entries = []
    for index, item in enumerate(value):
        table = _Table(
            item, f"nodes[{index}]", ("node_id", "identity_public_key", "checker_public_keys")
        )
        node_id = table.required("node_id", "every node needs an id")
        key = _decode_key(
            table.path("identity_public_key"),
            table.required("identity_public_key", "every node needs its identity public key"),
        )
        checkers = table.take("checker_public_keys")
        if checkers is MISSING:
            checkers = []
        if not isinstance(checkers, list):
            raise ConfigError(
                table.path("checker_public_keys"),
                checkers,
                "must be an array of Ed25519 public keys (64 hex digits or base64 each)",
            )
        checker_keys = tuple(
            _decode_key(f"{table.path('checker_public_keys')}[{i}]", value)
            for i, value in enumerate(checkers)
        )
        try:
            entries.append(NodeEntry(cast(str, node_id), key, checker_keys))
        except ConfigError as error:
            leaf = error.field.rpartition(".")[2]
            raise ConfigError(table.path(leaf), error.value, error.reason) from None
    return tuple(entries)


def _parse_rounds(value: object) -> tuple[RoundSpec, ...]:
    if value is MISSING:
        raise ConfigError(
            "plan.rounds", MISSING, "list every round and its tensors in [[plan.rounds]] tables"
        )
    if not isinstance(value, list):
        raise ConfigError("plan.rounds", value, "must be an array of [[plan.rounds]] tables")
    rounds = []
    for index, item in enumerate(value):
        where = f"plan.rounds[{index}]"
        table = _Table(item, where, _ROUND_KEYS)
        name = table.required("name", "every round needs a name")
        tensors = table.required("tensors", "every round lists its tensors: {name, shape}")
        try:
            layout = Layout.from_json(tensors)
        except LayoutError as error:
            raise ConfigError(f"{where}.tensors", tensors, str(error)) from None
        noise_std = table.take("noise_std")
        try:
            rounds.append(
                RoundSpec(
                    cast(str, name),
                    layout,
                    {} if noise_std is MISSING else cast(dict[str, int], noise_std),
                )
            )
        except ConfigError as error:
            if ".noise_std" in error.field:
                leaf = "noise_std" + error.field.partition(".noise_std")[2]
            else:
                leaf = "tensors" if error.field.endswith(".tensors") else "name"
            raise ConfigError(f"{where}.{leaf}", error.value, error.reason) from None
    return tuple(rounds)


def _parse_plan(value: object) -> PlanSpec:
    if value is MISSING:
        raise ConfigError("plan", MISSING, "name the plan the nodes run in a [plan] table")
    table = _Table(value, "plan", ("name", "version", "digest", "rounds"), open_tables=True)
    name = table.required("name", "name the plan the nodes run")
    version = table.required("version", "give the plan's version")
    digest = table.take("digest")
    rounds = _parse_rounds(table.take("rounds"))
    # The tables are checked to be tables by PlanSpec itself.
    settings = cast(dict[str, dict[str, Any]], table.rest())
    return PlanSpec(
        name=cast(str, name),
        version=cast(str, version),
        rounds=rounds,
        settings=settings,
        digest="" if digest is MISSING else cast(str, digest),
    )


def _check_format(value: object) -> None:
    """Refuse a config written for another format, saying how to remake it."""
    if value == CONFIG_FORMAT:
        return
    named = "none (a config made before formats were named)" if value is MISSING else repr(value)
    if value is MISSING or value in OLD_FORMATS:
        what = OLD_FORMATS.get(cast(str, value), OLD_FORMATS["zerosum/v1/federation"])
        raise ConfigError(
            "format",
            named,
            f"this federation was made by an older zerosum ({what}); this version reads only "
            f"{CONFIG_FORMAT!r}. Remake it with `zerosum federation init` and the same options, "
            "and share the new federation.toml, certificates and keys with every party",
        )
    raise ConfigError("format", named, f"this version reads only {CONFIG_FORMAT!r}")


def parse_federation(
    text: str, *, base_dir: Path | None = None, source: str = "federation.toml"
) -> FederationConfig:
    """Parse and validate federation TOML text (see :func:`load_federation`).

    ``source`` names the text in the error raised when it is not TOML at all.
    """
    try:
        # Depth is bounded before tomllib recurses, and again after it for
        # dotted keys and table headers, which nest without brackets.
        check_text_nesting(text, what="a federation config", syntax="toml")
        data = tomllib.loads(text)
        check_value_nesting(data, what="a federation config")
    except tomllib.TOMLDecodeError as error:
        raise ConfigError("file", source, f"is not valid TOML ({error})") from None
    except NestingError as error:
        raise ConfigError("file", source, str(error)) from None
    except RecursionError:
        raise ConfigError("file", source, "nests tables or arrays too deeply to be read") from None
    top = _Table(data, "", _TOP_KEYS)
    _check_format(top.take("format"))
    privacy_table = _Table(top.take("privacy"), "privacy", (*_PRIVACY_KEYS, "noise_design"))
    design_table = _Table(privacy_table.take("noise_design"), "privacy.noise_design", _DESIGN_KEYS)
    session_table = _Table(top.take("session"), "session", _SESSION_KEYS)
    nodes = _parse_nodes(top.take("nodes"))
    plan = _parse_plan(top.take("plan"))

    design = NoiseDesignSpec(**design_table.arguments((), _DESIGN_KEYS))
    privacy = PrivacyPolicy(
        noise_design=design,
        **privacy_table.arguments((), _PRIVACY_KEYS),
    )
    session = SessionTimings(**session_table.arguments((), _SESSION_KEYS))
    settings = top.arguments(
        ("federation_id", "coordinator_address", "ca_certificate"),
        ("fixed_point_bits", "min_cohort_size", "min_nodes", "stream_check", "revoked"),
    )
    return FederationConfig(
        nodes=nodes,
        plan=plan,
        privacy=privacy,
        session=session,
        base_dir=base_dir,
        **settings,
    )


def load_federation(path: str | Path) -> FederationConfig:
    """Read, parse and validate a federation TOML file.

    Relative paths inside the file resolve against the file's folder
    (``config.base_dir``). Raises :class:`ConfigError` naming the first bad
    setting, and :class:`~bounded.files.LocalFileError` (an OSError) naming the
    file when it cannot be read as a config (missing, not a regular file,
    larger than :data:`MAX_CONFIG_BYTES`, not UTF-8).
    """
    path = Path(path)
    text = read_limited_text(path, MAX_CONFIG_BYTES, what="federation config")
    return parse_federation(text, base_dir=path.resolve().parent, source=str(path))
