"""The RFC's first screen: what ships, what it costs, what a user changes, the alternatives and what never ran.

Every figure is read from the committed results (``patch-series.json``, ``patch-cost.json``, the benchmark files'
S7 rows, the conformance and drain-call runs); the sentences around them are fixed here, so that a page cannot
state a size, a ratio or a count the results do not hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prototypes import DESIGNS, RECOMMENDED
from rendering.code_pointers import PATCH_SUMMARY
from rendering.conformance import MATRIX_PAGE
from rendering.decision import thread_decision, thread_id, thread_points
from rendering.drain_rules import PROTOTYPE, STOCK, bad_cases, decision_line, drain_results, unasked
from rendering.evidence import evidence_commits
from rendering.markdown import cell, code, no_results, table
from rendering.patch_series import COMMAND as SERIES_COMMAND
from rendering.patch_series import COST_COMMAND, COST_FILE, OVER_REGULAR, WITHOUT_TRANSFER
from rendering.results import BENCHMARK_COMMAND, CONFORMANCE_COMMAND, Inputs, load_json
from rendering.standing import link_in_rfc, stance
from rendering.targets import verdict_of

JUDGED = (2, "20ms")  # S7's judged point: world size and step (benchmarks.targets)
NOT_RUN = ("a GPU (the CUDA path of the transfer and TorchRec's streams)", "NCCL", "more than 8 ranks, or ranks on "
           "more than one machine", "FSDP, DeepSpeed and Megatron's own strategy")
# Why each alternative loses, in one line; the figure beside it is rendered from the results.
WHY_NOT = {
    "upstream": "today's flavour: batches lost without a word and hangs at the end of data",
    "callback": "public API only: it cannot change what the loop counts or when it stops",
    "batch_processor": "a loop of its own: more private names, and DDP and Lightning's features fall behind",
    "prefetcher": "the stack's behaviour plus a thread and drain rules of its own: more code, and private DDP state",
}
OTHER_ALTERNATIVES = (
    ("fix only today's fetcher (look-ahead and counting, no DDP, no drain)", "not built: the drain-call runs show "
     "stock's loop losing batches and hanging, which counting alone does not change"),
    ("deprecate the flavour", "not measured: NeMo's Megatron step and TorchRec's pipelines need a step that pulls, "
     "and the regular flavour cannot express them"),
)


def _summary(inputs: Inputs) -> dict[str, Any] | None:
    path = inputs.results_dir / PATCH_SUMMARY
    return load_json(path) if path.is_file() else None


def ships_line(inputs: Inputs) -> str:
    summary = _summary(inputs)
    if summary is None:
        return f"**What ships:** {no_results('the patch series summary', SERIES_COMMAND)}."
    sizes = [str(pr["added_source"]) for pr in summary["pull_requests"]]
    total = sum(summary["added_source"][k] for k in ("code", "docstrings", "comments"))
    budget = summary["source_lines_budget"]
    verdict = "within" if total <= budget else "**over**"
    return (f"**What ships:** {len(sizes)} pull requests to pytorch-lightning {summary['release']}, adding "
            f"{total} non-blank source lines ({', '.join(sizes)} per pull request; {verdict} the budget of {budget}). "
            "No thread, no private torch state, nothing registered on the user's model.")


def _interval(value: Any, interval: Any) -> str:
    if interval:
        return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]"
    return f"{value:.3f}"


def s7_rows(inputs: Inputs, design: str = RECOMMENDED) -> list[tuple[str, dict[str, Any], str | None]]:
    """``design``'s S7 rows over every benchmark file, its controls included: (file kind, row, the judged verdict or
    None)."""
    found = []
    for kind, data in inputs.benchmarks.items():
        judged = [r for r in ((data.get("targets") or {}).get("S7") or {}).get("results") or []
                  if str(r.get("design", "")).split("[")[0] == design]
        for row in (data.get("scenarios") or {}).get("S7") or []:
            if str(row.get("design", "")).split("[")[0] != design:
                continue
            point = (row.get("world_size"), row.get("step"))
            verdict = verdict_of(judged[0]) if judged and point == JUDGED and row.get("role") == "design" else None
            found.append((kind, row, verdict))
    return found


def costs_line(inputs: Inputs, glossary: str = "glossary.md") -> str:
    parts = []
    cost = inputs.results_dir / COST_FILE
    if cost.is_file():
        for row in load_json(cost)["rows"]:
            if "verdict" in row:
                parts.append(f"a {row['flavour']} module's batch {_interval(row['ratio'], row['interval'])} of "
                             f"stock's (target ≤ {row['threshold']}: {row['verdict']})")
            elif row["case"] == OVER_REGULAR:
                parts.append(f"that batch {_interval(row['ratio'], row['interval'])} of stock's regular batch "
                             "(shown, not judged: both pass it through the transfer hooks, which today's flavour "
                             "skips)")
            elif row["case"] == WITHOUT_TRANSFER:
                parts.append("the flavour's batch with its transfer left out "
                             f"{_interval(row['ratio'], row['interval'])} of today's flavour (shown, not judged: the"
                             " look-ahead's own work)")
    else:
        parts.append(no_results("patch cost results", COST_COMMAND))
    found = s7_rows(inputs)
    for _, row, verdict in sorted(found, key=lambda r: (r[1]["world_size"], r[1]["step"] != "20ms")):
        if row.get("world_size") != JUDGED[0] or row.get("role") != "design":
            continue
        judged = f" (target ≤ 1.01: {verdict})" if verdict else " (shown, not judged)"
        parts.append(f"under DDP on 2 ranks, a [step call]({glossary}#step-call) of the {row['step']} step "
                     f"{_interval(row['overhead_vs_regular'], row['overhead_vs_regular_interval'])} of a regular "
                     f"batch{judged}")
    if not found:
        parts.append(f"S7 not measured for {code(RECOMMENDED)} ({BENCHMARK_COMMAND} in its environment)")
    return ("**What it costs** (time ratios, median [95 % interval], one machine of 2 CPUs): "
            + "; ".join(parts) + ".")


def changes_line(inputs: Inputs, own: str) -> str:
    summary = _summary(inputs)
    count = len(summary.get("migration") or []) if summary else 0
    return (f"**What a user changes:** nothing for a module without `dataloader_iter`. For the flavour, {count} "
            f"behaviours change, each with how to adapt ([migration]({own}#migration)). A step that still holds "
            f"batches when the data ends sets {code('self.drain_dataloader_iter = True')}; without it, a warning "
            "names the setting.")


def block_decisions(inputs: Inputs, page_dir: Path) -> str:
    """The first screen: what ships, the three decisions with their figures, and what never ran."""
    own = link_in_rfc(inputs, page_dir, "index.md")
    glossary = link_in_rfc(inputs, page_dir, "glossary.md")
    matrix = link_in_rfc(inputs, page_dir, "generated/" + MATRIX_PAGE)
    if inputs.conformance and (found := stance(inputs.conformance, RECOMMENDED)):
        contract = (f"The stack meets {len(found.met)} of {len(found.tested)} clauses in full"
                    + (f"; {', '.join(found.missed)} in part, each gap named" if found.missed else "")
                    + f" ([matrix]({matrix})).")
    else:
        contract = no_results("conformance results of the stack", CONFORMANCE_COMMAND)
    if inputs.benchmarks:
        faster, total = thread_points(inputs.benchmarks)
        default, _ = thread_decision(inputs.benchmarks)
        thread = (f"The prototype's thread ({code(thread_id())}) beat the fastest alternative at {faster} of {total} "
                  "measured workloads, each a ratio of loading or of hook work to compute"
                  + (", every one; a thread is left for a change of its own" if default else
                     "; a thread ships only if it wins at every one"))
    else:
        thread = no_results("benchmark results", BENCHMARK_COMMAND)
    return "\n".join([
        ships_line(inputs),
        "",
        costs_line(inputs, glossary),
        "",
        changes_line(inputs, own),
        "",
        f"- **Decision 1: adopt the contract ([clauses]({glossary}#clause) C1–C19), its conformance suite, and the "
        f"[stack]({glossary}#stack) that implements it.** "
        f"{contract}",
        f"- **Decision 2: no prefetch thread.** {thread} ([Decision 2]({own}#decision-2-no-prefetch-thread)).",
        "- " + decision_line(drain_results(inputs), f" ([Decision 3]({own}#decision-3-drain-calls-on-request))",
                             glossary),
        "",
        "**Never run:** " + "; ".join(NOT_RUN) + ". Every figure comes from CPU processes on one machine "
        f"([what this weakens]({own}#what-was-never-run)).",
        "",
        evidence_line(inputs),
    ])


def evidence_line(inputs: Inputs) -> str:
    """The commit every record ran at; or, where some ran at other commits with the same sources, the commit most
    ran at and the others with their files; or every commit where the sources differ."""
    commits = evidence_commits(inputs.results_dir)
    check = "CI checks that the code they measured has not changed since."
    if len(commits) == 1:
        return f"**Evidence:** every record in `rfc/results/` ran at commit `{commits[0][0][:12]}`; {check}"
    if all(same for _, same, _ in commits):
        others = "; ".join(f"{', '.join(code(name) for name in names)} ran at `{commit[:12]}`"
                           for commit, _, names in commits[1:])
        return (f"**Evidence:** every record in `rfc/results/` measured the code of commit `{commits[0][0][:12]}`. "
                f"{others}, where every measured source was the same. {check}")
    return (f"**Evidence:** the records in `rfc/results/` ran at {len(commits)} commits "
            f"({', '.join(f'`{commit[:12]}`' for commit, _, _ in commits)}).")


def block_alternatives(inputs: Inputs, page_dir: Path) -> str:
    """Each alternative in one line: what it meets, silent losses where measured, and why it loses."""
    rows = []
    drain = drain_results(inputs)
    for name in DESIGNS:
        if name == RECOMMENDED:
            continue
        found = stance(inputs.conformance, name) if inputs.conformance else None
        met = f"{len(found.met)} of {len(found.tested)}" if found else "not run"
        rows.append([code(name), met, cell(WHY_NOT.get(name, DESIGNS[name].summary))])
    for what, why in OTHER_ALTERNATIVES:
        rows.append([cell(what), "–", cell(why)])
    text = table(["Alternative", "clauses met in full", "why it loses"], rows)
    if drain:
        stock, prototype = len(bad_cases(drain["rows"], STOCK)), len(unasked(drain["rows"], PROTOTYPE))
        text += (f"\n\nIn the real clients' drain-call runs, stock loses batches silently or hangs in {stock} cases; "
                 f"the prototype's automatic rule makes calls nobody asked for in {prototype}.")
    return text


def block_pull_requests(inputs: Inputs, page_dir: Path) -> str:
    """The stack's pull requests: title, source lines added, the package files each touches."""
    summary = _summary(inputs)
    if summary is None:
        return no_results("the patch series summary", SERIES_COMMAND)
    rows = []
    for number, pr in enumerate(summary["pull_requests"], start=1):
        files = sorted({f["path"] for c in pr["commits"] for f in c["files"] if f["path"] != "CHANGELOG.md"})
        rows.append([str(number), cell(pr["title"]), str(pr["added_source"]), ", ".join(code(f) for f in files)])
    kinds = summary["added_source"]
    return (table(["#", "pull request", "source lines added", "package files"], rows)
            + f"\n\nSource lines: {kinds['code']} of code, {kinds['docstrings']} of docstrings, {kinds['comments']} of "
            f"comments, blank lines not counted; `loops/fetchers.py` grows by {summary['fetchers_growth']} (budget "
            f"{summary['fetchers_growth_budget']}), no pull request over {summary['pull_request_budget']}.")


