"""The benchmark targets, and where each measured design stands against them.

Which designs a target judges follows from what each design declares (``Design.prefetch_depth_option``), never
from its name: a new design that prefetches is judged like the ones already registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prototypes.common import Design

TARGETS = {
    "S1": dict(
        what="overlap efficiency at L = C of every design that prefetches (S1)",
        metric="efficiency",
        compare=">=",
        threshold=0.95,
    ),
    "S2": dict(
        what="speed-up of the pipelined step over the same step without pipelining, every design (S2)",
        metric="speedup",
        compare=">=",
        threshold=1.6,
    ),
    "S3": dict(
        what="time per batch of the dataloader_iter flavour relative to stock Lightning's regular flavour (S3)",
        metric="overhead_vs_regular",
        compare="<=",
        threshold=1.05,
    ),
    "S4": dict(
        what="peak batches in flight (produced by the dataset, not yet received by the step) <= depth + 1 (S4)",
        metric="peak_in_flight",
        compare="<=",
        threshold="depth + 1",
    ),
}


def _met(value: float, compare: str, threshold: float) -> bool:
    return value >= threshold if compare == ">=" else value <= threshold


def _prefetches(row: dict[str, Any], designs: Mapping[str, Design]) -> bool:
    design = designs.get(row["design"].split("[")[0])  # a row names a design or one of its variants
    return design is not None and design.prefetch_depth_option is not None


def evaluate_targets(rows: dict[str, list[dict[str, Any]]], designs: Mapping[str, Design]) -> dict[str, Any]:
    """Where each design stands against the targets, from the recorded rows and the designs' declarations."""
    out: dict[str, Any] = {}
    for scenario, spec in TARGETS.items():
        entry: dict[str, Any] = dict(spec)
        results = []
        for row in rows.get(scenario, []):
            if row.get("role") != "design":
                continue
            if scenario == "S1" and not (_prefetches(row, designs) and row["L_over_C"] == 1.0):
                continue
            if scenario == "S3" and row["flavour"] != "dataloader_iter":
                continue
            if scenario == "S4":
                if row.get("depth") is None:
                    continue
                limit = row["depth"] + 1
                results.append(dict(design=row["design"], value=row["peak_in_flight"], limit=limit,
                                    met=row["peak_in_flight"] <= limit))
                continue
            value = row[spec["metric"]]
            results.append(dict(design=row["design"], value=value, met=_met(value, spec["compare"], spec["threshold"])))
        entry["results"] = results
        if not results:
            entry["note"] = "no design measured for this target in this run (S1: no registered design prefetches)"
        out[scenario] = entry
    return out


