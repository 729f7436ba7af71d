"""Writing ``federation.toml`` in one fixed layout, so that dumps are deterministic.

:func:`dump_federation` writes every setting with a comment saying what it
is, the plan's own tables as they were given (with comments the plan may
supply), and each round's public tensor layout. ``parse_federation`` reads the
text back into an equal config, and so to the same config hash.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proto.federation.schema import CONFIG_FORMAT, FederationConfig, PlanSpec

__all__ = ["dump_federation", "toml_value"]

_PER_LINE = 8


def _toml_string(text: str) -> str:
    out = ['"']
    for char in text:
        code = ord(char)
        if char == '"':
            out.append('\\"')
        elif char == "\\":
            out.append("\\\\")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def toml_value(value: Any) -> str:
    """A TOML literal for a string, boolean, number or array of them.

    Floats use Python's shortest round-trip ``repr``, a valid TOML float for
    every finite value ("1e-06", "100.0"); ints stay ints. Long arrays wrap,
    eight items a line.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, list | tuple):
        return _toml_array([toml_value(v) for v in value])
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(k)} = {toml_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as TOML")


def _toml_array(items: list[str]) -> str:
    """The array of TOML literals ``items``: on one line, or eight items a line."""
    if len(items) <= _PER_LINE:
        return "[" + ", ".join(items) + "]"
    rows = [
        "    " + ", ".join(items[start : start + _PER_LINE]) + ","
        for start in range(0, len(items), _PER_LINE)
    ]
    return "[\n" + "\n".join(rows) + "\n]"


def _key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isalnum() and key.isascii()
    return key if bare else _toml_string(key)


def _table_lines(path: str, table: Mapping[str, Any], comments: Mapping[str, str]) -> list[str]:
    lines = ["", f"[{path}]"]
    nested = []
    for key, value in table.items():
        if isinstance(value, Mapping):
            nested.append((key, value))
            continue
        comment = comments.get(f"{path}.{key}")
        if comment:
            lines.append(f"# {comment}")
        lines.append(f"{_key(key)} = {toml_value(value)}")
    for key, value in nested:
        lines += _table_lines(f"{path}.{_key(key)}", value, comments)
    return lines


def _plan_lines(plan: PlanSpec, comments: Mapping[str, str]) -> list[str]:
    lines = [
        "",
        "# What the nodes compute, round by round. The plan's own settings follow in",
        "# [plan.*] tables; each round's tensor layout is public and fixed here, so the",
        "# coordinator checks every payload against it.",
        "[plan]",
        f"name = {_toml_string(plan.name)}",
        f"version = {_toml_string(plan.version)}",
    ]
    if plan.digest:
        lines += [
            "# SHA-256 of the plan's code; a node whose installed plan differs refuses to start",
            f"digest = {_toml_string(plan.digest)}",
        ]
    for name, table in plan.settings.items():
        lines += _table_lines(f"plan.{_key(name)}", table, comments)
    for spec in plan.rounds:
        lines += ["", "[[plan.rounds]]", f"name = {_toml_string(spec.name)}", "tensors = ["]
        lines += [
            f"    {{ name = {_toml_string(s.name)}, shape = {toml_value(list(s.shape))} }},"
            for s in spec.layout
        ]
        lines.append("]")
        if spec.noise_std:
            pinned = ", ".join(f"{_key(n)} = {v}" for n, v in spec.noise_std.items())
            lines += [
                "# noise standard deviation per tensor in grid units (σ·2^F, rounded up)",
                f"noise_std = {{ {pinned} }}",
            ]
    return lines


def dump_federation(config: FederationConfig, *, comments: Mapping[str, str] | None = None) -> str:
    """Write ``config`` as TOML in a fixed layout; ``parse_federation`` reads it back equal.

    ``comments`` may hold a one-line comment per plan setting, keyed by its
    dotted path (``"plan.model.kind"``).
    """
    privacy, design = config.privacy, config.privacy.noise_design
    lines = [
        "# zerosum federation configuration. Every node and the coordinator hold an",
        "# identical copy: its config hash is bound into every signature and seed.",
        "",
        f"format = {_toml_string(CONFIG_FORMAT)}",
        f"federation_id = {_toml_string(config.federation_id)}",
        f"coordinator_address = {_toml_string(config.coordinator_address)}",
        "# relative to this file's folder",
        f"ca_certificate = {_toml_string(config.ca_certificate)}",
        "# fraction bits F of the uint64 fixed-point encoding (scale 2^-F)",
        f"fixed_point_bits = {config.fixed_point_bits}",
        "# smallest cohort a node may contribute (N); delta must be at most 1/N²",
        f"min_cohort_size = {config.min_cohort_size}",
        "# fewest surviving nodes a round may be aggregated from",
        f"min_nodes = {config.min_nodes}",
    ]
    if config.stream_check is not None:
        lines += [
            "# SHA-256 of the reference Gaussian stream (noise.stream.stream_fingerprint);",
            "# a node whose installation draws differently refuses to start",
            f"stream_check = {_toml_string(config.stream_check)}",
        ]
    if config.revoked:
        lines += [
            "# SHA-256 fingerprints of revoked TLS certificates: the coordinator refuses",
            "# them (not part of the config hash; restart the coordinator to apply)",
            f"revoked = {toml_value(list(config.revoked))}",
        ]
    target = (
        _toml_string("calibrated")
        if design.target_std == "calibrated"
        else toml_value(float(design.target_std))
    )
    lines += [
        "",
        "[privacy]",
        "# (epsilon, delta) per release; epsilon_budget caps the composed total",
        f"epsilon = {toml_value(privacy.epsilon)}",
        f"delta = {toml_value(privacy.delta)}",
        f"epsilon_budget = {toml_value(privacy.epsilon_budget)}",
        "# independent noise so the aggregate itself is differentially private",
        f"residual_dp = {toml_value(privacy.residual_dp)}",
        "# largest coalition of other nodes every node must stay protected against",
        f"collusion_threshold = {privacy.collusion_threshold}",
        "",
        "[privacy.noise_design]",
        '# construction: "pairwise" or "cape"; graph: "complete" or "harary" (with degree)',
        f"construction = {_toml_string(design.construction)}",
        f"graph = {_toml_string(design.graph)}",
    ]
    if design.degree is not None:
        lines.append(f"degree = {design.degree}")
    lines += [
        '# per-node noise standard deviation, or "calibrated" from epsilon, delta and clipping',
        f"target_std = {target}",
        "",
        "[session]",
        "# seconds the coordinator waits for every node to join, and for each round",
        f"join_deadline_seconds = {toml_value(config.session.join_deadline_seconds)}",
        f"round_deadline_seconds = {toml_value(config.session.round_deadline_seconds)}",
        "# superseded attempts allowed per plan round, each a counted release of the same data",
        f"max_reruns = {config.session.max_reruns}",
    ]
    lines += _plan_lines(config.plan, comments or {})
    for entry in config.nodes:
        lines += [
            "",
            "[[nodes]]",
            f"node_id = {_toml_string(entry.node_id)}",
            f"identity_public_key = {_toml_string(entry.identity_public_key.hex())}",
        ]
        if entry.checker_public_keys:
            lines += [
                "# the output checkers' Ed25519 keys: only their signed decision releases",
                "# this node's egress (zerosum review)",
                "checker_public_keys = "
                + toml_value([checker.hex() for checker in entry.checker_public_keys]),
            ]
    return "\n".join(lines) + "\n"
