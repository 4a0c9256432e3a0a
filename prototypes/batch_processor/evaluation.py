"""The validation, test and prediction loops: they run the steps themselves when an evaluation step pulls batches."""


from __future__ import annotations

from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from pytorch_lightning.loops.evaluation_loop import _EvaluationLoop
from pytorch_lightning.loops.fetchers import _DataFetcher
from pytorch_lightning.loops.prediction_loop import _PredictionLoop
from pytorch_lightning.loops.utilities import _no_grad_context
from pytorch_lightning.trainer import call
from pytorch_lightning.utilities.exceptions import SIGTERMException

from prototypes.batch_processor.lookahead import LookAhead, LookAheadStepIterator, StepItem, fetch_within_limits
from prototypes.common import (
    STOP_ITERATION_WITH_BATCHES_LEFT,
    BatchTransfer,
    refuse_mixed_step_signature,
    takes_dataloader_iter,
)
from prototypes.lightning_changes import (
    PredictionWriterSeesStepCalls,
    StockProfilerActions,
    drain,
    evaluation_drain_call,
    prediction_drain_call,
)
from prototypes.step_calls import BatchesTakenPerCall, NoProgressGuard


# [RFC 2]
class _EvaluationStepsPullBatches:
    """What :class:`IteratorEvaluationLoop` and :class:`IteratorPredictionLoop` share: the steps of one run.

    The same look-ahead and step iterator as in training, over Lightning's sequential combined loader, with one
    difference: a step call's iterator covers one dataloader. It stops (``done``, then ``StopIteration``) at that
    dataloader's last batch; the next dataloader starts with a new step call, as in the regular flavour.
    ``batch_progress`` counts batches across dataloaders.
    """

    trainer: pl.Trainer
    batch_progress: Any
    _data_fetcher: _DataFetcher | None

    def _pull_batches(self, step: str, hooks: str, several_dataloaders: bool) -> None:
        trainer, progress = self.trainer, self.batch_progress
        assert self._data_fetcher is not None
        batches = LookAhead(partial(fetch_within_limits, self._data_fetcher), BatchTransfer(trainer))
        no_progress = NoProgressGuard(step)
        handed_out: list[StepItem] = []

        def hand_out(item: StepItem) -> StepItem:
            progress.increment_ready()
            progress.increment_started()
            progress.is_last_batch = batches.exhausted
            handed_out.append(item)
            return item

        previous_dataloader_idx, taken = 0, BatchesTakenPerCall()
        while not batches.exhausted:
            batch, batch_idx, dataloader_idx = batches.peek()
            if dataloader_idx != previous_dataloader_idx:
                self._on_dataloader_change()
                taken = BatchesTakenPerCall()
            previous_dataloader_idx = dataloader_idx
            hook_dataloader_idx = dataloader_idx if several_dataloaders else None
            hook_args = self._build_kwargs(batch, batch_idx, hook_dataloader_idx).values()
            self._on_step_start(batch, hook_dataloader_idx)
            call._call_callback_hooks(trainer, f"on_{hooks}_batch_start", *hook_args)
            call._call_lightning_module_hook(trainer, f"on_{hooks}_batch_start", *hook_args)

            handed_out.clear()
            dataloader_iter = LookAheadStepIterator(batches, hand_out, dataloader_idx, step)
            cut_short = False
            try:
                output = call._call_strategy_hook(trainer, step, dataloader_iter)
            except StopIteration:
                if not batches.exhausted_for(dataloader_idx):
                    raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step=step)) from None
                output, cut_short = None, True  # the end of this dataloader's part of the run, not an error
            finally:
                dataloader_iter.close()
            for _ in handed_out:
                progress.increment_processed()
            self._on_step_returned(output, dataloader_idx, [batch_idx for _, batch_idx, _ in handed_out], cut_short)

            if handed_out:
                batch, batch_idx, _ = handed_out[-1]
            hook_args = self._build_kwargs(batch, batch_idx, hook_dataloader_idx).values()
            call._call_callback_hooks(trainer, f"on_{hooks}_batch_end", output, *hook_args)
            call._call_lightning_module_hook(trainer, f"on_{hooks}_batch_end", output, *hook_args)
            for _ in handed_out:
                progress.increment_completed()
            self._on_step_end(output, dataloader_idx, cut_short)
            taken.note(len(handed_out), whole=bool(handed_out) and not cut_short)
            if not cut_short and batches.exhausted_for(dataloader_idx) and taken.pulled_ahead():
                self._drain_dataloader(step, batches, dataloader_idx)
            no_progress.step_returned(len(handed_out))
            self.on_iteration_done()

    def _drain_dataloader(self, step: str, batches: LookAhead, dataloader_idx: int) -> None:
        """The drain calls after the call that took a dataloader's last batch (C17 for evaluation and prediction)."""

    def _run_drain_call(self, step: str, batches: LookAhead, dataloader_idx: int) -> tuple[bool, Any]:
        """One call of ``step`` with the exhausted iterator of ``dataloader_idx``: whether a StopIteration ended it,
        and what it returned."""
        dataloader_iter = LookAheadStepIterator(batches, lambda item: item, dataloader_idx, step)  # exhausted
        try:
            return False, call._call_strategy_hook(self.trainer, step, dataloader_iter)
        except StopIteration:
            return True, None
        finally:
            dataloader_iter.close()

    def _on_dataloader_change(self) -> None:
        pass

    def _on_step_start(self, batch: Any, hook_dataloader_idx: int | None) -> None:
        pass

    def _on_step_returned(self, output: Any, dataloader_idx: int, consumed: list[int], cut_short: bool) -> None:
        """After each step call, before its batch-end hooks; ``consumed``: the ``batch_idx`` of each batch it took."""

    def _on_step_end(self, output: Any, dataloader_idx: int, cut_short: bool) -> None:
        pass


