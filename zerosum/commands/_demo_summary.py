"""The demo's view of the delta summaries: each node's released statistics beside the exact ones.

Only the demo may print the exact values: it holds every node's audit folder
on one machine. A real TRE releases ``values.csv`` alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["print_summaries", "read_summaries"]

_SHOWN = ("mean", "sd", "q5", "q50", "q95")


def read_summaries(out: Path, node_ids: list[str]) -> list[dict[str, Any]]:
    """Per node: ε, N, the released and the exact statistics (empty when summaries are off)."""
    rows = []
    for node_id in node_ids:
        base = Path(out) / "nodes" / node_id / "out"
        manifest_path = base / "egress" / "delta-summary" / "manifest.json"
        if not manifest_path.is_file():
            continue
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        audit = json.loads(
            (base / "audit" / "delta-summary" / "audit.json").read_text(encoding="utf-8")
        )
        rows.append(
            {
                "node_id": node_id,
                "epsilon": manifest["epsilon"],
                # The bundle holds no exact N (not DP); the demo reads the audit record.
                "n_subjects": audit["n_subjects"],
                "scales": {q["name"]: q["scale"] for q in manifest["queries"]},
                "released": {s["name"]: s["value"] for s in manifest["statistics"]},
                "exact": audit["exact"],
                "clipped": audit["clipped"],
            }
        )
    return rows


def print_summaries(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    first = rows[0]
    scales = first["scales"]
    print()
    print(
        f"delta summaries (Laplace, ε = {first['epsilon']:g} per node; scale b: mean "
        f"{scales['mean']:.3g} y, second moment {scales['second_moment']:.3g} y², histogram "
        f"{scales['histogram']:.3g}), released (exact, kept in the TRE):"
    )
    header = "".join(f"{name:>18}" for name in _SHOWN if name in first["released"])
    print(f"  {'node':>6}{'N':>6}{header}")
    for row in rows:
        cells = "".join(
            f"{row['released'][name]:>8.2f} ({row['exact'][name]:>6.2f})"
            for name in _SHOWN
            if name in row["released"]
        )
        print(f"  {row['node_id']:>6}{row['n_subjects']:>6}{cells}")
