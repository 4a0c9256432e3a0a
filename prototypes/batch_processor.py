"""``batch_processor``: Lightning's loops own the iterator they hand to the step (after PR #8807).

User code::

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # on self.device, transfer hooks applied
            loss = self.model(batch).mean()
            if not dataloader_iter.done:  # exact: True once the epoch's last batch was handed out
                extra, _, _ = next(dataloader_iter)  # a step may take 0, 1 or more batches
                loss = loss + self.model(extra).mean()
            self.log("loss", loss)  # batch size: the samples this step consumed
            return loss  # automatic optimisation, accumulation and clipping work as usual

        def validation_step(self, dataloader_iter):  # also test_step, predict_step
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # one call, one dataloader
            ...

    trainer = IMPLEMENTATIONS["batch_processor"].trainer(max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(Model(), train_dataloaders=loader)

``trainer()`` builds a stock Trainer and installs this module's loops: :class:`IteratorFitLoop` with
:class:`IteratorTrainingEpochLoop`, and :class:`IteratorEvaluationLoop` / :class:`IteratorPredictionLoop` for
validation (during fit too), test and predict. For a step without a ``dataloader_iter`` parameter every
overridden method defers to Lightning's own loop. Otherwise the loop keeps the run's batches one ahead of the step
(:class:`LookAhead`) and gives each step call a fresh :class:`StepIterator`:

- each ``next()`` hands out a batch that went through Lightning's regular transfer path and counts it in
  ``batch_progress``; ``self.log`` in training without ``batch_size=`` weighs by the samples the step consumed;
- the batch held back tells the loop whether another remains (so the step is never entered on an exhausted
  iterator, and ``done`` and ``is_last_batch`` are exact) and is the batch the batch-start hook receives;
- with automatic optimisation the step runs before ``optimizer.step``, which then gets the computed loss: only
  after the step does the loop know whether it took the epoch's last batch; accumulation counts step calls;
- validation runs at the first step boundary at which the consumed batches reach a multiple of
  ``val_check_batch``;
- after the step call that took the epoch's last batch, drain calls (``done`` True on entry) let a pipelining step
  train the batches it holds, until it raises ``StopIteration`` or calls ``next()`` past the end (clause C17);
- a ``StopIteration`` from ``next()`` inside a step ends the epoch (in evaluation: that dataloader's part of the
  run) like running out between steps does;
- a checkpoint records the loaders' state as of the batches handed out, not the one held back, and resuming
  restores ``batch_idx``, the step-call count and the progress of a step that consumed several batches;
- misuse: the iterator is closed when its step returns, a ``StopIteration`` not from it is an error, a step with
  both a batch and ``dataloader_iter`` is refused before any batch is fetched, and a run of steps consuming
  nothing ends with an error (``prototypes.common``'s checks);
- under DDP the ranks vote after every step call on whether each still has a batch (``every_rank_has_a_batch``),
  so uneven shards end every rank at the same step call.

Coupling to Lightning 2.6's private API, all of it here: ``_FitLoop``, ``_TrainingEpochLoop``, ``_EvaluationLoop``
and ``_PredictionLoop`` (subclassed; the restart and SIGTERM preamble of the training loop's ``advance`` and the
evaluation loops' ``run`` are repeated around the fetch-and-step part), ``_DataFetcher.__next__`` and ``done`` (the
plain, profiled fetch that ``_DataLoaderIterDataFetcher`` wraps), ``CombinedLoader._state_dicts`` and ``limits``,
``_AutomaticOptimization._make_closure`` and ``_optimizer_step``, ``LightningModule._on_before_batch_transfer``,
``trainer._logger_connector`` and ``trainer.call``'s hook dispatch. Lightning's guard in ``LightningModule.log``
(``batch_size=`` required when the training step takes ``dataloader_iter``) is met by an instance-level ``log`` on
the module for the duration of fit.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterator
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
from pytorch_lightning.utilities.data import extract_batch_size
from pytorch_lightning.utilities.exceptions import (
    MisconfigurationException,
    SIGTERMException,
)

from prototypes.common import (
    ITERATOR_USED_AFTER_ITS_STEP,
    STOP_ITERATION_WITH_BATCHES_LEFT,
    Design,
    NoProgressGuard,
    every_rank_has_a_batch,
    refuse_mixed_step_signature,
    takes_dataloader_iter,
    transfer_batch,
)
from prototypes.lightning_changes import (
    BatchCountingEpochLoop,
    BatchCountingFitLoop,
    ManualOptimizationSeesStopIteration,
    StockProfilerActions,
    drain,
    epoch_stopped_early,
    install_loops,
    loader_states,
    supply_log_batch_size,
)

Item = tuple[Any, int, int]  # (batch, batch_idx, dataloader_idx), as Lightning's combined loader yields it



class LookAhead:
    """The run's batches, fetched one ahead of the step so the loop knows whether another remains.

    ``fetch`` returns the next raw ``(batch, batch_idx, dataloader_idx)`` or raises ``StopIteration``; it is
    never called again after that. ``transfer(batch, dataloader_idx)`` moves a batch to the device; it runs once
    per batch, when the batch is first needed (handed out or shown to a batch-start hook), not when it is
    fetched, so a step that pipelines its own work decides when the copy happens. ``snapshot``, if given,
    returns the loaders' state; ``consumed_state`` is then their state as of the batches taken so far (the
    batch held back excluded), which is what a checkpoint must record.
    """

    def __init__(
        self, fetch: Callable[[], Item], transfer: Callable[[Any, int], Any], snapshot: Callable[[], Any] | None = None
    ) -> None:
        self._fetch = fetch
        self._transfer = transfer
        self._snapshot = snapshot or (lambda: None)
        self._head: Item | None = None
        self._head_transferred = False
        self._fetch_error: Exception | None = None
        self.exhausted = False
        self.consumed_state: Any = None
        self._fetch_head()

    def _fetch_head(self) -> None:
        # Why snapshot before fetching: the fetch advances the loaders past a batch no step has received yet
        self.consumed_state = self._snapshot()
        try:
            self._head = self._fetch()
        except StopIteration:
            self._head, self.exhausted = None, True
            # nothing is held back, and a loader's state after its end makes a resumed run start a new epoch
            self.consumed_state = self._snapshot()
        except Exception as error:
            # the failure belongs to the batch being looked ahead at, not to the one being handed out now:
            # raise it when that batch is asked for, with its original type and traceback
            self._head, self._fetch_error = None, error
        self._head_transferred = False

    def exhausted_for(self, dataloader_idx: int) -> bool:
        """No batch of ``dataloader_idx`` remains: the loaders ran out or (sequential mode) moved to the next one."""
        return self.exhausted or (self._head is not None and self._head[2] != dataloader_idx)

    def peek(self) -> Item:
        """The next batch, transferred, without taking it; ``StopIteration`` when none remains."""
        if self._fetch_error is not None:
            raise self._fetch_error
        if self._head is None:
            raise StopIteration
        if not self._head_transferred:
            batch, batch_idx, dataloader_idx = self._head
            self._head = (self._transfer(batch, dataloader_idx), batch_idx, dataloader_idx)
            self._head_transferred = True
        return self._head

    def take(self) -> Item:
        """The next batch, transferred; fetches the one after it so ``exhausted`` is exact afterwards."""
        item = self.peek()
        self._fetch_head()
        return item


class StepIterator(Iterator):
    """What ``*_step(self, dataloader_iter)`` receives: valid for one step call, over one dataloader.

    ``next()`` returns ``(batch, batch_idx, dataloader_idx)`` as ``hand_out`` passes it on (the loop counts it
    there); ``done`` is True once the last batch of ``dataloader_idx`` was handed out. After the step returns,
    the loop closes the iterator and ``next()`` raises a ``RuntimeError`` naming the fix (a batch taken then
    would belong to no step).
    """

    def __init__(
        self, batches: LookAhead, hand_out: Callable[[Item], Item], dataloader_idx: int = 0, step: str = "training_step"
    ) -> None:
        self._batches = batches
        self._hand_out = hand_out
        self._dataloader_idx = dataloader_idx
        self._step = step
        self._closed = False
        self.saw_end = False  # next() was called with no batch left: the step knows the data ended

    def __next__(self) -> Item:
        if self._closed:
            raise RuntimeError(ITERATOR_USED_AFTER_ITS_STEP.format(step=self._step))
        if self._batches.exhausted_for(self._dataloader_idx):
            self.saw_end = True
            raise StopIteration
        return self._hand_out(self._batches.take())

    @property
    def done(self) -> bool:
        return self._batches.exhausted_for(self._dataloader_idx)

    def close(self) -> None:
        self._closed = True


def _fetch(data_fetcher: _DataFetcher) -> Item:
    # the combined loader does not stop at a `limit_*_batches`; the fetcher's `done` counts against it
    if data_fetcher.done:
        raise StopIteration
    # the plain profiled fetch; Lightning's `_DataLoaderIterDataFetcher.__next__` hands out its own wrapper
    return _DataFetcher.__next__(data_fetcher)


class IteratorTrainingEpochLoop(BatchCountingEpochLoop):
    """Lightning's training epoch loop, processing batches itself when ``training_step`` pulls them.

    Progress, limits, ``max_steps``, validation intervals, checkpoints and the progress bar count batches;
    ``accumulate_grad_batches`` and the optimizer hooks' ``batch_idx`` count step calls. Validation during fit
    (and its sanity check) runs through :class:`IteratorEvaluationLoop`.
    """

    def __init__(self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self._pulling = False
        self._pulling_module: pl.LightningModule | None = None  # the module `_pulling` was decided for
        self._batches: LookAhead | None = None
        self._step_calls = 0  # this epoch's step calls, the unit of gradient accumulation
        self._window_open = False  # gradients accumulated since the last optimizer step
        self._window_loss: Any = None
        self._last_step_consumed = 0
        self._last_handed_out: tuple[Any, int] = (None, -1)
        self._step_batches: list[Any] = []  # what the running step consumed, for `self.log`'s batch size
        self._undo_log_batch_size: Callable[[], None] | None = None
        self._no_progress = NoProgressGuard()
        self._stateful_loaders = False  # a loader records its position: checkpoints must carry the consumed state
        self.manual_optimization = ManualOptimizationSeesStopIteration(trainer)
        self._step_saw_end = False  # the last step call raised StopIteration or called next() past the last batch
        self._draining = False

    def run(self, data_fetcher: _DataFetcher) -> None:
        step = self.trainer.lightning_module.training_step
        self._pulling_module, self._pulling = self.trainer.lightning_module, takes_dataloader_iter(step)
        if self._pulling:
            refuse_mixed_step_signature(step, "training_step")  # before on_run_start fetches a batch
            if self._undo_log_batch_size is None:  # `run` is called once per epoch
                self._undo_log_batch_size = supply_log_batch_size(self.trainer.lightning_module, self._step_batch_size)
        super().run(data_fetcher)

    def _steps_pull_batches(self) -> bool:
        # Why not only `run`'s answer: Lightning asks about a restart (`update_restart_stage`) before `run`
        module = self.trainer.lightning_module
        if module is not None and module is not self._pulling_module:
            self._pulling_module, self._pulling = module, takes_dataloader_iter(module.training_step)
        return self._pulling

    def _step_calls_this_epoch(self) -> int:
        return self._step_calls

    def _consumed_by_last_call(self) -> int:
        return self._last_step_consumed

    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        super().on_run_start(data_fetcher)
        if not self._pulling:
            return
        if self.batch_progress.current.ready == 0:  # not resuming mid-epoch: the restored counts stand otherwise
            self._step_calls = self._last_step_consumed = 0
        self._window_open, self._window_loss = False, None
        self._last_handed_out = (None, -1)
        self._no_progress = NoProgressGuard()
        combined_loader = self.trainer.fit_loop._combined_loader
        self._stateful_loaders = loader_states(combined_loader) is not None
        snapshot = partial(loader_states, combined_loader) if self._stateful_loaders else None
        self._batches = LookAhead(partial(self._fetch, data_fetcher), partial(transfer_batch, self.trainer), snapshot)
        # an unsized loader that is empty this epoch (on any rank) ends it before any step call
        self.batch_progress.is_last_batch = not every_rank_has_a_batch(self.trainer, not self._batches.exhausted)

    def _fetch(self, data_fetcher: _DataFetcher) -> Item:
        if data_fetcher.done and self._stateful_loaders and self._epoch_uncut():
            # Why ask the loader once more: a StatefulDataLoader records the end of its epoch only once it raised
            # StopIteration. Saved before that, its state would resume into an empty rest of this epoch.
            try:
                next(data_fetcher.iterator)  # no batch is left: the limits do not cut the loaders
            except StopIteration:
                pass
        return _fetch(data_fetcher)

    def _epoch_uncut(self) -> bool:
        loader = self.trainer.fit_loop._combined_loader
        return all(limit >= len(dl) for dl, limit in zip(loader.flattened, loader.limits))

    def _hand_out(self, item: Item) -> Item:
        batch, _, dataloader_idx = item
        # Why not the loader's index: the combined loader restarts it at 0 when a run resumes mid-epoch
        batch_idx = self.batch_progress.current.ready
        self.batch_progress.increment_ready()
        self.batch_progress.increment_started()
        self.batch_progress.is_last_batch = self._batches.exhausted
        self._last_handed_out = (batch, batch_idx)
        self._step_batches.append(batch)
        return batch, batch_idx, dataloader_idx

    def _step_batch_size(self) -> int | None:
        """Samples the running step consumed (1 if none, Lightning's fallback); None if a size cannot be inferred."""
        try:
            return sum(extract_batch_size(batch) for batch in self._step_batches) or 1
        except MisconfigurationException:
            return None

    def teardown(self) -> None:
        # Lightning tears down after every fit, failed ones included
        if self._undo_log_batch_size is not None:
            self._undo_log_batch_size()
            self._undo_log_batch_size = None
        super().teardown()

    def advance(self, data_fetcher: _DataFetcher) -> None:
        if not self._pulling:
            return super().advance(data_fetcher)
        assert self._batches is not None
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
        batch, _, _ = self._batches.peek()  # `done` was False, so a batch (or its fetch error) is there
        batch_idx = self.batch_progress.current.ready
        trainer._logger_connector.on_batch_start(batch)
        self._step_batches = []
        self._step_calls += 1  # the call begins with its batch-start hooks: `IteratorFitLoop.batch_idx` is its index
        call._call_callback_hooks(trainer, "on_train_batch_start", batch, batch_idx)
        response = call._call_lightning_module_hook(trainer, "on_train_batch_start", batch, batch_idx)
        call._call_strategy_hook(trainer, "on_train_batch_start", batch, batch_idx)
        if response == -1:
            self._step_calls -= 1  # the call does not happen
            self.batch_progress.is_last_batch = True
            raise StopIteration  # how `_TrainingEpochLoop.run` is told to end the epoch; nothing was consumed

        batch_output = self._run_step()
        self._no_progress.step_returned(self._last_step_consumed)

        # Why vote (one all-reduce per step call): a rank whose shard ran out must not stop alone while its peers
        # enter a step whose gradient all-reduce would wait for it; a rank stopped by its peers drops its rest
        has_batch = not self._batches.exhausted
        self.batch_progress.is_last_batch = not every_rank_has_a_batch(trainer, has_batch)
        if has_batch and self.batch_progress.is_last_batch:
            warnings.warn(
                f"rank {trainer.global_rank} ends the epoch with batches left: another rank's data ran out (uneven"
                " shards), and all ranks stop at the same step call. Give every rank the same number of batches."
            )
        for _ in range(self._last_step_consumed):
            self.batch_progress.increment_processed()
        self.update_lr_schedulers("step", update_plateau_schedulers=False)
        if self._num_ready_batches_reached():
            self.update_lr_schedulers("epoch", update_plateau_schedulers=False)

        batch, batch_idx = self._last_handed_out
        call._call_callback_hooks(trainer, "on_train_batch_end", batch_output, batch, batch_idx)
        call._call_lightning_module_hook(trainer, "on_train_batch_end", batch_output, batch, batch_idx)
        trainer._logger_connector.on_batch_end()
        for _ in range(self._last_step_consumed):
            self.batch_progress.increment_completed()
        trainer._logger_connector.update_train_step_metrics()

        # Why here, before the epoch-end validation of `on_advance_end`: batches a pipelining step still holds
        # belong to this epoch's training (C17)
        data_ended = self.batch_progress.is_last_batch and not epoch_stopped_early(trainer)
        if every_rank_has_a_batch(trainer, data_ended and not self._step_saw_end):
            self._drain_held_batches()

    def _drain_held_batches(self) -> None:
        consumed, self._draining = self._last_step_consumed, True
        try:
            drain(self.trainer, self._drain_call)
        finally:
            # the validation interval and a checkpoint look at the batches of the call that took the last one
            self._last_step_consumed, self._draining = consumed, False

    def _drain_call(self) -> bool:
        """One drain call: no batch, so no batch hooks; logging and optimisation as for any step call."""
        trainer = self.trainer
        self._step_batches = []
        self._step_calls += 1
        steps_before = trainer.global_step
        trainer._logger_connector.on_batch_start(None)
        self._run_step()
        trainer._logger_connector.on_batch_end()
        if trainer.global_step > steps_before:  # a call that only saw the end stepped no optimizer
            self.update_lr_schedulers("step", update_plateau_schedulers=False)
        trainer._logger_connector.update_train_step_metrics()
        return self._step_saw_end

    def _run_step(self) -> Any:
        """One step call; returns its output, or None when a StopIteration from ``dataloader_iter`` cut it short."""
        assert self._batches is not None
        trainer = self.trainer
        self._step_saw_end = False
        consumed_before = self.batch_progress.current.ready
        dataloader_iter = StepIterator(self._batches, self._hand_out)
        kwargs = OrderedDict(dataloader_iter=dataloader_iter)
        try:
            with trainer.profiler.profile("run_training_batch"):
                if trainer.lightning_module.automatic_optimization:
                    return self._run_automatic(kwargs)
                return self.manual_optimization.run(kwargs)
        except StopIteration:
            if not self._batches.exhausted:
                raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step="training_step")) from None
            # no backward and no optimizer step for the cut-short call; earlier calls of its accumulation
            # window still get their step, as Lightning steps on an epoch's final batch
            self._step_saw_end = True
            if self._window_open:
                self._step_optimizer()
            return None
        finally:
            dataloader_iter.close()
            self._step_saw_end = self._step_saw_end or dataloader_iter.saw_end
            self._last_step_consumed = self.batch_progress.current.ready - consumed_before

    def _run_automatic(self, kwargs: OrderedDict) -> dict:
        # Lightning calls `optimizer.step(closure)` and runs the step inside it, deciding beforehand whether to
        # step. Here the step runs first: only once it returns does the loop know whether it took the epoch's
        # last batch (which closes the accumulation window), and a call cut short by StopIteration must not
        # reach `optimizer.step` at all. Backward and zero_grad stay inside Lightning's closure.
        optimizer, batch_idx = self.trainer.optimizers[0], self._step_calls - 1
        closure = self.automatic_optimization._make_closure(kwargs, optimizer, batch_idx)
        if self._draining and batch_idx % self.trainer.accumulate_grad_batches:
            # Why: every drain call is a window of its own (the epoch's last batch closed the previous one), but
            # Lightning's closure zeroes the gradients only at a multiple of accumulate_grad_batches
            self.automatic_optimization._on_before_zero_grad(optimizer)
            self.automatic_optimization._optimizer_zero_grad(batch_idx, optimizer)
        # Lightning would wrap an accumulating call in `_block_parallel_sync_behavior` (no DDP gradient sync).
        # Whether this call closes its window is known only after it ran, so every backward syncs: one
        # all-reduce per step call rather than per window, but never a window stepped on unsynced gradients.
        closure()
        result = closure.consume_result()
        self._window_open, self._window_loss = True, result.loss
        if self.trainer.strategy.handles_gradient_accumulation or not self._should_accumulate():
            self._step_optimizer()
        return {} if result.loss is None else result.asdict()

    def _step_optimizer(self) -> None:
        loss, evaluated = self._window_loss, []

        def computed_loss() -> Any:
            # the closure's loss was computed already; mixed-precision plugins skip the step if it is None
            if evaluated:
                raise RuntimeError(
                    "the optimizer evaluated its closure more than once (as LBFGS does); with"
                    " training_step(self, dataloader_iter) each evaluation would need new batches. Use manual"
                    " optimisation (self.automatic_optimization = False) and call optimizer.step(closure) yourself."
                )
            evaluated.append(True)
            return loss

        # optimizer hooks get the step-call index, as zero_grad does: accumulation counts step calls
        self.automatic_optimization._optimizer_step(self._step_calls - 1, computed_loss)
        self._window_open, self._window_loss = False, None

    # ---- checkpoints and resume
    def on_save_checkpoint(self) -> dict:
        state_dict = super().on_save_checkpoint()
        state_dict["step_calls"] = self._step_calls
        state_dict["last_step_consumed"] = self._last_step_consumed
        return state_dict

    def on_load_checkpoint(self, state_dict: dict) -> None:
        super().on_load_checkpoint(state_dict)
        self._step_calls = state_dict.get("step_calls", 0)
        self._last_step_consumed = state_dict.get("last_step_consumed", 0)

    def loader_states_consumed(self) -> list[dict] | None:
        """The loaders' state as of the batches handed out, the held-back one excluded; None if not pulling."""
        return self._batches.consumed_state if self._pulling and self._batches is not None else None

    def reset(self) -> None:
        if self.restarted_on_train_batch_end:
            # Lightning's reset completes the one batch of that call; complete the others it consumed first
            while self.batch_progress.total.completed < self.batch_progress.total.processed - 1:
                self.batch_progress.increment_completed()
        super().reset()


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
        batches = LookAhead(partial(_fetch, self._data_fetcher), partial(transfer_batch, trainer))
        no_progress = NoProgressGuard(step)
        handed_out: list[Item] = []

        def hand_out(item: Item) -> Item:
            progress.increment_ready()
            progress.increment_started()
            progress.is_last_batch = batches.exhausted
            handed_out.append(item)
            return item

        previous_dataloader_idx = 0
        while not batches.exhausted:
            batch, batch_idx, dataloader_idx = batches.peek()
            if dataloader_idx != previous_dataloader_idx:
                self._on_dataloader_change()
            previous_dataloader_idx = dataloader_idx
            hook_dataloader_idx = dataloader_idx if several_dataloaders else None
            hook_args = self._build_kwargs(batch, batch_idx, hook_dataloader_idx).values()
            self._on_step_start(batch, hook_dataloader_idx)
            call._call_callback_hooks(trainer, f"on_{hooks}_batch_start", *hook_args)
            call._call_lightning_module_hook(trainer, f"on_{hooks}_batch_start", *hook_args)

            handed_out.clear()
            dataloader_iter = StepIterator(batches, hand_out, dataloader_idx, step)
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

            if handed_out:
                batch, batch_idx, _ = handed_out[-1]
            hook_args = self._build_kwargs(batch, batch_idx, hook_dataloader_idx).values()
            call._call_callback_hooks(trainer, f"on_{hooks}_batch_end", output, *hook_args)
            call._call_lightning_module_hook(trainer, f"on_{hooks}_batch_end", output, *hook_args)
            for _ in handed_out:
                progress.increment_completed()
            self._on_step_end(output, dataloader_idx, cut_short)
            no_progress.step_returned(len(handed_out))
            self.on_iteration_done()

    def _on_dataloader_change(self) -> None:
        pass

    def _on_step_start(self, batch: Any, hook_dataloader_idx: int | None) -> None:
        pass

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


