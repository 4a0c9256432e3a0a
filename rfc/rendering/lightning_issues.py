"""Lightning's issues in the flavour's path: which the stack closes, the stack's test that reproduces each, and
the ones it leaves open.

The list is written here (each issue's state read from Lightning's tracker when the list was made); the outcome of
each test on stock and on the patched build is read from ``lightning-stack-tests.json``, so a test that stops
failing on stock, or stops passing with the stack, shows in the rendered table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rendering.lightning_tests import STACK_TESTS_FILE
from rendering.markdown import cell, code, no_results
from rendering.results import Inputs, load_json

ISSUE_URL = "https://github.com/Lightning-AI/pytorch-lightning/issues/{}"
STACK_TESTS_COMMAND = (
    "python -m patch.lightning_tests --select --stack-tests --out rfc/results/lightning-stack-tests.json"
)


@dataclass(frozen=True)
class Issue:
    """``number``, its state in the tracker, what it reports, what the stack does about it, and the stack's test of
    the issue's scenario (``module::test`` under ``tests/tests_pytorch``), None where no test can show it."""

    number: int
    state: str
    reports: str
    stack: str
    test: str | None


ISSUES = (
    Issue(18334, "closed", "`limit_train_batches=1` consumed 3 batches", "fixes it for good: limits count batches",
          "loops.test_dataloader_iter_fetcher::test_limit_train_batches_counts_batches"),
    Issue(18498, "closed", "the progress bar counts step calls, not batches", "fixes it: progress counts batches",
          "loops.test_dataloader_iter_fetcher::test_progress_counts_the_batches_the_step_took"),
    Issue(18831, "closed", "batches no longer moved to the device", "fixes it: every batch passes the transfer hooks",
          "loops.test_dataloader_iter_fetcher::test_batches_pass_the_transfer_hooks"),
    Issue(20404, "open", "uneven data across DDP ranks hangs", "fixes it for the flavour only: the regular flavour "
          "still hangs, so it stays open (pull request 3 refers to it)",
          "loops.test_dataloader_iter_ddp::test_ranks_stop_at_the_same_step_call_when_one_rank_runs_out_of_data"),
    Issue(19987, "open", "a partial last accumulation window is scaled as a full one", "leaves it: the last "
          "window steps as stock's does, in both flavours", None),
    Issue(20550, "open", "a stateful loader's state is dropped on resume after `estimated_stepping_batches`",
          "leaves it: the stack saves the state as of the batches taken, but does not touch the restore order", None),
    Issue(19624, "open", "an over-counted iterable ends the epoch before validation", "leaves it: the regular "
          "flavour's path, which the stack does not change", None),
)


def _outcomes(inputs: Inputs) -> dict[str, tuple[str, str]] | None:
    """Each stack test's outcome on stock and patched, its parametrisations merged: one outcome where they agree,
    else every outcome they had."""
    path = inputs.results_dir / STACK_TESTS_FILE
    if not path.is_file():
        return None
    found: dict[str, tuple[set[str], set[str]]] = {}
    for row in load_json(path).get("stack_tests") or []:
        test = row["test"].removeprefix("tests.tests_pytorch.").split("[")[0]
        stock, patched = found.setdefault(test, (set(), set()))
        stock.add(row["stock"])
        patched.add(row["patched"])
    return {test: (" or ".join(sorted(stock)), " or ".join(sorted(patched)))
            for test, (stock, patched) in found.items()}


def block_lightning_issues(inputs: Inputs, page_dir: Path) -> str:
    outcomes = _outcomes(inputs)
    lines = ["| Issue | state | what it reports | the stack | its test: stock → patched |",
             "| --- | --- | --- | --- | --- |"]
    for issue in ISSUES:
        if issue.test is None:
            test = "–"
        elif outcomes is None:
            test = no_results("the stack's tests", STACK_TESTS_COMMAND)
        else:
            stock, patched = outcomes.get(issue.test, ("not run", "not run"))
            test = f"{code(issue.test.split('::')[1])}: {stock} → {patched}"
        lines.append(f"| [#{issue.number}]({ISSUE_URL.format(issue.number)}) | {issue.state} | {cell(issue.reports)} |"
                     f" {cell(issue.stack)} | {test} |")
    return "\n".join(lines)
