"""Drain calls: the step called again after the last batch, so a pipelining step trains what it holds."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.utilities import _is_max_limit_reached
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from prototypes.ranks import RanksVote, vote
from prototypes.step_calls import NoProgressGuard


# ----------------------------------------------------------------------- [RFC 4] drain a pipelining step
def epoch_stopped_early(trainer: pl.Trainer) -> bool:
    """The epoch ends before its data does: ``should_stop`` was set or ``max_steps`` was reached."""
    epoch_loop = trainer.fit_loop.epoch_loop
    return trainer.should_stop or _is_max_limit_reached(trainer.global_step, epoch_loop.max_steps)


# [RFC 4]
def drain(
    trainer: pl.Trainer, drain_call: Callable[[], bool], hook_name: str = "training_step",
    vote_after_call: Callable[[bool], RanksVote] | None = None,
) -> int:
    """Make drain calls until one ends the draining (clause C17); returns how many were made.

    Once the epoch's last batch has been handed out, a step that pipelines (it pulled batch i+1 and kept it for the
    next call) still holds untrained batches. The loop calls the step again with an exhausted ``dataloader_iter``
    (``done`` True on entry, ``next()`` raising StopIteration without touching the loader). ``drain_call()`` runs one
    such call and returns whether it ended the draining: the step raised StopIteration, or it did no work (returned
    nothing and stepped no optimizer). A step that holds nothing ends it at its first ``next()``, so a simple step
    needs no guard. Under DDP the ranks vote after every call so that all make the same number of calls over the
    dataloader (each may end in a gradient all-reduce): ``vote_after_call(ended)``, by default a vote of this call
    alone. Whether to drain at all is the loop's, by its rule (``DRAIN_RULES``).
    """
    if vote_after_call is None:
        def vote_after_call(ended: bool) -> RanksVote:
            return vote(trainer, not ended, pulled_ahead=not ended, continues_the_dataloader=not ended)

    calls = 0
    while True:
        calls += 1
        if not vote_after_call(drain_call()).every_rank_continues_the_dataloader:
            return calls
        if calls >= NoProgressGuard.LIMIT:
            raise RuntimeError(
                f"`{hook_name}(dataloader_iter)` was called {calls} times after the epoch's last batch and kept"
                " returning a loss or stepping an optimizer. A drain call ends the draining by raising StopIteration"
                " or by returning None without stepping an optimizer: raise StopIteration (or return None) once the"
                " step holds no batch (`dataloader_iter.done` is True in every drain call)."
            )


# [RFC 4]
@dataclass
class OptimizerSteps:
    """The optimizer steps taken during a drain call (``optimizer_steps``)."""

    configured: list[torch.optim.Optimizer] = field(default_factory=list)  # steps of optimizers the module configured
    unconfigured: bool = False  # an optimizer it did not configure stepped, and not inside a configured one's step


# [RFC 4]
@contextlib.contextmanager
def optimizer_steps(trainer: pl.Trainer) -> Iterator[OptimizerSteps]:
    """While it is open, every optimizer ``step()`` is recorded in the ``OptimizerSteps`` it yields: a step of an
    optimizer the module configured, whether it went through Lightning's wrapper (``self.optimizers()``) or the raw
    optimizer (``self.optimizers(use_pl_optimizer=False)``, as TorchRec's examples hand it to a pipeline), and
    whether an optimizer the module did not configure stepped on its own (a combined optimizer stepping its parts
    inside a configured one's step does not count): how the loop tells that a drain call which looks idle to the
    drain rule trained all the same, with an optimizer it cannot see.

    Why torch's global step hooks, only around a drain call: they see every optimizer, the drain rule (C17) is the one
    reader, and the regular path pays nothing; removed on exit, so the Trainer stays picklable and deep-copyable.
    """
    steps = OptimizerSteps()
    configured = {id(optimizer) for optimizer in trainer.optimizers}
    inside_configured = 0

    def before(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        nonlocal inside_configured
        inside_configured += id(optimizer) in configured

    def after(optimizer: torch.optim.Optimizer, *_: Any) -> None:
        nonlocal inside_configured
        if id(optimizer) in configured:
            inside_configured -= 1
            steps.configured.append(optimizer)
        elif not inside_configured:
            steps.unconfigured = True

    handles = [register_optimizer_step_pre_hook(before), register_optimizer_step_post_hook(after)]
    try:
        yield steps
    finally:
        for handle in handles:
            handle.remove()


DRAIN_CALL_TRAINED_UNSEEN = (
    "a drain call of `training_step(dataloader_iter)` stepped an optimizer that `configure_optimizers` did not return,"
    " but returned None and stepped none that it returned, so the loop took it for idle and ended the draining:"
    " batches the step still holds will not be trained. Step an optimizer that `configure_optimizers` returns"
    " (Lightning's wrapper or `self.optimizers(use_pl_optimizer=False)`), or return the loss of the batch the call"
    " trained."
)


HELD_BATCHES_NOT_DRAINED = (
    "rank {rank}'s `training_step(dataloader_iter)` pulled batches ahead of its calls and may still hold some, but"
    " another rank's step holds none (or its last call was cut short), so no rank makes drain calls: a drain call"
    " in which one rank trains and another does not would pair that batch's gradient all-reduce with nothing. The"
    " batches this rank holds are not trained. Give every rank the same batches per call (a `DistributedSampler`,"
    " `drop_last=True`)."
)


# [RFC 4]
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


# [RFC 4]
def prediction_drain_call(
    loop: Any, dataloader_idx: int, run_call: Callable[[], tuple[bool, Any]], consumed: Callable[[], list[int]] = list
) -> bool:
    """One drain call of ``predict_step`` over ``dataloader_idx`` (C17 for prediction), whose batches are all handed
    out: ``run_call()`` runs the step with that dataloader's exhausted iterator and returns whether a StopIteration
    ended it and what it returned; ``consumed()``, the ``batch_idx`` of batches a pipeline's thread took toward it.
    Returns whether the call ended the draining: it raised StopIteration or returned None (no work). A prediction
    it returned goes where the regular calls' go, in order (``PredictionWriterSeesStepCalls._on_drain_call_returned``).
    """
    stopped, prediction = run_call()
    if stopped or prediction is None:
        return True
    loop._on_drain_call_returned(prediction, dataloader_idx, consumed())
    return False
