"""What ``BasePredictionWriter`` reads, kept per step call."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from pytorch_lightning.callbacks import BasePredictionWriter
from pytorch_lightning.utilities.combined_loader import CombinedLoader


# ----------------------------------------------------------------------- [RFC 5] the prediction writer
class PredictionWriterSeesStepCalls:
    """A prediction loop's record of what ``BasePredictionWriter`` reads, kept per step call when the step pulls
    batches.

    Lightning records the sample indices of each batch for the writers only in the regular flavour:
    ``current_batch_indices`` (read by ``write_on_batch_end``) and ``epoch_batch_indices`` (read by
    ``write_on_epoch_end`` beside the predictions, which it keeps then even without ``return_predictions``). Here a
    step call is the unit a batch is there: its indices are those of the batches it consumed, in order, and a call
    cut short by ``StopIteration`` (no prediction) has no entry. A design calls :meth:`_on_step_returned` after
    each step call, before its batch-end hooks.
    """

    trainer: pl.Trainer
    current_batch_indices: list[int]
    epoch_batch_indices: list[list[list[int]]]
    _predictions: list[list[Any]]
    _return_predictions: bool
    _combined_loader: CombinedLoader | None

    def _on_step_returned(self, prediction: Any, dataloader_idx: int, consumed: list[int], cut_short: bool) -> None:
        """``consumed``: the ``batch_idx`` of each batch the call took from dataloader ``dataloader_idx``."""
        writers = [callback for callback in self.trainer.callbacks if isinstance(callback, BasePredictionWriter)]
        if not writers:  # Why: as Lightning, ask for the indices only for a writer (it warns when there are none)
            return
        seen = self._seen_indices(dataloader_idx)
        if seen:
            self.current_batch_indices = [i for batch_idx in consumed for i in seen[batch_idx]]
        if cut_short or not any(writer.interval.on_epoch for writer in writers):
            return
        if seen:
            self.epoch_batch_indices[dataloader_idx].append(self.current_batch_indices)
        if not self._return_predictions:  # with return_predictions the loop keeps them already
            self._predictions[dataloader_idx].append(move_data_to_device(prediction, torch.device("cpu")))

    # [RFC 4]
    def _on_drain_call_returned(self, prediction: Any, dataloader_idx: int, consumed: list[int]) -> None:
        """A drain call of ``predict_step`` (C17) returned ``prediction``: it joins ``trainer.predict``'s results and
        what the writers get, after the predictions of the calls before it. ``consumed``: the ``batch_idx`` of the
        batches a pipeline's thread took toward the call. No batch hook runs around a drain call, so the loop hands a
        ``"batch"`` writer the prediction itself, with no batch and no ``batch_idx`` (None)."""
        self._on_step_returned(prediction, dataloader_idx, consumed, cut_short=False)
        if self._return_predictions:
            self._predictions[dataloader_idx].append(move_data_to_device(prediction, torch.device("cpu")))
        trainer = self.trainer
        for writer in trainer.callbacks:
            if isinstance(writer, BasePredictionWriter) and writer.interval.on_batch:
                indices = self.current_batch_indices if consumed else []
                writer.write_on_batch_end(trainer, trainer.lightning_module, prediction, indices, None, None,
                                          dataloader_idx)

    def _seen_indices(self, dataloader_idx: int) -> list[list[int]]:
        """Each batch's sample indices so far (empty, with Lightning's warning, when the loader cannot tell them)."""
        assert self._combined_loader is not None
        return self._get_batch_indices(self._combined_loader.flattened[dataloader_idx])  # type: ignore[attr-defined]
