"""Where each design stands: conformance counts next to every benchmark target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rendering.benchmarks import is_baseline, target_result_cell, verdict_of
from rendering.conformance import conformance_parts
from rendering.coupling import private_names_used
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
    judged: list[tuple[str, str, dict[str, Any]]] = []  # (target name with its machine kind, kind, spec)
    for kind, data in inputs.benchmarks.items():
        for target, spec in (data.get("targets") or {}).items():
            suffix = f" [{kind}]" if len(inputs.benchmarks) > 1 else ""
            judged.append((f"{target}{suffix}", kind, spec))
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
    if judged:
        headers += ["benchmark targets met", "missed, inconclusive or not judged"]
    headers.append("private Lightning names used")

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
        if judged:
            met, missed, total = 0, [], 0
            for target, _, spec in judged:
                for r in spec.get("results") or []:
                    if design_of_row(str(r.get("design", ""))) != name or verdict_of(r) is None:
                        continue
                    total += 1
                    if verdict_of(r) == "met":
                        met += 1
                    else:  # missed, inconclusive or not judged: each shown with its median and verdict
                        missed.append(f"{target} {code(r.get('design'))}: "
                                      + target_result_cell(r, str(spec.get("metric", "")), spec.get("threshold")))
            row += [f"{met} of {total}" if total else "–", "<br>".join(missed) or ("none" if total else "–")]
        row.append(_coupling_cell(name))
        rows.append(row)
    legend = ("Conformance counts add up every variant of a design (for example each prefetch depth). Benchmark "
              "targets count each judged result (a target judges a design's registered configuration, at each "
              "point it applies to); any other shows its median, 95 % interval and verdict. \"–\": no target applies "
              "to that design or it was not measured. Private Lightning names: read from each design's source by "
              "`python -m prototypes.coupling`, with how many of them the shared modules use, which every design "
              "importing them shares (the design pages list them). Details: the conformance matrix, and "
              "the targets table of the benchmarks.")
    return "\n\n".join(parts + [table(headers, rows), legend])


def _coupling_cell(name: str) -> str:
    try:
        return private_names_used(name)
    except KeyError:  # a design in the results that is no longer registered
        return "–"
