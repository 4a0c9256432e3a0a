"""Benchmark blocks: the page's setup line, the targets, one table per scenario and machine kind, run notes.

Each scenario table leads with what a decision needs (the design, the point, the headline figures, which targets
the row meets or misses); the figures behind them (measured L and C, the baselines, the raw-loop ideal, rounds)
follow in a collapsed ``<details>`` block. The setup line and the run's warning appear once per page
(``bench-setup``), not per table.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rendering.markdown import bench_setup, cell, code, fmt_number, is_number, is_scalar, no_results, table
from rendering.registry_order import registry_key
from rendering.results import BENCHMARK_COMMAND, Inputs
from rendering.targets import row_verdicts, targets_table, with_interval

SCENARIOS = {
    "S1": "I/O-bound loading: efficiency against the ideal and time against the alternatives",
    "S2": "Step-level pipelining (the #8316 use case): speed-up",
    "S3": "Overhead: time per batch relative to stock Lightning and a raw PyTorch loop",
    "S4": "Jitter and prefetch depth: efficiency and memory by depth",
    "S5": "GPU: pinned-memory host-to-device copies against compute",
    "S6": "Main-process work in the transfer hooks, loading in workers: efficiency and time against the alternatives",
    "S3-profile": "Where the extra time per batch goes: a main-thread profile against stock Lightning's regular one",
    "S7": "A step call under DDP: its time against a batch of stock's regular flavour, on 2, 4 and 8 gloo ranks",
}
COLUMN_LABELS = {
    "design": "Design",
    "flavour": "flavour",
    "point": "point",
    "L_over_C": "L/C",
    "L_over_C_measured": "L/C measured",
    "M_over_C_measured": "M/C measured",
    "L_target_ms": "L target (ms)",
    "C_target_ms": "C target (ms)",
    "M_target_ms": "M target (ms)",
    "L_ms": "L (ms)",
    "C_ms": "C (ms)",
    "M_ms": "M (ms)",
    "C_raw_ms": "C raw loop (ms)",
    "R_ms": "R (ms)",
    "n_batches": "batches",
    "time_per_batch_ms": "time per batch (ms)",
    "time_per_batch_plain_ms": "unpipelined (ms)",
    "t_serial_ms": "T_serial (ms)",
    "t_ideal_ms": "T_ideal (ms)",
    "t_ideal_raw_ms": "T_ideal raw loop (ms)",
    "t_regular_ms": "stock regular (ms)",
    "t_raw_ms": "raw loop (ms)",
    "efficiency": "efficiency",
    "efficiency_raw_ideal": "efficiency vs raw-loop ideal",
    "best_alternative": "fastest alternative",
    "vs_fixed_depth": "time vs the same design at a fixed depth",
    "overhead_vs_stock": "time vs stock, same flavour",
    "overhead_vs_stock_interleaved": "time vs stock, same flavour, interleaved rounds",
    "paired": "lockstep pairs",
    "pairs": "pairs",
    "same_entry_ratio": "stock over itself, lockstep pairs",
    "t_stock_iter_ms": "stock dataloader_iter (ms)",
    "timed_batches": "timed batches",
    "workers": "workers",
    "speedup": "speed-up",
    "speedup_vs_serial": "speed-up vs serial",
    "vs_best_alternative": "time vs best alternative",
    "vs_workers": "time vs workers",
    "vs_nodes_prefetch": "time vs nodes prefetch",
    "overhead_vs_regular": "overhead vs stock regular",
    "overhead_vs_raw": "overhead vs raw loop",
    "depth": "depth",
    "peak_rss_mb": "peak RSS (MB)",
    "peak_rss_delta_mb": "peak RSS delta (MB)",
    "peak_in_flight": "peak batches in flight",
    "in_flight_limit": "limit",
    "rounds": "rounds",
    "off_main_thread": "share loaded off the main thread",
    "function": "function (main thread)",
    "extra_us_per_batch": "extra µs per batch",
    "us_per_batch": "µs per batch",
    "stock_us_per_batch": "stock regular µs per batch",
    "R_target_ms": "R target (ms)",
    "ideal_speedup": "ideal speed-up",
    "batch_mib": "batch (MiB)",
    "weights_max_abs_diff": "max weight difference",
    "correct": "correct",
    "world_size": "ranks",
    "step": "step",
    "backend": "backend",
    "t_call_us": "µs per step call",
    "t_regular_us": "stock regular µs per batch",
}
TARGETS_COLUMN = "targets"
# Per scenario: the lead table's columns and the details table's; the rows they show (roles).
LAYOUTS: dict[str, dict[str, Any]] = {
    "S1": dict(lead=["design", "point", "L_over_C_measured", "time_per_batch_ms", "efficiency",
                     "vs_best_alternative", "off_main_thread", TARGETS_COLUMN],
               details=["design", "point", "L_ms", "C_ms", "t_serial_ms", "t_ideal_ms", "best_alternative",
                        "vs_fixed_depth", "rounds"],
               raw=["design", "point", "C_raw_ms", "t_ideal_raw_ms", "efficiency_raw_ideal", "vs_workers",
                    "vs_nodes_prefetch"]),
    "S2": dict(lead=["design", "time_per_batch_plain_ms", "time_per_batch_ms", "speedup", "ideal_speedup",
                     TARGETS_COLUMN],
               details=["design", "R_target_ms", "C_target_ms", "n_batches", "rounds"]),
    "S3": dict(lead=["design", "flavour", "time_per_batch_ms", "overhead_vs_stock", "overhead_vs_regular",
                     "off_main_thread", TARGETS_COLUMN],
               details=["design", "flavour", "paired", "pairs", "overhead_vs_stock_interleaved", "t_regular_ms",
                        "t_stock_iter_ms", "t_raw_ms", "overhead_vs_raw", "n_batches", "rounds"]),
    "S4": dict(lead=["design", "depth", "time_per_batch_ms", "efficiency", "peak_in_flight", "in_flight_limit",
                     "peak_rss_delta_mb", TARGETS_COLUMN],
               details=["design", "L_ms", "C_ms", "t_serial_ms", "t_ideal_ms", "peak_rss_mb", "off_main_thread",
                        "rounds"],
               raw=["design", "C_raw_ms", "t_ideal_raw_ms", "efficiency_raw_ideal"]),
    "S5": dict(lead=["design", "point", "L_over_C_measured", "time_per_batch_ms", "efficiency", "correct",
                     "weights_max_abs_diff"],
               details=["design", "point", "L_ms", "C_ms", "t_serial_ms", "t_ideal_ms", "rounds"],
               raw=["design", "point", "C_raw_ms", "t_ideal_raw_ms", "efficiency_raw_ideal"]),
    "S6": dict(lead=["design", "point", "M_over_C_measured", "time_per_batch_ms", "efficiency",
                     "vs_best_alternative", "off_main_thread", TARGETS_COLUMN],
               details=["design", "point", "M_ms", "C_ms", "L_ms", "t_serial_ms", "t_ideal_ms", "best_alternative",
                        "vs_fixed_depth", "rounds"],
               raw=["design", "point", "C_raw_ms", "t_ideal_raw_ms", "efficiency_raw_ideal", "vs_workers",
                    "vs_nodes_prefetch"]),
    "S7": dict(lead=["design", "world_size", "step", "t_call_us", "t_regular_us", "overhead_vs_regular",
                     TARGETS_COLUMN],
               details=["design", "world_size", "backend", "timed_batches", "rounds"]),
    "S3-profile": dict(lead=["design", "function", "extra_us_per_batch", "us_per_batch", "stock_us_per_batch"],
                       details=[]),
}
BASELINE_COLUMNS = ["design", "point", "flavour", "depth", "time_per_batch_ms", "rounds", "same_entry_ratio", "pairs"]
UNSHOWN = {"role", "default", "configuration", "L_over_C", "M_over_C"}  # the design cell and the point show these
# a figure's interval is shown with the figure: "<figure>_interval" is never a column of its own
ROLE_NOTE = {"baseline": "baseline", "alternative": "alternative"}


def is_baseline(row: dict[str, Any]) -> bool:
    """Not a design: a baseline or an alternative a user has today."""
    return row.get("role") in ("baseline", "alternative")


def l_over_c(row: dict[str, Any]) -> float | None:
    """The measured L/C of a row (falling back to the nominal one, or to L and C, for older files)."""
    for key in ("L_over_C_measured", "L_over_C"):
        if is_number(row.get(key)):
            return float(row[key])
    L, C = row.get("L_ms"), row.get("C_ms")
    if is_number(L) and is_number(C) and C:
        return float(L) / float(C)
    return None


ROLE_ORDER = {"baseline": 0, "alternative": 1}  # then the designs


def in_registry_order(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A scenario's rows point by point (in the file's order of points), each point's baselines and alternatives as
    the file lists them, then its design entries in the registry's order."""
    points = list(dict.fromkeys(str(r.get("point")) for r in rows))

    def key(indexed: tuple[int, dict[str, Any]]) -> tuple[Any, ...]:
        index, row = indexed
        role = ROLE_ORDER.get(str(row.get("role")), len(ROLE_ORDER))
        within = index if role < len(ROLE_ORDER) else registry_key(str(row.get("design", "")))
        return points.index(str(row.get("point"))), role, within

    return [row for _, row in sorted(enumerate(rows), key=key)]


