"""Lightning's training epoch loop, changed where it assumes one batch per step call, and the stock profiler
action names its subclasses keep."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.training_epoch_loop import RestartStage, _TrainingEpochLoop
from pytorch_lightning.utilities.combined_loader import CombinedLoader
from pytorch_lightning.utilities.exceptions import SIGTERMException

from prototypes.lightning_changes.draining import (
    DRAIN_CALL_TRAINED_UNSEEN,
    HELD_BATCHES_NOT_DRAINED,
    drain,
    epoch_stopped_early,
    optimizer_steps,
)
from prototypes.ranks import RanksVote, end_of_data_vote_needed, every_rank_has_a_batch
from prototypes.step_calls import PULLED_AHEAD, makes_drain_calls


# [RFC 1] stock profiler action names
class StockProfilerActions:
    """Loop subclasses that profile fetches under stock Lightning's action names."""

    trainer: pl.Trainer

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Why computed here: read twice per batch, and a loop's class and stage never change (the per-batch rules,
        # in this package's docstring)
        self._stock_fetch_action = stock_fetch_action(self)

    def _on_before_fetch(self) -> None:
        self.trainer.profiler.start(self._stock_fetch_action)

    def _on_after_fetch(self) -> None:
        self.trainer.profiler.stop(self._stock_fetch_action)


class DrainsHeldBatches:
    """The drain rule at the end of a training epoch's data (C17): the loop calls a pipelining step with an exhausted
    ``dataloader_iter`` until it ends the draining. A mixin of ``BatchCountingEpochLoop`` (Lightning's fit loop sees
    one epoch loop); a design supplies ``_run_drain_call`` and ``_draining``.
    """

    trainer: pl.Trainer

    # ------------------------------------------------------------------- [RFC 4] drain a pipelining step
    def _run_drain_call(self) -> tuple[bool, Any]:
        """Run the step once with an exhausted ``dataloader_iter``: whether a StopIteration ended the call, and the
        outputs the optimisation loop returned for it (empty when the step returned None)."""
        raise NotImplementedError

    def _draining(self) -> contextlib.AbstractContextManager:
        """What the design keeps while it drains: the window rule of C17, and the last call's batch count (after the
        drain ``_consumed_by_last_call()`` still answers for the call that took the epoch's last batch)."""
        raise NotImplementedError

    def _pulled_ahead(self) -> bool:
        """Whether this epoch's step pulled batches ahead of its calls (``StepCalls.pulled_ahead``)."""
        raise NotImplementedError

    def _drain_rule(self) -> str:
        """When the loop makes drain calls (``step_calls.DRAIN_RULES``)."""
        return PULLED_AHEAD

    def _vote_since_the_last_call(self) -> RanksVote | None:
        """The ranks' vote between the last step call and the next (``ranks.vote``), where the design's vote carries
        what the loop must agree on there; None where it does not (the loop then votes on its own)."""
        return None

    # [RFC 4]
    def _drain_if_the_data_ended(self, last_call_stopped: bool) -> None:
        # Why at the end of `advance`, before the epoch-end validation of `on_advance_end`: batches a pipelining
        # step still holds belong to this epoch's training (C17). A call ended by StopIteration holds nothing.
        data_ended = self.batch_progress.is_last_batch and not epoch_stopped_early(self.trainer)
        if not data_ended and not self._ranks_vote_every_step():
            return  # one rank: before its data ends there is nothing to agree on
        vote, rule = self._vote_since_the_last_call(), self._drain_rule()
        pulled_ahead = data_ended and self._pulled_ahead()
        if vote is None:
            drains = every_rank_has_a_batch(
                self.trainer, data_ended and not last_call_stopped and makes_drain_calls(rule, pulled_ahead)
            )
        else:  # the end of data is agreed; what the ranks' calls were like travelled with it
            drains = data_ended and vote.drains(rule)
        if drains:
            self._drain_held_batches()
        elif pulled_ahead and not last_call_stopped and makes_drain_calls(rule, True) and self._ranks_vote_every_step():
            warnings.warn(HELD_BATCHES_NOT_DRAINED.format(rank=self.trainer.global_rank), UserWarning, stacklevel=2)

    def _drain_held_batches(self) -> None:
        with self._draining():
            drain(self.trainer, self._drain_call, vote_after_call=self._vote_after_drain_call())

    def _vote_after_drain_call(self) -> Callable[[bool], RanksVote] | None:
        """The ranks' vote after a drain call where the design's vote records it (``drain``), else None."""
        return None

    # [RFC 4]
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
        trainer._logger_connector.on_batch_start(None)
        # Why count the configured optimizers' own steps, not `global_step`: a step may hand a pipeline the raw
        # optimizer, whose steps Lightning's counts never see; they are work all the same (C17)
        with optimizer_steps(trainer) as steps:
            stopped, outputs = self._run_drain_call()
        trainer._logger_connector.on_batch_end()
        stepped = bool(steps.configured)
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
        # may return nothing, and its optimizers' steps are what tells
        manual = not trainer.lightning_module.automatic_optimization
        idle = not (outputs or (manual and stepped))
        if idle and not stopped and steps.unconfigured:
            warnings.warn(DRAIN_CALL_TRAINED_UNSEEN, UserWarning, stacklevel=2)
        return stopped or idle


