"""Lightning's own tests that asserted what the look-ahead fetcher changes (``look_ahead``), updated in its commit."""

import ast
import re

from patch.edits import ModuleSource
from patch.items import UpdatedTest
from patch.statements import asserts, asserts_exactly, calls

DONE_IS_EXACT = (
    "the fetcher looks one batch ahead, so `done` is known for unsized data too, and the step's iterator ends with "
    "its dataloader"
)
START_HOOK_SEES_THE_STEP_BATCH = (
    "the batch-start hook received the previous call's batch (None at the first); it now receives the batch the "
    "step takes first"
)
COUNTS_BATCHES = (
    "progress counts the batches the step took, and `self.log` needs no `batch_size`: the test takes two batches per "
    "call"
)
OWN_STOP_ITERATION = (
    "a `StopIteration` the step raises itself while batches remain is an error naming the fix, not the end of the "
    "epoch"
)
# the cases of an unsized loader whose end the released fetcher could not know before reading past it
UNSIZED_CASES_NOW_KNOWN = (
    '("min_size", [IterDataset()], None, 3', '("min_size", [IterDataset(2), IterDataset(3)], None, 2',
    '("max_size", [IterDataset(2), IterDataset(3)], 100, 3',
    '("max_size_cycle", [IterDataset(2), IterDataset(3)], 100, 3',
    '("sequential", [IterDataset(2), IterDataset(3)], 100, 5', '("max_size", [IterDataset(2), [1, 2, 3]], None, 3',
    '("max_size_cycle", [IterDataset(2), [1, 2, 3]], None, 3',
)


def _done_is_exact_for_unsized_data(test: ModuleSource) -> None:
    test.replace_statement(
        "test_done_dataloader_iter",
        lambda node: isinstance(node, ast.If) and ast.unparse(node.test) == "isinstance(iterable, list)",
        "assert dataloader_iter.done  # the fetcher looks one batch ahead: known for unsized data too",
        comments_above=True,
    )


def _done_is_exact_with_a_limit(test: ModuleSource) -> None:
    name = "test_done_dataloader_iter_with_limit"
    for case in UNSIZED_CASES_NOW_KNOWN:
        test.substitute(name, rf"^(\s*){re.escape(case)}, False\),.*$",
                        rf"\g<1>{case}, True),  # looked ahead: known for unsized data too")
    test.replace_statement(
        name, lambda node: isinstance(node, ast.For),
        """
        for _ in range(num_fetches):
            if dataloader_iter.done:  # `sequential`: the step gets each dataloader's iterator in turn
                dataloader_iter = next(fetcher)
            next(dataloader_iter)
        """,
    )
    test.replace_statement(
        name, asserts_exactly("dataloader_iter.done == expected"),
        'assert dataloader_iter.done == expected or mode == "sequential"  # it ends with its dataloader',
    )


def _start_hook_sees_the_step_batch(test_name: str):
    def update(test: ModuleSource) -> None:
        test.replace_statement(test_name, asserts("model.batch_start_ins"),
                               "assert model.batch_start_ins == model.step_outs", comments_above=True)

    return update


def _counts_batches(test: ModuleSource) -> None:
    name = "test_fetching_dataloader_iter_opt"
    test.remove_statement(name, lambda node: isinstance(node, ast.With) and "MisconfigurationException" in
                          ast.unparse(node.items[0]))
    test.substitute(name, r"batch_progress\.current\.ready == 32", "batch_progress.current.ready == 64")


def _own_stop_iteration_is_an_error(test: ModuleSource) -> None:
    name = "test_stop_iteration_with_dataloader_iter"
    test.replace_statement(
        name, calls("trainer.fit"),
        """
        if trigger_stop_iteration:
            with pytest.raises(RuntimeError, match="had batches left"):
                trainer.fit(m)
            return
        trainer.fit(m)
        """,
    )


FETCHERS = "loops/test_fetchers.py"
UPDATED_TESTS = (
    UpdatedTest(FETCHERS, "test_done_dataloader_iter", DONE_IS_EXACT, _done_is_exact_for_unsized_data),
    UpdatedTest(FETCHERS, "test_done_dataloader_iter_with_limit", DONE_IS_EXACT, _done_is_exact_with_a_limit),
    UpdatedTest(FETCHERS, "test_fetching_dataloader_iter_opt", COUNTS_BATCHES, _counts_batches),
    UpdatedTest(FETCHERS, "test_stop_iteration_with_dataloader_iter", OWN_STOP_ITERATION,
                _own_stop_iteration_is_an_error),
    *(UpdatedTest(module, test, START_HOOK_SEES_THE_STEP_BATCH, _start_hook_sees_the_step_batch(test))
      for module, test in (
          ("loops/test_training_epoch_loop.py", "test_training_loop_dataloader_iter_multiple_dataloaders"),
          ("loops/test_evaluation_loop.py", "test_evaluation_loop_dataloader_iter_multiple_dataloaders"),
          ("loops/test_prediction_loop.py", "test_prediction_loop_with_iterable_dataset"),
      )),
)
