"""Drain calls: the step called again after the last batch, so a pipelining step trains what it holds."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loops.utilities import _is_max_limit_reached

from prototypes.common import NoProgressGuard, every_rank_has_a_batch


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
