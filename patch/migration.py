"""What a user of today's ``dataloader_iter`` flavour notices under the stack, and how to adapt: one row per behaviour
the stack changes on purpose, each with the items that change it and the tests that show it (added to Lightning's
tests, updated there, or the conformance suite's). ``python -m patch.series --summary`` writes the rows into the
summary the RFC renders its migration table from; ``tests/test_patch_series.py`` checks that every test a row names
exists."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Change:
    """``old``: what the released flavour did; ``new``: what the stack does; ``adapt``: what a user changes (or
    "nothing"); ``items``: the change list's items that make it; ``tests``: ``<path>::<test>``, a path under
    Lightning's ``tests/tests_pytorch`` (a test the stack adds or updates) or under this repository's ``tests/``."""

    old: str
    new: str
    adapt: str
    items: tuple[int, ...]
    tests: tuple[str, ...]


CHANGES = (
    Change(
        "progress, the progress bar, `limit_train_batches` and `val_check_interval` count step calls",
        "they count the batches the step took; `accumulate_grad_batches` counts step calls",
        "state limits and intervals in batches; `max_steps` still counts optimizer steps",
        (1, 2),
        ("loops/test_dataloader_iter_fetcher.py::test_progress_counts_the_batches_the_step_took",
         "loops/test_dataloader_iter_fetcher.py::test_limit_train_batches_counts_batches",
         "loops/test_dataloader_iter_fetcher.py::test_val_check_interval_counts_batches",
         "loops/test_dataloader_iter_fetcher.py::test_accumulation_counts_step_calls"),
    ),
    Change(
        "`on_*_batch_start` receives the previous call's batch (`None` first)",
        "it receives the batch the call takes first",
        "nothing; a hook that ignored its batch can use it",
        (1, 2),
        ("loops/test_dataloader_iter_fetcher.py::test_progress_counts_the_batches_the_step_took",),
    ),
    Change(
        "the step receives raw batches and moves them itself",
        "every batch passes the precision conversion and the three transfer hooks before `next()` returns it",
        "drop the step's own `.to(device)` (keeping it is harmless)",
        (1, 2),
        ("loops/test_dataloader_iter_fetcher.py::test_batches_pass_the_transfer_hooks",
         "loops/test_dataloader_iter_evaluation.py::test_each_evaluation_dataloader_gets_an_iterator_of_its_own"),
    ),
    Change(
        "`dataloader_iter.done` is known for an unsized loader only after a `next()` found its end, and the step is"
        " called once more",
        "`done` is known before the step runs, the step is not called on an exhausted iterator, and"
        " `has_batches(n)` says whether `n` more batches remain",
        "a step that held batches and relied on that extra call sets `self.drain_dataloader_iter = True`",
        (1, 4),
        ("loops/test_dataloader_iter_fetcher.py::test_done_and_has_batches_are_known_before_the_step_takes_a_batch",
         "loops/test_dataloader_iter_drain.py::"
         "test_without_asking_the_step_is_not_called_again_and_the_held_batch_is_reported"),
    ),
    Change(
        "a `StopIteration` from the step ends the epoch silently, under manual optimization it is swallowed",
        "one from `dataloader_iter` running out warns (`CutShortCallWarning`), any other is an error",
        "ask `dataloader_iter.has_batches(n)` before taking `n` batches; catch a `StopIteration` of the step's own",
        (1,),
        ("loops/test_dataloader_iter_fetcher.py::"
         "test_a_call_cut_short_by_the_end_of_the_data_warns_and_trains_none_of_its_batches",
         "loops/test_dataloader_iter_misuse.py::test_a_stop_iteration_the_step_raises_itself_is_an_error"),
    ),
    Change(
        "one evaluation or prediction iterator spans all dataloaders",
        "each dataloader gets an iterator of its own",
        "take the next dataloader's batches in the next call",
        (2,),
        ("loops/test_dataloader_iter_evaluation.py::test_each_evaluation_dataloader_gets_an_iterator_of_its_own",),
    ),
    Change(
        "under DDP, a rank whose data ends first leaves its peers waiting in the gradient all-reduce",
        "every rank stops at the same call; a rank with batches left warns",
        "nothing",
        (3,),
        ("loops/test_dataloader_iter_ddp.py::test_ranks_stop_at_the_same_step_call_when_one_rank_runs_out_of_data",),
    ),
    Change(
        "`BasePredictionWriter` refuses a `predict_step` taking `dataloader_iter`",
        "it gets the sample indices of every batch of the call",
        "a writer of your own may drop its guard",
        (5,),
        ("callbacks/test_dataloader_iter_callbacks.py::"
         "test_prediction_writer_gets_the_indices_of_every_batch_of_a_call",),
    ),
)
