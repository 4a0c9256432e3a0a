"""The benchmark targets, and where each measured design stands against them.

The targets are for the configuration a design is registered with (its defaults; the rows of other depths are
measured and shown, not judged), on the measuring machine. Which designs a target judges follows from what each
design declares (``Design.prefetch_depth_option``), never from its name: a new design that prefetches is judged
like the ones already registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prototypes.common import Design

# Time ratios within this factor of 1 count as "no slower": the spread between interleaved rounds of one entry on
# the measuring machine (a few per cent) is of this size, so a smaller difference is not a measured one.
NOISE_MARGIN = 1.05

TARGETS = {
    "S1": dict(
        what="overlap efficiency at L = C (measured L/C within 10 %) of every design that prefetches (S1)",
        metric="efficiency",
        compare=">=",
        threshold=0.95,
    ),
    "S1-alternatives": dict(
        what="time per batch against the fastest alternative at every S1 point, every design that prefetches"
             f" (no slower: within the noise margin {NOISE_MARGIN})",
        metric="vs_best_alternative",
        compare="<=",
        threshold=NOISE_MARGIN,
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
    "S6": dict(
        what="overlap efficiency at every M/C point of every design that prefetches (S6)",
        metric="efficiency",
        compare=">=",
        threshold=0.90,
    ),
    "S6-alternatives": dict(
        what="time per batch against the fastest alternative at every S6 point, every design that prefetches"
             f" (no slower: within the noise margin {NOISE_MARGIN})",
        metric="vs_best_alternative",
        compare="<=",
        threshold=NOISE_MARGIN,
    ),
}


def _met(value: float | None, compare: str, threshold: float) -> bool:
    if value is None:
        return False
    return value >= threshold if compare == ">=" else value <= threshold


def _design(row: dict[str, Any], designs: Mapping[str, Design]) -> Design | None:
    return designs.get(row["design"].split("[")[0])  # a row names a design or one of its variants


def _judged(target: str, row: dict[str, Any], designs: Mapping[str, Design]) -> bool:
    """Whether ``row`` is one the target judges: design rows of a design's registered configuration, and for the
    overlap targets only designs that prefetch; S4 judges every row with a fixed depth."""
    if row.get("role") != "design":
        return False
    if target == "S4":
        return isinstance(row.get("depth"), int)
    if row.get("default") is False:
        return False
    if target == "S3":
        return row["flavour"] == "dataloader_iter"
    if target == "S2":
        return True
    design = _design(row, designs)
    if design is None or design.prefetch_depth_option is None:
        return False
    return target != "S1" or row.get("L_over_C") == 1.0


def evaluate_targets(rows: dict[str, list[dict[str, Any]]], designs: Mapping[str, Design]) -> dict[str, Any]:
    """Where each design stands against the targets, from the recorded rows and the designs' declarations."""
    out: dict[str, Any] = {}
    for target, spec in TARGETS.items():
        scenario = target.split("-")[0]
        entry: dict[str, Any] = dict(spec)
        results = []
        for row in rows.get(scenario, []):
            if not _judged(target, row, designs):
                continue
            if target == "S4":
                limit = row["depth"] + 1
                results.append(dict(design=row["design"], value=row["peak_in_flight"], limit=limit,
                                    met=row["peak_in_flight"] <= limit))
                continue
            value = row.get(spec["metric"])
            result = dict(design=row["design"], value=value, met=_met(value, spec["compare"], spec["threshold"]))
            if row.get("point") is not None:
                result["point"] = row["point"]
            for ratio in ("L_over_C", "L_over_C_measured", "M_over_C", "M_over_C_measured"):
                if row.get(ratio) is not None:
                    result[ratio] = row[ratio]
            results.append(result)
        entry["results"] = results
        if not results:
            entry["note"] = f"no design measured for this target in this run ({scenario} not run, or no design" \
                            " it applies to is registered)"
        out[target] = entry
    return out