def _design_cell(row: dict[str, Any]) -> str:
    text = code(row.get("design", "?"))
    role = ROLE_NOTE.get(str(row.get("role")))
    if role:
        return f"{text} *({role})*"
    if row.get("configuration"):  # "ships" or "opt-in thread" (benchmarks.entries)
        return f"{text} *({row['configuration']})*"
    # results written before rows named their configuration
    return text + (" *(default)*" if row.get("default") is True and row.get("depth") is not None else "")


# ---------------------------------------------------------------------------------------------- tables
def _columns_table(rows: list[dict[str, Any]], keys: list[str], targets: dict[str, Any], scenario: str) -> str:
    keys = [k for k in keys if k in ("design", TARGETS_COLUMN) or any(k in r for r in rows)
            or (k == "L_over_C_measured" and any(l_over_c(r) is not None for r in rows))]
    if keys == ["design"]:
        return ""
    if TARGETS_COLUMN in keys and not any(name.split("-")[0] == scenario for name in targets or {}):
        keys.remove(TARGETS_COLUMN)
    body = []
    for row in rows:
        cells = []
        for k in keys:
            if k == "design":
                cells.append(_design_cell(row))
            elif k == TARGETS_COLUMN:
                cells.append(row_verdicts(row, scenario, targets))
            elif k == "L_over_C_measured":
                cells.append(fmt_number("ratio", l_over_c(row)))
            elif k == "off_main_thread" and is_number(row.get(k)):
                cells.append(f"{row[k]:.0%}")
            elif k == "vs_fixed_depth" and isinstance(row.get(k), dict):
                cells.append("<br>".join(f"depth {depth}: {with_interval('ratio', v.get('value'), v.get('interval'))}"
                                         for depth, v in row[k].items()) or "–")
            else:
                cells.append(with_interval(k, row.get(k), row.get(f"{k}_interval")))
        body.append(cells)
    headers = [COLUMN_LABELS.get(k, code(k)) if k != TARGETS_COLUMN else "targets" for k in keys]
    numeric = [all(is_number(r.get(k)) or r.get(k) is None for r in rows) and k not in ("design", "point",
               TARGETS_COLUMN) for k in keys]
    return table(headers, body, ["--:" if n else "---" for n in numeric])


