"""The review's clipping check: the share of subjects clipped per feature, against the threshold.

Bounds that do not fit the data are invisible in the release itself: the
sums are sums of values flattened to the bounds, with exactly the declared
noise, and every other check passes. What shows it is the count of values the
node clipped, which stays inside the TRE in the round's audit record
(``node.egress.audit``: a count per clipped column, and ``subjects``, the number
they are out of). The installed plan names its columns and the threshold
(``PlanDefinition.clipped_columns``; for the brain-age plan age and each
feature of ``plan.clipping.feature_names``, held to
``plan.clipping.max_clipped_fraction``). With that record (``zerosum review
--audit``) this check fails any column clipped for more than the threshold's
share of the subjects, the same rule the node's pre-flight refuses to start on
(``node.preflight``). Without the record the check says it was not made; a
plan that names no columns has no such check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from node.egress.audit import AuditRecord
from node.egress.bundle import EgressBundle
from node.plans.interface import ClippedColumns
from node.plans.registry import installed_plan
from node.review.findings import Finding, fail, note, passed
from proto.federation import ConfigError, FederationConfig

__all__ = ["ClippingTable", "ColumnClipping", "check_clipping", "clipping_table"]


@dataclass(frozen=True)
class ColumnClipping:
    """One column's clipped count and its share of the subjects."""

    name: str
    clipped: int
    fraction: float


@dataclass(frozen=True)
class ClippingTable:
    """Every column's clipping in a round, with the threshold it is held to."""

    subjects: int
    threshold: float
    columns: tuple[ColumnClipping, ...]
    # The columns in words ("age and every feature"), as the plan names them.
    in_words: str = "every column"

    def over(self) -> tuple[ColumnClipping, ...]:
        return tuple(c for c in self.columns if c.fraction > self.threshold)

    def lines(self) -> list[str]:
        """For the terminal: the clipped columns by name, or one line when none was."""
        head = f"clipped to the public bounds (audit record, share of {self.subjects} subjects"
        head += f"; fails above {self.threshold:.1%})"
        clipped = [c for c in self.columns if c.clipped]
        if not clipped:
            return [f"{head}: 0 % for {self.in_words}"]
        lines = [f"{head}:"]
        for column in clipped:
            mark = "  FAIL" if column.fraction > self.threshold else ""
            lines.append(
                f"  {column.name:<28} {column.fraction:>7.1%} ({column.clipped} values){mark}"
            )
        rest = len(self.columns) - len(clipped)
        if rest:
            lines.append(f"  the other {rest} columns: 0 %")
        return lines

    def to_json(self) -> dict[str, object]:
        return {
            "subjects": self.subjects,
            "max_clipped_fraction": self.threshold,
            "columns": [
                {"name": c.name, "clipped": c.clipped, "fraction": c.fraction} for c in self.columns
            ],
        }


def clipping_table(
    bundle: EgressBundle, config: FederationConfig | None, record: AuditRecord | None
) -> ClippingTable | None:
    """The round's clipping by column name; None without a record or a plan naming columns."""
    if record is None:
        return None
    columns_of = _clipped_columns(config)
    if config is None or columns_of is None:
        return None
    try:
        clipping = columns_of(config)
    except ConfigError:
        return None
    counts = record.clipped
    # Records written before they held the count: the N the bundle declares.
    subjects = record.subjects if record.subjects is not None else bundle.sdc.n_subjects
    columns = tuple(
        ColumnClipping(name, int(counts.get(key, 0)), int(counts.get(key, 0)) / max(subjects, 1))
        for name, key in zip(clipping.names, clipping.keys, strict=True)
    )
    return ClippingTable(subjects, clipping.max_fraction, columns, clipping.in_words)


def _clipped_columns(
    config: FederationConfig | None,
) -> Callable[[FederationConfig], ClippedColumns] | None:
    """The installed plan's clipped columns, when the config names a plan that has them."""
    definition = installed_plan(config) if config is not None else None
    return None if definition is None else definition.clipped_columns


def check_clipping(
    bundle: EgressBundle, config: FederationConfig | None, record: AuditRecord | None
) -> list[Finding]:
    """Fail each column clipped past the threshold; note when the counts are not at hand."""
    if _clipped_columns(config) is None:
        return []
    if record is None:
        return [
            note(
                "clipping",
                "not checked: the counts of clipped values stay in the TRE's audit record; "
                "pass --audit OUT/audit to check them against plan.clipping.max_clipped_fraction",
            )
        ]
    table = clipping_table(bundle, config, record)
    if table is None:
        return []
    over = table.over()
    if over:
        return [
            fail(
                "clipping",
                f"{c.name!r} was clipped to the public bounds for {c.fraction:.1%} of the "
                f"{table.subjects} subjects ({c.clipped} values), more than "
                f"plan.clipping.max_clipped_fraction = {table.threshold:g}: the bounds do not "
                "fit these data, and the release sums values flattened to the bounds",
            )
            for c in over
        ]
    worst = max(table.columns, key=lambda c: c.fraction)
    detail = (
        f"at most {worst.fraction:.1%} ({worst.name!r})"
        if worst.clipped
        else f"0 % for {table.in_words}"
    )
    return [
        passed(
            "clipping",
            f"clipped to the public bounds: {detail} of the {table.subjects} subjects, within "
            f"plan.clipping.max_clipped_fraction = {table.threshold:g}",
        )
    ]