class IteratorPredictionLoop(StockProfilerActions, _EvaluationStepsPullBatches, _PredictionLoop):
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

    def _on_step_end(self, output: Any, dataloader_idx: int, cut_short: bool) -> None:
        if cut_short:  # a call ended by StopIteration returned nothing
            return
        if output is None:
            self._warning_cache.warn("predict returned None if it was on purpose, ignore this warning...")
        if self._return_predictions:
            self._predictions[dataloader_idx].append(move_data_to_device(output, torch.device("cpu")))


class IteratorFitLoop(BatchCountingFitLoop):
    """Lightning's fit loop; a checkpoint records the loaders' state as of the batches handed out to steps."""

    def consumed_loader_states(self) -> list[dict] | None:
        return self.epoch_loop.loader_states_consumed()


def _trainer_with_iterator_loops(trainer_kwargs: dict[str, Any]) -> pl.Trainer:
    return install_loops(
        pl.Trainer(**trainer_kwargs),
        fit_loop=IteratorFitLoop,
        epoch_loop=IteratorTrainingEpochLoop,
        evaluation_loop=IteratorEvaluationLoop,
        prediction_loop=IteratorPredictionLoop,
    )


DESIGN = Design(
    name="batch_processor",
    summary="Lightning's loops hand the step a look-ahead iterator; each next() transfers and counts a batch",
    make_trainer=_trainer_with_iterator_loops,
)