def generic_table(rows: list[dict[str, Any]]) -> str:
    """Columns from the rows' own scalar keys, in the order the rows first use them (scenarios without a layout)."""
    seen: list[str] = []
    for row in rows:
        for k, v in row.items():
            if k not in seen and k != "role" and is_scalar(v):
                seen.append(k)
    keys = ["design"] + [k for k in seen if k != "design"]
    return _columns_table(rows, keys, {}, "")


def details(summary: str, *tables: str) -> str:
    body = "\n\n".join(t for t in tables if t)
    return f"<details><summary>{summary}</summary>\n\n{body}\n\n</details>"


def scenario_tables(data: dict[str, Any], scenario: str) -> str:
    rows = in_registry_order(data["scenarios"].get(scenario) or [])
    targets = data.get("targets") or {}
    layout = LAYOUTS.get(scenario)
    if layout is None:
        return generic_table(rows)
    leading = [r for r in rows if r.get("role") != "baseline"]
    baselines = [r for r in rows if r.get("role") == "baseline"]
    parts = [_columns_table(leading, layout["lead"], targets, scenario)]
    behind = [_columns_table(leading, layout["details"], targets, scenario)] if layout["details"] else []
    if layout.get("raw") and any("C_raw_ms" in r for r in leading):
        behind.append(_columns_table(leading, layout["raw"], targets, scenario))
    if baselines:
        behind.append(_columns_table(baselines, BASELINE_COLUMNS, targets, scenario))
    shown = {k for name in ("lead", "details", "raw") for k in layout.get(name, [])} | set(BASELINE_COLUMNS)
    other = [k for k in dict.fromkeys(k for r in rows for k, v in r.items() if is_scalar(v) or k.endswith("_interval"))
             if k not in shown and k not in UNSHOWN and not k.endswith("_interval")]
    if other:  # whatever else the rows record (a schema addition shows up here without a layout change)
        behind.append(_columns_table(rows, ["design", "point", *other], targets, scenario))
    if any(behind):
        parts.append(details("Measured L, C and the baselines, the raw-loop ideal, rounds", *behind))
    return "\n\n".join(parts)


