"""C17 Steps with work in flight: a step that holds batches across step calls trains every batch exactly once.

The two pipelining patterns real code uses (``AsyncHandleModule``: Lightning's own tests of the flavour;
``TrainPipelineModule``: TorchRec's train pipelines) pull batch i+1 before training batch i, so after the call that
takes the epoch's last batch they still hold one. The loop makes *drain calls* (``done`` True on entry, ``next()``
raising StopIteration) until the step ends them by raising StopIteration or by a call that did no work (returned
nothing and stepped no optimizer). A simple step is entered at most once more, at whose first ``next()`` the epoch
ends: it needs no guard.
"""

from __future__ import annotations

import csv
import re
import warnings
from pathlib import Path

import pytest
import torch
from pytorch_lightning.callbacks import BasePredictionWriter, TQDMProgressBar
from pytorch_lightning.loggers import CSVLogger

from tests.conformance.harness import (
    BATCH_SIZE,
    LOADER_CASES,
    LR,
    IterStepModule,
    RegularStepModule,
    ids,
    loader_sequence,
    make_loader,
    make_trainer,
    reference_weights,
    stock_trainer,
)
from tests.conformance.pipelining import AsyncHandleModule, PipeliningModule, TrainPipelineModule

pytestmark = [pytest.mark.clause("C17"), pytest.mark.timeout(120)]

N_ITEMS = 10  # 5 batches per epoch
PIPELINES = [pytest.param(AsyncHandleModule, id="async-handle"), pytest.param(TrainPipelineModule, id="train-pipeline")]
OPTIMISATION = [pytest.param(True, id="automatic"), pytest.param(False, id="manual")]


def assert_weights_of_a_plain_loop(module, trained_batches) -> None:
    """Final weights equal a plain PyTorch loop taking one SGD step per trained batch, in the same order."""
    expected = reference_weights(module, [[batch] for batch in trained_batches], complete=[True] * len(trained_batches))
    for name, value in module.layer.state_dict().items():
        torch.testing.assert_close(value, expected[name])


@pytest.mark.parametrize("automatic", OPTIMISATION)
@pytest.mark.parametrize("kind,workers", LOADER_CASES)
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_pipelining_step_trains_every_batch_once_per_epoch(design, pipeline, kind, workers, automatic):
    module = pipeline(automatic=automatic)
    make_trainer(design, max_epochs=2).fit(module, make_loader(kind, n_items=N_ITEMS, num_workers=workers))
    sequence = loader_sequence(make_loader(kind, n_items=N_ITEMS, num_workers=workers))
    assert module.trained == [sequence, sequence], (
        f"batches trained per epoch {module.trained}; each epoch must train {sequence} (a missing last batch was"
        " still held by the step when the epoch ended)"
    )
    assert_weights_of_a_plain_loop(module, sequence + sequence)


