"""A step that takes several batches per call, through Lightning's public API only: the warning when the epoch's
last call is cut short by the end of the data (C5), and the optimizer steps a schedule is sized with (C18)."""

from __future__ import annotations

import math

import pytorch_lightning as pl


class CutShortCallWarning(UserWarning):
    """A training step call was cut short by the end of the data (C5): its batches were counted, not stepped. Its own
    category so a user can make it an error: ``warnings.filterwarnings("error", category=CutShortCallWarning)``."""


CALL_CUT_SHORT = (
    "a `training_step(dataloader_iter)` call was cut short by the end of the data after {consumed} of its batches: "
    "they are counted but no optimizer stepped on them, and the loop discarded the gradients the call left. Shown once "
    "per fit; each epoch of this length will do the same. To train them, ask `dataloader_iter.has_batches(k)` before "
    "starting a call of k batches and take fewer in the epoch's last call; to make this an error, "
    "`warnings.filterwarnings('error', category=CutShortCallWarning)`."
)


# [RFC 1] a schedule a step can size exactly
def estimated_optimizer_steps(trainer: pl.Trainer, batches_per_call: int, last_call_trained: bool = True) -> float:
    """The optimizer steps of a fit whose step takes ``batches_per_call`` batches per call: what a schedule such as
    ``OneCycleLR`` is sized with (C18), where ``trainer.estimated_stepping_batches`` counts one batch per call.

    Per epoch, ``ceil(batches / k)`` calls when the epoch's last call trains the batches left (a step sizing it with
    ``dataloader_iter.has_batches``), ``batches // k`` when it is cut short (C5); then ``accumulate_grad_batches``
    windows of calls, the last one closed by the epoch's end; times the epochs, at most ``max_steps``. Why not
    ``estimated_stepping_batches // k``: it divides the run's batches, not each epoch's calls (10 batches, k = 3,
    3 epochs: 12 steps, not 10). Infinite for an unsized loader without ``max_steps``, as Lightning's estimate.
    """
    if isinstance(batches_per_call, bool) or not isinstance(batches_per_call, int) or batches_per_call < 1:
        raise ValueError(f"batches_per_call must be a whole number >= 1, got {batches_per_call!r}")
    estimate = trainer.estimated_stepping_batches  # asked first: it sets up the training data Lightning counts
    batches, epochs, max_steps = trainer.num_training_batches, trainer.max_epochs, trainer.max_steps
    if batches == float("inf") or epochs in (None, -1):
        return estimate  # bounded by max_steps alone, as Lightning's
    calls = math.ceil(batches / batches_per_call) if last_call_trained else batches // batches_per_call
    steps = epochs * math.ceil(calls / trainer.accumulate_grad_batches)
    return steps if max_steps == -1 else min(steps, max_steps)