# What a reader needs before a scenario's tables, where two of its columns measure one thing two ways
READING = {
    "S3": ("Two ways to the same ratio. The lead table's times and the details' \"time vs stock, same flavour, "
           "interleaved rounds\" come from rounds in which each entry runs whole in turn, so the machine's drift "
           "between rounds (another process, frequency, caches) lands in the ratio and widens its interval. The "
           "lockstep pairs (\"lockstep pairs\", and what the S3 target judges) alternate the two loops batch by batch "
           "on one core, so drift hits both alike and cancels; \"stock over itself, lockstep pairs\" shows what is "
           "left of the method's own spread. Where the two disagree, the lockstep ratio is the one to read."),
}


def _bench_section(inputs: Inputs, kind: str, scenario: str) -> str:
    data = inputs.benchmarks[kind]
    head = f"**{scenario}: {SCENARIOS.get(scenario, scenario)}** ({code('benchmarks-' + kind + '.json')})"
    if not data["scenarios"].get(scenario):
        return f"{head}\n\nNo {scenario} rows in this results file."
    reading = f"\n\n{READING[scenario]}" if scenario in READING else ""
    return f"{head}{reading}\n\n{scenario_tables(data, scenario)}"


def bench_block(scenario: str) -> Callable[[Inputs, Path], str]:
    def block(inputs: Inputs, page_dir: Path) -> str:
        if not inputs.benchmarks:
            return no_results("benchmark results", BENCHMARK_COMMAND)
        return "\n\n".join(_bench_section(inputs, kind, scenario) for kind in inputs.benchmarks)

    block.__doc__ = f"Benchmark scenario {scenario} ({SCENARIOS[scenario]}), one table per machine kind."
    return block


def block_bench_setup(inputs: Inputs, page_dir: Path) -> str:
    """The setup line (machine, versions, commit) and the run's warnings, once per results file."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    return "\n\n".join(bench_setup(data, kind) for kind, data in inputs.benchmarks.items())


def block_bench_targets(inputs: Inputs, page_dir: Path) -> str:
    """The benchmark targets and where each design stands against them, per machine kind."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    return "\n\n".join(f"**Targets** ({code('benchmarks-' + kind + '.json')})\n\n{targets_table(data.get('targets'))}"
                       for kind, data in inputs.benchmarks.items())


def block_bench_other(inputs: Inputs, page_dir: Path) -> str:
    """Any scenario a results file holds beyond S1-S6, rendered generically."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    out = [_bench_section(inputs, kind, scenario)
           for kind, data in inputs.benchmarks.items()
           for scenario in data["scenarios"] if scenario not in SCENARIOS]
    return "\n\n".join(out) if out else "None."


def _notes_table(notes: Any) -> str:
    if not notes:
        return ""
    rows = []
    for key, value in notes.items():
        if isinstance(value, list) and all(is_number(v) for v in value):
            text = ", ".join(fmt_number(key, v) for v in value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            text = "; ".join(cell(v) for v in value) or "none"
        elif isinstance(value, dict) and all(is_scalar(v) for v in value.values()):
            text = "; ".join(f"{k} {fmt_number(k, v)}" for k, v in value.items())
        elif isinstance(value, dict) and all(isinstance(v, dict) for v in value.values()):
            text = "<br>".join(f"{cell(k)}: " + ", ".join(f"{kk} {fmt_number(kk, vv)}" for kk, vv in v.items())
                               for k, v in value.items())
        else:
            text = fmt_number(key, value) if is_scalar(value) else code(json.dumps(value))
        rows.append([code(key), text])
    return table(["Run note", "Value"], rows)


def block_bench_notes(inputs: Inputs, page_dir: Path) -> str:
    """The run notes a results file records (mode, sizes, calibration, load average), per machine kind."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    out = []
    for kind, data in inputs.benchmarks.items():
        notes = _notes_table(data.get("notes")) or "No run notes recorded."
        out.append(f"**Run notes** ({code('benchmarks-' + kind + '.json')})\n\n{notes}")
    return "\n\n".join(out)


