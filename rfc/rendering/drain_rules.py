"""The RFC's third decision, read off the real clients' runs: when the loop makes drain calls.

``rfc/results/drain-rules.json`` (written by ``python -m tests.test_drain_rules``) holds one row per client, case
and rule: the verdict beside the same client driven by a plain loop ("as the plain loop", "loses batches, warned",
"loses batches silently", "hangs", "error"). The rule is fixed here, before any run: the loop ships the candidate
rule under which the fewest cases lose batches silently, hang or fail (ties go to the earlier candidate of
``step_calls.DRAIN_RULES``); stock Lightning's column stands beside them for comparison only. The block also
says what the code ships (the recommended design's ``drain`` default), so the two cannot drift apart unseen.
"""

from __future__ import annotations

import inspect
from collections import Counter
from pathlib import Path
from typing import Any

from prototypes import DESIGNS
from prototypes.step_calls import DRAIN_RULES
from rendering.decision import RECOMMENDED
from rendering.markdown import cell, code, no_results, setup_line
from rendering.pipelines import CPU_STAND_INS
from rendering.results import Inputs, load_json

FILE = "drain-rules.json"
COMMAND = "python -m tests.test_drain_rules rfc/results/drain-rules.json"
STOCK = "stock"
AS_THE_PLAIN_LOOP = "as the plain loop"
WARNED = "loses batches, warned"
NAMES_THE_FIX = "times out, naming the fix"
BAD = ("loses batches silently", "hangs", "error")  # what the decision counts against a rule, a fix unnamed


def drain_results(inputs: Inputs) -> dict[str, Any] | None:
    path = inputs.results_dir / FILE
    return load_json(path) if path.is_file() else None


def shipped_rule() -> str:
    """The recommended design's ``drain`` default: what the code ships."""
    return inspect.signature(DESIGNS[RECOMMENDED].make_trainer).parameters["drain"].default


def bad_cases(rows: list[dict[str, Any]], rule: str) -> list[dict[str, Any]]:
    return [row for row in rows if row["rule"] == rule and row["verdict"] in BAD]


def chosen_rule(rows: list[dict[str, Any]]) -> str:
    """The candidate with the fewest cases that lose batches silently, hang or fail; the earlier one on a tie."""
    return min(DRAIN_RULES, key=lambda rule: (len(bad_cases(rows, rule)), DRAIN_RULES.index(rule)))


def decision_line(results: dict[str, Any] | None, evidence: str = "") -> str:
    """Decision 3 in one paragraph, for the decisions block (``evidence``: a parenthesis of links after the figures)."""
    if not results:
        missing = no_results("drain-rule results", COMMAND)
        return f"**Decision 3: when the loop makes drain calls.** {missing}{evidence}."
    rows, rule = results["rows"], chosen_rule(results["rows"])
    cases = len({(row["client"], row["case"]) for row in rows})
    named = [row for row in rows if row["rule"] == rule and row["verdict"] == NAMES_THE_FIX]
    stops = (f"; {len(named)} stop at the process group's timeout with an error naming the client's fix "
             f"({', '.join(sorted({cell(row['client']) for row in named}))}, where the data ends inside a call)"
             if named else "")
    others = ", ".join(f"{code(other)}: {len(bad_cases(rows, other))}" for other in [*DRAIN_RULES, STOCK]
                       if other != rule)
    return (f"**Decision 3: drain calls by the rule {code(rule)}.** Of the real clients' {cases} cases run unmodified, "
            f"{len(bad_cases(rows, rule))} lose batches silently, hang or fail without naming a fix under it{stops}; "
            f"under the other rules and stock: {others}{evidence}. In the code: "
            f"{code('drain=' + repr(shipped_rule()))}.")


def _cell(rows: list[dict[str, Any]]) -> str:
    counts = Counter(row["verdict"] for row in rows)
    parts = []
    for verdict in (AS_THE_PLAIN_LOOP, WARNED, NAMES_THE_FIX, *BAD):
        if counts[verdict]:
            text = f"{verdict} {counts[verdict]}/{len(rows)}"
            parts.append(f"**{text}**" if verdict in BAD else text)
    return "<br>".join(parts)


def _failures(rows: list[dict[str, Any]], rule: str) -> list[str]:
    lines = []
    for row in bad_cases(rows, rule):
        if row.get("error"):
            detail = row["error"]
        elif row["verdict"] == "hangs":
            detail = "still running at the launch deadline, no error raised"
        else:
            detail = f"trained {row['trained_per_epoch']} per epoch, the plain loop {row['plain_loop_per_epoch']}"
        lines.append(f"- {cell(row['client'])} ({cell(row['case'])}): {row['verdict']}; {cell(detail)}")
    return lines


def block_drain_decision(inputs: Inputs, page_dir: Path) -> str:
    """The rule, the verdict it gives, and the table of every client under every rule and stock."""
    results = drain_results(inputs)
    if not results:
        return no_results("drain-rule results", COMMAND)
    rows = results["rows"]
    rule = chosen_rule(rows)
    columns = [*DRAIN_RULES, STOCK]
    clients = list(dict.fromkeys(row["client"] for row in rows))
    table = ["| Client (cases) | " + " | ".join(code(c) for c in columns) + " |",
             "| --- |" + " --- |" * len(columns)]
    for client in clients:
        mine = [row for row in rows if row["client"] == client]
        cases = len({row["case"] for row in mine})
        table.append(f"| {cell(client)} ({cases}) | "
                     + " | ".join(_cell([row for row in mine if row["rule"] == c]) for c in columns) + " |")
    shipped = shipped_rule()
    agreement = ("the code's default is that rule" if shipped == rule else
                 f"**the code ships {code(shipped)}, not the rule the runs choose**")
    lines = [
        decision_line(results),
        "",
        "The rule, fixed before the runs: the loop ships the candidate under which the fewest cases lose batches "
        "silently, hang or fail without an error that names the fix (a tie goes to the earlier of "
        + ", ".join(code(r) for r in DRAIN_RULES) + "); "
        f"stock Lightning's column is for comparison. Chosen: {code(rule)}; {agreement}.",
        "",
        "Each cell counts a client's cases by their outcome beside the same client driven by a plain loop over the "
        "same batches: the batches trained per epoch and the final weights, a hang (C16's deadlines, or the process "
        "group's timeout), or an error. " + CPU_STAND_INS,
        "",
        setup_line(results.get("setup") or {}, FILE),
        "",
        "\n".join(table),
    ]
    for name in columns:
        failures = _failures(rows, name)
        if failures:
            lines += ["", f"Under {code(name)}:", "", *failures]
    return "\n".join(lines)


DRAIN_BLOCKS = {"drain-decision": block_drain_decision}
