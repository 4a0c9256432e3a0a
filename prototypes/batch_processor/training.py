"""The training loops: the epoch loop runs the step calls itself when ``training_step`` pulls batches."""


from __future__ import annotations

import contextlib
import warnings
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.fetchers import _DataFetcher
from pytorch_lightning.trainer import call

from prototypes.batch_processor.lookahead import (
    LookAhead,
    LookAheadStepCalls,
    LookAheadStepIterator,
    StepItem,
    fetch_within_limits,
)
from prototypes.common import (
    STOP_ITERATION_WITH_BATCHES_LEFT,
    BatchTransfer,
    refuse_mixed_step_signature,
    takes_dataloader_iter,
    warn_declined,
)
from prototypes.lightning_changes import (
    BatchCountingEpochLoop,
    BatchCountingFitLoop,
    ConsumedBatchProgress,
    ManualOptimizationSeesStopIteration,
    StepFirstAutomaticOptimization,
    discard_cut_short_call,
    loader_state_reader,
    supply_log_batch_size,
)
from prototypes.ranks import BATCHES_LEFT_WHEN_A_PEER_ENDED
from prototypes.step_calls import StepCall


class _StepCallHandOut:
    """The look-ahead handed out to the step calls: a ``LookAheadStepIterator`` per call, each batch counted and
    recorded in the running call (``self.log`` reads them), the drain calls. A mixin of ``IteratorTrainingEpochLoop``:
    Lightning's fit loop sees one epoch loop."""

    trainer: pl.Trainer

    def _step_calls_this_epoch(self) -> int:
        return self._calls.call.index

    def _consumed_by_last_call(self) -> int:
        return len(self._calls.call.batch_indices)  # Why not `consumed`: a call fewer on every batch

    def _pulled_ahead(self) -> bool:
        return self._calls.pulled_ahead()

    # [RFC 1] each batch handed out is counted
    def _hand_out(self, item: StepItem) -> StepItem:
        batch, _, dataloader_idx = item
        # Why not the loader's index: the combined loader restarts it at 0 when a run resumes mid-epoch
        progress, calls = self.batch_progress, self._calls
        batch_idx = progress.current.ready
        progress.count_consumed()
        progress.is_last_batch = calls.batches.exhausted
        calls.last_handed_out = (batch, batch_idx)
        call = calls.call
        call.batches.append(batch)
        call.batch_indices.append(batch_idx)
        return batch, batch_idx, dataloader_idx

    def _log_batches(self) -> list[Any]:
        """What ``self.log``'s batch size counts: the batches the running step consumed, or before its first next()
        the batch it will get (a drain call gets none)."""
        calls = self._calls
        if calls.call.batches or calls.upcoming_batch is None:
            return calls.call.batches
        return [calls.upcoming_batch]

    def _draining(self) -> contextlib.AbstractContextManager:
        return self._calls.drain_calls()

    def _run_drain_call(self) -> tuple[bool, Any]:
        self._calls.upcoming_batch = None
        drain_call = self._calls.start_call(drain=True)
        outputs = self._run_step()
        return drain_call.cut_short, outputs

    def _run_step(self) -> Any:
        """The running step call (a drain call is an accumulation window of its own); returns its output, or None
        when a StopIteration from ``dataloader_iter`` cut it short."""
        trainer, calls = self.trainer, self._calls
        batches, step_call = calls.batches, calls.call
        assert batches is not None
        dataloader_iter = LookAheadStepIterator(batches, self._hand_out, call=step_call)
        kwargs = OrderedDict(dataloader_iter=dataloader_iter)
        try:
            with trainer.profiler.profile("run_training_batch"):
                if trainer.lightning_module.automatic_optimization:
                    return self.automatic_optimization.run_step_call(
                        kwargs, trainer.optimizers[0], step_call, lambda: batches.exhausted
                    )
                return self.manual_optimization.run(kwargs)
        except StopIteration:
            if not batches.exhausted:
                raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step="training_step")) from None
            # no backward and no optimizer step for the cut-short call; earlier calls of its accumulation
            # window still get their step, as Lightning steps on an epoch's final batch
            step_call.cut_short = True
            if trainer.lightning_module.automatic_optimization:
                self.automatic_optimization.close_window(step_call.index - 1)
            discard_cut_short_call(trainer, step_call.consumed)
            return None
        finally:
            dataloader_iter.close()
            step_call.open = False


