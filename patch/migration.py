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
        "progress, `limit_*_batches`, `val_check_interval`, the progress bar and checkpoints count step calls",
        "they count the batches the step took",
        "state limits and intervals in batches; `max_steps` still counts optimizer steps",
        (1,),
        ("loops/test_dataloader_iter_fetcher.py::test_batch_progress_counts_the_batches_the_step_consumed",
         "loops/test_fetchers.py::test_fetching_dataloader_iter_opt"),
    ),
    Change(
        "`on_*_batch_start` receives the previous call's batch (`None` first)",
        "it receives the batch the call gets first",
        "nothing; a hook that ignored its batch can use it",
        (2, 7),
        ("loops/test_training_epoch_loop.py::test_training_loop_dataloader_iter_multiple_dataloaders",
         "loops/test_evaluation_loop.py::test_evaluation_loop_dataloader_iter_multiple_dataloaders"),
    ),
    Change(
        "`dataloader_iter.done` is known for an unsized loader only after a `next()` found its end",
        "`done` is exact, and `has_batches(k)` says whether `k` more batches remain",
        "ask `has_batches(k)` before a call that needs `k` batches",
        (2,),
        ("loops/test_dataloader_iter_fetcher.py::test_done_and_has_batches_are_exact_before_the_step_reads",
         "loops/test_fetchers.py::test_done_dataloader_iter_with_limit"),
    ),
    Change(
        "the step receives raw batches and moves them itself",
        "every batch passes the precision conversion and the three transfer hooks before `next()` returns it",
        "drop the step's own `.to(device)` (keeping it is harmless)",
        (4,),
        ("loops/test_dataloader_iter_fetcher.py::test_batches_pass_the_transfer_hooks",),
    ),
    Change(
        "a step that pulls batches ahead of the ones it trains loses what it holds at the end of the data",
        "the loop calls it again (drain calls, `done` True) until a call raises `StopIteration` or returns `None` "
        "without stepping",
        "a drain call trains what the step holds and raises `StopIteration` (its `next()` does) when it holds nothing",
        (3,),
        ("loops/test_dataloader_iter_drain.py::test_a_pipelining_step_trains_the_batch_it_holds_at_the_end_of_the_data",
         "loops/test_fetchers.py::test_step_methods_with_dataloader_iter"),
    ),
    Change(
        "validation, test and predict steps share one iterator across dataloaders and are never drained",
        "each dataloader gets an iterator of its own, and a pipelining step is drained at each dataloader's end",
        "nothing for a step that takes one batch per call; a pipelining step handles drain calls as in training",
        (7,),
        ("loops/test_dataloader_iter_evaluation.py::test_each_evaluation_dataloader_gets_an_iterator_of_its_own",
         "loops/test_dataloader_iter_evaluation.py::"
         "test_a_pipelining_predict_step_predicts_the_batch_it_holds_at_the_end_of_its_dataloader",
         "conformance/test_c17_pipelining.py::test_pipelining_validation_step_evaluates_every_batch_of_each_dataloader"),
    ),
    Change(
        "the optimizer steps inside the step, before it returns; accumulation counts batches",
        "the loop steps after the call returns, and accumulation counts step calls",
        "size `accumulate_grad_batches` in step calls; schedules by `trainer.estimated_stepping_batches`",
        (5, 13),
        ("loops/optimization/test_dataloader_iter_accumulation.py::"
         "test_accumulation_counts_step_calls_and_the_last_call_closes_the_window",
         "tuner/test_lr_finder_dataloader_iter.py::test_lr_find_with_accumulation_and_several_batches_per_step_call"),
    ),
    Change(
        "a call the end of the data cuts short ends the epoch silently, its batches untrained",
        "its batches are counted and still not stepped, its gradients discarded, and it warns once per fit with "
        "`CutShortCallWarning`",
        "ask `has_batches(k)` first and return `None`; to make it an error, filter the warning by its category",
        (2, 5),
        ("loops/optimization/test_dataloader_iter_cut_short.py::"
         "test_a_call_cut_short_by_the_end_of_the_data_warns_and_steps_no_optimizer",),
    ),
    Change(
        "a `StopIteration` the step raises itself ends the epoch silently, batches left untrained",
        "it is a `RuntimeError` that says it did not come from `dataloader_iter`",
        "catch `StopIteration` from your own iterators inside the step",
        (10,),
        ("loops/test_dataloader_iter_misuse.py::test_a_stop_iteration_the_step_raises_itself_is_an_error",
         "loops/test_fetchers.py::test_stop_iteration_with_dataloader_iter"),
    ),
    Change(
        "a step taking both a batch and `dataloader_iter` fails with Python's missing-argument error",
        "it is refused with a `TypeError` naming both ways to write the step",
        "take either the batch or `dataloader_iter`",
        (10,),
        ("loops/test_dataloader_iter_misuse.py::test_a_step_taking_a_batch_and_dataloader_iter_is_refused_naming_both_ways",),
    ),
    Change(
        "`self.log` needs `batch_size=`",
        "it infers the batch size from the samples the call consumed",
        "drop `batch_size=` where it only counted the call's samples",
        (9,),
        ("core/test_dataloader_iter_log.py::test_self_log_infers_the_batch_size_from_the_batches_the_step_consumed",),
    ),
    Change(
        "a checkpoint saved mid-epoch resumes at a count of step calls",
        "it records the loaders' state as of the consumed batches and resumes with exactly the batches not consumed",
        "nothing",
        (6,),
        ("checkpointing/test_dataloader_iter_resume.py::test_resuming_mid_epoch_gets_exactly_the_batches_not_consumed",),
    ),
    Change(
        "under DDP a rank whose data ends first stops while its peers wait in the gradient all-reduce until the "
        "timeout",
        "the ranks agree on the end of data between calls, in the gradients' all-reduce of the call's backward "
        "(no collective of its own; a regular batch also meets its peers in the SIGTERM broadcast) or in the "
        "broadcast's place, and a rank left with batches warns",
        "give every rank the same number of batches",
        (8,),
        ("loops/test_dataloader_iter_ddp.py::test_ranks_stop_at_the_same_step_call_when_one_rank_runs_out_of_data",
         "loops/test_dataloader_iter_ddp.py::test_a_step_call_meets_its_peers_only_in_the_gradient_all_reduce",
         "conformance/test_c16_collectives.py::test_a_step_call_meets_its_peers_only_in_the_gradients_all_reduce"),
    ),
    Change(
        "`ThroughputMonitor` counts one batch per step call; `BasePredictionWriter` fails on a `dataloader_iter` step",
        "the monitor counts every batch a call took; the writer gets the indices of every batch a call consumed, "
        "and `batch=None`, `batch_idx=None` for a drain call",
        "a writer that reads `batch` or `batch_idx` handles `None` (its docstring says so)",
        (14, 15),
        ("callbacks/test_throughput_monitor_dataloader_iter.py::"
         "test_throughput_monitor_counts_every_batch_a_dataloader_iter_step_took",
         "callbacks/test_prediction_writer_dataloader_iter.py::"
         "test_a_prediction_writer_gets_the_indices_of_every_batch_a_call_consumed"),
    ),
    Change(
        "the iterator exposes `data_fetcher`, and `_DataLoaderIterDataFetcher()` builds bare",
        "the fetcher is built for the Trainer whose loop chooses it; the iterator keeps `done`, `fetched` and "
        "`length`, not the fetcher",
        "code that built the fetcher itself (tests) passes the Trainer, the step's name and the batch progress",
        (2,),
        ("loops/test_fetchers.py::test_done_dataloader_iter",),
    ),
)
