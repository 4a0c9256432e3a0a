"""The catalogue: each defect, grouped by the clause that must catch it."""

from __future__ import annotations

from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.utilities.data import extract_batch_size

import prototypes.common as common
import prototypes.step_calls
from prototypes import batches_per_call, lightning_changes
from prototypes.batch_processor import evaluation as bp_evaluation
from prototypes.batch_processor import lookahead as bp_lookahead
from prototypes.batch_processor import training as bp_training
from prototypes.lightning_changes import log_batch_size, optimization
from prototypes.prefetcher import fetcher as prefetch_fetcher
from prototypes.prefetcher import loops as prefetch_loops
from prototypes.prefetcher import options as prefetch_options
from prototypes.prefetcher import prefetch_thread
from prototypes.prefetcher import producer as prefetch_producer
from prototypes.prefetcher import profiler_guard as prefetch_profiler_guard
from prototypes.prefetcher import step_calls as prefetch_step_calls
from tests.conformance.defects.defect import Defect
from tests.conformance.defects.replacements import (
    _after,
    _calls_the_start_hook_per_batch,
    _complete_one_batch_per_call,
    _counts_only_a_calls_first_batch,
    _counts_only_wrapper_steps,
    _counts_the_batch_held_back_on_minus_one,
    _discards_silently,
    _divides_the_runs_batches,
    _drain_call_as_any_call,
    _drain_call_logging_every_call,
    _foreign_stop_ends_the_call,
    _forget_a_cut_short_calls_batches,
    _get_retyping_errors,
    _instead,
    _keeping,
    _keeps_counted_progress,
    _keeps_the_steps_first_batch_for_the_end_hook,
    _looks_ahead_only_at_what_it_holds,
    _produce_ending_on_error,
    _redelivers_every_fifth,
    _run_catching_exception_only,
    _saves_step_calls_for_every_module,
    _sees_only_configured_optimizers,
    _shutdown_without_join,
    _skips_the_epochs_last_window,
    _skips_the_vote_for_equal_shards,
    _step_after_a_cut_short_call,
    _stop_forgetting_the_thread,
    _this_ranks_vote_alone,
    _transfer_without_after_hook,
    _transfer_without_precision,
    _validates_on_multiples_only,
    _warns_but_keeps_the_gradients,
    _writer_indices_of_the_last_batch,
)

_Fetcher = prefetch_fetcher._PrefetchingIterFetcher  # the prefetcher's fetcher, the owner most defects patch
_EpochLoop = bp_training.IteratorTrainingEpochLoop


# --------------------------------------------------------------------------------------------------- the catalogue
C01 = "test_c01_selection.py::"
C01_OBJECT = "test_c01_trainer_object.py::"
C02 = "test_c02_items.py::"
C03 = "test_c03_exactly_once.py::"
C04 = "test_c04_transfer.py::"
C05 = "test_c05_end_of_data.py::"
C06 = "test_c06_progress.py::"
C07 = "test_c07_limits.py::"
C08 = "test_c08_hooks.py::"
C09 = "test_c09_optimisation.py::"
C10 = "test_c10_logging.py::"
C11 = "test_c11_resume.py::"
C12 = "test_c12_errors.py::"
C13 = "test_c13_interrupts.py::"
C14 = "test_c14_misuse.py::"
C15 = "test_c15_evaluation.py::"
C16 = "test_c16_distributed.py::"
C16_COST = "test_c16_collectives.py::"
C17 = "test_c17_pipelining.py::"
C18 = "test_c18_features.py::"
C19 = "test_c19_real_pipelines.py::"
C19_MEGATRON = "test_c19_megatron.py::"
C19_PIPELINE = "test_c19_megatron_pipeline.py::"
PIPELINE_TEST = "test_megatron_pipeline_schedule_on_two_stages_matches_the_plain_loop"
SIZED = "sized and not unsized"
# the prefetcher ships without a thread; a defect in its thread's lifetime is applied with one running all the time
WITH_THREAD = {"depth": 2}

