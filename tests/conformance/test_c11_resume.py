"""C11 Exactly-once resume: after a crash, resuming from the last checkpoint delivers exactly the unconsumed batches.

A run with torchdata's ``StatefulDataLoader`` and ``ModelCheckpoint(every_n_train_steps=k)`` crashes (an exception
from the step, before it consumes anything) at step call ``crash_at``; a fresh Trainer and module then resume with
``fit(..., ckpt_path=last.ckpt)``. The checkpoint was written after step call ``j = k * (crash_at // k)``, so the
resumed run must receive the loader's sequence from the first batch not consumed by then, with that batch's index,
and end with the same ``global_step`` and batch progress as an uninterrupted run.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from pytorch_lightning.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.conformance.harness import (
    BATCH_SIZE,
    Crash,
    CrashingModule,
    SizedItems,
    make_trainer,
    reference_weights,
    split_by_pattern,
)
from tests.conformance.pipelining import AsyncHandleModule, Handle

pytestmark = [
    pytest.mark.clause("C11"),
    # On purpose: the resumed run checkpoints into the directory it resumes from, and torchdata's StatefulDataLoader
    # calls its own deprecated API; neither is what C11 checks.
    pytest.mark.filterwarnings("ignore:Checkpoint directory .* exists and is not empty"),
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]


def stateful_loader(n_items: int, workers: int = 0) -> StatefulDataLoader:
    return StatefulDataLoader(SizedItems(n_items), batch_size=BATCH_SIZE, num_workers=workers)


def crash_and_resume(design, tmp_path, *, pattern, interval, crash_at, n_items, epochs=1, workers=0, loader=None):
    loader = loader or (lambda: stateful_loader(n_items, workers))
    checkpoints = tmp_path / "checkpoints"

    def trainer():
        every = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=interval, save_last=True, save_top_k=-1)
        return make_trainer(design, max_epochs=epochs, enable_checkpointing=True, callbacks=[every])

    first = CrashingModule(pattern, crash_at=crash_at)
    with pytest.raises(Crash):
        trainer().fit(first, loader())
    saved_after = interval * (crash_at // interval)
    resumed = CrashingModule(pattern, first_call=saved_after)
    resumed_trainer = trainer()
    resumed_trainer.fit(resumed, loader(), ckpt_path=str(checkpoints / "last.ckpt"))
    return first, resumed, resumed_trainer, saved_after


def expected_after_resume(pattern, n_items, epochs, saved_after):
    """``[(ids, batch_idx), ...]`` still owed after the first ``saved_after`` step calls, and the final counters."""
    sequence = [tuple(range(i, min(i + BATCH_SIZE, n_items))) for i in range(0, n_items, BATCH_SIZE)]
    groups = split_by_pattern(list(enumerate(sequence)), pattern)
    steps = [group for _ in range(epochs) for group in groups]  # every step call of an uninterrupted run
    owed = [(batch, index) for group in steps[saved_after:] for index, batch in group]
    complete = sum(len(group) == pattern[k % len(pattern)] for k, group in enumerate(groups))
    return owed, complete * epochs, len(sequence)


def check_resumed(design, tmp_path, pattern, interval, crash_at, n_items, epochs=1, workers=0):
    _, resumed, trainer, saved_after = crash_and_resume(
        design, tmp_path, pattern=pattern, interval=interval, crash_at=crash_at, n_items=n_items, epochs=epochs,
        workers=workers,
    )
    owed, global_steps, batches_per_epoch = expected_after_resume(pattern, n_items, epochs, saved_after)
    received = [(batch, index) for epoch in resumed.record.received_in_epochs() for batch, index in epoch]
    assert received == owed, f"checkpoint after step call {saved_after}: resumed run received {received}, owed {owed}"
    assert trainer.global_step == global_steps
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == batches_per_epoch


PATTERNS = st.lists(st.integers(1, 3), min_size=1, max_size=4)


@given(pattern=PATTERNS, interval=st.integers(1, 3), crash_offset=st.integers(0, 8))
def test_resume_delivers_exactly_the_unconsumed_batches(design, tmp_path_factory, pattern, interval, crash_offset):
    n_items = 20  # 10 batches: at least 4 step calls per epoch, so a crash after the first checkpoint always fits
    steps_per_epoch = len(split_by_pattern(range(n_items // BATCH_SIZE), pattern))
    crash_at = min(interval + crash_offset, steps_per_epoch - 1)
    check_resumed(design, tmp_path_factory.mktemp("run"), pattern, interval, crash_at, n_items)


@pytest.mark.parametrize(
    "interval,crash_at",
    [
        pytest.param(2, 3, id="saved-at-epoch-end"),
        pytest.param(3, 4, id="saved-mid-epoch-1"),
        pytest.param(1, 5, id="saved-mid-epoch-2"),
    ],
)
def test_resume_across_the_epoch_boundary(design, tmp_path, interval, crash_at):
    # 8 items = 4 batches taken 2 per step: 2 step calls per epoch, 4 epochs.
    check_resumed(design, tmp_path, (2,), interval, crash_at, n_items=8, epochs=4)


def test_resume_with_loader_workers(design, tmp_path):
    check_resumed(design, tmp_path, (1, 2), 2, 5, n_items=20, workers=2)


def test_resume_with_a_loader_that_cannot_resume_warns(design, tmp_path):
    from torch.utils.data import DataLoader

    with pytest.warns(Warning, match="(?i)resum"):
        crash_and_resume(
            design, tmp_path, pattern=(2,), interval=2, crash_at=3, n_items=20,
            loader=lambda: DataLoader(SizedItems(20), batch_size=BATCH_SIZE),
        )


class HoldsAcrossCheckpoints(AsyncHandleModule):
    """The async-handle step (C17), crashing at step call ``crash_at``; with ``saves_held`` it saves the batch it holds
    in the checkpoint and restores it on resume (the module's own ``on_save_checkpoint`` / ``on_load_checkpoint``)."""

    def __init__(self, crash_at: int | None = None, saves_held: bool = True) -> None:
        super().__init__()
        self.crash_at, self.saves_held, self.calls = crash_at, saves_held, 0

    def training_step(self, dataloader_iter):
        if self.calls == self.crash_at:
            raise Crash(f"crash at step call {self.crash_at}")
        self.calls += 1
        return super().training_step(dataloader_iter)

    def on_save_checkpoint(self, checkpoint) -> None:
        if self.saves_held and self.handle is not None:
            checkpoint["held_batch"] = self.handle.wait()

    def on_load_checkpoint(self, checkpoint) -> None:
        if "held_batch" in checkpoint:
            self.handle = Handle(checkpoint["held_batch"])


@pytest.mark.parametrize("saves_held", [True, False], ids=["module-saves-held-batch", "module-saves-nothing"])
def test_resume_while_the_step_holds_a_batch(design, tmp_path, saves_held):
    # 10 batches, one trained per step call; checkpoints after optimizer steps 2 and 4. The checkpoint at step 4 is
    # written at the end of step call 3, which consumed batch 4 and holds it: the loader resumes at batch 5.
    n_items, checkpoints = 20, tmp_path / "checkpoints"

    def trainer():
        every = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=2, save_last=True, save_top_k=-1)
        return make_trainer(design, enable_checkpointing=True, callbacks=[every])

    with pytest.raises(Crash):
        trainer().fit(HoldsAcrossCheckpoints(crash_at=5, saves_held=saves_held), stateful_loader(n_items))
    resumed = HoldsAcrossCheckpoints(saves_held=saves_held)
    trainer().fit(resumed, stateful_loader(n_items), ckpt_path=str(checkpoints / "last.ckpt"))

    batches = [tuple(range(i, i + BATCH_SIZE)) for i in range(0, n_items, BATCH_SIZE)]
    trained_after_resume = [batch for epoch in resumed.trained for batch in epoch]
    if saves_held:  # exactly once: the checkpoint's weights hold batches 0-3, the resumed run trains 4-9
        assert trained_after_resume == batches[4:]
        expected = reference_weights(resumed, [[b] for b in batches], complete=[True] * len(batches))
        for name, value in resumed.layer.state_dict().items():
            torch.testing.assert_close(value, expected[name])
    else:  # the stated outcome: the loader resumes after the consumed batches, so the held batch 4 is lost
        assert trained_after_resume == batches[5:], (
            f"resumed run trained {trained_after_resume}: the specification says a held batch the module does not"
            " save is lost (and nothing else is)"
        )


