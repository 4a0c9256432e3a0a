"""Defects of the patched design: one of the patch's changes undone, the method put back as Lightning released it.

Each names the patch item whose hunk it reverts; the suite must catch it in the clause that item serves. They run
only where the patched package is installed (``python -m patch.environment``), as the ``patched`` design does.
"""

from __future__ import annotations

from pytorch_lightning.callbacks.throughput_monitor import ThroughputMonitor
from pytorch_lightning.core.module import LightningModule
from pytorch_lightning.loops.optimization.manual import _ManualOptimization
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop

from patch.stock import released_method
from tests.conformance.defects.defect import Defect


def _as_released(owner: type, name: str):
    return lambda _patched: released_method(owner, name)


C07, C09, C10, C14, C18 = (
    f"test_c{n}.py::" for n in ("07_limits", "09_optimisation", "10_logging", "14_misuse", "18_features")
)

PATCH_HUNK_DEFECTS = [
    Defect("patch_item_1_validation_by_step_index", "C7", "patched",
           "validates by Lightning's released rule (item 1's hunk in `_should_check_val_fx` undone)",
           (_TrainingEpochLoop, "_should_check_val_fx"), _as_released(_TrainingEpochLoop, "_should_check_val_fx"),
           (C07 + "test_val_check_interval_counts_batches",)),
    Defect("patch_item_1_accumulation_by_batches", "C9", "patched",
           "counts the accumulation window in batches (item 1's hunk in `_accumulated_batches_reached` undone)",
           (_TrainingEpochLoop, "_accumulated_batches_reached"),
           _as_released(_TrainingEpochLoop, "_accumulated_batches_reached"),
           (C09 + "test_accumulation_counts_step_calls",)),
    Defect("patch_item_1_log_needs_batch_size", "C10", "patched",
           "asks `self.log` for `batch_size=` as released (item 1's hunk in `LightningModule.log` undone)",
           (LightningModule, "log"), _as_released(LightningModule, "log"),
           (C10 + "test_log_without_batch_size_reaches_callback_metrics",)),
    Defect("patch_item_1_manual_swallows_stray_stop", "C14", "patched",
           "suppresses every StopIteration of a manual step (item 1's hunk in `_ManualOptimization.run` undone)",
           (_ManualOptimization, "run"), _as_released(_ManualOptimization, "run"),
           (C14 + "test_stop_iteration_not_from_the_iterator_is_an_error_under_manual_optimisation",)),
    Defect("patch_item_5_throughput_of_the_last_batch", "C18", "patched",
           "counts one batch per step call in `ThroughputMonitor`, the call's last (item 5's hunk in"
           " `on_train_batch_end` undone)",
           (ThroughputMonitor, "on_train_batch_end"), _as_released(ThroughputMonitor, "on_train_batch_end"),
           (C18 + "test_throughput_monitor_counts_every_batch_and_sample",)),
]