class _LookAheadLifecycle:
    """The look-ahead's lifecycle: made at each epoch's start on Lightning's fetcher (within the limits), dropped at
    teardown, and the record of step calls a checkpoint keeps and a resumed run restores. A mixin of
    ``IteratorTrainingEpochLoop``: Lightning's fit loop sees one epoch loop."""

    trainer: pl.Trainer

    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        super().on_run_start(data_fetcher)
        if not self._pulling:
            return
        # resuming mid-epoch, the step call the checkpoint recorded stands (`on_load_checkpoint`)
        resumed_call = self._calls.call if self.batch_progress.current.ready else None
        self.automatic_optimization.start_epoch()
        # Why one reader per epoch: whether a loader is stateful is a Protocol check, too costly per batch
        snapshot = loader_state_reader(self.trainer.fit_loop._combined_loader)
        stateful = snapshot is not None  # a loader records its position: checkpoints carry consumed state
        batches = LookAhead(partial(self._fetch, data_fetcher, stateful), BatchTransfer(self.trainer), snapshot)
        self._calls = LookAheadStepCalls(batches, resumed_call)
        # an unsized loader that is empty this epoch (on any rank) ends it before any step call
        self.batch_progress.is_last_batch = not self._every_rank_has_a_batch(not batches.exhausted)

    def _fetch(self, data_fetcher: _DataFetcher, stateful: bool) -> StepItem:
        if data_fetcher.done and stateful and self._epoch_uncut():
            # Why ask the loader once more: a StatefulDataLoader records the end of its epoch only once it raised
            # StopIteration. Saved before that, its state would resume into an empty rest of this epoch.
            try:
                next(data_fetcher.iterator)  # no batch is left: the limits do not cut the loaders
            except StopIteration:
                pass
        return fetch_within_limits(data_fetcher)

    def _epoch_uncut(self) -> bool:
        loader = self.trainer.fit_loop._combined_loader
        return all(limit >= len(dl) for dl, limit in zip(loader.flattened, loader.limits, strict=True))

    def teardown(self) -> None:
        # Lightning tears down after every fit, failed ones included
        if self._undo_log_batch_size is not None:
            self._undo_log_batch_size()
            self._undo_log_batch_size = None
        # Why: the look-ahead holds the run's loader iterator and callables bound to its fetcher, which a Trainer
        # pickled after fit (C1) must not carry; a checkpoint saved now records the loaders' own (exhausted) state
        self._calls.batches = None
        super().teardown()

    # ---- checkpoints and resume
    # [RFC 1] the flavour's own entries, for that module only
    def on_save_checkpoint(self) -> dict:
        state_dict = super().on_save_checkpoint()
        if self._steps_pull_batches():
            # Why only for the flavour (C1): a regular module's checkpoint holds exactly what stock Lightning writes.
            # The flavour's two entries are the ones the specification names (C11): accumulation and the validation
            # interval of a run resumed mid-epoch need the step calls made and the batches the last one took.
            state_dict["step_calls"] = self._calls.call.index
            state_dict["last_step_consumed"] = self._calls.call.consumed
        return state_dict

    def on_load_checkpoint(self, state_dict: dict) -> None:
        super().on_load_checkpoint(state_dict)
        # Lightning loads the progress first: the last call's batches are the ones up to the batch count restored
        consumed, ready = state_dict.get("last_step_consumed", 0), self.batch_progress.current.ready
        last = StepCall(state_dict.get("step_calls", 0), batch_indices=list(range(ready - consumed, ready)))
        self._calls = LookAheadStepCalls(None, last)

    def consumed_loader_states(self) -> list[dict] | None:
        """The loaders' state as of the batches handed out, the held-back one excluded; None if not pulling."""
        batches = self._calls.batches
        return batches.consumed_loader_states if self._pulling and batches is not None else None


