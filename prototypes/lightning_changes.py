"""What Lightning has to change for ``training_step(self, dataloader_iter)``, written once.

The two designs that change Lightning's loops (``batch_processor`` and ``prefetcher``) differ in who owns the
iterator: the training loop's look-ahead, or a fetcher that prefetches. Everything else they change is the same
change to Lightning 2.6, and lives here. Each piece is tagged with its item in the RFC's list "What Lightning has
to change" (``rfc/index.md``): ``[RFC n]``. Everything in this module is an override of, or a call into, Lightning's
private loop API; ``prototypes.common`` holds what needs only the public API.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.apply_func import move_data_to_device
from lightning_fabric.utilities.types import _Stateful
from pytorch_lightning.callbacks import BasePredictionWriter
from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.optimization.manual import _ManualOptimization
from pytorch_lightning.loops.progress import _BatchProgress, _Progress
from pytorch_lightning.loops.training_epoch_loop import RestartStage, _TrainingEpochLoop
from pytorch_lightning.loops.utilities import _is_max_limit_reached
from pytorch_lightning.trainer.states import RunningStage, TrainerFn
from pytorch_lightning.utilities.combined_loader import CombinedLoader
from pytorch_lightning.utilities.data import extract_batch_size
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from prototypes.common import NoProgressGuard, end_of_data_vote_needed, every_rank_has_a_batch


# ----------------------------------------------------------------------- [RFC 1] progress counts batches
class CountsConsumed:
    """Progress in batches consumed, however many a step call takes (mixed into Lightning's progress classes).

    Lightning's loops increment ready and started before each step call and processed and completed after it. While
    ``counts_consumed`` is on (a design turns it on while the step pulls batches), ``count_consumed()`` counts ready
    and started per batch handed out, Lightning's per-call ``increment_ready`` / ``increment_started`` do nothing, and
    its per-call ``increment_processed`` / ``increment_completed`` only bring processed and completed up to that
    count. Off, this is Lightning's class with Lightning's own methods.

    Why the four are shadowed on the instance, not overridden: a regular module's loop calls them for every batch,
    and an override that defers to Lightning's would be per-batch work the regular flavour pays for nothing (C1). The
    shadowing methods are not dataclass fields: a checkpoint holds exactly the fields stock Lightning's class has.
    """

    total: Any
    current: Any

    @property
    def counts_consumed(self) -> bool:
        return self.increment_ready is _counted_per_batch  # type: ignore[attr-defined]

    @counts_consumed.setter
    def counts_consumed(self, on: bool) -> None:
        # Why setattr/delattr, never vars(self): reading an instance's __dict__ makes CPython keep a real dict for it,
        # and every attribute and method lookup on the object (Lightning's, dozens per batch) gets slower
        if not on:
            if self.counts_consumed:
                for name in _SHADOWED_INCREMENTS:
                    delattr(self, name)
            return
        self.increment_ready = self.increment_started = _counted_per_batch
        self.increment_processed = self._processed_up_to_started
        self.increment_completed = self._completed_up_to_processed

    def count_consumed(self) -> None:
        total, current = self.total, self.current
        total.ready, current.ready = total.ready + 1, current.ready + 1
        total.started, current.started = total.started + 1, current.started + 1

    def _processed_up_to_started(self) -> None:
        self.total.processed, self.current.processed = self.total.started, self.current.started

    def _completed_up_to_processed(self) -> None:
        self.total.completed, self.current.completed = self.total.processed, self.current.processed


_SHADOWED_INCREMENTS = ("increment_ready", "increment_started", "increment_processed", "increment_completed")


def _counted_per_batch() -> None:
    """Lightning's per-call ready and started, while ``count_consumed()`` counts them per batch."""


class ConsumedBatchProgress(CountsConsumed, _BatchProgress):
    """The training and evaluation loops' ``_BatchProgress``, counting consumed batches."""


class ConsumedProgress(CountsConsumed, _Progress):
    """The prediction loop's ``_Progress`` (it has no ``is_last_batch`` field), counting consumed batches."""


# [RFC 11] stock profiler action names
class StockProfilerActions:
    """Loop subclasses that profile fetches under stock Lightning's action names."""

    trainer: pl.Trainer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Why computed once: read twice per batch, and a loop's class and stage never change. Why not a
        # functools.cached_property: it writes the instance's __dict__, which makes every lookup on the loop slower
        self._stock_fetch_action = stock_fetch_action(self)

    def _on_before_fetch(self) -> None:
        self.trainer.profiler.start(self._stock_fetch_action)

    def _on_after_fetch(self) -> None:
        self.trainer.profiler.stop(self._stock_fetch_action)


class BatchCountingEpochLoop(StockProfilerActions, _TrainingEpochLoop):
    """Lightning's training epoch loop, changed where it assumes one batch per step call.

    A design says when its machinery is active (``_steps_pull_batches``), how many step calls this epoch made
    (``_step_calls_this_epoch``) and how many batches the last one consumed (``_consumed_by_last_call``); with the
    regular flavour every override defers to Lightning.
    """

    def _steps_pull_batches(self) -> bool:
        raise NotImplementedError

    def _step_calls_this_epoch(self) -> int:
        raise NotImplementedError

    def _consumed_by_last_call(self) -> int:
        raise NotImplementedError

    # [RFC 1] the validation interval reads the batch count
    def _should_check_val_fx(self, data_fetcher: Any) -> bool:
        if not self._steps_pull_batches():
            return super()._should_check_val_fx(data_fetcher)
        # Why None: given a dataloader_iter fetcher, Lightning validates at every epoch end because its counts are
        # step calls; here the counts are batches, so the regular flavour's rule applies.
        if super()._should_check_val_fx(None):
            return True
        interval = self.trainer.val_check_batch
        if interval in (None, float("inf")):
            return False
        # Why: Lightning validates when the batch count is a multiple of the interval; a step consuming several
        # batches can step over the multiple, so validate at the first step boundary at or past it.
        progress = self.batch_progress
        counted = (progress.total if self.trainer.check_val_every_n_epoch is None else progress.current).completed
        passed_a_multiple = counted // interval > (counted - self._consumed_by_last_call()) // interval
        # Why the epoch's rule last: it is a chain of calls, and most step calls pass no multiple
        return passed_a_multiple and self._should_check_val_epoch()

    # ------------------------------------------------------------------- [RFC 3] drain a pipelining step
    def _run_drain_call(self) -> tuple[bool, Any]:
        """Run the step once with an exhausted ``dataloader_iter``: whether a StopIteration ended the call, and the
        outputs the optimisation loop returned for it (empty when the step returned None)."""
        raise NotImplementedError

    def _draining(self) -> contextlib.AbstractContextManager:
        """What the design keeps while it drains: the window rule of C17, and the last call's batch count (after the
        drain ``_consumed_by_last_call()`` still answers for the call that took the epoch's last batch)."""
        raise NotImplementedError

    # [RFC 3]
    def _drain_if_the_data_ended(self, last_call_stopped: bool) -> None:
        # Why at the end of `advance`, before the epoch-end validation of `on_advance_end`: batches a pipelining
        # step still holds belong to this epoch's training (C17). A call ended by StopIteration holds nothing.
        data_ended = self.batch_progress.is_last_batch and not epoch_stopped_early(self.trainer)
        if not data_ended and not self._ranks_vote_every_step():
            return  # every rank's data ends at the same step call: before it there is nothing to agree on
        if every_rank_has_a_batch(self.trainer, data_ended and not last_call_stopped):
            self._drain_held_batches()

    # [RFC 8] the end-of-data vote, where this epoch's loaders need it
    def _every_rank_has_a_batch(self, has_batch: bool) -> bool:
        """The ranks' end-of-data vote (``every_rank_has_a_batch``) when ``_ranks_vote_every_step()``; otherwise
        every rank's data ends at the same step call, and this rank's ``has_batch`` is the answer."""
        return every_rank_has_a_batch(self.trainer, has_batch) if self._ranks_vote_every_step() else has_batch

    def _ranks_vote_every_step(self) -> bool:
        """Whether this epoch's loaders need the ranks' end-of-data vote after every step call (decided once per
        combined loader: ``end_of_data_vote_needed``)."""
        combined = self.trainer.fit_loop._combined_loader
        decided_for, vote = getattr(self, "_vote_decision", (None, False))
        if decided_for is not combined or combined is None:
            flattened = combined.flattened if combined is not None else []
            vote = end_of_data_vote_needed(self.trainer, flattened)
            self._vote_decision = combined, vote  # one attribute: past 29 CPython gives the loop a slower, real dict
        return vote

    def _drain_held_batches(self) -> None:
        with self._draining():
            drain(self.trainer, self._drain_call)

    # [RFC 3]
    def _drain_call(self) -> bool:
        """One drain call: no batch, so no batch hooks and no batch progress.

        A call that steps an optimizer (it trained a held batch) is a step of the loop: the step schedulers advance
        and what it logged reaches the loggers at a logging step of its own. A call that steps none (it only saw the
        end) leaves no trace: no logger row, no step counted.

        Returns whether it ended the draining (C17's rule): it raised StopIteration, or it did no work (returned
        nothing and stepped no optimizer). Why not also "called next() on the exhausted iterator": TorchRec's
        pipelines refill their queue with ``next(it, None)`` while they still hold batches.
        """
        trainer = self.trainer
        steps_before = trainer.global_step
        trainer._logger_connector.on_batch_start(None)
        stopped, outputs = self._run_drain_call()
        trainer._logger_connector.on_batch_end()
        stepped = trainer.global_step > steps_before
        if stepped:
            # Why count here: Lightning counts the logging step of a call (`_batches_that_stepped`) in
            # `on_advance_end`, once per `advance`, and the drain calls run inside the `advance` of the call that took
            # the epoch's last batch. Counting the call before this one now gives this call's row a step of its own
            # instead of the previous row's; `on_advance_end` then counts the last call that stepped.
            self._batches_that_stepped += 1
            self.update_lr_schedulers("step", update_plateau_schedulers=False)
            trainer._logger_connector.update_train_step_metrics()
        # Why the outputs alone under automatic optimisation: Lightning counts an optimizer step for a call that
        # returned None too (the closure's None only skips the update); under manual optimisation a step that trains
        # may return nothing, and its `self.optimizers()` steps are what tells
        manual = not trainer.lightning_module.automatic_optimization
        did_work = bool(outputs) or (manual and stepped)
        return stopped or not did_work

    # ------------------------------------------------------------------- [RFC 5] accumulation counts step calls
    def _accumulated_batches_reached(self) -> bool:
        accumulate = self.trainer.accumulate_grad_batches
        if accumulate == 1:
            return True  # as Lightning's count modulo 1; why first: Lightning asks six times per batch
        if not self._steps_pull_batches():
            return super()._accumulated_batches_reached()
        return self._step_calls_this_epoch() % accumulate == 0

    # ------------------------------------------------------------------- [RFC 6] resume restores the counts
    def update_restart_stage(self) -> None:
        super().update_restart_stage()
        total = self.batch_progress.total
        mid_step = total.ready == total.started == total.processed > total.completed
        if self.restarting and self._steps_pull_batches() and mid_step:
            # Why: Lightning recognises a checkpoint saved in on_train_batch_end by completed == processed - 1 (one
            # batch per step call); here the call that saved it may have consumed several batches.
            self._restart_stage = RestartStage.RESTARTED_ON_TRAIN_BATCH_END


# [RFC 11]
def stock_fetch_action(loop: Any) -> str:
    """``[_TrainingEpochLoop].train_dataloader_next`` and its kin, whatever the subclass (C1).

    Why: Lightning names the action after the loop's class; profiler reports are read by users and parsed by
    scripts, so a design's subclass must not rename them.
    """
    stock = _stock_loop_name(type(loop))
    prefix = {"_TrainingEpochLoop": "train_dataloader", "_PredictionLoop": "predict"}.get(stock)
    return f"[{stock}].{prefix or loop._stage.dataloader_prefix}_next"


def _stock_loop_name(loop_type: type) -> str:
    return next(c.__name__ for c in loop_type.__mro__ if c.__module__.startswith("pytorch_lightning."))


# ----------------------------------------------------------------------- [RFC 3] drain a pipelining step
def epoch_stopped_early(trainer: pl.Trainer) -> bool:
    """The epoch ends before its data does: ``should_stop`` was set or ``max_steps`` was reached."""
    epoch_loop = trainer.fit_loop.epoch_loop
    return trainer.should_stop or _is_max_limit_reached(trainer.global_step, epoch_loop.max_steps)


# [RFC 3]
def drain(trainer: pl.Trainer, drain_call: Callable[[], bool], hook_name: str = "training_step") -> int:
    """Make drain calls until one ends the draining (clause C17); returns how many were made.

    Once the epoch's last batch has been handed out, a step that pipelines (it pulled batch i+1 and kept it for the
    next call) still holds untrained batches. The loop calls the step again with an exhausted ``dataloader_iter``
    (``done`` True on entry, ``next()`` raising StopIteration without touching the loader). ``drain_call()`` runs one
    such call and returns whether it ended the draining: the step raised StopIteration, or it did no work (returned
    nothing and stepped no optimizer). A step that holds nothing ends it at its first ``next()``, so a simple step
    needs no guard. Under DDP the ranks vote after every call so that all make the same number of drain calls
    (each may end in a gradient all-reduce).
    """
    for calls in itertools.count(1):
        ended = drain_call()
        if not every_rank_has_a_batch(trainer, not ended):
            return calls
        if calls >= NoProgressGuard.LIMIT:
            raise RuntimeError(
                f"`{hook_name}(dataloader_iter)` was called {calls} times after the epoch's last batch and kept"
                " returning a loss or stepping an optimizer. A drain call ends the draining by raising StopIteration"
                " or by returning None without stepping an optimizer: raise StopIteration (or return None) once the"
                " step holds no batch (`dataloader_iter.done` is True in every drain call)."
            )
    raise AssertionError("unreachable")


# [RFC 3]
def evaluation_drain_call(loop: Any, dataloader_idx: int, run_call: Callable[[], tuple[bool, Any]]) -> bool:
    """One drain call of a validation or test step (C17 for evaluation) over ``dataloader_idx``, whose batches are
    all handed out; ``run_call()`` runs the step with that dataloader's exhausted iterator and returns whether a
    StopIteration ended it and what it returned. Returns whether the call ended the draining, as ``drain`` wants.

    As in training: no batch hooks and no batch counted (the call has no batch of its own). What it logs goes into
    the run's epoch aggregates, with Lightning's batch size of a call without a batch (1) unless the step passes one;
    a call that returned an output is a step of the loop, so its step-level values reach the loggers at a logging
    step of its own. Its output, like any evaluation step's, goes nowhere else (no ``on_*_batch_end`` receives it).
    The draining ends at a call that raises StopIteration or returns None (no work): a pipelining step that holds
    batches returns each one's output.
    """
    trainer = loop.trainer
    connector = trainer._logger_connector
    connector.on_batch_start(None, dataloader_idx if loop._is_sequential and loop.num_dataloaders > 1 else None)
    stopped, output = run_call()
    connector.on_batch_end()
    did_work = not stopped and output is not None
    if did_work and not trainer.sanity_checking:
        connector.update_eval_step_metrics(loop._seen_batches_per_dataloader[dataloader_idx])
        loop._seen_batches_per_dataloader[dataloader_idx] += 1
    return not did_work


# ----------------------------------------------------------------------- [RFC 6] checkpoints: consumed state
def loader_state_reader(combined_loader: CombinedLoader | None) -> Callable[[], list[dict] | None]:
    """A function returning the loaders' state at the moment it is called, or None when no loader can be resumed
    (only stateful loaders are checkpointed).

    Why decided once: whether a loader is stateful is a runtime ``Protocol`` check (``typing._get_protocol_attrs``,
    tens of microseconds), too costly to repeat for every batch, and the loaders do not change within an epoch.
    """
    if combined_loader is None or not any(isinstance(dl, _Stateful) for dl in combined_loader.flattened):
        return lambda: None
    return combined_loader._state_dicts


class BatchCountingFitLoop(_FitLoop):
    """Lightning's fit loop, changed where it assumes one batch per step call. ``epoch_loop`` is a
    :class:`BatchCountingEpochLoop`; a design says what its loaders' state was as of the batches handed out."""

    epoch_loop: BatchCountingEpochLoop

    def consumed_loader_states(self) -> list[dict] | None:
        raise NotImplementedError

    # ------------------------------------------------------------------- [RFC 6] checkpoints: consumed state
    def on_save_checkpoint(self) -> dict:
        state_dict = super().on_save_checkpoint()
        # Why: the loaders ran ahead of the steps (look-ahead or prefetch); resuming from their live state would
        # skip the batches read but not handed out
        consumed = self.consumed_loader_states()
        if consumed is not None:
            state_dict["combined_loader"] = consumed
        return state_dict

    # ------------------------------------------------------------------- [RFC 12] the LR finder asks the loop
    @property
    def batch_idx(self) -> int:
        """When the training step pulls batches, the running step call's index in the epoch; otherwise Lightning's.

        Why: Lightning's LR finder reads ``fit_loop.batch_idx`` (nothing else in Lightning does) to tell whether the
        running call steps the optimizer, as ``(batch_idx + 1) % accumulate_grad_batches == 0``. Accumulation counts
        step calls here (C9) while ``batch_idx`` counts batches, so with several batches per call the finder would
        record a learning rate more than once per optimizer step. Lightning proper would let the finder ask the loop.
        """
        if self.epoch_loop._steps_pull_batches():
            return self.epoch_loop._step_calls_this_epoch() - 1  # a call is counted from its batch-start hooks on
        return super().batch_idx


# ----------------------------------------------------------------------- [RFC 5] the optimizer step after the step
class StepFirstAutomaticOptimization(_AutomaticOptimization):
    """Lightning's automatic optimisation, with the optimizer step (or accumulation) decided after the step returns.

    Lightning calls ``optimizer.step(closure)`` and runs the step inside it, deciding beforehand whether to step.
    When the step pulls its batches, only its return tells whether it took the epoch's last batch (which closes the
    accumulation window), and a call cut short by StopIteration must not reach ``optimizer.step`` at all. Here
    Lightning's closure (step, zero_grad, backward) runs first; then the optimizer steps with the loss already
    computed, or the window stays open. The step call's index in the epoch stands in for ``batch_idx``: windows and
    the optimizer hooks count step calls (C9). A drain call (C17) is a window of its own, and one that computed no
    loss reaches no optimizer hook. ``run`` stays Lightning's, for the regular flavour.
    """

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self._window_open = False  # gradients accumulated since the last optimizer step
        self._window_loss: torch.Tensor | None = None  # the loss of the window's last call

    def start_epoch(self) -> None:
        """The epoch's first step call starts a window."""
        self._window_open, self._window_loss = False, None

    def run_step_call(
        self, kwargs: Any, optimizer: torch.optim.Optimizer, step_call_idx: int, drain: bool,
        data_ended: Callable[[], bool],
    ) -> dict:
        """One step call; ``data_ended()``, asked once the step returned, says whether it took the epoch's last batch.

        A StopIteration from the step propagates (no backward ran): the design tells the end of the data from a stray
        one, then calls :meth:`close_window`, as Lightning steps on an epoch's final batch even mid-window.
        """
        trainer = self.trainer
        if drain and not self._skip_backward:
            # Why on the instance, for this call only: a drain call is a window of its own (the epoch's last batch
            # closed the previous one), while Lightning zeroes only at a multiple of accumulate_grad_batches; an
            # override would be a call more on every batch
            self._make_zero_grad_fn = self._zero_grad_fn_of_a_drain_call
            try:
                closure = self._make_closure(kwargs, optimizer, step_call_idx)
            finally:
                del self._make_zero_grad_fn
        else:
            closure = self._make_closure(kwargs, optimizer, step_call_idx)
        # Lightning would wrap an accumulating call in `_block_parallel_sync_behavior` (no DDP gradient sync).
        # Whether this call closes its window is known only after it ran, so every backward syncs: one
        # all-reduce per step call rather than per window, but never a window stepped on unsynced gradients.
        closure()
        result = closure.consume_result()
        if drain and result.loss is None:
            return {}  # it only saw the end: no optimizer hook, as for a call Lightning never makes
        self._window_open, self._window_loss = True, result.loss
        if data_ended():
            trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
        # Why accumulate_grad_batches first: without accumulation every call closes its window, and asking the
        # strategy and the loop is a chain of calls on every batch
        closes = trainer.accumulate_grad_batches == 1 or trainer.strategy.handles_gradient_accumulation
        if closes or not trainer.fit_loop._should_accumulate():
            self.close_window(step_call_idx)
        return {} if result.loss is None else result.asdict()

    def close_window(self, step_call_idx: int) -> None:
        """Step the optimizer for the open window with the loss its last call computed; nothing if none is open."""
        if not self._window_open:
            return
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

        self._optimizer_step(step_call_idx, computed_loss)
        self._window_open, self._window_loss = False, None

    def _zero_grad_fn_of_a_drain_call(self, batch_idx: int, optimizer: torch.optim.Optimizer) -> Callable[[], None]:
        def zero_grad_fn() -> None:
            self._on_before_zero_grad(optimizer)
            self._optimizer_zero_grad(batch_idx, optimizer)

        return zero_grad_fn


# ----------------------------------------------------------------------- [RFC 9] self.log's batch size
def supply_log_batch_size(
    module: pl.LightningModule, step_batches: Callable[[], list[Any] | None]
) -> Callable[[], None]:
    """Shadow ``module.log`` so that in training ``batch_size`` defaults to the samples in ``step_batches()``;
    returns the undo.

    ``step_batches()`` is the loop's answer for the running step call: the batches it consumed so far, or, before its
    first ``next()``, the batch it will get (none in a drain call); None when the loop cannot tell. The size is their
    samples summed, 1 (Lightning's fallback) for no batch, and None when a batch's size cannot be inferred: then the
    guard's own error asks for ``batch_size=``. Why on the instance: ``LightningModule.log`` refuses the flavour
    without ``batch_size=`` (a guard for stock Lightning, which cannot know it). The loop knows; Lightning proper
    would drop the guard and infer the size in the loop.
    """

    def log(*args: Any, **kwargs: Any) -> None:
        bound = _LOG_SIGNATURE.bind(module, *args, **kwargs)
        if bound.arguments.get("batch_size") is None and module.trainer.training:
            bound.arguments["batch_size"] = samples_in(step_batches())
        return pl.LightningModule.log(*bound.args, **bound.kwargs)

    module.log = log
    return lambda: module.__dict__.pop("log", None)


def samples_in(batches: list[Any] | None) -> int | None:
    """The samples in ``batches`` (1 if there are none, Lightning's fallback); None if a size cannot be inferred."""
    if batches is None:
        return None
    try:
        return sum(extract_batch_size(batch) for batch in batches) or 1
    except MisconfigurationException:
        return None


_LOG_SIGNATURE = inspect.signature(pl.LightningModule.log)


# ----------------------------------------------------------------------- [RFC 10] misuse: a stray StopIteration
class _StepRaisedStopIteration(Exception):
    """Carries a step's StopIteration past Lightning's manual-optimisation loop, which suppresses it."""


# [RFC 10]
class ManualOptimizationSeesStopIteration(_ManualOptimization):
    """Lightning's manual optimisation, except that a ``StopIteration`` raised by the step reaches the caller.

    Why: ``_ManualOptimization.run`` wraps the step in ``suppress(StopIteration)`` (stock Lightning uses the
    exception only to end the epoch). A loop that tells the end of data from a stray ``StopIteration`` (C14 f) and
    ends the epoch on the former must see it under manual optimisation as under automatic optimisation.
    """

    def advance(self, kwargs: Any) -> None:
        try:
            super().advance(kwargs)
        except StopIteration as stop:
            raise _StepRaisedStopIteration from stop

    def run(self, kwargs: Any) -> Any:
        try:
            return super().run(kwargs)
        except _StepRaisedStopIteration as carried:
            raise carried.__cause__ from None


# ----------------------------------------------------------------------- [RFC 15] the prediction writer
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

    def _seen_indices(self, dataloader_idx: int) -> list[list[int]]:
        """Each batch's sample indices so far (empty, with Lightning's warning, when the loader cannot tell them)."""
        assert self._combined_loader is not None
        return self._get_batch_indices(self._combined_loader.flattened[dataloader_idx])  # type: ignore[attr-defined]


# ----------------------------------------------------------------------- installing a design's loops
def install_loops(
    trainer: pl.Trainer,
    fit_loop: type[_FitLoop],
    epoch_loop: type[_TrainingEpochLoop],
    evaluation_loop: type,
    prediction_loop: type,
    **design_options: Any,
) -> pl.Trainer:
    """Replace a stock Trainer's loops with a design's subclasses, keeping the Trainer's settings.

    ``design_options`` reach every loop's constructor (for example the prefetcher's depth).
    """
    stock, inference_mode = trainer.fit_loop, trainer.predict_loop.inference_mode
    fit = fit_loop(trainer, min_epochs=stock.min_epochs, max_epochs=stock.max_epochs, **design_options)
    fit.epoch_loop = epoch_loop(
        trainer, min_steps=stock.epoch_loop.min_steps, max_steps=stock.epoch_loop.max_steps, **design_options
    )
    fit.epoch_loop.val_loop = evaluation_loop(
        trainer, TrainerFn.FITTING, RunningStage.VALIDATING, verbose=False, inference_mode=False, **design_options
    )
    trainer.fit_loop = fit
    for attribute, fn, stage in (
        ("validate_loop", TrainerFn.VALIDATING, RunningStage.VALIDATING),
        ("test_loop", TrainerFn.TESTING, RunningStage.TESTING),
    ):
        loop = evaluation_loop(trainer, fn, stage, inference_mode=inference_mode, **design_options)
        setattr(trainer, attribute, loop)
    trainer.predict_loop = prediction_loop(trainer, inference_mode=inference_mode, **design_options)
    return trainer