CATALOGUE: tuple[Defect, ...] = (
    # C1 Selection
    Defect("regular_accumulation_by_step_calls", "C1", "batch_processor",
           "counts accumulation in the flavour's step calls for the regular flavour too",
           (_EpochLoop, "_accumulated_batches_reached"),
           _instead(lambda self: self._calls.call.index % self.trainer.accumulate_grad_batches == 0),
           (C01 + "test_regular_flavour_with_trainer_options_as_stock",), "accumulate3"),
    Defect("options_pickled_with_their_locks", "C1", "prefetcher",
           "pickles its loops' options as they are, thread locks included, instead of rebuilding them on unpickling",
           (prefetch_options.RunResources, "__reduce__"), _instead(object.__reduce__),
           (C01_OBJECT + "test_trainer_pickles_and_copies_before_and_after_fit",), "regular and no_profiler"),
    Defect("profiler_left_serialised", "C1", "prefetcher",
           "leaves its serialising start/stop on the user's profiler after the prefetch thread stopped",
           (prefetch_profiler_guard.ProfilerGuard, "thread_stopped_recording"), _instead(lambda self, profiler: None),
           (C01_OBJECT + "test_trainer_pickles_and_copies_before_and_after_fit",), "dataloader_iter and simple",
           options=WITH_THREAD),
    Defect("step_calls_in_regular_checkpoints", "C1", "batch_processor",
           "writes its step-call count and last call's batch count into every checkpoint, a regular module's too",
           (_EpochLoop, "on_save_checkpoint"), _instead(_saves_step_calls_for_every_module),
           (C01_OBJECT + "test_regular_module_checkpoint_is_stock_lightnings",)),
    Defect("progress_saved_twice", "C1", "prefetcher",
           "keeps a second reference to its evaluation loops' batch progress, which Lightning saves as loop state",
           (prefetch_loops._PrefetchingEvaluationSteps, "__init__"), _after(_keeps_counted_progress),
           (C01_OBJECT + "test_regular_module_checkpoint_is_stock_lightnings",)),
    # C2 Items
    Defect("batch_idx_from_one", "C2", "batch_processor", "numbers the batches of an epoch from 1",
           (_EpochLoop, "_hand_out"), _after(lambda self, item, _: (item[0], item[1] + 1, item[2])),
           (C02 + "test_next_returns_batch_index_and_dataloader_index",), SIZED),
    Defect("batch_idx_counts_step_calls", "C2", "prefetcher", "hands out the step-call index as `batch_idx`",
           (_Fetcher, "consume"), _after(lambda self, item, _: (item[0], self.call.index - 1, item[2])),
           (C02 + "test_next_returns_batch_index_and_dataloader_index",), SIZED),
    Defect("batch_idx_across_epochs", "C2", "batch_processor",
           "numbers batches across epochs (total instead of current progress)",
           (_EpochLoop, "_hand_out"),
           _after(lambda self, item, _: (item[0], self.batch_progress.total.ready - 1, item[2])),
           (C02 + "test_batch_idx_restarts_from_zero_each_epoch",), SIZED),
    # C3 Exactly once, in order
    Defect("read_ahead_batch_dropped", "C3", "prefetcher", "drops the read-ahead batch whenever a step call closes",
           (_Fetcher, "end_step_call"), _after(lambda self, _, *args: setattr(self.calls, "head", None)),
           (C03 + "test_fixed_patterns_receive_the_loader_sequence_every_epoch",), SIZED, {"depth": 0}),
    # depth 0 for both: in a thread a lost or repeated batch would also unbalance the prefetch slots (a hang)
    Defect("batch_repeated", "C3", "prefetcher", "hands out every fifth batch a second time (a retried get())",
           (_Fetcher, "_next_produced"), _redelivers_every_fifth,
           (C03 + "test_fixed_patterns_receive_the_loader_sequence_every_epoch",), SIZED, {"depth": 0}),
    # C4 Device and transfer hooks
    Defect("after_transfer_hook_skipped", "C4", "prefetcher", "never calls `on_after_batch_transfer`",
           (common.BatchTransfer, "__call__"), _instead(_transfer_without_after_hook),
           (C04 + "test_every_batch_passes_each_transfer_hook_once",), SIZED),
    Defect("transfer_hooks_twice", "C4", "batch_processor",
           "transfers a batch when the hooks peek at it and again when it is handed out",
           (bp_lookahead.LookAhead, "take"),
           _after(lambda self, item: (self._transfer(item[0], item[2]), item[1], item[2])),
           (C04 + "test_every_batch_passes_each_transfer_hook_once",), SIZED),
    Defect("precision_conversion_skipped", "C4", "prefetcher", "skips the precision plugin's input conversion",
           (common.BatchTransfer, "__call__"), _instead(_transfer_without_precision),
           (C04 + "test_batches_arrive_on_the_module_device_in_its_precision",)),
    # C5 End of data
    Defect("done_never_true", "C5", "prefetcher", "never sets `dataloader_iter.done`",
           (prefetch_fetcher.FetcherStepIterator, "done"), _instead(property(lambda self: False)),
           (C05 + "test_done_is_true_exactly_once_the_last_batch_is_handed_out",), SIZED),
    Defect("cut_short_batches_uncounted", "C5", "batch_processor",
           "does not count the batches of a step call cut short by StopIteration",
           (_EpochLoop, "_run_step"),
           _after(_forget_a_cut_short_calls_batches),
           (C05 + "test_stop_iteration_in_step_counts_its_consumed_batches",), SIZED),
    Defect("cut_short_call_unreported", "C5", "batch_processor",
           "discards a call cut short's gradients without telling the user",
           (bp_training, "discard_cut_short_call"), _instead(_discards_silently),
           (C05 + "test_call_cut_short_is_reported_once_per_fit",), SIZED),
    Defect("optimizer_step_on_cut_short_call", "C5", "batch_processor",
           "takes an optimizer step for a step call cut short by StopIteration",
           (_EpochLoop, "_run_step"),
           _after(_step_after_a_cut_short_call),
           (C05 + "test_stop_iteration_in_step_takes_no_optimizer_step",), SIZED),
    # C6 Progress counts batches
    Defect("progress_counts_step_calls", "C6", "prefetcher", "advances batch progress once per step call",
           (lightning_changes.ConsumedBatchProgress, "count_consumed"), _counts_only_a_calls_first_batch,
           (C06 + "test_completed_progress_equals_batches_consumed",), SIZED),
    Defect("completed_counts_one_per_call", "C6", "batch_processor",
           "completes at most one batch per step call",
           (lightning_changes.ConsumedBatchProgress, "_completed_up_to_processed"),
           _instead(_complete_one_batch_per_call),
           (C06 + "test_completed_progress_equals_batches_consumed",), SIZED),
    # C7 Limits
    Defect("limit_off_by_one", "C7", "prefetcher", "delivers one batch more than `limit_train_batches`",
           (_Fetcher, "reset"),
           _after(lambda self, _: setattr(self, "length", None if self.length is None else self.length + 1)),
           (C07 + "test_limit_train_batches_delivers_exactly_n_batches",), SIZED),
    Defect("validation_on_multiples_only", "C7", "prefetcher",
           "validates only when the batch count lands on a multiple of `val_check_interval`",
           (prefetch_loops._PrefetchingEpochLoop, "_should_check_val_fx"), _validates_on_multiples_only,
           (C07 + "test_val_check_interval_counts_batches",)),
    # C8 Hooks
    Defect("stale_start_hook_batch", "C8", "prefetcher",
           "gives `on_train_batch_start` the previous step's batch (stock Lightning's behaviour)",
           (_Fetcher, "__next__"),
           lambda original: lambda self: _keeping(self, ("_batch", "_batch_idx"), original),
           (C08 + "test_start_hook_gets_the_first_batch_the_step_receives",), SIZED),
    Defect("end_hook_gets_first_batch", "C8", "batch_processor",
           "gives `on_train_batch_end` the step's first batch instead of its last",
           (_EpochLoop, "_hand_out"), _keeps_the_steps_first_batch_for_the_end_hook,
           (C08 + "test_end_hook_gets_the_last_batch_the_step_received",), SIZED),
    Defect("start_hook_per_batch", "C8", "batch_processor", "calls `on_train_batch_start` for every batch handed out",
           (_EpochLoop, "_hand_out"), _calls_the_start_hook_per_batch,
           (C08 + "test_batch_hooks_once_per_step_call_in_order",), SIZED),
    Defect("minus_one_counts_the_batch_held_back", "C8", "batch_processor",
           "counts the looked-ahead batch when `on_train_batch_start` returns -1",
           (_EpochLoop, "advance"), _counts_the_batch_held_back_on_minus_one,
           (C08 + "test_minus_one_from_start_hook_ends_epoch_without_consuming",), SIZED),
    # C9 Optimisation
    Defect("accumulation_counts_batches", "C9", "prefetcher",
           "closes accumulation windows by batches instead of step calls",
           (prefetch_loops._PrefetchingEpochLoop, "_accumulated_batches_reached"),
           _instead(lambda self: self.batch_progress.current.ready % self.trainer.accumulate_grad_batches == 0),
           (C09 + "test_accumulation_counts_step_calls",)),
    Defect("window_open_at_epoch_end", "C9", "batch_processor",
           "leaves the last accumulation window of an epoch without an optimizer step",
           (lightning_changes.StepFirstAutomaticOptimization, "close_window"), _skips_the_epochs_last_window,
           (C09 + "test_accumulation_counts_step_calls",)),
    # C10 Logging
    Defect("batch_size_in_batches", "C10", "prefetcher", "infers `self.log`'s batch size as the number of batches",
           (log_batch_size, "samples_in"), _instead(lambda batches: len(batches) if batches else 1),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED),
    Defect("batch_size_of_first_batch", "C10", "batch_processor",
           "infers `self.log`'s batch size from the step's first batch only",
           (log_batch_size, "samples_in"),
           _instead(lambda batches: extract_batch_size(batches[0]) if batches else 1),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED),
    # C11 Exactly-once resume
    Defect("checkpoint_of_produced_batches", "C11", "prefetcher",
           "checkpoints the loader state of the batches produced ahead, not of those consumed",
           (prefetch_loops._PrefetchingFitLoop, "on_save_checkpoint"), _instead(_FitLoop.on_save_checkpoint),
           (C11 + "test_resume_delivers_exactly_the_unconsumed_batches",)),
    Defect("batch_idx_renumbered_on_resume", "C11", "batch_processor",
           "hands out the loader's own index, which restarts at 0 after a resume",
           (_EpochLoop, "_hand_out"), _after(lambda self, handed, item: (handed[0], item[1], item[2])),
           (C11 + "test_resume_delivers_exactly_the_unconsumed_batches",)),
    # C12 Errors surface
    Defect("loading_error_ends_the_epoch", "C12", "prefetcher", "ends the epoch quietly when a batch fails to load",
           (prefetch_producer.BatchProducer, "__call__"), _produce_ending_on_error,
           (C12 + "test_dataset_error_reaches_fit_with_its_type",), "main"),
    Defect("loading_error_retyped", "C12", "prefetcher", "re-raises a loading error as a RuntimeError",
           (_Fetcher, "_next_produced"), _get_retyping_errors,
           (C12 + "test_dataset_error_reaches_fit_with_its_type",), "main"),
    Defect("thread_not_joined", "C12", "prefetcher", "stops its prefetch thread without joining it",
           (prefetch_thread.PrefetchThread, "shutdown"), _instead(_shutdown_without_join),
           (C12 + "test_error_in_the_step_while_loading_leaves_no_thread_running",), options=WITH_THREAD),
    # C13 Interrupts and early stops
    Defect("interrupt_kills_the_thread", "C13", "prefetcher",
           "lets a KeyboardInterrupt end its thread instead of reaching the step",
           (prefetch_thread.PrefetchThread, "_run"), _instead(_run_catching_exception_only),
           (C13 + "test_keyboard_interrupt_while_loading_takes_the_interrupt_path",), options=WITH_THREAD),
    # the leaked thread polls until the process ends; w0: no worker processes are kept alive with it
    Defect("early_stop_leaves_the_thread", "C13", "prefetcher",
           "drops its prefetcher at an early stop without shutting the thread down",
           (_Fetcher, "stop"), _instead(_stop_forgetting_the_thread),
           (C13 + "test_early_stop_leaves_nothing_running_and_loses_no_batch",), "w0 and max_steps",
           options=WITH_THREAD),
    # C14 Misuse
    Defect("iterator_stays_open", "C14", "prefetcher",
           "keeps an epoch's `dataloader_iter` usable after the epoch, handing out the next epoch's batches",
           (prefetch_fetcher.FetcherStepIterator, "close"), _instead(lambda self: None),
           (C14 + "test_iterator_used_after_its_loop_ended",), "next_epoch"),
    Defect("iterator_per_step_call", "C14", "prefetcher",
           "closes a step's `dataloader_iter` when the step returns and hands the next call a new one",
           (_Fetcher, "end_step_call"), _after(lambda self, _: self._close_iterator()),
           (C14 + "test_iterator_is_one_object_per_epoch",)),
    Defect("empty_steps_spin", "C14", "batch_processor", "calls a step that consumes nothing forever",
           (prototypes.step_calls.NoProgressGuard, "step_returned"), _instead(lambda self, consumed: None),
           (C14 + "test_step_that_keeps_consuming_nothing_ends_with_an_error",), SIZED + " and never"),
    Defect("mixed_signature_accepted", "C14", "batch_processor",
           "accepts a step taking both a batch and `dataloader_iter`",
           (bp_training, "refuse_mixed_step_signature"), _instead(lambda step, hook_name: None),
           (C14 + "test_step_taking_a_batch_and_dataloader_iter_is_refused",)),
    Defect("foreign_stop_iteration_ends_the_epoch", "C14", "prefetcher",
           "ends the epoch on a StopIteration that did not come from `dataloader_iter`",
           (_Fetcher, "step_stopped"), _instead(_foreign_stop_ends_the_call),
           (C14 + "test_stop_iteration_not_from_the_iterator_is_an_error",), SIZED),
    # C15 Evaluation steps
    Defect("evaluation_iterator_spans_dataloaders", "C15", "prefetcher",
           "lets one evaluation step call's iterator run on into the next dataloader",
           (_Fetcher, "done_for"),
           _instead(lambda self, dataloader_idx, vote=True: self.calls.peek_on_every_rank() is None),
           (C15 + "test_multiple_dataloaders_one_step_call_one_dataloader",), "validate"),
    Defect("evaluation_batch_idx_spans_dataloaders", "C15", "prefetcher",
           "numbers evaluation batches across dataloaders instead of from 0 in each",
           (_Fetcher, "consume"), _after(lambda self, item, _: (item[0], self.fetched - 1, item[2])),
           (C15 + "test_multiple_dataloaders_each_sequence_once_with_its_dataloader_idx",), "validate and " + SIZED),
    # C16 Distributed
    Defect("no_end_of_data_vote", "C16", "prefetcher", "ends an uneven shard's epoch without the ranks' vote",
           (prefetch_step_calls, "start_vote"), _instead(_this_ranks_vote_alone),
           (C16 + "test_uneven_shards_stop_every_rank_at_the_same_step_or_raise_the_same_error",)),
    Defect("vote_beside_the_sigterm_broadcast", "C16", "prefetcher",
           "keeps stock Lightning's SIGTERM broadcast before each step call beside the ranks' vote",
           (lightning_changes.BatchCountingEpochLoop, "_broadcast_sigterm_tensor"),
           _instead(_TrainingEpochLoop._broadcast_sigterm_tensor),
           (C16_COST + "test_a_step_call_costs_no_collective_beyond_stocks_per_batch_one",)),
    Defect("every_backward_synchronises", "C16", "prefetcher",
           "all-reduces the gradients in every backward of an accumulation window, not once per window",
           (optimization, "blocks_gradient_sync"), _instead(lambda trainer, call: False),
           (C16_COST + "test_accumulation_all_reduces_gradients_once_per_window",)),
    Defect("window_closed_unforeseen_left_unsynchronised", "C16", "prefetcher",
           "steps the optimizer on a window whose last call skipped DDP's all-reduce without averaging its gradients",
           (optimization, "average_gradients_over_ranks"), _instead(lambda model: None),
           (C16_COST + "test_a_window_the_data_ends_unforeseen_is_synchronised_once",)),
    Defect("vote_skipped_for_equal_shards", "C16", "prefetcher",
           "skips the ranks' vote for equal DistributedSampler shards, whatever number of batches each call takes",
           (prefetch_fetcher, "end_of_data_vote_needed"), _skips_the_vote_for_equal_shards,
           (C16 + "test_equal_shards_with_unequal_calls_stop_every_rank_at_the_same_step",)),
    # C17 Steps with work in flight
    Defect("never_drains", "C17", "batch_processor",
           "ends the epoch without drain calls, while a pipelining step still holds a batch",
           (_EpochLoop, "_drain_held_batches"), _instead(lambda self: None),
           (C17 + "test_pipelining_step_trains_every_batch_once_per_epoch",), "sized-w0"),
    Defect("no_drain_calls", "C17", "prefetcher",
           "ends the epoch without drain calls, while a pipelining step still holds a batch",
           (prefetch_loops._PrefetchingEpochLoop, "_drain_held_batches"), _instead(lambda self: None),
           (C17 + "test_held_batch_is_trained_at_a_limit",)),
    Defect("drains_every_step", "C17", "prefetcher",
           "makes drain calls after every epoch's data, whether or not the step pulled batches ahead",
           (prefetch_loops._PrefetchingEpochLoop, "_drain_rule"), _instead(lambda self: prototypes.step_calls.ALWAYS),
           (C17 + "test_simple_step_needs_no_guard_and_loses_nothing",), "sized-w0-automatic"),
    Defect("pull_ahead_unseen", "C17", "prefetcher",
           "takes every step for one that trains what it pulls, so no pipelining step is drained",
           (prototypes.step_calls.BatchesTakenPerCall, "pulled_ahead"), _instead(lambda self: False),
           (C17 + "test_pipelining_step_trains_every_batch_once_per_epoch",), "sized-w0"),
    Defect("prediction_never_drains", "C17", "batch_processor",
           "ends a prediction dataloader without drain calls, while the predict step still holds a batch",
           (bp_evaluation.IteratorPredictionLoop, "_drain_dataloader"), _instead(lambda self, step, batches, idx: None),
           (C17 + "test_pipelining_predict_step_returns_every_batchs_prediction_in_order",), "sized"),
    Defect("weight_change_unnoticed", "C17", "prefetcher",
           "ends the draining at a call that looks idle, blind to an optimizer it did not configure stepping",
           (lightning_changes.epoch_loop, "optimizer_steps"), _instead(_sees_only_configured_optimizers),
           (C17 + "test_drain_call_that_trains_unseen_is_reported",)),
    Defect("drain_call_logs_again", "C17", "batch_processor",
           "writes the epoch's last logger row again in a drain call that trains nothing, and a held batch's at the"
           " previous row's step", (_EpochLoop, "_drain_call"), _instead(_drain_call_logging_every_call),
           (C17 + "test_drain_calls_log_and_count_as_the_regular_flavour",), "automatic-1"),
    # C18 Lightning's own features
    Defect("lr_finder_counts_batches", "C18", "batch_processor",
           "lets the LR finder read `batch_idx` in batches, as stock Lightning's loop reports it",
           (bp_training.IteratorFitLoop, "batch_idx"), _instead(_FitLoop.batch_idx),
           (C18 + "test_lr_find_matches_the_regular_flavour",), "2-2"),
    Defect("transfer_hooks_unprofiled", "C18", "prefetcher",
           "runs the transfer hooks on its thread without recording them in the profiler",
           (common, "profiled"), _instead(lambda profiler, action, function: function),
           (C18 + "test_profiler_records_the_training_batches_actions",), "SimpleProfiler"),
    Defect("drain_call_enters_optimizer_step", "C18", "prefetcher",
           "enters the `optimizer_step` hook in a drain call before the step runs, even when it trains nothing",
           (prefetch_loops._StepCallAutomaticOptimization, "run"), _drain_call_as_any_call,
           (C18 + "test_estimated_optimizer_steps_sizes_a_schedule_when_calls_do_not_divide_the_epoch",)),
    Defect("writer_gets_the_last_batchs_indices", "C18", "batch_processor",
           "gives a prediction writer the sample indices of a step call's last batch only",
           (bp_evaluation.IteratorPredictionLoop, "_on_step_returned"), _writer_indices_of_the_last_batch,
           (C18 + "test_prediction_writer_gets_each_step_calls_predictions_and_indices",), "2 and sized"),
    # C19 Real pipelines: what the suite's own pipelining steps (C17, one batch held) cannot see
    Defect("look_ahead_counts_only_what_it_holds", "C19", "prefetcher",
           "answers `has_batches(k)` from the batches it holds already, without taking more from the producer",
           (prefetch_step_calls.HeldBatches, "available"), _instead(_looks_ahead_only_at_what_it_holds),
           (C19_PIPELINE + PIPELINE_TEST,), "k2-12batches-sized"),
    Defect("declined_call_does_not_end_the_data", "C19", "batch_processor",
           "calls the step again after it declined the batches left (`has_batches(k)` False, no batch taken)",
           (prototypes.step_calls.StepCall, "declined"), _instead(property(lambda self: False)),
           (C19_PIPELINE + PIPELINE_TEST,), "k2-13batches-sized"),
    Defect("drains_once", "C19", "prefetcher",
           "ends the draining after one drain call, while a pipeline still holds a second batch",
           (prefetch_loops._PrefetchingEpochLoop, "_drain_call"), _after(lambda self, ended: True),
           (C19 + "test_train_pipeline_trains_every_batch_once_per_epoch",), "TrainPipelineSparseDist and sized-w0"),
    Defect("cut_short_gradients_kept", "C19", "prefetcher",
           "reports a call cut short but leaves the gradients it produced for the next epoch's first step",
           (prefetch_loops, "discard_cut_short_call"), _instead(_warns_but_keeps_the_gradients),
           (C19_MEGATRON + "test_megatron_call_cut_short_is_counted_discarded_and_reported",), "k2 and sized"),
    Defect("raw_optimizer_steps_unseen", "C19", "batch_processor",
           "counts a drain call's optimizer steps from global_step, so a raw optimizer's steps look idle",
           (lightning_changes.epoch_loop, "optimizer_steps"), _instead(_counts_only_wrapper_steps),
           (C19 + "test_train_pipeline_with_the_raw_optimizer_trains_every_batch_once",),
           "TrainPipelineSparseDist and sized"),
    Defect("schedule_sized_by_the_runs_batches", "C18", "prefetcher",
           "sizes a step's schedule as estimated_stepping_batches // k, short of the epochs' partial calls",
           (batches_per_call, "estimated_optimizer_steps"), _instead(_divides_the_runs_batches),
           (C18 + "test_estimated_optimizer_steps_sizes_a_schedule_when_calls_do_not_divide_the_epoch",)),
    Defect("look_ahead_of_one", "C18", "prefetcher",
           "looks ahead one batch only, so has_batches(k) is False for every k above 1",
           (prefetch_step_calls.HeldBatches, "available"),
           _instead(lambda self, count, dataloader_idx, take_ahead: int(
               self.head_of(dataloader_idx, self.peek()) is not None)),
           (C18 + "test_estimated_optimizer_steps_sizes_a_schedule_when_calls_do_not_divide_the_epoch",)),
    Defect("evaluation_never_drains", "C19", "prefetcher",
           "ends an evaluation dataloader without drain calls, while the validation step still holds batches",
           (prefetch_loops._PrefetchingEvaluationLoop, "_drain_dataloader"), _instead(lambda self, idx: None),
           (C19 + "test_eval_pipeline_evaluates_every_batch_once_per_validation_run",), "sized-w0"),
)
