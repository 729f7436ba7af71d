"""Checks a node makes of itself before it contacts anyone: its streams and its cohort.

*Streams.* Masks cancel only if every node draws the same keyed Gaussian
streams from the same keys: numpy's ziggurat sampler over randomgen's AES-128
counter-mode generator, and the maths library beneath them. ``federation
init`` pins the SHA-256 of a reference stream (``noise.stream.stream_fingerprint``)
in the config as ``stream_check``; :func:`check_stream` refuses an
installation that draws differently, naming its numpy and randomgen versions.

*Cohort against the bounds* (:class:`CohortPreflight`). The public clipping
bounds fix every tensor's sensitivity, so a value outside them is clipped to
the bound before it is summed. Bounds that do not fit the data (raw volumes in
mm³ against bounds of −10..10) clip nearly every value flat; the sums are then
of the bounds, not of the data, and the model is meaningless, while every
check of the release itself passes. Before joining, the node therefore
reports — inside the TRE, never sent — how many subjects it read, how many
the missing-value policy leaves, and for age and each feature (by name) the
share of those subjects clipped, and refuses to start, one sentence per
problem, when any share exceeds ``plan.clipping.max_clipped_fraction`` or the
subjects left are fewer than ``min_cohort_size``. ``zerosum node --check``
prints the same report and stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import version

from noise.stream import stream_fingerprint
from proto.federation import ConfigError, FederationConfig

__all__ = ["ClipShare", "CohortPreflight", "check_stream"]


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


@dataclass(frozen=True)
class ClipShare:
    """How many of the subjects used lie below or above one column's public bounds."""

    name: str
    low: float
    high: float
    below: int
    above: int
    used: int

    @property
    def clipped(self) -> int:
        return self.below + self.above

    @property
    def fraction(self) -> float:
        return self.clipped / self.used if self.used else 0.0

    def line(self) -> str:
        detail = f" ({self.below} below {self.low:g}, {self.above} above {self.high:g})"
        return f"{self.name}: {self.fraction:.1%} clipped" + (detail if self.clipped else "")


@dataclass(frozen=True)
class CohortPreflight:
    """A cohort measured against the federation's bounds and minimum (stays in the TRE).

    ``columns`` are age first, then every feature in the config's order;
    ``max_clipped_fraction`` None reports the shares without refusing on them.
    """

    source: str
    n_read: int
    n_used: int
    nan_policy: str
    min_cohort_size: int
    columns: tuple[ClipShare, ...]
    max_clipped_fraction: float | None

    def over(self) -> tuple[ClipShare, ...]:
        """The columns clipped for more than the threshold."""
        limit = self.max_clipped_fraction
        if limit is None:
            return ()
        return tuple(c for c in self.columns if c.fraction > limit)

    def problems(self) -> tuple[str, ...]:
        """One sentence per reason to refuse; empty when the cohort may take part."""
        out = []
        if self.n_used < self.min_cohort_size:
            out.append(
                f"{self.source}: only {self.n_used} of the {self.n_read} subjects read are "
                f"left after the missing-value policy (plan.model.nan_policy = "
                f"{self.nan_policy!r}); the federation requires at least "
                f"{self.min_cohort_size} per node (min_cohort_size)."
            )
        limit = self.max_clipped_fraction
        for column in self.over():
            assert limit is not None
            out.append(
                f"{self.source}: {column.name!r} is clipped for {column.fraction:.1%} of the "
                f"{column.used} subjects used ({column.below} below {column.low:g}, "
                f"{column.above} above {column.high:g}), more than "
                f"plan.clipping.max_clipped_fraction = {limit:g}; the federation's bounds do "
                "not fit these data (are they in the same units?)."
            )
        return tuple(out)

    @property
    def passed(self) -> bool:
        return not self.problems()

    def lines(self, *, every_column: bool = True) -> list[str]:
        """The report; without ``every_column`` only the clipped columns are listed."""
        policy = {
            "drop": " (nan_policy 'drop' leaves out subjects with a missing value)",
            "mean": " (nan_policy 'mean' imputes missing values with the global means)",
        }.get(self.nan_policy, "")
        limit = (
            f"; refused above {self.max_clipped_fraction:.1%}"
            if self.max_clipped_fraction is not None
            else ""
        )
        lines = [
            f"pre-flight of {self.source}: {self.n_read} subjects read, {self.n_used} used"
            f"{policy}; at least {self.min_cohort_size} needed",
            f"clipped to the public bounds, share of the {self.n_used} subjects used{limit}:",
        ]
        shown = [c for c in self.columns if every_column or c.clipped]
        lines += [f"  {c.line()}" for c in shown]
        hidden = len(self.columns) - len(shown)
        if hidden:
            which = f"the other {hidden} columns" if shown else f"all {hidden} columns"
            lines.append(f"  {which}: 0 % clipped")
        return lines
