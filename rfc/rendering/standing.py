"""Where each design stands: conformance counts next to every benchmark target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rendering.benchmarks import is_baseline, target_result_cell, target_rule
from rendering.conformance import conformance_parts
from rendering.markdown import bench_setup, code, no_results, setup_line, table
from rendering.results import BENCHMARK_COMMAND, CONFORMANCE_COMMAND, FAIL, XFAIL, Inputs


def design_of_row(row_design: str) -> str:
    return row_design.split("[", 1)[0]


def block_standing(inputs: Inputs, page_dir: Path) -> str:
    """Where each design stands: clauses met, expected failures, failures, and each benchmark target."""
    names: list[str] = []
    if inputs.conformance:
        names += list(inputs.conformance.get("designs") or {})
        names += [r["design"] for r in inputs.conformance["results"]]
    for data in inputs.benchmarks.values():  # the benchmarks' own design order (registry order) next
        for rows in data["scenarios"].values():
            names += [design_of_row(str(r.get("design", "?"))) for r in rows if not is_baseline(r)]
    target_cols: list[tuple[str, str, dict[str, Any]]] = []  # (header, kind, spec)
    for kind, data in inputs.benchmarks.items():
        for scenario, spec in (data.get("targets") or {}).items():
            suffix = f" [{kind}]" if len(inputs.benchmarks) > 1 else ""
            target_cols.append((f"{scenario}: {target_rule(spec)}{suffix}", kind, spec))
            names += [design_of_row(str(r.get("design", "?"))) for r in spec.get("results") or []]
    names = list(dict.fromkeys(names))
    if not names:
        return (no_results("conformance results", CONFORMANCE_COMMAND) + "\n\n"
                + no_results("benchmark results", BENCHMARK_COMMAND))

    parts, headers = [], ["Design"]
    conf = None
    if inputs.conformance:
        parts.append(setup_line(inputs.conformance["setup"], "conformance.json"))
        _, ordered, counts, design_of, variants = conformance_parts(inputs.conformance)
        conf = (ordered, counts, design_of, variants)
        headers += ["clauses met (every variant passes)", "expected failures", "failures"]
    else:
        parts.append(no_results("conformance results", CONFORMANCE_COMMAND))
    if inputs.benchmarks:
        parts += [bench_setup(data, kind) for kind, data in inputs.benchmarks.items()]
    else:
        parts.append(no_results("benchmark results", BENCHMARK_COMMAND))
    headers += [h for h, _, _ in target_cols]

    rows = []
    for name in names:
        row = [code(name)]
        if conf:
            ordered, counts, design_of, variants = conf
            mine = [v for v in variants if design_of[v] == name]
            tested = [c for c in ordered if any(counts[v].get(c) for v in mine)]
            met = [c for c in tested if all(not counts[v][c][XFAIL] and not counts[v][c][FAIL] for v in mine)]
            xf = sum(counts[v][c][XFAIL] for v in mine for c in ordered)
            fl = sum(counts[v][c][FAIL] for v in mine for c in ordered)
            if mine:
                missed = [c for c in tested if c not in met]
                row += [f"{len(met)} of {len(tested)}" + (f" (not {', '.join(missed)})" if missed else ""),
                        str(xf), f"**{fl}**" if fl else "0"]
            else:
                row += ["not run", "–", "–"]
        for _, _, spec in target_cols:
            mine = [r for r in spec.get("results") or [] if design_of_row(str(r.get("design", ""))) == name]
            if not mine:
                row.append("–")
                continue
            metric = str(spec.get("metric", ""))
            if len(mine) > 2:  # many variants (e.g. every depth): count them, list only the misses
                missed = [r for r in mine if r.get("met") is False]
                text = f"{len(mine) - len(missed)} of {len(mine)} results met"
                text += "".join(f"<br>{code(r.get('design'))}: {target_result_cell(r, metric, spec.get('threshold'))}"
                                for r in missed)
                row.append(text)
                continue
            row.append("<br>".join(
                (f"{code(r.get('design'))}: " if len(mine) > 1 or r.get("design") != name else "")
                + target_result_cell(r, metric, spec.get("threshold")) for r in mine))
        rows.append(row)
    legend = ("Conformance counts add up every variant of a design (for example each prefetch depth). A target "
              "cell shows the recorded median and whether it meets the rule in the header; \"–\" means the target "
              "does not apply to that design or was not measured. Details: the conformance matrix and the "
              "benchmark tables.")
    return "\n\n".join(parts + [table(headers, rows), legend])