# OnExceptionCheckpoint asks Lightning to resume from "last", which the first run, started fresh, has no checkpoint for
@pytest.mark.filterwarnings("ignore:.*fit\\(ckpt_path=None\\). was called without a model")
@pytest.mark.filterwarnings("ignore:.fit\\(ckpt_path=\"last\"\\) is set, but there is no last checkpoint")
def test_resume_from_the_on_exception_checkpoint_of_a_crash_in_an_epochs_first_call(design, tmp_path):
    # 16 items = 8 batches taken 2 per step call: 4 step calls per epoch, 2 epochs. The crash comes in the first step
    # call of epoch 2, before it consumes anything; Lightning's OnExceptionCheckpoint writes the checkpoint as it
    # unwinds, at the boundary between the epochs. Resumed from it, epoch 2 is trained once, as in an uninterrupted
    # run: its 8 batches from batch_idx 0, and 8 optimizer steps in all. (Where the designs that drain make a drain
    # call at the end of epoch 1, that call is the one that crashes: the checkpoint holds epoch 1 complete.)
    n_items, pattern, calls_per_epoch, epochs = 16, (2,), 4, 2
    checkpoints = tmp_path / "checkpoints"

    def trainer():
        on_exception = OnExceptionCheckpoint(dirpath=checkpoints)
        return make_trainer(design, max_epochs=epochs, enable_checkpointing=True, callbacks=[on_exception])

    with pytest.raises(Crash):
        trainer().fit(CrashingModule(pattern, crash_at=calls_per_epoch), stateful_loader(n_items))
    resumed, resumed_trainer = CrashingModule(pattern, first_call=calls_per_epoch), trainer()
    resumed_trainer.fit(resumed, stateful_loader(n_items), ckpt_path=str(checkpoints / "on_exception.ckpt"))

    owed, global_steps, _ = expected_after_resume(pattern, n_items, epochs, calls_per_epoch)
    received = [(batch, index) for epoch in resumed.record.received_in_epochs() for batch, index in epoch]
    assert received == owed, f"resumed run received {received}, owed {owed}"
    assert resumed_trainer.global_step == global_steps
