"""Defects of the patched design: one of the patch's changes undone, the method put back as Lightning released it.

Each names the patch item whose hunk it reverts; the suite must catch it in the clause that item serves. They run
only where the patched package is installed (``python -m patch.environment``), as the ``patched`` design does.
"""

from __future__ import annotations

from pytorch_lightning.callbacks.throughput_monitor import ThroughputMonitor
from pytorch_lightning.core.module import LightningModule
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.optimization.manual import _ManualOptimization
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop

from patch.stock import released_method
from tests.conformance.defects.defect import Defect


def _as_released(owner: type, name: str):
    return lambda _patched: released_method(owner, name)


C07, C09, C10, C11, C14, C16, C18 = (
    f"test_c{n}.py::" for n in ("07_limits", "09_optimisation", "10_logging", "11_resume", "14_misuse",
                                "16_collectives", "18_features")
)
SIZED = "sized and not unsized"

PATCH_HUNK_DEFECTS = [
    Defect("patch_item_1_validation_by_step_index", "C7", "patched",
           "validates by Lightning's released rule (item 1's hunk in `_should_check_val_fx` undone)",
           (_TrainingEpochLoop, "_should_check_val_fx"), _as_released(_TrainingEpochLoop, "_should_check_val_fx"),
           (C07 + "test_val_check_interval_counts_batches",)),
    Defect("patch_item_5_step_inside_optimizer_step", "C9", "patched",
           "decides the optimizer step before the step runs, inside `optimizer.step`, as released (item 5's hunk in"
           " `_AutomaticOptimization.run` undone)",
           (_AutomaticOptimization, "run"), _as_released(_AutomaticOptimization, "run"),
           (C09 + "test_accumulation_counts_step_calls",)),
    Defect("patch_item_5_accumulation_by_batches", "C9", "patched",
           "counts the accumulation window in batches (item 5's hunk in `_accumulated_batches_reached` undone)",
           (_TrainingEpochLoop, "_accumulated_batches_reached"),
           _as_released(_TrainingEpochLoop, "_accumulated_batches_reached"),
           (C09 + "test_accumulation_counts_step_calls",)),
    Defect("patch_item_6_resume_completes_one_batch", "C11", "patched",
           "completes one batch of the saving call on resume (item 6's hunk in the epoch loop's `reset` undone)",
           (_TrainingEpochLoop, "reset"), _as_released(_TrainingEpochLoop, "reset"),
           (C11 + "test_resume_delivers_exactly_the_unconsumed_batches",)),
    Defect("patch_item_8_sigterm_broadcast_beside_the_vote", "C16", "patched",
           "broadcasts the SIGTERM flag before each step call as released, beside the ranks' vote (item 8's hunk in"
           " `_broadcast_sigterm_tensor` undone)",
           (_TrainingEpochLoop, "_broadcast_sigterm_tensor"),
           _as_released(_TrainingEpochLoop, "_broadcast_sigterm_tensor"),
           (C16 + "test_a_step_call_costs_no_collective_beyond_stocks_per_batch_one",)),
    Defect("patch_item_9_log_needs_batch_size", "C10", "patched",
           "asks `self.log` for `batch_size=` as released (item 9's hunk in `LightningModule.log` undone)",
           (LightningModule, "log"), _as_released(LightningModule, "log"),
           (C10 + "test_epoch_mean_is_weighted_by_items_consumed",), SIZED),
    Defect("patch_item_10_manual_swallows_stray_stop", "C14", "patched",
           "suppresses every StopIteration of a manual step (item 10's hunk in `_ManualOptimization.run` undone)",
           (_ManualOptimization, "run"), _as_released(_ManualOptimization, "run"),
           (C14 + "test_stop_iteration_not_from_the_iterator_is_an_error_under_manual_optimisation",)),
    Defect("patch_item_14_throughput_of_the_last_batch", "C18", "patched",
           "counts one batch per step call in `ThroughputMonitor`, the call's last (item 14's hunk in"
           " `on_train_batch_end` undone)",
           (ThroughputMonitor, "on_train_batch_end"), _as_released(ThroughputMonitor, "on_train_batch_end"),
           (C18 + "test_throughput_monitor_counts_every_batch_and_sample",)),
]
