"""The command-line inputs of `zerosum federation init`, read and checked.

Each reader turns one option's text (or file) into values, or raises
:class:`InitError` with one sentence naming the option and what is wrong;
nothing is written before every input has been read.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from bounded.files import read_limited_text
from proto.federation import ConfigError, validate_identifier
from zerosum import pki
from zerosum.errors import CommandError

__all__ = [
    "SYNTHETIC_SIZES",
    "InitError",
    "checker_keys",
    "feature_bounds",
    "feature_names",
    "node_ids",
    "pair",
    "sizes",
]

# Synthetic cohorts: deliberately unequal sizes (cycled), all above N = 100.
SYNTHETIC_SIZES = (400, 250, 600, 300, 500)


class InitError(CommandError):
    """A command-line input is unusable; the message is one sentence for the user."""


def node_ids(text: str) -> list[str]:
    ids = [part.strip() for part in text.split(",")]
    for node_id in ids:
        try:
            validate_identifier("--nodes", node_id)
        except ConfigError as error:
            raise InitError(f"node id {node_id!r} is not allowed: {error.reason}.") from None
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        raise InitError(f"node ids must be unique; {', '.join(repeated)} repeated in --nodes.")
    if len(ids) < 2:
        raise InitError(f"a federation needs at least 2 nodes; --nodes lists {len(ids)}.")
    return ids


def checker_keys(options: Sequence[str], node_ids: Sequence[str]) -> dict[str, list[bytes]]:
    """``NODE=PUBFILE`` options as the public keys given per node."""
    given: dict[str, list[bytes]] = {}
    for option in options:
        node_id, sep, file = option.partition("=")
        if not sep or not node_id or not file:
            raise InitError(f"--checker-key {option!r} must be NODE=PUBFILE.")
        if node_id not in node_ids:
            raise InitError(
                f"--checker-key {option!r} names node {node_id!r}, which is not in --nodes."
            )
        try:
            key = pki.read_ed25519_public_key(file)
        except OSError as error:
            raise InitError(f"--checker-key {option!r}: cannot read {file}: {error}.") from None
        given.setdefault(node_id, []).append(key)
    return given


def pair(option: str, text: str) -> tuple[float, float]:
    try:
        low, high = (float(part) for part in text.split(","))
    except ValueError:
        raise InitError(f"{option} {text!r} must be two numbers LO,HI.") from None
    return low, high


def feature_names(text: str) -> list[str]:
    """``--feature-names a,b,c``: the cohort's feature columns, in order, each named once."""
    names = [part.strip() for part in text.split(",")]
    if not all(names):
        raise InitError(f"--feature-names {text!r} has an empty name; give NAME,NAME,...")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise InitError(f"--feature-names names {', '.join(map(repr, repeated))} more than once.")
    reserved = [n for n in names if n.lower() in ("id", "age")]
    if reserved:
        raise InitError(
            f"--feature-names lists {reserved[0]!r}, which is the cohort's {reserved[0].lower()} "
            "column, not a feature."
        )
    return names


def feature_bounds(
    path: Path, n_features: int | None
) -> tuple[list[str], list[float], list[float]]:
    """(names, lows, highs) from a bounds CSV: header feature,low,high, one row per feature.

    The ``feature`` column names the cohort's column each bound belongs to;
    the rows are in the order of the cohort's feature columns. ``n_features``
    (from --n-features, when given) must match the number of rows.
    """
    option = f"--feature-bounds {path}"
    try:
        text = read_limited_text(path, 1 << 20, what="bounds file")
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except (OSError, UnicodeDecodeError) as error:
        raise InitError(f"{option}: cannot read it: {error}.") from None
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    header = [cell.strip().lower() for cell in rows[0]] if rows else []
    if header != ["feature", "low", "high"]:
        raise InitError(
            f"{option}: the first line must be the header feature,low,high; got "
            f"{','.join(rows[0]) if rows else 'an empty file'!r}."
        )
    if len(rows) < 2:
        raise InitError(f"{option}: no feature rows after the header; give one row per feature.")
    if n_features is not None and len(rows) - 1 != n_features:
        raise InitError(
            f"{option}: {len(rows) - 1} feature row(s) for a model of --n-features "
            f"{n_features}; give one row per feature."
        )
    names: list[str] = []
    lows: list[float] = []
    highs: list[float] = []
    for line, row in enumerate(rows[1:], start=2):
        where = f"{option}, line {line}"
        names.append(_bound_name(where, row, names))
        named = f"{where} ({names[-1]!r})"
        lows.append(_bound_value(named, "low", row[1]))
        highs.append(_bound_value(named, "high", row[2]))
        if lows[-1] >= highs[-1]:
            raise InitError(f"{named}: high {highs[-1]:g} must exceed low {lows[-1]:g}.")
    return names, lows, highs


def _bound_name(where: str, row: list[str], names: list[str]) -> str:
    """The feature a bounds row names (three fields, a name not seen on an earlier row)."""
    if len(row) != 3:
        raise InitError(f"{where}: 3 fields feature,low,high; got {len(row)}.")
    name = row[0].strip()
    if not name:
        raise InitError(
            f"{where}: the feature column is empty; name the cohort column this bound belongs to."
        )
    if name in names:
        raise InitError(
            f"{where}: feature {name!r} already has bounds on line {names.index(name) + 2}."
        )
    return name


def _bound_value(where: str, column: str, cell: str) -> float:
    """The finite number in a bounds row's ``column`` (low or high)."""
    try:
        value = float(cell)
    except ValueError:  # float()'s own error for text that is not a number
        raise InitError(f"{where}: {column} {cell.strip()!r} is not a number.") from None
    if not math.isfinite(value):
        raise InitError(f"{where}: {column} must be finite; got {cell!r}.")
    return value


def sizes(text: str | None, count: int) -> list[int]:
    if text is None:
        return [SYNTHETIC_SIZES[i % len(SYNTHETIC_SIZES)] for i in range(count)]
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise InitError(f"--cohort-sizes {text!r} must be whole numbers N,N,...") from None
    if len(sizes) != count:
        raise InitError(f"--cohort-sizes lists {len(sizes)} sizes for {count} nodes.")
    return sizes
