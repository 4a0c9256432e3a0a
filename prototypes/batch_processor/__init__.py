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

    trainer = DESIGNS["batch_processor"].trainer(max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(Model(), train_dataloaders=loader)

``trainer()`` builds a stock Trainer and installs this module's loops: :class:`IteratorFitLoop` with
:class:`IteratorTrainingEpochLoop`, and :class:`IteratorEvaluationLoop` / :class:`IteratorPredictionLoop` for
validation (during fit too), test and predict. For a step without a ``dataloader_iter`` parameter every
overridden method defers to Lightning's own loop. Otherwise the loop keeps the run's batches one ahead of the step
(:class:`LookAhead`) and gives each step call a fresh :class:`LookAheadStepIterator`:

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
  so uneven shards, and ranks whose calls take different numbers of batches, end every rank at the same step call
  (``end_of_data_vote_needed``: always with more than one rank).

Its use of Lightning 2.6's private API (imports, overrides, attributes) is read from the source by
``python -m prototypes.coupling`` and listed on the design page. Lightning's guard in ``LightningModule.log``
(``batch_size=`` required when the training step takes ``dataloader_iter``) is met by an instance-level ``log`` on
the module for the duration of fit.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from prototypes.batch_processor.evaluation import IteratorEvaluationLoop, IteratorPredictionLoop
from prototypes.batch_processor.training import IteratorFitLoop, IteratorTrainingEpochLoop
from prototypes.common import Design
from prototypes.lightning_changes import install_loops


def _trainer_with_iterator_loops(trainer_kwargs: dict[str, Any]) -> pl.Trainer:
    loops = IteratorFitLoop, IteratorTrainingEpochLoop, IteratorEvaluationLoop, IteratorPredictionLoop
    return install_loops(pl.Trainer(**trainer_kwargs), *loops)


DESIGN = Design(
    name="batch_processor",
    summary="Lightning's loops hand the step a look-ahead iterator; each next() transfers and counts a batch",
    make_trainer=_trainer_with_iterator_loops,
    changes_lightning_loops=True,
)
