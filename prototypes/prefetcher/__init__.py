"""``prefetcher``: Lightning 2.6's loops with a data fetcher that keeps batches in flight and counts consumed batches.

User code::

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # already on self.device
            loss = self.model(batch).mean()
            self.log("loss", loss)  # batch_size inferred from the batch the step received
            return loss

        def validation_step(self, dataloader_iter):  # also test_step, predict_step: one call, one dataloader
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # StopIteration at this dataloader's end

    trainer = DESIGNS["prefetcher"].trainer(max_epochs=1)                       # depth=0: no thread
    trainer = DESIGNS["prefetcher"].variant(depth="auto").trainer(max_epochs=1)  # opt in to the thread
    trainer.fit(Model(), train_dataloaders=loader)

Options: ``depth`` is the most batches produced ahead of the step. The default, ``0``, produces each batch on the
step's thread when the step asks for it: the RFC's thread decision makes the thread opt-in. ``"auto"`` prefetches 2
and, after timing the first 8 batches of each epoch, drops the thread when it could hide less than 1 ms per batch
(loading or stepping is that cheap), since the hand-off between threads would then cost more than the overlap saves
(``prefetch_thread.PrefetchThread``). ``transfer_ahead`` (default True) runs the batch-transfer hooks in the
background with the loading; ``False`` leaves them on the main thread, applied as a batch is taken from the queue.

One background thread per epoch (and per evaluation run) loads batches and applies the transfer hooks; on CUDA it also
pins them and copies them on a side stream created once per fit. The step's ``dataloader_iter`` draws from that queue;
batch progress, ``batch_idx``, ``done``, the hooks' batch and the loader state a checkpoint records all follow the
batches the step consumed, never the ones merely prefetched. Evaluation steps get the same fetcher; a step call's
iterator ends (``done``, then StopIteration) at its dataloader's last batch and the next dataloader starts a new call.
The regular flavour keeps Lightning's own fetcher. After the step call that took the epoch's last batch, drain calls
(``done`` True on entry) let a pipelining step train the batches it holds (clause C17): by default only where the
step pulled batches ahead of its calls (``drain="pulled-ahead"``); ``"always"`` and ``"never"`` are the rules the
RFC's drain decision compares it with.
"""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl

from prototypes.common import Design
from prototypes.lightning_changes import install_loops
from prototypes.prefetcher.loops import (
    _PrefetchingEpochLoop,
    _PrefetchingEvaluationLoop,
    _PrefetchingFitLoop,
    _PrefetchingPredictionLoop,
)
from prototypes.prefetcher.options import Options, RunResources
from prototypes.prefetcher.prefetch_thread import AUTO
from prototypes.step_calls import PULLED_AHEAD


def _make_trainer(
    trainer_kwargs: dict[str, Any], depth: int | str = 0, transfer_ahead: bool = True, drain: str = PULLED_AHEAD
) -> pl.Trainer:
    options = Options(depth, transfer_ahead, drain)  # refuses an option it cannot run, before a Trainer is made
    trainer = pl.Trainer(**trainer_kwargs)
    loops = _PrefetchingFitLoop, _PrefetchingEpochLoop, _PrefetchingEvaluationLoop, _PrefetchingPredictionLoop
    return install_loops(trainer, *loops, resources=RunResources(options))


DESIGN = Design(
    name="prefetcher",
    summary=(
        "Lightning's loops with a fetcher that counts consumed batches and drains pipelining steps; a prefetch thread"
        " is opt-in"
    ),
    make_trainer=_make_trainer,
    # What ships, as the RFC's thread decision renders it: no thread unless asked for (`thread_options`).
    options={"depth": 0},
    thread_options={"depth": AUTO},
    changes_lightning_loops=True,
    # Why these: the default (no thread), the opt-in thread that may switch itself off ("auto") and a thread
    # through the whole run (2) take every path the contract sees; depths 1 and 4 change only how many batches wait
    # in the queue, which the design's own tests run at every depth (tests/designs/test_prefetcher.py), and
    # `--design 'prefetcher[depth=4]'` checks one in the suite. Two fewer variants keep the default suite well under
    # 20 minutes on two cores.
    suite_variants=({"depth": AUTO}, {"depth": 2}),
    prefetch_depth_option="depth",
    promised_s1_efficiency={"L=C": 0.8, "L=0.5C": 0.5, "L=2C": 0.5},
    promised_s4_efficiency_at_depth={4: 0.5, 8: 0.5},
)
