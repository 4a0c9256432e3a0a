"""What each difference between Lightning's own tests on stock 2.6.6 and on the patched build is.

``python -m patch.lightning_tests`` lists every test whose outcome differs between the two runs; ``CLASSIFIED`` says
what each one is, and the runner writes it beside the difference:

- ``Deliberate(clause, why)``: the specification changes that behaviour on purpose (the clause of
  ``rfc/specification.md`` that says so), so the test asserts what the RFC replaces;
- ``Regression(item, why)``: the patch breaks something the specification keeps; ``item`` is the patch item
  (``patch/items/``) whose edit reads as the cause.

Before any entry, a difference the runner's reruns (``reruns``: each differing test run again on both builds) show
passing on both builds every time is "not repeated": the first run's outcome was a flake of that run (a spawned
process killed on a busy machine), not a change, and no entry is needed.

A key is a test id as the runner writes it (``tests.tests_pytorch.<module>::<test>[<parameters>]``), or the id
without its parameters, which stands for every parametrisation of that test. A difference no entry names stays
``"unclassified"``; an entry that names no difference is stale and is reported, so the list keeps to what the last
run measured. To apply an edited list to a committed report without running the tests again:

    python -m patch.lightning_test_differences [rfc/results/lightning-tests.json]
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Deliberate:
    """The specification changes the behaviour the test asserts; ``clause`` names where."""

    clause: str
    why: str


@dataclass(frozen=True)
class Regression:
    """The patch breaks what the test asserts, which the specification keeps; ``item`` is the suspected patch item."""

    item: int
    why: str


Classification = Deliberate | Regression

_TESTS = "tests.tests_pytorch."
CLASSIFIED: dict[str, Classification] = {
    # Lightning's own tests of the flavour, which assert what stock Lightning does and the stack changes; the stack
    # updates each in the commit that changes the behaviour (patch/items/lightning_test_updates.py).
    f"{_TESTS}loops.test_fetchers::test_fetching_dataloader_iter_opt[False]": Deliberate(
        "C6", "asserts batch progress counts the step's calls (32) where the step consumed 64 batches"),
    f"{_TESTS}loops.test_fetchers::test_fetching_dataloader_iter_opt[True]": Deliberate(
        "C10", "asserts `self.log` without `batch_size=` raises; the loop now takes the size of the call's first "
        "batch (the test's progress count would differ next, C6)"),
    f"{_TESTS}loops.test_fetchers::test_stop_iteration_with_dataloader_iter[True]": Deliberate(
        "C14", "the step raises its own `StopIteration` while `dataloader_iter` has batches left; case (f) makes "
        "that an error instead of an epoch ended early"),
    f"{_TESTS}loops.test_fetchers::test_done_dataloader_iter": Deliberate(
        "C5", "builds the fetcher bare and expects `done` unknown for unsized data until a `next()` found the end;"
        " the fetcher is now built for its Trainer and looks one batch ahead, so `done` is exact (the stack updates"
        " the test)"),
    f"{_TESTS}loops.test_fetchers::test_done_dataloader_iter_with_limit": Deliberate(
        "C5", "builds the fetcher bare, expects `done` unknown for unsized data and one iterator across `sequential`"
        " dataloaders; the fetcher is built for its Trainer, `done` is exact and each dataloader gets its iterator"
        " (C15; the stack updates the test)"),
    f"{_TESTS}loops.test_training_epoch_loop::test_training_loop_dataloader_iter_multiple_dataloaders": Deliberate(
        "C8", "asserts `on_train_batch_start` gets the previous call's batch (`None` first); it now gets the batch "
        "the step will receive"),
    f"{_TESTS}loops.test_evaluation_loop::test_evaluation_loop_dataloader_iter_multiple_dataloaders": Deliberate(
        "C15", "asserts `on_validation_batch_start` gets the previous call's batch (`None` first); it now gets the "
        "batch the call receives first"),
    f"{_TESTS}loops.test_prediction_loop::test_prediction_loop_with_iterable_dataset": Deliberate(
        "C15", "asserts `on_predict_batch_start` gets the previous call's batch (`None` first); it now gets the "
        "batch the call receives first"),
    # A test of the regular flavour that stock fails here and the stack passes, through a line the stack removes.
    f"{_TESTS}utilities.test_compile::test_trainer_compiled_model_that_logs": Deliberate(
        "C10", "fails on stock in every run: inside the compiled `training_step`, `self.log` inspects the step's "
        "signature for the flavour's `batch_size` check, which dynamo cannot trace; the stack removes that check"),
}


def entry_for(test_id: str, classified: dict[str, Classification]) -> tuple[str, Classification] | None:
    """The entry naming ``test_id`` (exactly, or its test without parameters) and its key, or None."""
    for key in (test_id, test_id.split("[", 1)[0]):
        if key in classified:
            return key, classified[key]
    return None


def classify(differences: list[dict], classified: dict[str, Classification] = CLASSIFIED) -> list[str]:
    """Write each difference's classification (and its clause or item, and why) in place; return the stale keys."""
    used = set()
    for difference in differences:
        for field in ("clause", "item", "why"):
            difference.pop(field, None)
        reruns = difference.get("reruns") or {}
        if len(reruns) == 2 and all(outcomes and set(outcomes) == {"passed"} for outcomes in reruns.values()):
            counts = " and ".join(f"{len(outcomes)} on {label}" for label, outcomes in reruns.items())
            difference.update(classification="not repeated", why=f"passed in every rerun ({counts})")
            continue
        found = entry_for(difference["test"], classified)
        if found is None:
            difference["classification"] = "unclassified"
            continue
        key, entry = found
        used.add(key)
        if isinstance(entry, Deliberate):
            difference.update(classification="deliberate", clause=entry.clause, why=entry.why)
        else:
            difference.update(classification="regression", item=entry.item, why=entry.why)
    return sorted(set(classified) - used)


def classify_report(report: dict, classified: dict[str, Classification] = CLASSIFIED) -> list[str]:
    """Classify a runner report's differences and record the stale keys in it; return the stale keys."""
    stale = classify(report.get("differences", []), classified)
    report["classifications_without_a_difference"] = stale
    return stale


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0] if args else "rfc/results/lightning-tests.json")
    report = json.loads(path.read_text(encoding="utf-8"))
    stale = classify_report(report)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    unclassified = [d["test"] for d in report.get("differences", []) if d["classification"] == "unclassified"]
    for test in unclassified:
        print(f"unclassified: {test}: add it to patch.lightning_test_differences.CLASSIFIED", file=sys.stderr)
    for key in stale:
        print(f"stale: {key} names no difference of {path}: remove it from CLASSIFIED", file=sys.stderr)
    return 1 if stale or unclassified else 0


if __name__ == "__main__":
    sys.exit(main())
