"""Where each design stands: one line per registered design, conformance counts next to its benchmark verdicts."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prototypes import DESIGNS, RECOMMENDED
from rendering.conformance import conformance_parts
from rendering.coupling import private_names_used
from rendering.markdown import bench_setup, code, conformance_setup, no_results, relative_link, table
from rendering.patch_series import patch_cost_verdicts
from rendering.results import BENCHMARK_COMMAND, CONFORMANCE_COMMAND, FAIL, XFAIL, Inputs
from rendering.targets import VERDICT_TEXT, verdict_of


def design_of_row(row_design: str) -> str:
    return row_design.split("[", 1)[0]


@dataclass
class Stance:
    """A design's conformance over every variant the suite ran: the clauses every variant passes, the clauses
    tested, and its expected failures and failures per clause."""

    met: list[str]
    tested: list[str]
    expected_failures: Counter
    failures: Counter

    @property
    def missed(self) -> list[str]:
        return [c for c in self.tested if c not in self.met]


def stance(conformance: dict[str, Any], design: str) -> Stance | None:
    """``design``'s conformance in the results; None when the suite did not run it."""
    _, ordered, counts, design_of, variants = conformance_parts(conformance)
    mine = [v for v in variants if design_of[v] == design]
    if not mine:
        return None
    tested = [c for c in ordered if any(counts[v].get(c) for v in mine)]
    met = [c for c in tested if all(not counts[v][c][XFAIL] and not counts[v][c][FAIL] for v in mine)]
    return Stance(met, tested, Counter({c: sum(counts[v][c][XFAIL] for v in mine) for c in tested}),
                  Counter({c: sum(counts[v][c][FAIL] for v in mine) for c in tested}))


def link_in_rfc(inputs: Inputs, page_dir: Path, target: str) -> str:
    """A link from a page in ``page_dir`` to ``target`` (relative to the RFC directory): relative inside the RFC;
    from the site's home page through the ``docs/rfc`` symlink to it."""
    rfc_dir = inputs.rfc_dir.resolve()
    if page_dir.resolve() == rfc_dir or rfc_dir in page_dir.resolve().parents:
        return relative_link(rfc_dir / target, page_dir.resolve())
    return f"rfc/{target}"


def targets_link(inputs: Inputs, page_dir: Path) -> str:
    return link_in_rfc(inputs, page_dir, "generated/benchmarks.md#targets")


def opt_in_id(name: str) -> str | None:
    """The registry id of a design's opt-in configuration (its thread), where it registers one apart from what it
    ships."""
    design = DESIGNS[name]
    if not design.thread_options or dict(design.thread_options) == dict(design.options):
        return None
    return design.variant(**design.thread_options).id


def judged_results(inputs: Inputs) -> dict[str, Counter]:
    """Per registered design, and apart per opt-in configuration (``opt_in_id``), how many benchmark target results
    carry each verdict, over every machine kind; the patch's own cost cases (``patch-cost.json``) for ``patched``."""
    opt_in = {opt_in_id(name): name for name in DESIGNS if opt_in_id(name)}
    found: dict[str, Counter] = {}
    for data in inputs.benchmarks.values():
        for spec in (data.get("targets") or {}).values():
            for r in spec.get("results") or []:
                outcome = verdict_of(r)
                if outcome is not None:
                    row_design = str(r.get("design", ""))
                    key = row_design if row_design in opt_in else design_of_row(row_design)
                    found.setdefault(key, Counter())[outcome] += 1
    for outcome in patch_cost_verdicts(inputs):
        found.setdefault(RECOMMENDED, Counter())[outcome] += 1
    return found


def _verdict_counts(counted: Counter) -> str:
    return ", ".join(f"{counted[v]} {VERDICT_TEXT[v]}" for v in VERDICT_TEXT if counted[v]) or "–"


def block_standing(inputs: Inputs, page_dir: Path) -> str:
    """Where each registered design stands: clauses met, expected failures, failures, benchmark verdicts."""
    if not inputs.conformance and not inputs.benchmarks:
        return (no_results("conformance results", CONFORMANCE_COMMAND) + "\n\n"
                + no_results("benchmark results", BENCHMARK_COMMAND))
    parts, headers = [], ["Design"]
    if inputs.conformance:
        parts.append(conformance_setup(inputs.conformance))
        headers += ["clauses met (every variant passes)", "expected failures", "failures"]
    else:
        parts.append(no_results("conformance results", CONFORMANCE_COMMAND))
    verdicts = judged_results(inputs)
    if inputs.benchmarks:
        parts += [bench_setup(data, kind) for kind, data in inputs.benchmarks.items()]
        headers.append(f"benchmark targets ([targets table]({targets_link(inputs, page_dir)}))")
    else:
        parts.append(no_results("benchmark results", BENCHMARK_COMMAND))
    headers.append("private Lightning names used")

    rows = []
    for name in DESIGNS:
        row = [code(name)]
        if inputs.conformance:
            found = stance(inputs.conformance, name)
            if found is None:
                row += ["not run", "–", "–"]
            else:
                failures = sum(found.failures.values())
                row += [f"{len(found.met)} of {len(found.tested)}"
                        + (f" (not {', '.join(found.missed)})" if found.missed else ""),
                        str(sum(found.expected_failures.values())), f"**{failures}**" if failures else "0"]
        if inputs.benchmarks:
            row.append(_verdict_counts(verdicts.get(name, Counter())))
        row.append(private_names_used(name))
        rows.append(row)
        opt_in = opt_in_id(name)
        if opt_in and verdicts.get(opt_in):  # the opt-in thread, apart from what ships
            rows.append([f"{code(opt_in)} (opt-in)", *(["–"] * (3 if inputs.conformance else 0)),
                         _verdict_counts(verdicts.get(opt_in, Counter())), "–"])
    legend = ("Clauses met: every variant of the design the suite ran passes every test of the clause. Benchmark "
              "targets: the design's judged results by verdict, met or missed only when the whole 95 % interval is on "
              "one side of the threshold; `patched` adds the patch's cost cases. Private Lightning names: "
              "`python -m prototypes.coupling`.")
    return "\n\n".join(parts + [table(headers, rows), legend])
