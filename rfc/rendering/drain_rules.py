"""The RFC's third decision, read off the real clients' runs: drain calls only where the module asks for them.

``rfc/results/drain-rules.json`` (written by ``python -m tests.test_drain_rules`` in each environment) holds one row
per client, case and column: stock Lightning, the earlier prototype's automatic rule, and the patched Lightning
without and with the module's opt-in. Each row has its verdict beside the same client driven by a plain loop ("as the
plain loop", "loses batches, warned", "times out, naming the fix", "loses batches silently", "hangs", "error") and
``after_the_end``: the calls the client got after its data ended that it did not ask for.

The rule is fixed here, before any run: without the opt-in the patched loop makes no call the client did not ask for
and loses no batch silently, hangs in no case and fails in none without naming the fix; with the opt-in it does the
same. The block says whether the rows meet it; it cannot say more than they do.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from rendering.markdown import cell, code, no_results, setup_line
from rendering.pipelines import CPU_STAND_INS
from rendering.results import Inputs, load_json

FILE = "drain-rules.json"
COMMAND = "python -m tests.test_drain_rules rfc/results/drain-rules.json"
STOCK, PROTOTYPE, PATCHED, OPT_IN = "stock", "prototype (automatic)", "patched", "patched, opt-in"
AS_THE_PLAIN_LOOP = "as the plain loop"
WARNED = "loses batches, warned"
NAMES_THE_FIX = "times out, naming the fix"
BAD = ("loses batches silently", "hangs", "error")  # what the rule counts against a column
# how a count of cases reads in a sentence
PAST = {AS_THE_PLAIN_LOOP: "ran as the plain loop", WARNED: "lost batches with a warning",
        NAMES_THE_FIX: "timed out naming the fix", "loses batches silently": "lost batches silently", "hangs": "hung",
        "error": "failed"}
OPT_IN_NAME = "LightningModule.drain_dataloader_iter"
PAGE = "generated/drain-calls.md"


def drain_results(inputs: Inputs) -> dict[str, Any] | None:
    path = inputs.results_dir / FILE
    return load_json(path) if path.is_file() else None


def _of(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    return [row for row in rows if row["rule"] == column]


def bad_cases(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    return [row for row in _of(rows, column) if row["verdict"] in BAD]


def unasked(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    return [row for row in _of(rows, column) if row.get("after_the_end")]


def _counts(rows: list[dict[str, Any]], column: str) -> str:
    mine = _of(rows, column)
    counts = Counter(row["verdict"] for row in mine)
    parts = [f"{counts[v]} {PAST[v]}" for v in (AS_THE_PLAIN_LOOP, WARNED, NAMES_THE_FIX, *BAD) if counts[v]]
    calls = unasked(rows, column)
    if calls:
        parts.append(f"{len(calls)} got calls after the end they did not ask for")
    return ", ".join(parts)


def rule_holds(rows: list[dict[str, Any]]) -> bool:
    return all(not bad_cases(rows, c) and not unasked(rows, c) for c in (PATCHED, OPT_IN))


def decision_line(results: dict[str, Any] | None, evidence: str = "", glossary: str = "glossary.md") -> str:
    """Decision 3 in one paragraph, for the decisions block (``evidence``: a parenthesis of links after the figures;
    ``glossary``: the glossary page as the block's page links it)."""
    head = (f"**Decision 3: [drain calls]({glossary}#drain-call) only on request** ({code(OPT_IN_NAME)}, "
            f"[opt-in]({glossary}#opt-in)).")
    if not results:
        return f"{head} {no_results('drain-call results', COMMAND)}{evidence}."
    rows = results["rows"]
    cases = len({(row["client"], row["case"]) for row in rows})
    verdict = ("The patched loop meets the rule" if rule_holds(rows) else
               "**The patched loop does not meet the rule**")
    return (f"{head} {verdict} in the real clients' {cases} cases: without the opt-in, {_counts(rows, PATCHED)}; "
            f"with it, {_counts(rows, OPT_IN)}. Stock: {_counts(rows, STOCK)}. The earlier automatic rule: "
            f"{_counts(rows, PROTOTYPE)}{evidence}.")


# a table cell's words for each outcome, defined under the table
SHORT = {AS_THE_PLAIN_LOOP: "plain", WARNED: "warned", NAMES_THE_FIX: "fix named", "loses batches silently": "silent",
         "hangs": "hangs", "error": "error"}


def _cell(rows: list[dict[str, Any]]) -> str:
    counts = Counter(row["verdict"] for row in rows)
    parts = []
    for verdict in (AS_THE_PLAIN_LOOP, WARNED, NAMES_THE_FIX, *BAD):
        if counts[verdict]:
            text = f"{SHORT[verdict]} {counts[verdict]}"
            parts.append(f"**{text}**" if verdict in BAD else text)
    calls = [row for row in rows if row.get("after_the_end")]
    if calls:
        parts.append(f"unasked {len(calls)}")
    return ", ".join(parts)


def _detail(row: dict[str, Any]) -> str:
    if row.get("error"):
        return str(row["error"])
    if row["verdict"] == "hangs":
        return "still running at the launch deadline, no error raised"
    if row["verdict"].startswith("loses"):
        return f"trained {row['trained_per_epoch']} per epoch, the plain loop {row['plain_loop_per_epoch']}"
    return f"{row['after_the_end']} calls after the end of data"


def _table(rows: list[dict[str, Any]], columns: list[str]) -> str:
    clients = list(dict.fromkeys(row["client"] for row in rows))
    table = ["| Client (cases) | " + " | ".join(cell(c) for c in columns) + " |", "| --- |" + " --- |" * len(columns)]
    for client in clients:
        mine = [row for row in rows if row["client"] == client]
        cases = len({row["case"] for row in mine})
        table.append(f"| {cell(client)} ({cases}) | "
                     + " | ".join(_cell([row for row in mine if row["rule"] == c]) for c in columns) + " |")
    return "\n".join(table)


def _setups(results: dict[str, Any]) -> list[str]:
    lines: dict[str, list[str]] = {}
    for column, setup in (results.get("setups") or {}).items():
        lines.setdefault(setup_line(setup, FILE), []).append(column)
    return [line.replace(f"({FILE}):*", f"({FILE}, {', '.join(columns)}):*") for line, columns in lines.items()]


def block_drain_decision(inputs: Inputs, page_dir: Path) -> str:
    """The rule, whether the rows meet it, and every client under every column."""
    results = drain_results(inputs)
    if not results:
        return no_results("drain-call results", COMMAND)
    rows, columns = results["rows"], list(results["columns"])
    verdict = "The patched loop meets it." if rule_holds(rows) else "**The patched loop does not meet it.**"
    return "\n".join([
        "The rule, fixed before the runs: without the opt-in the patched loop calls a step only when stock would. "
        f"With it or without, no case loses batches silently, hangs, or fails without naming the fix. {verdict}",
        "",
        "Each cell counts a client's cases beside the same client driven by a plain loop over the same batches: "
        "*plain*, trained as the plain loop; *warned*, lost batches with a warning naming the opt-in; *fix named*, "
        "timed out with an error naming the fix; *silent*, lost batches without a word; *hangs*; *error*; "
        "*unasked*, got calls after its data ended that it did not ask for.",
        "",
        *[line + "\n" for line in _setups(results)],
        _table(rows, columns),
        "",
        f"Each case that did not run as the plain loop, and the clients' CPU stand-ins: [drain calls]({PAGE}).",
    ])


def block_drain_cases(inputs: Inputs, page_dir: Path) -> str:
    """Every case that lost batches, hung, failed or got unasked calls, per column."""
    results = drain_results(inputs)
    if not results:
        return no_results("drain-call results", COMMAND)
    rows, lines = results["rows"], []
    for column in results["columns"]:
        noted = [row for row in _of(rows, column)
                 if row["verdict"] not in (AS_THE_PLAIN_LOOP,) or row.get("after_the_end")]
        if noted:
            lines += ["", f"**{cell(column)}**", ""]
            lines += [f"- {cell(row['client'])} ({cell(row['case'])}): {row['verdict']}; {cell(_detail(row))}"
                      for row in noted]
    return CPU_STAND_INS + "\n\n" + ("\n".join(lines).strip() or "Every case ran as the plain loop in every column.")


DRAIN_BLOCKS = {"drain-decision": block_drain_decision, "drain-cases": block_drain_cases}
