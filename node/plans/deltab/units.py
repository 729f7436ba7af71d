"""The brain-age plan's released sums in real units: years and feature units (the reviewer's view).

A node of the brain-age plan clips every value to the federation's public
bounds and maps each range [lo, hi] onto [-1, 1] before summing
(node/deltab/scaling.py): s = (v − c)/h with centre c = (lo + hi)/2 and
half-width h = (hi − lo)/2. The bundle therefore carries sums of s, not of
the values themselves. Since v = c + h·s, every sum in real units is an
affine function of the round's released sums (with the released count n as
S_0):

    Σ v           = n·c + h·S_x
    Σ vᵏ          = Σ_{m=0..k} C(k, m) c^(k−m) h^m S_m      (age: S_m = sum_y^m)
    Σ x_i x_j     = n c_i c_j + c_i h_j S_j + c_j h_i S_i + h_i h_j S_ij
    Σ x_j·age     = n c_j c_y + c_j h_y S_y + c_y h_j S_j + h_j h_y S_jy
    Σ x_j·age²    = c_j (n c_y² + 2 c_y h_y S_y + h_y² S_y²)
                    + h_j (c_y² S_j + 2 c_y h_y S_jy + h_y² S_jy²)

(the binomial expansion of (c + h s)ᵏ, term by term). Computed from the noised
release, these are post-processing and cost no privacy. Tensors the plan
does not know are shown scaled only (``node.review.units``).
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
from numpy.typing import NDArray

from node.plans.deltab.settings import DeltabSettings
from proto.federation import ConfigError, FederationConfig

__all__ = ["MEANINGS", "DeltabUnits", "unit_decoder"]

MEANINGS: Final[dict[str, str]] = {
    "n": "number of subjects, noised",
    "count_x": "number of subjects with each feature observed, noised",
    "sum_x": "sum over subjects of each feature, noised",
    "sum_xx": (
        "sum over subjects of the product of each pair of features, upper triangle row by row "
        "(the diagonal holds the sums of squares), noised"
    ),
    "sum_xy": "sum over subjects of each feature times age, noised",
    "sum_xy2": "sum over subjects of each feature times age squared, noised",
    "sum_y": "sum of the subjects' ages, noised",
    "sum_y2": "sum of the subjects' squared ages, noised",
    "sum_y3": "sum of the subjects' cubed ages, noised",
    "sum_y4": "sum of the subjects' ages to the fourth power, noised",
}


def _triu(p: int) -> list[tuple[int, int]]:
    rows, cols = np.triu_indices(p)
    return list(zip(rows.tolist(), cols.tolist(), strict=True))


def _age_power_sum(k: int, n: float, s: list[float], c: float, h: float) -> float:
    """Σ ageᵏ from S_0 = n and S_m = s[m-1] (m = 1..k), by the binomial expansion."""
    sums = [n, *s]
    return sum(math.comb(k, m) * c ** (k - m) * h**m * sums[m] for m in range(k + 1))


class DeltabUnits:
    """Real-unit decoding for the brain-age plan's rounds (``node.deltab.sums``)."""

    def __init__(self, settings: DeltabSettings, tensors: dict[str, NDArray[np.float64]]) -> None:
        bounds = settings.clipping
        self.p = settings.n_features
        self.names = bounds.feature_names or tuple(f"feature {j}" for j in range(self.p))
        low = np.asarray(bounds.feature_low, dtype=np.float64)
        high = np.asarray(bounds.feature_high, dtype=np.float64)
        self.cx, self.hx = (low + high) / 2, (high - low) / 2
        self.cy = (bounds.age_low + bounds.age_high) / 2
        self.hy = (bounds.age_high - bounds.age_low) / 2
        self.t = {name: np.asarray(v, dtype=np.float64).reshape(-1) for name, v in tensors.items()}

    def meaning(self, name: str) -> str:
        """What tensor ``name`` is; the sums were sent pre-scaled, the counts as they are."""
        meaning = MEANINGS.get(name, "a tensor of the plan, noised")
        if name not in ("n", "count_x"):
            meaning += " (sent as sums of values pre-scaled to [-1, 1] by the public bounds)"
        return meaning

    def _scalar(self, name: str) -> float | None:
        value = self.t.get(name)
        return None if value is None or value.size != 1 else float(value[0])

    def real(self, name: str) -> tuple[NDArray[np.float64] | None, list[str], str]:  # noqa: PLR0911 - one return per tensor of the plan: the table of real units
        """Real-unit values of tensor ``name``, per-entry labels, and the unit."""
        t, p = self.t, self.p
        features = list(self.names)
        n = self._scalar("n")
        sy = [self._scalar(f"sum_y{k}" if k > 1 else "sum_y") for k in range(1, 5)]
        if name in ("n", "count_x"):
            labels = ["subjects"] if name == "n" else [f"{f} observed" for f in features]
            return t[name], labels, "subjects"
        if name == "sum_x" and "count_x" in t:  # the means round: over observed values
            return t["count_x"] * self.cx + self.hx * t["sum_x"], features, "feature units"
        if n is None:
            return None, [], ""
        if name == "sum_x":
            return n * self.cx + self.hx * t["sum_x"], features, "feature units"
        if name.startswith("sum_y") and name[5:] in ("", "2", "3", "4"):
            k = int(name[5:] or 1)
            if any(v is None for v in sy[:k]):
                return None, [], ""
            known = [float(v) for v in sy[:k] if v is not None]
            value = _age_power_sum(k, n, known, self.cy, self.hy)
            unit = "years" if k == 1 else f"years^{k}"
            return np.array([value]), [f"age^{k}" if k > 1 else "age"], unit
        if "sum_x" not in t:
            return None, [], ""
        sx = t["sum_x"]
        cx, hx, cy, hy = self.cx, self.hx, self.cy, self.hy
        if name == "sum_xx":
            pairs = _triu(p)
            sxx = t["sum_xx"]
            values = np.array(
                [
                    n * cx[i] * cx[j]
                    + cx[i] * hx[j] * sx[j]
                    + cx[j] * hx[i] * sx[i]
                    + hx[i] * hx[j] * sxx[k]
                    for k, (i, j) in enumerate(pairs)
                ]
            )
            return values, [f"{features[i]} × {features[j]}" for i, j in pairs], "feature units²"
        if sy[0] is None:
            return None, [], ""
        y1 = float(sy[0])
        if name == "sum_xy":
            values = n * cx * cy + cx * hy * y1 + cy * hx * sx + hx * hy * t["sum_xy"]
            return values, [f"{f} × age" for f in features], "feature units × years"
        if name == "sum_xy2" and sy[1] is not None and "sum_xy" in t:
            y2 = float(sy[1])
            values = cx * (n * cy**2 + 2 * cy * hy * y1 + hy**2 * y2) + hx * (
                cy**2 * sx + 2 * cy * hy * t["sum_xy"] + hy**2 * t["sum_xy2"]
            )
            return values, [f"{f} × age²" for f in features], "feature units × years²"
        return None, [], ""


def unit_decoder(
    config: FederationConfig, tensors: dict[str, NDArray[np.float64]]
) -> DeltabUnits | None:
    """The real-unit reading of ``tensors`` under the config's bounds; None if it has none."""
    try:
        return DeltabUnits(DeltabSettings.from_tables(config.plan.settings), tensors)
    except (ConfigError, ValueError):
        return None
