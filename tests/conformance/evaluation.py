"""Evaluation runs for the C15 clause (``test_c15_evaluation.py``): a module whose evaluation steps take
``dataloader_iter`` and record what they received, and one entry point that runs it in each stage."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from tests.conformance.harness import IterStepModule, ids, ids_or_none, loader_sequence, make_loader, make_trainer

STAGES = ["validate", "test", "predict", "sanity", "fit"]
FIT_EPOCHS = 2  # validation during fit runs at the end of each epoch: the second run must start afresh


# --------------------------------------------------------------------------------------------------- recording
@dataclass
class EvalRun:
    """One evaluation run (an evaluation epoch) as the user's evaluation step and hooks saw it."""

    stage: str  # "validation", "test" or "predict"
    sanity: bool
    steps: list[list[tuple]] = field(default_factory=list)  # per step call: (ids, batch_idx, dataloader_idx)
    done_after_next: list[bool] = field(default_factory=list)
    hooks: list[tuple] = field(default_factory=list)  # ("start" | "end", ids, batch_idx) per batch hook call
    completed: int | None = None  # the running loop's batch_progress.current.completed at the epoch end
    drain_calls: int = 0  # calls entered with every batch of their dataloader handed out (C17)

    @property
    def received(self) -> list[tuple]:
        return [b for step in self.steps for b in step]


def _running_loop(trainer, stage: str):
    if stage == "predict":
        return trainer.predict_loop
    if stage == "test":
        return trainer.test_loop
    if trainer.state.fn == "fit":
        return trainer.fit_loop.epoch_loop.val_loop
    return trainer.validate_loop


class EvalIterModule(IterStepModule):
    """Trains one batch per step; each evaluation step calls ``next()`` ``pattern[k % len(pattern)]`` times in call k
    of its run and records what it received."""

    def __init__(self, pattern=(1,)) -> None:
        super().__init__((1,))
        self.eval_pattern = tuple(pattern)
        self.runs: list[EvalRun] = []
        self._calls_in_run = 0

    def _start(self, stage: str) -> None:
        self.runs.append(EvalRun(stage, bool(self.trainer.sanity_checking)))
        self._calls_in_run = 0

    def _end(self, stage: str) -> None:
        self.runs[-1].completed = _running_loop(self.trainer, stage).batch_progress.current.completed

    def _eval_step(self, dataloader_iter):
        run = self.runs[-1]
        if self._calls_in_run and dataloader_iter.done:
            # A drain call (C17): the step returned an output after its dataloader's last batch. It holds no batch,
            # so it ends the draining the way a simple step does, at its first next().
            run.drain_calls += 1
            next(dataloader_iter)
            raise AssertionError("next() on an exhausted dataloader_iter returned instead of raising StopIteration")
        call = self._calls_in_run
        self._calls_in_run += 1
        received: list[tuple] = []
        run.steps.append(received)
        for _ in range(self.eval_pattern[call % len(self.eval_pattern)]):
            # A StopIteration here propagates: C5 says it ends the run (or this dataloader's part of it) cleanly.
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            received.append((ids(batch), batch_idx, dataloader_idx))
            run.done_after_next.append(bool(dataloader_iter.done))
        return torch.zeros(())

    def validation_step(self, dataloader_iter):
        return self._eval_step(dataloader_iter)

    def test_step(self, dataloader_iter):
        return self._eval_step(dataloader_iter)

    def predict_step(self, dataloader_iter):
        return self._eval_step(dataloader_iter)

    def on_validation_epoch_start(self) -> None:
        self._start("validation")

    def on_validation_epoch_end(self) -> None:
        self._end("validation")

    def on_test_epoch_start(self) -> None:
        self._start("test")

    def on_test_epoch_end(self) -> None:
        self._end("test")

    def on_predict_epoch_start(self) -> None:
        self._start("predict")

    def on_predict_epoch_end(self) -> None:
        self._end("predict")

    def _hook(self, which: str, batch, batch_idx) -> None:
        if self.runs:
            self.runs[-1].hooks.append((which, ids_or_none(batch), batch_idx))

    def on_validation_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self._hook("start", batch, batch_idx)

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self._hook("end", batch, batch_idx)

    def on_test_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self._hook("start", batch, batch_idx)

    def on_test_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self._hook("end", batch, batch_idx)

    def on_predict_batch_start(self, batch, batch_idx, dataloader_idx=0):
        self._hook("start", batch, batch_idx)

    def on_predict_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self._hook("end", batch, batch_idx)


def run_stage(design, stage: str, module: EvalIterModule, loaders, **trainer_kwargs) -> list[EvalRun]:
    """Run ``module``'s evaluation step through ``design`` in ``stage``; the runs of that stage, in order."""
    if stage in ("validate", "test", "predict"):
        trainer = make_trainer(design, **trainer_kwargs)
        if stage == "predict":
            with warnings.catch_warnings():
                # on purpose: the evaluation step records what it received and returns nothing to predict
                warnings.filterwarnings("ignore", "predict returned None")
                trainer.predict(module, loaders)
        else:
            getattr(trainer, stage)(module, loaders, verbose=False)
        return module.runs
    train = make_loader("sized", n_items=2)  # one training batch per epoch: the evaluation is under test
    if stage == "sanity":
        # all validation batches in the sanity check (-1) unless the test says otherwise; no validation after it
        kwargs = {**dict(num_sanity_val_steps=-1, check_val_every_n_epoch=100), **trainer_kwargs}
        make_trainer(design, **kwargs).fit(module, train, loaders)
        return [run for run in module.runs if run.sanity]
    make_trainer(design, max_epochs=FIT_EPOCHS, **trainer_kwargs).fit(module, train, loaders)
    return [run for run in module.runs if not run.sanity]


def expected_runs(stage: str) -> int:
    return FIT_EPOCHS if stage == "fit" else 1


def triples(loader, dataloader_idx: int = 0) -> list[tuple]:
    return [(batch, index, dataloader_idx) for index, batch in enumerate(loader_sequence(loader))]


def only_runs(runs: list[EvalRun], stage: str) -> list[EvalRun]:
    assert len(runs) == expected_runs(stage), (
        f"{stage}: {len(runs)} evaluation runs recorded, expected {expected_runs(stage)}"
    )
    return runs
