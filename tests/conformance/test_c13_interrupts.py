"""C13 Interrupts and early stops: Ctrl-C takes Lightning's interrupt path; every way of stopping early leaves
nothing running and loses no counted batch (batch progress equals the batches the step consumed).
"""

from __future__ import annotations

import signal

import pytest
from pytorch_lightning.callbacks import Callback, EarlyStopping
from torch.utils.data import DataLoader

from tests.conformance.harness import (
    BATCH_SIZE,
    FailingItems,
    IterStepModule,
    Running,
    assert_nothing_left,
    make_loader,
    make_trainer,
)

pytestmark = [pytest.mark.clause("C13"), pytest.mark.timeout(60)]


class SeenExceptions(Callback):
    def __init__(self) -> None:
        self.seen: list[BaseException] = []

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.seen.append(exception)


@pytest.fixture
def sigint_raises_keyboard_interrupt():
    """Ctrl-C raises KeyboardInterrupt for the test's duration, however pytest was started; restored afterwards.

    A process started in the background (``nohup``, ``&``) inherits SIGINT as ignored, so the signal the test
    raises would never arrive; and Lightning's interrupt path ignores SIGINT for the rest of the process ("user
    could press Ctrl+C many times").
    """
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, handler)


class SignalledStep(IterStepModule):
    """Sends itself a real SIGINT at step call ``at``, after that step consumed its batches."""

    def __init__(self, pattern, at: int) -> None:
        super().__init__(pattern)
        self.at = at

    def training_step(self, dataloader_iter):
        loss = super().training_step(dataloader_iter)
        if self.step_calls - 1 == self.at:
            signal.raise_signal(signal.SIGINT)
        return loss


@pytest.mark.parametrize("workers", [0, 2], ids=lambda w: f"w{w}")
def test_ctrl_c_takes_lightnings_interrupt_path(design, sigint_raises_keyboard_interrupt, workers):
    seen = SeenExceptions()
    trainer = make_trainer(design, callbacks=[seen])
    before = Running.now()
    with pytest.raises(SystemExit):  # Lightning's graceful shutdown ends in sys.exit(1)
        trainer.fit(SignalledStep((2,), at=1), make_loader("sized", n_items=16, num_workers=workers))
    assert trainer.interrupted
    assert [type(e) for e in seen.seen] == [KeyboardInterrupt]
    assert_nothing_left(before)


def test_keyboard_interrupt_while_loading_takes_the_interrupt_path(design, sigint_raises_keyboard_interrupt):
    # Raised where the batch is produced: for a prefetching design, in its background thread.
    seen = SeenExceptions()
    trainer = make_trainer(design, callbacks=[seen])
    before = Running.now()
    loader = DataLoader(FailingItems(16, 9, error=KeyboardInterrupt), batch_size=BATCH_SIZE)
    with pytest.raises(SystemExit):
        trainer.fit(IterStepModule((2,)), loader)
    assert trainer.interrupted
    assert [type(e) for e in seen.seen] == [KeyboardInterrupt]
    assert_nothing_left(before)


class StopWhenAsked(IterStepModule):
    def __init__(self, pattern, stop_after_call: int) -> None:
        super().__init__(pattern)
        self.stop_after_call = stop_after_call

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.step_calls == self.stop_after_call:
            self.trainer.should_stop = True


def _assert_clean_stop(module, trainer, before):
    assert_nothing_left(before)
    consumed = len(module.record.received_in_epochs()[-1])
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == consumed, "a counted batch was lost"


@pytest.mark.parametrize(
    "how",
    ["max_steps", "minus_one", "should_stop"],
)
@pytest.mark.parametrize("workers", [0, 2], ids=lambda w: f"w{w}")
def test_early_stop_leaves_nothing_running_and_loses_no_batch(design, how, workers):
    before = Running.now()
    if how == "max_steps":
        module, trainer = IterStepModule((2,)), make_trainer(design, max_steps=3)
    elif how == "minus_one":
        module, trainer = IterStepModule((2,), stop_epoch_at_step=3), make_trainer(design)
    else:
        module, trainer = StopWhenAsked((2,), stop_after_call=3), make_trainer(design)
    trainer.fit(module, make_loader("sized", n_items=20, num_workers=workers))
    assert len(module.record.received) == 6, "the run did not stop after three step calls of two batches"
    _assert_clean_stop(module, trainer, before)


def test_early_stopping_callback_stops_cleanly(design):
    class LogsAConstant(IterStepModule):
        def training_step(self, dataloader_iter):
            self.log("constant", 1.0, on_step=False, on_epoch=True, batch_size=1)  # never improves
            return super().training_step(dataloader_iter)

    before = Running.now()
    module = LogsAConstant((2,))
    stopper = EarlyStopping(monitor="constant", patience=0, check_on_train_epoch_end=True)
    trainer = make_trainer(design, max_epochs=5, callbacks=[stopper])
    trainer.fit(module, make_loader("sized", n_items=16))
    assert trainer.current_epoch == 2 and len(module.record.epoch_ends) == 2, "EarlyStopping did not stop at epoch 2"
    _assert_clean_stop(module, trainer, before)