def block_s7(inputs: Inputs, page_dir: Path) -> str:
    """The recommended design's S7 rows at the judged world size: each step, the ratio and its interval, the judged
    verdict; the other world sizes are on the benchmarks page."""
    found = s7_rows(inputs)
    if not found:
        return no_results(f"S7 results of {code(RECOMMENDED)}", BENCHMARK_COMMAND + " in the patched environment")
    files = sorted({f"`benchmarks-{kind}.json`" for kind, _, _ in found})
    others = sorted({row["world_size"] for _, row, _ in found} - {JUDGED[0]})
    found = [(kind, row, verdict) for kind, row, verdict in found if row["world_size"] == JUDGED[0]]
    benchmarks = link_in_rfc(inputs, page_dir, "generated/benchmarks.md")
    elsewhere = (f" {' and '.join(map(str, others))} ranks: [the benchmarks]({benchmarks}#s7-a-step-call-under-ddp)."
                 if others else "")
    rows = []
    for kind, row, verdict in sorted(found, key=lambda r: (r[1]["world_size"], r[1].get("role") != "design",
                                                           r[1]["step"] != "tiny")):
        shown = _interval(row["overhead_vs_regular"], row["overhead_vs_regular_interval"])
        judged = f"≤ 1.01: **{verdict}**" if verdict else "–"
        control = f" ({row['configuration']}, a control)" if row.get("role") != "design" else ""
        rows.append([str(row["world_size"]), row["step"] + control, f"{row['t_call_us'] / 1000:.2f}",
                     f"{row['t_regular_us'] / 1000:.2f}", shown, judged]
                    + ([f"`benchmarks-{kind}.json`"] if len(files) > 1 else []))
    header = ["ranks", "step", "ms per call", "stock ms per batch", "ratio [95 % interval]", "target"]
    if len(files) > 1:
        return table([*header, "file"], rows) + ("\n\n" + elsewhere.strip() if elsewhere else "")
    return table(header, rows) + f"\n\nFrom {files[0]}.{elsewhere}"


FIRST_SCREEN_BLOCKS = {"decisions": block_decisions, "alternatives": block_alternatives,
                       "pull-requests": block_pull_requests, "s7": block_s7}