# The model that carries S7's per-call cost to large worlds. Assumptions, stated where the block renders them:
# NCCL reduces a message this small with a tree, so a collective costs per-hop latency times its passes over the
# tree's depth (log2 of the ranks); a broadcast makes one pass (down), an all-reduce two (up, then down); the payload
# (one int against a few, six more elements in a bucket) adds nothing measurable at that size; the host read after
# it costs what stock's does.
MODEL_WORLDS = (64, 256, 1024, 4096)
MODEL_HOP_LATENCY_US = (5.0, 10.0)  # assumed per-hop latency of a small NCCL message, low and high


def block_ddp_cost_model(inputs: Inputs, page_dir: Path) -> str:
    """What a step call costs under DDP: S7's measured points per world size, then the model for large worlds."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    parts = []
    for kind, data in inputs.benchmarks.items():
        rows = [r for r in in_registry_order(data["scenarios"].get("S7") or [])
                if r.get("world_size") and r.get("t_call_us")]
        if not rows:
            parts.append(f"No S7 step-call rows in {code('benchmarks-' + kind + '.json')}.")
            continue
        body = [[_design_cell(r), str(r["world_size"]), str(r["step"]),
                 fmt_number("t_call_us", r["t_call_us"]),
                 fmt_number("t_regular_us", r["t_regular_us"]),
                 with_interval("overhead_vs_regular", r.get("overhead_vs_regular"),
                               r.get("overhead_vs_regular_interval")),
                 fmt_number("t_call_us", r["t_call_us"] - r["t_regular_us"])] for r in rows]
        measured = table(["Design", "ranks", "step", "µs per step call", "stock regular µs per batch", "ratio",
                          "difference (µs)"], body, ["---", "--:", "---", "--:", "--:", "--:", "--:"])
        parts.append(f"Measured ({code('benchmarks-' + kind + '.json')}, S7, gloo on this machine's cores):\n\n"
                     + measured)
    low, high = MODEL_HOP_LATENCY_US

    model = [[str(world), str(int(math.log2(world))), f"{math.log2(world) * low:.0f} to {math.log2(world) * high:.0f}"]
             for world in MODEL_WORLDS]
    parts.append(
        "The model for larger worlds on NCCL, per step call, against a batch of stock Lightning's regular flavour."
        " Stock's batch meets its peers twice: rank 0's SIGTERM broadcast before the batch, and the gradients'"
        " all-reduce. The stack's call also meets them twice: the gradients' all-reduce, and the vote, an all-reduce"
        " in place of the broadcast. Each epoch adds one vote, before its first call. Assumed: NCCL reduces a"
        " message this small with a tree. A collective then costs the per-hop latency times its passes over the"
        " tree's depth (log2 of the ranks): one pass for a broadcast, two for an all-reduce. Both send one number."
        f" A small message's per-hop latency is {low:.0f} to {high:.0f} µs (in a node over"
        " NVLink, or per switch hop over InfiniBand). So the vote puts one more pass on the wire per call than stock"
        " (below, in µs). The model leaves out what S7 measures beside it: an all-reduce waits for the slowest rank,"
        " where the broadcast's root does not. The `prefetcher` prototype carries the vote in the gradients'"
        " all-reduce instead, through DDP's private state, and saves the broadcast. The gloo points above, with more"
        " processes than cores beyond 2 ranks, show the form, not NCCL's magnitude.\n\n"
        + table(["ranks", "tree depth", "one pass (µs)"], model, ["--:", "--:", "--:"]))
    return "\n\n".join(parts)
