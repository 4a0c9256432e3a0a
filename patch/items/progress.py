"""[RFC 1] Batch progress counts the batches handed out, not step calls."""

import ast

from patch.edits import LightningSource, ModuleSource, asserts, assigns, calls
from patch.items import Item, UpdatedTest
from patch.transplant import methods_source
from prototypes.lightning_changes.progress import CountsConsumed

_PER_CALL = {
    "increment_ready": "",
    "increment_started": "",
    "increment_processed": "self.batch_progress._processed_up_to_started()",
    "increment_completed": "self.batch_progress._completed_up_to_processed()",
}


def _count_batches(source: LightningSource) -> None:
    progress = source.module("loops.progress")
    progress.insert(
        methods_source(CountsConsumed, ("count_consumed", "_processed_up_to_started", "_completed_up_to_processed")),
        after="_Progress.increment_completed",
    )
    for module, method, flavour in (
        ("loops.training_epoch_loop", "_TrainingEpochLoop.advance", "using_dataloader_iter"),
        ("loops.evaluation_loop", "_EvaluationLoop._evaluation_step", "using_dataloader_iter"),
        ("loops.prediction_loop", "_PredictionLoop._predict_step", "using_dataloader_iter"),
    ):
        loop = source.module(module)
        for increment, per_call in _PER_CALL.items():
            # Why: a step taking `dataloader_iter` has each batch counted ready and started as the fetcher hands it
            # out (`_Progress.count_consumed`); after the call, processed and completed catch up with that count
            replacement = f"self.batch_progress.{increment}()"
            if per_call:
                loop.replace_statement(
                    method, calls(f"self.batch_progress.{increment}"),
                    f"""
                    if {flavour}:
                        {per_call}
                    else:
                        {replacement}
                    """,
                )
            else:
                loop.replace_statement(
                    method, calls(f"self.batch_progress.{increment}"),
                    f"""
                    if not {flavour}:  # counted per batch handed out
                        {replacement}
                    """,
                )

    epoch_loop = source.module("loops.training_epoch_loop")
    # the validation interval: a step taking several batches can step over a multiple of `val_check_batch`; validate
    # at the first step boundary at or past it. Lightning validated at every epoch end instead, its counts being calls
    epoch_loop.replace_condition("_TrainingEpochLoop._should_check_val_fx", "_DataLoaderIterDataFetcher", (
        "is_last_batch and is_infinite_dataset"
    ))
    epoch_loop.insert_in_body(
        "_TrainingEpochLoop._should_check_val_fx",
        """
        if self.trainer.fit_loop.prefetching_fetcher is not None:
            counted, interval = current_iteration + 1, self.trainer.val_check_batch
            consumed = self.trainer.fit_loop.prefetching_fetcher.calls.call.consumed
            is_val_check_batch = counted // interval > (counted - consumed) // interval
        """,
        after=_val_check_by_iteration,
    )


def _val_check_by_iteration(node: ast.stmt) -> bool:
    """The assignment of ``is_val_check_batch`` from ``current_iteration``."""
    return assigns("is_val_check_batch")(node) and "current_iteration" in ast.unparse(node)


def _progress_counts_64_batches(test: ModuleSource) -> None:
    test.replace_statement(
        "test_fetching_dataloader_iter_opt.TestModel.on_train_epoch_end",
        asserts("self.trainer.fit_loop.epoch_loop.batch_progress.current.ready"),
        "assert self.trainer.fit_loop.epoch_loop.batch_progress.current.ready == 64",
    )


ITEM = Item(
    1,
    "Batch progress counts the batches handed out, not step calls",
    """
With `training_step(self, dataloader_iter)`, the loops counted one batch per step call whatever the step consumed,
so `limit_*_batches`, `val_check_interval`, the progress bar, checkpoints and resume counted calls. Each batch the
fetcher hands out now counts as ready and started (`_Progress.count_consumed`), and the loop's once-per-call
processed and completed catch up with that count. `val_check_interval` validates at the first step boundary at or past
each multiple of the interval; the flavour no longer validates at every epoch end regardless.
""",
    _count_batches,
    changelog=(
        ("Changed", (
            "With `training_step(self, dataloader_iter)`, batch progress counts the batches the step consumed"
            " rather than its calls: `limit_train_batches`, `val_check_interval`, `log_every_n_steps`, the "
            "progress bar, checkpoints and resuming count batches"
        )),
    ),
    updated_tests=(
        UpdatedTest(
            "loops/test_fetchers.py", "test_fetching_dataloader_iter_opt",
            "its step takes two batches per call: batch progress counts the 64 batches it consumed, not its 32 calls",
            _progress_counts_64_batches,
        ),
    ),
)