class BatchCountingEpochLoop(StockProfilerActions, DrainsHeldBatches, _TrainingEpochLoop):
    """Lightning's training epoch loop, changed where it assumes one batch per step call.

    A design says when its machinery is active (``_steps_pull_batches``), how many step calls this epoch made
    (``_step_calls_this_epoch``) and how many batches the last one consumed (``_consumed_by_last_call``); with the
    regular flavour every override defers to Lightning.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._vote_decided_for: CombinedLoader | None = None  # the combined loader `_ranks_vote` was decided for
        self._ranks_vote = False

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

    # [RFC 3] the vote travels in stock's collective before each step call
    def _broadcast_sigterm_tensor(self) -> None:
        vote = self._vote_since_the_last_call() if self._steps_pull_batches() else None
        if vote is None:
            super()._broadcast_sigterm_tensor()
            return
        # Why no broadcast of its own: the ranks' vote between the calls carried rank 0's SIGTERM flag
        if vote.sigterm:
            with contextlib.suppress(Exception):
                torch.distributed.barrier()  # as stock Lightning: the ranks meet before they exit
            raise SIGTERMException()

    # [RFC 1]
    def _a_rank_ends_within_this_call(self) -> bool:
        """Whether, before the running step call, any rank's look-ahead saw its data end within it (the vote's
        ``a_rank_ends_within_the_next_call``): the call then closes its accumulation window and synchronises the
        gradients. False where the design's vote does not carry it: the window is synchronised once at its close."""
        return False

    # [RFC 3] the end-of-data vote, where this epoch's loaders need it
    def _every_rank_has_a_batch(self, has_batch: bool) -> bool:
        """The ranks' end-of-data vote (``every_rank_has_a_batch``) when ``_ranks_vote_every_step()``; otherwise
        there is one rank, and its ``has_batch`` is the answer."""
        return every_rank_has_a_batch(self.trainer, has_batch) if self._ranks_vote_every_step() else has_batch

    def _ranks_vote_every_step(self) -> bool:
        """Whether the ranks vote on the end of data after every step call (``end_of_data_vote_needed``), decided once
        per combined loader: the answer holds for a fit, and the loop asks after every call."""
        combined = self.trainer.fit_loop._combined_loader
        if self._vote_decided_for is not combined or combined is None:
            self._ranks_vote = end_of_data_vote_needed(self.trainer)
            self._vote_decided_for = combined
        return self._ranks_vote

    # ------------------------------------------------------------------- [RFC 1] accumulation counts step calls
    def _accumulated_batches_reached(self) -> bool:
        accumulate = self.trainer.accumulate_grad_batches
        if accumulate == 1:
            return True  # as Lightning's count modulo 1; why first: Lightning asks six times per batch
        if not self._steps_pull_batches():
            return super()._accumulated_batches_reached()
        return self._step_calls_this_epoch() % accumulate == 0

    # ------------------------------------------------------------------- [RFC 1] resume restores the counts
    def update_restart_stage(self) -> None:
        super().update_restart_stage()
        total = self.batch_progress.total
        mid_step = total.ready == total.started == total.processed > total.completed
        if self.restarting and self._steps_pull_batches() and mid_step:
            # Why: Lightning recognises a checkpoint saved in on_train_batch_end by completed == processed - 1 (one
            # batch per step call); here the call that saved it may have consumed several batches.
            self._restart_stage = RestartStage.RESTARTED_ON_TRAIN_BATCH_END


# [RFC 1]
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
