"""Benchmark blocks: targets, one table per scenario and machine kind, run notes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rendering.markdown import bench_setup, cell, code, fmt_number, no_results, table
from rendering.results import BENCHMARK_COMMAND, Inputs

SCENARIOS = {
    "S1": "I/O-bound loading: time per batch and efficiency against the ideal",
    "S2": "Step-level pipelining (the #8316 use case): speed-up",
    "S3": "Overhead: time per batch relative to stock Lightning and a raw PyTorch loop",
    "S4": "Jitter and prefetch depth: efficiency and memory by depth",
    "S5": "GPU: pinned-memory host-to-device copies against compute",
}
COLUMN_LABELS = {
    "design": "Design",
    "flavour": "flavour",
    "L_over_C": "L/C",
    "L_target_ms": "L target (ms)",
    "C_target_ms": "C target (ms)",
    "L_ms": "L measured (ms)",
    "C_ms": "C measured (ms)",
    "R_ms": "R (ms)",
    "n_batches": "batches",
    "time_per_batch_ms": "time per batch (ms)",
    "t_serial_ms": "T_serial (ms)",
    "t_ideal_ms": "T_ideal (ms)",
    "efficiency": "efficiency",
    "speedup": "speed-up",
    "speedup_vs_serial": "speed-up vs serial",
    "overhead_vs_regular": "overhead vs stock regular",
    "overhead_vs_raw": "overhead vs raw loop",
    "depth": "depth",
    "peak_rss_mb": "peak RSS (MB)",
    "peak_in_flight": "peak batches in flight",
    "rounds": "rounds",
    "point": "point",
    "R_target_ms": "R target (ms)",
    "efficiency_ceiling": "efficiency ceiling",
    "ideal_speedup": "ideal speed-up",
    "peak_rss_delta_mb": "peak RSS delta (MB)",
    "batch_mib": "batch (MiB)",
    "weights_max_abs_diff": "max weight difference",
    "correct": "correct",
}
# Known keys first, in this order; any other scalar key follows in the order the rows first use it.
COLUMN_ORDER = [
    "design", "flavour", "point", "depth", "L_over_C", "L_target_ms", "C_target_ms", "R_target_ms", "R_ms", "L_ms",
    "C_ms", "n_batches", "batch_mib", "time_per_batch_ms", "t_serial_ms", "t_ideal_ms", "efficiency",
    "efficiency_ceiling", "speedup", "ideal_speedup", "speedup_vs_serial", "overhead_vs_regular", "overhead_vs_raw",
    "peak_rss_mb", "peak_rss_delta_mb", "peak_in_flight", "correct", "weights_max_abs_diff",
]
HIDDEN_COLUMNS = {"role"}  # shown by marking the design cell instead


def is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def is_baseline(row: dict[str, Any]) -> bool:
    return row.get("role") == "baseline"


def _design_cell(row: dict[str, Any]) -> str:
    text = code(row.get("design", "?"))
    return f"{text} *(baseline)*" if is_baseline(row) else text


def _scenario_table(rows: list[dict[str, Any]]) -> str:
    """Columns from the rows' own keys (known ones in a fixed order, then the rest), so schema additions show up."""
    seen: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k not in seen and k not in HIDDEN_COLUMNS and is_scalar(v):
                seen.append(k)
    if "L_ms" in seen and "C_ms" in seen and "L_over_C" not in seen:
        seen.append("L_over_C")  # derived below from the measured L and C
    keys = [k for k in COLUMN_ORDER if k in seen] + [k for k in seen if k not in COLUMN_ORDER]
    body = []
    for row in rows:
        cells = []
        for k in keys:
            if k == "design":
                cells.append(_design_cell(row))
            elif k == "L_over_C" and "L_over_C" not in row:
                cells.append(fmt_number("ratio", l_over_c(row)))
            else:
                cells.append(fmt_number(k, row.get(k)))
        body.append(cells)
    headers = [COLUMN_LABELS.get(k, code(k)) for k in keys]
    numeric = [k == "L_over_C" or all(is_number(r.get(k)) or r.get(k) is None for r in rows) for k in keys]
    align = ["---"] + ["--:" if n else "---" for n in numeric[1:]]
    return table(headers, body, align)


def l_over_c(row: dict[str, Any]) -> float | None:
    if isinstance(row.get("L_over_C"), (int, float)):
        return float(row["L_over_C"])
    L, C = row.get("L_ms"), row.get("C_ms")
    if isinstance(L, (int, float)) and isinstance(C, (int, float)) and C:
        return float(L) / float(C)
    return None


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def target_rule(spec: dict[str, Any]) -> str:
    metric, compare, threshold = spec.get("metric"), spec.get("compare"), spec.get("threshold")
    if metric is None or compare is None or threshold is None:
        return "–"
    shown = fmt_number(str(metric), threshold) if is_number(threshold) else cell(threshold)
    return f"{code(metric)} {cell(str(compare).replace('>=', '≥').replace('<=', '≤'))} {shown}"