class IteratorEvaluationLoop(StockProfilerActions, _EvaluationStepsPullBatches, _EvaluationLoop):
    """Lightning's validation/test loop; runs the steps itself when ``validation_step``/``test_step`` pull batches."""

    def run(self) -> list:
        name = "test_step" if self.trainer.testing else "validation_step"
        step = getattr(self.trainer.lightning_module, name)
        if not takes_dataloader_iter(step):
            return super().run()
        refuse_mixed_step_signature(step, name)
        return self._run_pulling(name)

    def _drain_dataloader(self, step: str, batches: LookAhead, dataloader_idx: int) -> None:
        run_call = partial(self._run_drain_call, step, batches, dataloader_idx)
        drain(self.trainer, partial(evaluation_drain_call, self, dataloader_idx, run_call), step)

    @_no_grad_context
    def _run_pulling(self, step: str) -> list:
        # `_EvaluationLoop.run` with the fetch-and-step part replaced
        self.setup_data()
        if self.skip:
            return []
        self.reset()
        self.on_run_start()
        several = self._is_sequential and self.num_dataloaders > 1
        self._pull_batches(step, "test" if self.trainer.testing else "validation", several)
        self._store_dataloader_outputs()
        return self.on_run_end()

    def _on_dataloader_change(self) -> None:
        self._store_dataloader_outputs()

    def _on_step_start(self, batch: Any, hook_dataloader_idx: int | None) -> None:
        self.trainer._logger_connector.on_batch_start(batch, hook_dataloader_idx)

    def _on_step_end(self, output: Any, dataloader_idx: int, cut_short: bool) -> None:
        trainer = self.trainer
        trainer._logger_connector.on_batch_end()
        if not trainer.sanity_checking:
            self._has_run = True
            trainer._logger_connector.update_eval_step_metrics(self._seen_batches_per_dataloader[dataloader_idx])
            self._seen_batches_per_dataloader[dataloader_idx] += 1
        if not self.batch_progress.is_last_batch and trainer.received_sigterm:
            raise SIGTERMException


class IteratorPredictionLoop(
    StockProfilerActions, PredictionWriterSeesStepCalls, _EvaluationStepsPullBatches, _PredictionLoop
):
    """Lightning's prediction loop; runs the steps itself when ``predict_step`` pulls batches."""

    def run(self) -> Any:
        step = self.trainer.lightning_module.predict_step
        if not takes_dataloader_iter(step):
            return super().run()
        refuse_mixed_step_signature(step, "predict_step")
        return self._run_pulling()

    @_no_grad_context
    def _run_pulling(self) -> Any:
        # `_PredictionLoop.run` with the fetch-and-step part replaced
        self.setup_data()
        if self.skip:
            return None
        self.reset()
        self.on_run_start()
        self._pull_batches("predict_step", "predict", self.num_dataloaders > 1)
        return self.on_run_end()

    def _drain_dataloader(self, step: str, batches: LookAhead, dataloader_idx: int) -> None:
        run_call = partial(self._run_drain_call, step, batches, dataloader_idx)
        drain(self.trainer, partial(prediction_drain_call, self, dataloader_idx, run_call), step)

    def _on_step_end(self, output: Any, dataloader_idx: int, cut_short: bool) -> None:
        if cut_short:  # a call ended by StopIteration returned nothing
            return
        if output is None:
            self._warning_cache.warn("predict returned None if it was on purpose, ignore this warning...")
        if self._return_predictions:
            self._predictions[dataloader_idx].append(move_data_to_device(output, torch.device("cpu")))