@pytest.mark.parametrize("automatic", OPTIMISATION)
@pytest.mark.parametrize("kind,workers", LOADER_CASES)
def test_simple_step_needs_no_guard_and_loses_nothing(design, kind, workers, automatic):
    module = IterStepModule((1,), automatic=automatic)
    make_trainer(design, max_epochs=2).fit(module, make_loader(kind, n_items=N_ITEMS, num_workers=workers))
    sequence = loader_sequence(make_loader(kind, n_items=N_ITEMS, num_workers=workers))
    assert [[batch for batch, _ in epoch] for epoch in module.record.received_in_epochs()] == [sequence, sequence]
    entered_blind = [call for call, step in enumerate(module.record.steps) if not step]
    assert not entered_blind, (
        f"step calls {entered_blind} were entered with `done` False and found no batch: a step without an"
        " end-of-data guard cannot tell them from a call that has batches"
    )
    assert module.record.drain_calls == 0, (
        f"{module.record.drain_calls} drain calls in 2 epochs: a step that takes one batch in every call holds none,"
        " so C17's rule makes none"
    )
    assert_weights_of_a_plain_loop(module, sequence + sequence)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_held_batch_is_trained_before_the_epoch_end_validation(design, pipeline):
    class Observed(pipeline):
        def on_validation_start(self) -> None:
            super().on_validation_start()
            self.record.validations[-1] = (self.current_epoch, len(self.trained[-1]))

    module = Observed()
    make_trainer(design, max_epochs=1).fit(module, make_loader("sized", n_items=N_ITEMS), make_loader("sized", 4))
    assert module.record.validations == [(0, N_ITEMS // 2)], (
        "(epoch, batches trained) when the epoch-end validation started: the epoch's training was not over"
    )


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("pipeline", PIPELINES)
def test_held_batch_is_trained_at_a_limit(design, pipeline, kind):
    module = pipeline()
    make_trainer(design, max_epochs=2, limit_train_batches=3).fit(module, make_loader(kind, n_items=N_ITEMS))
    first_three = loader_sequence(make_loader(kind, n_items=N_ITEMS))[:3]
    assert module.trained == [first_three, first_three]


class NeverLetsGo(PipeliningModule):
    """A step that pulls ahead (its first call takes two batches, so the loop drains it) and, once the data ended,
    keeps training its last batch again: every drain call returns a loss."""

    def training_step(self, dataloader_iter):
        for _ in range(1 if self.step_calls else 2):
            if not dataloader_iter.done:
                batch, _, _ = next(dataloader_iter)
                self.last = self.receive(batch)
        return self.train_one(self.last)


def test_drain_that_never_ends_is_an_error_naming_the_fix(design):
    with pytest.raises(Exception) as caught:
        make_trainer(design, max_epochs=1).fit(NeverLetsGo(), make_loader("sized", n_items=N_ITEMS))
    message = str(caught.value)
    assert "StopIteration" in message and "dataloader_iter" in message, message


class TrainsWithItsOwnOptimizer(AsyncHandleModule):
    """The async-handle step under manual optimisation, training with an optimizer it made itself (not one
    ``configure_optimizers`` returned) and returning None: its drain call trains the held batch, yet looks idle."""

    def __init__(self) -> None:
        super().__init__(automatic=False)
        self.own_optimizer = torch.optim.SGD(self.layer.parameters(), lr=LR)

    def train_one(self, batch):
        self.trained[-1].append(ids(batch))
        self.own_optimizer.zero_grad()
        self.manual_backward(self.loss_of([batch]))
        self.own_optimizer.step()


def test_drain_call_that_trains_unseen_is_reported(design):
    unseen = "stepped an optimizer that `configure_optimizers` did not return"
    with pytest.warns(UserWarning, match=re.escape(unseen)) as warned:
        make_trainer(design, max_epochs=1).fit(TrainsWithItsOwnOptimizer(), make_loader("sized", n_items=N_ITEMS))
    reported = [str(w.message) for w in warned if unseen in str(w.message)]
    assert len(reported) == 1 and "configure_optimizers" in reported[0], f"one warning naming the fix: {reported}"


class BarCounts(TQDMProgressBar):
    """Lightning's progress bar, noting its count after each batch-end hook and at each epoch end."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: list = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self.counts.append(self.train_progress_bar.n)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        self.counts.append(("epoch end", self.train_progress_bar.n))


def logged_step_rows(log_dir) -> list[tuple[int, int, float]]:
    """(step, epoch, value) of every row the CSV logger wrote for the step-level metric, in order."""
    (metrics_file,) = Path(log_dir).glob("**/metrics.csv")
    with metrics_file.open() as rows:
        return [
            (int(row["step"]), int(row["epoch"]), float(row["step_ids_sum_step"]))
            for row in csv.DictReader(rows) if row.get("step_ids_sum_step")
        ]


# (the step, the progress bar's count after each of an epoch's step calls with a batch): a pipelining step's first call
# pulls two batches. The steps pass batch_size= (what C10 lets them omit): this is about what reaches the logger.
LOGGED = dict(log_metrics=True, log_batch_size=2)
STEPS_WITH_DRAIN_CALLS = [
    pytest.param(lambda automatic: IterStepModule((1,), automatic=automatic, **LOGGED), [1, 2, 3, 4, 5], id="simple"),
    pytest.param(lambda automatic: AsyncHandleModule(automatic=automatic, **LOGGED), [2, 3, 4, 5], id="async-handle"),
    pytest.param(lambda automatic: TrainPipelineModule(automatic=automatic, **LOGGED), [2, 3, 4, 5],
                 id="train-pipeline"),
]


@pytest.mark.parametrize("every_n_steps", [1, 2])
@pytest.mark.parametrize("automatic", OPTIMISATION)
@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("make_module,bar_per_epoch", STEPS_WITH_DRAIN_CALLS)
def test_drain_calls_log_and_count_as_the_regular_flavour(
    design, make_module, bar_per_epoch, kind, automatic, every_n_steps, tmp_path
):
    # Each of these steps trains one batch per optimizer step (the pipelining ones one call late, the last in a
    # drain call), so a CSVLogger must hold the regular flavour's rows: one per logged optimizer step, the value of
    # the batch trained at it. A drain call that trains nothing writes no row; one that trains its held batch
    # writes it at its own step. The progress bar counts batches consumed and moves only in batch-end hooks.
    module, bar = make_module(automatic), BarCounts()
    trainer = make_trainer(
        design, max_epochs=2, logger=CSVLogger(tmp_path / "flavour"), log_every_n_steps=every_n_steps,
        enable_progress_bar=True, callbacks=[bar],
    )
    trainer.fit(module, make_loader(kind, n_items=N_ITEMS))
    regular = RegularStepModule(automatic=automatic, log_metrics=True)
    stock = stock_trainer(max_epochs=2, logger=CSVLogger(tmp_path / "regular"), log_every_n_steps=every_n_steps)
    stock.fit(regular, make_loader(kind, n_items=N_ITEMS))
    rows, regular_rows = logged_step_rows(tmp_path / "flavour"), logged_step_rows(tmp_path / "regular")
    assert rows == regular_rows, (
        f"(step, epoch, value) rows of the CSV logger:\n  got:     {rows}\n  regular: {regular_rows}"
    )
    assert trainer.global_step == stock.global_step == module.optimizer_steps_taken()
    expected_bar = [*bar_per_epoch, ("epoch end", N_ITEMS // 2)] * 2
    assert bar.counts == expected_bar, (
        f"the progress bar's count after each batch-end hook and at each epoch end:\n  got:      {bar.counts}\n"
        f"  expected: {expected_bar}"
    )


class HoldsOneBatch(IterStepModule):
    """An evaluation step that holds one batch across calls: each call pulls the next batch and works on the one
    pulled before (``swap``); with nothing held at a dataloader's end, its ``next()`` ends the draining."""

    def __init__(self) -> None:
        super().__init__((1,))
        self.held: tuple | None = None
        self.drain_dataloader_iter = True  # the opt-in to drain calls (C17)

    def swap(self, dataloader_iter) -> tuple:
        """The batch pulled before, and its dataloader's index; the one pulled now is held."""
        if self.held is None:
            self.held = next(dataloader_iter)
        try:
            following = next(dataloader_iter)
        except StopIteration:
            following = None
        batch, _, dataloader_idx = self.held
        self.held = following
        return batch, dataloader_idx


class PipeliningValidation(HoldsOneBatch):
    """Evaluates the batch it held, returning an output."""

    def __init__(self) -> None:
        super().__init__()
        self.validated: list[tuple[tuple[int, ...], int]] = []  # (ids, dataloader_idx) in the order evaluated

    def validation_step(self, dataloader_iter):
        batch, dataloader_idx = self.swap(dataloader_iter)
        self.validated.append((ids(batch), dataloader_idx))
        return torch.zeros(())


@pytest.mark.parametrize("kind", ["sized", "unsized"])
def test_pipelining_validation_step_evaluates_every_batch_of_each_dataloader(design, kind):
    # two dataloaders: the batch held at the end of the first is evaluated before the step sees the second
    module = PipeliningValidation()
    loaders = [make_loader(kind, n_items=8), make_loader(kind, n_items=6)]
    make_trainer(design).validate(module, loaders, verbose=False)
    expected = [(batch, idx) for idx, loader in enumerate(loaders) for batch in loader_sequence(loader)]
    assert module.validated == expected, (
        f"(ids, dataloader_idx) evaluated {module.validated}; expected every batch of each dataloader once, in order:"
        f" {expected} (the batch a step holds at a dataloader's end is evaluated in a drain call)"
    )


class PipeliningPrediction(HoldsOneBatch):
    """Returns the prediction of the batch it held: its ids and dataloader."""

    def predict_step(self, dataloader_iter):
        batch, dataloader_idx = self.swap(dataloader_iter)
        return ids(batch), dataloader_idx


class KeptWrites(BasePredictionWriter):
    """Keeps the predictions a writer is given, per ``write_on_batch_end`` and at ``write_on_epoch_end``. Its
    ``setup`` skips Lightning's guard against the flavour (C18)."""

    def __init__(self) -> None:
        super().__init__("batch_and_epoch")
        self.batch_writes: list = []
        self.epoch_writes: list = []

    def setup(self, trainer, pl_module, stage) -> None:
        pass

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batch_writes.append(prediction)

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch_writes = predictions


# Expected: a design that gives the writer the sample indices asks the loader for them, and an iterable dataset has
# no sampler to tell them; stock's regular flavour warns the same with a writer (the flavour never asks).
@pytest.mark.filterwarnings("ignore:Couldn't infer the batch indices fetched from your dataloader:UserWarning")
@pytest.mark.parametrize("kind", ["sized", "unsized"])
def test_pipelining_predict_step_returns_every_batchs_prediction_in_order(design, kind):
    # two dataloaders: the batch held at the end of each is predicted in a drain call, before the next dataloader
    loaders = [make_loader(kind, n_items=8), make_loader(kind, n_items=6)]
    writer = KeptWrites()
    results = make_trainer(design, callbacks=[writer]).predict(PipeliningPrediction(), loaders)
    expected = [[(batch, idx) for batch in loader_sequence(loader)] for idx, loader in enumerate(loaders)]
    assert results == expected, f"trainer.predict returned {results}; expected every batch's prediction in order"
    assert writer.batch_writes == [p for per_loader in expected for p in per_loader], "the writer's batch writes"
    assert writer.epoch_writes == expected, "the writer's epoch write"


# ----------------------------------------------------------------------------------- without the opt-in: stock's calls
class HoldsWithoutAsking(AsyncHandleModule):
    """The async-handle step without the opt-in to drain calls: it holds a batch when the data ends."""

    def __init__(self) -> None:
        super().__init__()
        self.drain_dataloader_iter = False
        self.entered_after_the_end = 0

    def on_train_epoch_start(self) -> None:
        super().on_train_epoch_start()
        self.handle = None  # what the last epoch left held is dropped, so that each epoch shows its own loss

    def training_step(self, dataloader_iter):
        self.entered_after_the_end += dataloader_iter.done  # a drain call finds the data ended on entry
        return super().training_step(dataloader_iter)


@pytest.mark.parametrize("kind", ["sized", "unsized"])
def test_without_the_opt_in_a_holding_step_gets_no_drain_call_and_a_warning(design, kind):
    module = HoldsWithoutAsking()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(design, max_epochs=2).fit(module, make_loader(kind, n_items=N_ITEMS))
    sequence = loader_sequence(make_loader(kind, n_items=N_ITEMS))
    assert module.entered_after_the_end == 0, (
        f"the step was called {module.entered_after_the_end} times after the end of its data, which it did not ask for"
    )
    assert module.trained == [sequence[:-1], sequence[:-1]], f"batches trained per epoch {module.trained}"
    named = [str(w.message) for w in caught if "drain_dataloader_iter" in str(w.message)]
    assert len(named) == 1, f"warnings naming the opt-in, expected one per fit: {named}"


class TakesKInValidation(IterStepModule):
    """A validation step taking ``k`` batches in every call, with no end-of-data guard."""

    def __init__(self, k: int) -> None:
        super().__init__((k,))
        self.k, self.validation_calls = k, 0

    def validation_step(self, dataloader_iter):
        self.validation_calls += 1
        for _ in range(self.k):
            next(dataloader_iter)


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("k", [2, 3])
def test_validation_step_taking_k_batches_over_k_batches_is_called_once(design, k, kind):
    module = TakesKInValidation(k)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_trainer(design).validate(module, make_loader(kind, n_items=k * BATCH_SIZE), verbose=False)
    assert module.validation_calls == 1, f"{module.validation_calls} calls over {k} batches taken {k} per call"
    assert not [w for w in caught if "drain_dataloader_iter" in str(w.message)], "a step holding nothing was warned"