def target_result_cell(result: dict[str, Any], metric: str, threshold: Any = None) -> str:
    value = result.get("value")
    text = fmt_number(metric, value) if is_scalar(value) else code(json.dumps(value))
    if is_number(value) and is_number(threshold) and text == fmt_number(metric, threshold) and value != threshold:
        text = f"{value:.4f}"  # rounding would make a miss read like the threshold itself
    if result.get("point") is not None:
        text = f"{cell(result['point'])}: {text}"
    if is_number(result.get("limit")):
        text += f" (limit {fmt_number(metric, result['limit'])})"
    met = result.get("met")
    return text + (" met" if met is True else " **missed**" if met is False else "")


def _targets_table(targets: Any) -> str:
    """The results file's ``targets``: scenario -> {what, metric, compare, threshold, results: [{design, value, met}]}."""
    if not targets:
        return "No targets recorded in the results file."
    rows = []
    for scenario, spec in targets.items():
        metric = str(spec.get("metric", ""))
        results = spec.get("results") or []
        if results:
            where = "<br>".join(f"{code(r.get('design', '?'))}: {target_result_cell(r, metric, spec.get('threshold'))}"
                                for r in results)
        else:
            where = cell(spec.get("note") or "no result")
        rows.append([cell(scenario), cell(spec.get("what", "")), target_rule(spec), where])
    return table(["Scenario", "Target", "Rule", "Where each design stands"], rows)


def _notes_table(notes: Any) -> str:
    if not notes:
        return ""
    rows = []
    for key, value in notes.items():
        if isinstance(value, list) and all(is_number(v) for v in value):
            text = ", ".join(fmt_number(key, v) for v in value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            text = "; ".join(cell(v) for v in value) or "none"
        elif isinstance(value, dict):
            text = "; ".join(f"{k} {fmt_number(k, v)}" for k, v in value.items() if is_scalar(v))
        else:
            text = fmt_number(key, value) if is_scalar(value) else code(json.dumps(value))
        rows.append([code(key), text])
    return table(["Run note", "Value"], rows)


def _bench_section(inputs: Inputs, kind: str, scenario: str) -> str:
    data = inputs.benchmarks[kind]
    rows = data["scenarios"].get(scenario) or []
    title = SCENARIOS.get(scenario, scenario)
    head = f"**{scenario}: {title}** ({code('benchmarks-' + kind + '.json')})"
    setup = bench_setup(data, kind)
    if not rows:
        return f"{head}\n\n{setup}\n\nNo {scenario} rows in this results file."
    return f"{head}\n\n{setup}\n\n{_scenario_table(rows)}"


def bench_block(scenario: str) -> Callable[[Inputs, Path], str]:
    def block(inputs: Inputs, page_dir: Path) -> str:
        if not inputs.benchmarks:
            return no_results("benchmark results", BENCHMARK_COMMAND)
        return "\n\n".join(_bench_section(inputs, kind, scenario) for kind in inputs.benchmarks)

    block.__doc__ = f"Benchmark scenario {scenario} ({SCENARIOS[scenario]}), one table per machine kind."
    return block


def block_bench_targets(inputs: Inputs, page_dir: Path) -> str:
    """The benchmark targets and where each design stands against them, per machine kind."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    out = []
    for kind, data in inputs.benchmarks.items():
        out.append(
            f"**Targets** ({code('benchmarks-' + kind + '.json')})\n\n"
            + bench_setup(data, kind)
            + "\n\n"
            + _targets_table(data.get("targets"))
        )
    return "\n\n".join(out)


def block_bench_other(inputs: Inputs, page_dir: Path) -> str:
    """Any scenario a results file holds beyond S1-S5, rendered generically."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    out = [_bench_section(inputs, kind, scenario)
           for kind, data in inputs.benchmarks.items()
           for scenario in data["scenarios"] if scenario not in SCENARIOS]
    return "\n\n".join(out) if out else "None."


def block_bench_notes(inputs: Inputs, page_dir: Path) -> str:
    """The run notes a results file records (mode, sizes, calibration, load average), per machine kind."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    out = []
    for kind, data in inputs.benchmarks.items():
        table = _notes_table(data.get("notes")) or "No run notes recorded."
        out.append(f"**Run notes** ({code('benchmarks-' + kind + '.json')})\n\n{bench_setup(data, kind)}\n\n{table}")
    return "\n\n".join(out)
