"""Installing a design's loops in a stock Trainer."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loops.fit_loop import _FitLoop
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.trainer.states import RunningStage, TrainerFn


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
