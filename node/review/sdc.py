"""Statistical disclosure control thresholds a review applies, ACRO's by default.

ACRO (Green et al. 2023, "ACRO: a tool for semi-automated statistical
disclosure control"; its configuration file ``acro/default.yaml``) sets a
minimum frequency ``safe_threshold`` of 10 for every cell and a minimum of 10
residual degrees of freedom (``safe_dof_threshold``) for analytical
statistics such as regressions. A review applies both to a bundle: every
released value is a sum over the node's N subjects (N >= safe_threshold) and
the brain-age fit has N − P − 1 residual degrees of freedom (at least
safe_dof_threshold). The federation's own ``min_cohort_size`` applies on top.

``--sdc FILE`` reads other values from a file in ACRO's own format: flat
``key: value`` lines (YAML scalars; comments, blank lines and the keys this
review does not use are ignored), or a JSON object with the same keys.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bounded.files import LocalFileError, read_limited_text
from bounded.nesting import NestingError, parse_json
from node.errors import NodeError

# An SDC settings file holds a handful of thresholds.
_SDC_FILE_BYTES = 1 << 20

__all__ = ["ACRO_DEFAULTS", "SDCThresholds", "read_sdc_file"]

_KEYS: Final = ("safe_threshold", "safe_dof_threshold")


class SDCFileError(NodeError, ValueError):
    """An SDC settings file cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class SDCThresholds:
    """Minimum subjects per released value and minimum residual degrees of freedom."""

    safe_threshold: int = 10
    safe_dof_threshold: int = 10
    source: str = "ACRO's defaults, acro/default.yaml"


ACRO_DEFAULTS: Final = SDCThresholds()


def _whole(path: Path, key: str, text: object) -> int:
    try:
        value = int(str(text).strip())
    except ValueError:
        raise SDCFileError(f"{path}: {key} = {text!r} must be a whole number") from None
    if value < 0:
        raise SDCFileError(f"{path}: {key} = {value} must be >= 0")
    return value


def read_sdc_file(path: Path) -> SDCThresholds:
    """Thresholds from an ACRO-style settings file; keys it omits keep ACRO's defaults."""
    path = Path(path)
    try:
        text = read_limited_text(path, _SDC_FILE_BYTES, what="SDC settings file")
    except LocalFileError as error:
        raise SDCFileError(f"cannot read the SDC settings: {error}") from None
    found: dict[str, object] = {}
    if text.lstrip().startswith("{"):
        try:
            data = parse_json(text, what=f"SDC settings file {path}")
        except (json.JSONDecodeError, NestingError) as error:
            raise SDCFileError(f"{path} is not valid JSON: {error}") from None
        found = {k: v for k, v in data.items() if k in _KEYS}
    else:
        for line in text.splitlines():
            content = line.split("#", 1)[0]
            key, sep, value = content.partition(":")
            if sep and key.strip() in _KEYS and not line.startswith((" ", "\t", "-")):
                found[key.strip()] = value
    values = {key: _whole(path, key, value) for key, value in found.items()}
    return SDCThresholds(**values, source=f"{path}")
