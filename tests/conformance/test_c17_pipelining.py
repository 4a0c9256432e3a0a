"""C17 Steps with work in flight: a step that holds batches across step calls trains every batch exactly once.

The two pipelining patterns real code uses (``AsyncHandleModule``: Lightning's own tests of the flavour;
``TrainPipelineModule``: TorchRec's train pipelines) pull batch i+1 before training batch i, so after the call that
takes the epoch's last batch they still hold one. The loop makes *drain calls* (``done`` True on entry, ``next()``
raising StopIteration) until the step ends them by raising StopIteration or by a call that did no work (returned
nothing and stepped no optimizer). A simple step is entered at most once more, at whose first ``next()`` the epoch ends: it needs no guard.
"""

from __future__ import annotations

import pytest
import torch

from tests.conformance.harness import (
    LOADER_CASES,
    IterStepModule,
    loader_sequence,
    make_loader,
    make_trainer,
    reference_weights,
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
    assert module.record.drain_calls <= 2, f"{module.record.drain_calls} drain calls in 2 epochs; at most one each"
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
    """A step that, once the data ended, keeps training its last batch again: every drain call returns a loss."""

    def training_step(self, dataloader_iter):
        if not dataloader_iter.done or not self.step_calls:
            batch, _, _ = next(dataloader_iter)
            self.last = self.receive(batch)
        return self.train_one(self.last)


def test_drain_that_never_ends_is_an_error_naming_the_fix(design):
    with pytest.raises(Exception) as caught:
        make_trainer(design, max_epochs=1).fit(NeverLetsGo(), make_loader("sized", n_items=N_ITEMS))
    message = str(caught.value)
    assert "StopIteration" in message and "dataloader_iter" in message, message
