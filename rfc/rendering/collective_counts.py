"""What a step call costs under DDP, counted: the collectives and host reads of their results per rank, from C16's
count test (``test_c16_collectives.py``) in the conformance results, beside stock Lightning's regular flavour counted
in the same run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prototypes import DESIGNS, RECOMMENDED
from rendering.conformance import conformance_parts
from rendering.markdown import code, no_results, table
from rendering.results import CONFORMANCE_COMMAND, Inputs

COUNT_TEST = "test_c16_collectives.py::test_a_step_call_costs_no_collective_beyond_stocks_per_batch_one"
STEPS = {"1-per-call": "one batch per call", "2-per-call": "two batches per call",
         "async-handle": "Lightning's async-handle pattern (pulls ahead)"}


def counted_runs(data: dict[str, Any], design: str, test: str = COUNT_TEST) -> dict[str, dict[str, list[int]]]:
    """``{step: measured counts}`` of ``test``'s runs for what ``design`` ships (its registered options), or its
    first variant where that did not run."""
    _, _, _, design_of, variants = conformance_parts(data)
    shipped = DESIGNS[design].id
    variant = shipped if shipped in variants else next((v for v in variants if design_of[v] == design), None)
    runs = {}
    for r in data["results"]:
        test_id, _, step = r["test_id"].partition("[")
        if test_id == test and (r.get("variant") or r["design"]) == variant and r.get("measured"):
            runs[step.rstrip("]")] = r["measured"]
    return runs


def _per_rank(values: list[int]) -> str:
    return " / ".join(str(v) for v in values) if len(set(values)) > 1 else str(values[0])


def block_ddp_counts(inputs: Inputs, page_dir: Path) -> str:
    """One row per step of the count test: step calls, collectives and host reads per rank, and stock's."""
    data = inputs.conformance
    if data is None:
        return no_results("conformance results", CONFORMANCE_COMMAND)
    runs = counted_runs(data, RECOMMENDED)
    if not runs:
        return f"The results file holds no counts of {code(COUNT_TEST)} for {code(RECOMMENDED)}."
    rows, beyond = [], set()
    for step, m in _in_step_order(runs):
        beyond.update(t - c for t, c in zip(m["total"], m["calls"], strict=True))
        rows.append([STEPS.get(step, step), _per_rank(m["calls"]), _per_rank(m["drain_calls"]), _per_rank(m["total"]),
                     _per_rank(m["host_reads"]), _per_rank(m["stock_batches"]), _per_rank(m["stock_total"]),
                     _per_rank(m["stock_host_reads"])])
    extra = _per_rank(sorted(beyond))
    return (
        f"Counted per rank over one training epoch on two gloo ranks ({code(COUNT_TEST)}, "
        f"{code(DESIGNS[RECOMMENDED].id)}, as it ships), "
        "beside stock Lightning's regular flavour over the same items in the same run (a value per rank where the "
        "ranks differ):\n\n"
        + table(["step", "step calls", "of them drain calls", "collectives", "host reads", "stock: batches",
                 "stock: collectives", "stock: host reads"], rows)
        + f"\n\nBeyond one collective and one host read per step call: {extra} per epoch (the vote before the first "
        "call)."
    )


def _in_step_order(runs: dict[str, dict[str, list[int]]]) -> list[tuple[str, dict[str, list[int]]]]:
    return sorted(runs.items(), key=lambda kv: list(STEPS).index(kv[0]) if kv[0] in STEPS else len(STEPS))
