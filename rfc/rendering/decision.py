"""The RFC's second decision, read off the benchmark verdicts: does the loop prefetch on a thread of its own?

The rule is fixed here, before any run: the thread is the default only if, at every S1 and S6 point, the
configuration the targets judge (the recommended design with its ``thread_options``, whatever a results file calls
it) is faster than the fastest alternative of that point (what users already use, and the design without a thread
composed with it), with the whole 95 % interval of the time ratio below 1 (verdict
"met" of the ``S1-alternatives`` and ``S6-alternatives`` targets). Any point where it is slower, not distinguishable
or not judged leaves the thread out, and the block says which points those are. The text cannot contradict the
numbers because it is rendered from them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prototypes import DESIGNS
from rendering.markdown import cell, code, no_results
from rendering.results import BENCHMARK_COMMAND, Inputs
from rendering.targets import verdict_of, with_interval

# The prototype that measured a prefetch thread: its opt-in thread (``thread_options``) is what Decision 2 judges,
# read from the registry, never typed into a page. What ships (``prototypes.RECOMMENDED``) has no thread.
THREAD_DESIGN = "prefetcher"
DECIDING_TARGETS = ("S1-alternatives", "S6-alternatives")
OUTCOME_WORDS = {"met": "faster", "missed": "slower", "inconclusive": "not distinguishable",
                 "not judged": "not judged"}


def _where(results: list[tuple[str, dict[str, Any]]], outcome: str, metric: str) -> str:
    items = []
    for target, r in results:
        if verdict_of(r) != outcome:
            continue
        figure = with_interval(metric, r.get("value"), r.get("interval"))
        text = f"{target.split('-')[0]} {cell(r.get('point') or '')}: {figure}"
        if outcome == "not judged" and r.get("reason"):
            text += f" ({cell(r['reason'])})"
        items.append(text)
    return "; ".join(items)


def thread_decision(benchmarks: dict[str, dict[str, Any]]) -> tuple[bool, list[str]]:
    """Whether the thread is the default, and one paragraph per machine kind and design saying why."""
    default, lines = None, []
    for kind, data in benchmarks.items():
        targets = data.get("targets") or {}
        by_design: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        for name in DECIDING_TARGETS:
            for r in (targets.get(name) or {}).get("results") or []:
                by_design.setdefault(str(r.get("design")), []).append((name, r))
        for design, results in by_design.items():
            metric = str((targets.get(results[0][0]) or {}).get("metric", "ratio"))
            wins = all(verdict_of(r) == "met" for _, r in results)
            default = wins if default is None else default and wins
            parts = [f"{OUTCOME_WORDS[o]} at {where}" for o in OUTCOME_WORDS
                     if (where := _where(results, o, metric))]
            lines.append(f"- {code(design)} ({code('benchmarks-' + kind + '.json')}), time per batch over the fastest "
                         f"alternative, median [95 % interval]: " + "; ".join(parts) + ".")
    return bool(default), lines


def thread_id() -> str:
    """How results and ``--design`` spell the recommended design with its opt-in thread (``thread_options``)."""
    design = DESIGNS[THREAD_DESIGN]
    return design.variant(**design.thread_options).id


def thread_on_by_default() -> bool:
    """Whether the recommended design's registered options are those of its thread: what the code ships."""
    design = DESIGNS[THREAD_DESIGN]
    return bool(design.thread_options) and dict(design.options) == dict(design.thread_options)


def thread_points(benchmarks: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(points where the thread was faster than the fastest alternative, points judged or measured), over the
    deciding targets of every machine kind."""
    verdicts = [verdict_of(r) for data in benchmarks.values() for name in DECIDING_TARGETS
                for r in ((data.get("targets") or {}).get(name) or {}).get("results") or []]
    return sum(v == "met" for v in verdicts), len(verdicts)


def block_decision(inputs: Inputs, page_dir: Path) -> str:
    """Decision 2 (whether the loop prefetches on a thread), rendered from the benchmark verdicts."""
    if not inputs.benchmarks:
        return no_results("benchmark results", BENCHMARK_COMMAND)
    default, lines = thread_decision(inputs.benchmarks)
    if not lines:
        return ("**The prefetch thread: no verdict.** No results file judges a prefetching design against the "
                "alternatives (targets `S1-alternatives`, `S6-alternatives`), so no thread ships.")
    rule = ("The rule: a thread ships only if it is faster than the fastest alternative at every measured workload. "
            "S1 sets the loading time L against the step's compute C; S6 sets the transfer hooks' work M against C. "
            "The alternatives run in the same rounds: stock Lightning with DataLoader workers or torchdata `nodes` "
            "prefetching, the design without a thread with either, and in S6 the hook work moved into the workers or "
            "`ParallelMapper` threads. Faster means the whole 95 % interval of the time ratio is below 1.")
    faster, total = thread_points(inputs.benchmarks)
    if default:
        head = (f"**Decision 2: the measurements favour a prefetch thread, which the stack lacks.** "
                f"{code(thread_id())} beats the fastest alternative at every point judged.")
        then = "A thread would be a change of its own, after this one; the stack ships none."
    else:
        head = (f"**Decision 2: no prefetch thread.** The prototype's opt-in thread ({code(thread_id())}) is faster "
                f"than the fastest alternative at {faster} of {total} measured workloads.")
        then = ("So the stack ships no thread: the step's `next()` loads the batch on the step's thread, and a user "
                "who needs loading hidden keeps DataLoader workers or torchdata, as today.")
    return "\n\n".join([head, rule, "\n".join(lines), then])
