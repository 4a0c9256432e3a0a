"""The benchmark targets, and where each measured design stands against them.

Which rows a target judges follows from what each design declares, never from its name (``benchmarks.entries``):
the targets on a design's own cost and behaviour (S2, S3, S3-regular) judge the configuration it ships; the overlap
targets (S1, S6 and their alternatives) measure the prefetch thread, so they judge its opt-in thread
(``Design.thread_options``), or what it ships where it prefetches without declaring one; S4 judges every fixed depth.
Rows of other depths are measured and shown, not judged. A new design is judged like the ones already registered.

Each judged result carries the figure's median over rounds (``value``), its 95 % interval (``interval``) and a
``verdict`` from the interval (``benchmarks.intervals``): met, missed, inconclusive (the interval straddles the
threshold), or not judged with a ``reason`` (too few rounds for an interval, or a point whose measured L/C or M/C
is off its nominal value by more than ``harness_common.RATIO_TOLERANCE``: the point measured something else).
``met`` (True only for "met") is kept for readers of older files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from benchmarks import intervals
from benchmarks.entries import SHIPS, thread_configuration
from harness_common import RATIO_TOLERANCE
from prototypes.common import Design

TARGETS = {
    "S1": dict(
        what="overlap efficiency at L = C of every design that prefetches (S1)",
        metric="efficiency",
        compare=">=",
        threshold=0.95,
    ),
    "S1-alternatives": dict(
        what="time per batch over that of the fastest alternative (stock Lightning with workers or torchdata nodes"
             " prefetching, the simpler design with either) at every S1 point, every design that prefetches:"
             " below 1 it is faster",
        metric="vs_best_alternative",
        compare="<=",
        threshold=1.0,
    ),
    "S2": dict(
        what="speed-up of the pipelined step over the same step without pipelining, every design (S2)",
        metric="speedup",
        compare=">=",
        threshold=1.6,
    ),
    "S3": dict(
        what="time per batch of each design's dataloader_iter flavour over stock Lightning's dataloader_iter"
             " flavour (today's), tiny model (S3)",
        metric="overhead_vs_stock",
        compare="<=",
        threshold=1.05,
    ),
    "S3-regular": dict(
        what="time per batch of each design's regular flavour over stock Lightning's regular flavour, tiny model (S3)",
        metric="overhead_vs_stock",
        compare="<=",
        threshold=1.02,
    ),
    "S4": dict(
        what="peak batches in flight (produced by the dataset, not yet received by the step) <= depth + 1 in every"
             " round (S4)",
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
        what="time per batch over that of the fastest alternative (stock Lightning with workers, with torchdata nodes"
             " prefetching, with the hook work in the workers or in ParallelMapper threads, the simpler design with"
             " nodes prefetching) at every S6 point, every design that prefetches: below 1 it is faster",
        metric="vs_best_alternative",
        compare="<=",
        threshold=1.0,
    ),
    "S7": dict(
        what="time per step call of each design's dataloader_iter flavour (one batch per call) over stock Lightning's"
             " regular flavour's time per batch, under DDP on 2 gloo ranks, a step of about 20 ms of compute (S7)",
        metric="overhead_vs_regular",
        compare="<=",
        threshold=1.01,
    ),
}

NOMINAL_RATIOS = (("L_over_C", "L/C"), ("M_over_C", "M/C"))


def _design(row: dict[str, Any], designs: Mapping[str, Design]) -> Design | None:
    return designs.get(row["design"].split("[")[0])  # a row names a design or one of its variants


OWN_COST = {"S2": None, "S3": "dataloader_iter", "S3-regular": "regular", "S7": "dataloader_iter"}  # -> its flavour
JUDGED_WORLD_SIZE = 2  # S7 judges 2 ranks: on this machine's 2 cores, more ranks wait for the scheduler
JUDGED_STEP = "20ms"  # S7 judges the step of about 20 ms of compute; the tiny step shows the vote's cost alone


def _judged(target: str, row: dict[str, Any], designs: Mapping[str, Design]) -> bool:
    """Whether ``row`` is one the target judges: S4 every design row with a fixed depth; S2, S3 and S7 the rows of
    what a design ships (``configuration``), S7 at 2 ranks and the 20 ms step; the overlap targets the rows of the
    configuration that runs a design's prefetch thread (``entries.thread_configuration``), S1 only at L = C."""
    if row.get("role") != "design":
        return False
    if target == "S4":
        return isinstance(row.get("depth"), int)
    if target in OWN_COST:
        world = row.get("world_size", JUDGED_WORLD_SIZE)
        step = JUDGED_STEP if target != "S7" else row["step"]
        return row.get("configuration") == SHIPS and OWN_COST[target] in (None, row["flavour"]) and (
            world == JUDGED_WORLD_SIZE and step == JUDGED_STEP)
    design = _design(row, designs)
    judged = thread_configuration(design) if design is not None else None  # None: the design does not prefetch
    return judged is not None and row.get("configuration") == judged and (target != "S1" or row.get("L_over_C") == 1.0)


def off_nominal(row: dict[str, Any]) -> str | None:
    """Why a point's row cannot be judged: its measured ratio is off the nominal one by more than the tolerance."""
    for ratio, name in NOMINAL_RATIOS:
        nominal, measured = row.get(ratio), row.get(f"{ratio}_measured")
        if nominal and measured is not None and abs(measured / nominal - 1.0) > RATIO_TOLERANCE:
            return (f"measured {name} {measured:.2f} is off the nominal {nominal:.2f} by more than"
                    f" {RATIO_TOLERANCE:.0%}")
    return None


def judge(row: dict[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """A result for ``row`` against one target: value, interval, verdict (and reason when not judged)."""
    value, interval = row.get(spec["metric"]), row.get(f"{spec['metric']}_interval")
    reason = off_nominal(row)
    if reason is None and interval is None:
        reason = f"no 95 % interval: fewer than {intervals.MIN_ROUNDS} rounds" if value is not None else "not measured"
    verdict = intervals.NOT_JUDGED if reason else intervals.verdict(interval, spec["compare"], spec["threshold"])
    result = dict(design=row["design"], value=value, interval=interval, verdict=verdict,
                  met=verdict == intervals.MET)
    if reason:
        result["reason"] = reason
    return result


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
                # a bound on a count, not a noisy figure: exceeding it in any round misses it
                limit = row["depth"] + 1
                met = row["peak_in_flight"] <= limit
                results.append(dict(design=row["design"], value=row["peak_in_flight"], interval=None, limit=limit,
                                    verdict=intervals.MET if met else intervals.MISSED, met=met))
                continue
            result = judge(row, spec)
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