class IteratorTrainingEpochLoop(_StepCallHandOut, _LookAheadLifecycle, BatchCountingEpochLoop):
    """Lightning's training epoch loop, processing batches itself when ``training_step`` pulls them.

    Progress, limits, ``max_steps``, validation intervals, checkpoints and the progress bar count batches;
    ``accumulate_grad_batches`` and the optimizer hooks' ``batch_idx`` count step calls. Validation during fit
    (and its sanity check) runs through :class:`IteratorEvaluationLoop`.
    """

    def __init__(self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self.batch_progress = ConsumedBatchProgress()
        self._pulling = False
        self._pulling_module: pl.LightningModule | None = None  # the module `_pulling` was decided for
        self._calls = LookAheadStepCalls(None)  # this epoch's step calls; accumulation counts them
        self._undo_log_batch_size: Callable[[], None] | None = None
        self.automatic_optimization = StepFirstAutomaticOptimization(trainer)
        self.manual_optimization = ManualOptimizationSeesStopIteration(trainer)

    def run(self, data_fetcher: _DataFetcher) -> None:
        step = self.trainer.lightning_module.training_step
        self._pulling_module, self._pulling = self.trainer.lightning_module, takes_dataloader_iter(step)
        self.batch_progress.counts_consumed = self._pulling
        if self._pulling:
            refuse_mixed_step_signature(step, "training_step")  # before on_run_start fetches a batch
            if self._undo_log_batch_size is None:  # `run` is called once per epoch
                self._undo_log_batch_size = supply_log_batch_size(self.trainer.lightning_module, self._log_batches)
        super().run(data_fetcher)

    def _steps_pull_batches(self) -> bool:
        # Why not only `run`'s answer: Lightning asks about a restart (`update_restart_stage`) before `run`
        module = self.trainer.lightning_module
        if module is not None and module is not self._pulling_module:
            self._pulling_module, self._pulling = module, takes_dataloader_iter(module.training_step)
            self.batch_progress.counts_consumed = self._pulling
        return self._pulling

    def advance(self, data_fetcher: _DataFetcher) -> None:
        if not self._pulling:
            return super().advance(data_fetcher)
        calls = self._calls
        assert calls.batches is not None
        # restart and SIGTERM handling, as in `_TrainingEpochLoop.advance`
        if self.restarting and self._should_check_val_fx(data_fetcher):
            if self.val_loop.restarted_mid_evaluation:
                return
            if self.restarted_on_last:
                self._skip_next_val = True
                return
            self.val_loop.increment_progress_to_evaluation_end()
        self.val_loop.restarting = False
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.trainer.world_size > 1:
            self._broadcast_sigterm_tensor()

        trainer = self.trainer
        batch, _, _ = calls.batches.peek()  # `done` was False, so a batch (or its fetch error) is there
        batch_idx = self.batch_progress.current.ready
        trainer._logger_connector.on_batch_start(batch)
        calls.upcoming_batch, previous_call = batch, calls.call
        calls.start_call()  # the call begins with its batch-start hooks: `IteratorFitLoop.batch_idx` is its index
        call._call_callback_hooks(trainer, "on_train_batch_start", batch, batch_idx)
        response = call._call_lightning_module_hook(trainer, "on_train_batch_start", batch, batch_idx)
        call._call_strategy_hook(trainer, "on_train_batch_start", batch, batch_idx)
        if response == -1:
            calls.call = previous_call  # the call does not happen
            self.batch_progress.is_last_batch = True
            raise StopIteration  # how `_TrainingEpochLoop.run` is told to end the epoch; nothing was consumed

        batch_output = self._run_step()
        calls.no_progress.step_returned(len(calls.call.batch_indices))  # Why not `consumed`: a call fewer per batch

        # Why vote (one all-reduce per step call, with more than one rank): a rank whose shard ran out must not stop
        # alone while its peers enter a step whose gradient all-reduce would wait for it; a rank stopped by its peers
        # drops its rest
        if calls.call.declined:
            warn_declined("training_step", calls.batches.drop_rest())
        has_batch = not calls.batches.exhausted
        self.batch_progress.is_last_batch = not self._every_rank_has_a_batch(has_batch)
        if has_batch and self.batch_progress.is_last_batch:
            warnings.warn(BATCHES_LEFT_WHEN_A_PEER_ENDED.format(rank=trainer.global_rank), stacklevel=2)
            # Why: a drain call (C17) after this one must find no batch here either, as on the ranks that ran out
            calls.batches.drop_rest()
        self.batch_progress.increment_processed()  # up to the batches handed out (`ConsumedBatchProgress`)
        self.update_lr_schedulers("step", update_plateau_schedulers=False)
        if self._num_ready_batches_reached():
            self.update_lr_schedulers("epoch", update_plateau_schedulers=False)

        batch, batch_idx = calls.last_handed_out
        call._call_callback_hooks(trainer, "on_train_batch_end", batch_output, batch, batch_idx)
        call._call_lightning_module_hook(trainer, "on_train_batch_end", batch_output, batch, batch_idx)
        trainer._logger_connector.on_batch_end()
        self.batch_progress.increment_completed()
        trainer._logger_connector.update_train_step_metrics()

        self._drain_if_the_data_ended(calls.call.cut_short)


class IteratorFitLoop(BatchCountingFitLoop):
    """Lightning's fit loop; a checkpoint records the loaders' state as of the batches handed out to steps."""

    def consumed_loader_states(self) -> list[dict] | None:
        return self.epoch_loop.consumed_loader_states()
