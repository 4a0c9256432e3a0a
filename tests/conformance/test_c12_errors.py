"""C12 Errors surface: a dataset error reaches the caller of ``fit`` with its type, leaves nothing running,
and the same module and Trainer can run again.

The error is raised by item ``k`` of the dataset: in the main process (``num_workers=0``, which for a prefetching
design means its background thread) and in a DataLoader worker (``num_workers=2``).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch.utils.data._utils
from torch.utils.data import DataLoader

from tests.conformance.harness import (
    BATCH_SIZE,
    DatasetBroke,
    FailingItems,
    IterStepModule,
    Running,
    SlowItems,
    assert_nothing_left,
    loader_sequence,
    make_loader,
    make_trainer,
)

pytestmark = [pytest.mark.clause("C12"), pytest.mark.timeout(60)]

WORKERS = [pytest.param(0, id="main-process"), pytest.param(2, id="worker")]


@pytest.fixture(autouse=True)
def fast_worker_shutdown(monkeypatch):
    # After a worker raised, torch's DataLoader shutdown waits out its status-check interval (5 s) once per worker
    # before terminating it, for any caller (stock Lightning and a plain loop alike). A shorter interval keeps the
    # suite fast without changing what is checked: the workers must still be gone afterwards.
    monkeypatch.setattr(torch.utils.data._utils, "MP_STATUS_CHECK_INTERVAL", 0.2)


def failing_loader(fail_at: int, workers: int) -> DataLoader:
    return DataLoader(FailingItems(16, fail_at), batch_size=BATCH_SIZE, num_workers=workers)


@pytest.mark.parametrize("workers", WORKERS)
@pytest.mark.parametrize("fail_at", [0, 7], ids=lambda k: f"item{k}")
def test_dataset_error_reaches_fit_with_its_type(design, workers, fail_at):
    module = IterStepModule((2,))
    with pytest.raises(DatasetBroke, match=f"item {fail_at} cannot be loaded"):
        make_trainer(design).fit(module, failing_loader(fail_at, workers))
    # nothing from the failing batch or later may have been handed to the step
    assert all(fail_at not in batch for batch in module.record.received)


@pytest.mark.parametrize("workers", WORKERS)
def test_dataset_error_leaves_no_thread_or_worker_running(design, workers):
    before = Running.now()
    with pytest.raises(DatasetBroke):
        make_trainer(design).fit(IterStepModule((2,)), failing_loader(9, workers))
    assert_nothing_left(before)


def test_same_module_and_trainer_run_again_after_an_error(design):
    module = IterStepModule((2,))
    trainer = make_trainer(design, max_epochs=1)
    with pytest.raises(DatasetBroke):
        trainer.fit(module, failing_loader(9, 0))
    module.record.events.clear()
    trainer.fit(module, make_loader("sized", n_items=16))
    received = [batch for epoch in module.record.received_in_epochs() for batch, _ in epoch]
    assert received == loader_sequence(make_loader("sized", n_items=16))


def test_error_in_the_step_leaves_no_thread_running(design):
    class BrokenStep(IterStepModule):
        def training_step(self, dataloader_iter):
            if self.step_calls == 2:
                raise ZeroDivisionError("the user's step failed")
            return super().training_step(dataloader_iter)

    before = Running.now()
    with pytest.raises(ZeroDivisionError, match="the user's step failed"):
        make_trainer(design).fit(BrokenStep((1,)), make_loader("sized", n_items=16, num_workers=2))
    assert_nothing_left(before)


class FailsInItsSecondCall(IterStepModule):
    """Every step (training and evaluation) takes one batch; the second step call raises."""

    def _step(self, dataloader_iter):
        self.step_calls += 1
        if self.step_calls == 2:
            raise ZeroDivisionError("the user's step failed")
        next(dataloader_iter)

    training_step = validation_step = test_step = predict_step = _step


@pytest.mark.parametrize("entry", ["fit", "validate", "test", "predict"])
@pytest.mark.filterwarnings("ignore:predict returned None")  # on purpose: the step's first call returns nothing
def test_error_in_the_step_while_loading_leaves_no_thread_running(design, entry):
    # From item 4 on each item takes 0.5 s: when the second step call raises, a design loading ahead is inside the
    # loader's next(). Its thread must have been stopped and joined by the time the run returns.
    loader = DataLoader(SlowItems(16, slow_from=4, delay_s=0.5), batch_size=BATCH_SIZE)
    trainer = make_trainer(design)
    run = {"fit": trainer.fit, "predict": trainer.predict}.get(entry) or partial(getattr(trainer, entry), verbose=False)
    before = Running.now()
    with pytest.raises(ZeroDivisionError, match="the user's step failed"):
        run(FailsInItsSecondCall(), loader)
    assert_nothing_left(before)
