# Copyright The Lightning AI team.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


class RandomIterableDataset(IterableDataset):
    def __init__(self, size, length):
        self.data = torch.randn(length, size)

    def __iter__(self):
        return iter(self.data)


def _loader(batches, sized=True):
    dataset = RandomDataset(32, 2 * batches) if sized else RandomIterableDataset(32, 2 * batches)
    return DataLoader(dataset, batch_size=2)


class RecordsTheCalls(TwoBatchesPerStep):
    def __init__(self):
        super().__init__()
        self.transferred = 0
        self.batch_start_indices = []

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.transferred += 1
        return batch

    def on_train_batch_start(self, batch, batch_idx):
        self.batch_start_indices.append(batch_idx)


@pytest.mark.parametrize("sized", [True, False])
def test_progress_counts_the_batches_the_step_took(tmp_path, sized):
    """Progress, and so the progress bar, counts batches, not step calls (#18498); the hooks get the call's first
    batch."""
    model = RecordsTheCalls()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, _loader(8, sized))

    assert model.consumed == list(range(8))
    assert trainer.global_step == 4
    total = trainer.fit_loop.epoch_loop.batch_progress.total
    assert total.ready == total.started == total.processed == total.completed == 8
    assert model.batch_start_indices == [0, 2, 4, 6]


def test_batches_pass_the_transfer_hooks(tmp_path):
    model = RecordsTheCalls()
    quiet_trainer(tmp_path).fit(model, _loader(4))
    assert model.transferred == 4


def test_limit_train_batches_counts_batches(tmp_path):
    """`limit_train_batches=1` hands out one batch (#18334)."""

    class TakesThree(BoringModel):
        def __init__(self):
            super().__init__()
            self.taken = 0

        def training_step(self, dataloader_iter):
            for _ in range(3):
                if not dataloader_iter.has_batches(1):
                    return None
                batch, _, _ = next(dataloader_iter)
                self.taken += 1
            return self.step(batch)

    model = TakesThree()
    quiet_trainer(tmp_path, limit_train_batches=1).fit(model, _loader(6))
    assert model.taken == 1


@pytest.mark.parametrize("sized", [True, False])
def test_done_and_has_batches_are_known_before_the_step_takes_a_batch(tmp_path, sized):
    class RecordsTheEnd(BoringModel):
        def __init__(self):
            super().__init__()
            self.done_before, self.has_two_before, self.done_after = [], [], []

        def training_step(self, dataloader_iter):
            self.done_before.append(dataloader_iter.done)
            self.has_two_before.append(dataloader_iter.has_batches(2))
            batch, _, _ = next(dataloader_iter)
            self.done_after.append(dataloader_iter.done)
            return self.step(batch)

    model = RecordsTheEnd()
    quiet_trainer(tmp_path).fit(model, _loader(3, sized))

    assert model.done_before == [False, False, False]
    assert model.has_two_before == [True, True, False]
    assert model.done_after == [False, False, True]


def test_val_check_interval_counts_batches(tmp_path):
    """With two batches per call and `val_check_interval=3`, validation runs at the first call boundary past each
    multiple of 3 batches."""

    class RecordsValidations(TwoBatchesPerStep):
        def __init__(self):
            super().__init__()
            self.validated_after = []

        def on_validation_start(self):
            self.validated_after.append(len(self.consumed))

    model = RecordsValidations()
    trainer = quiet_trainer(tmp_path, val_check_interval=3, limit_val_batches=1, num_sanity_val_steps=0)
    trainer.fit(model, _loader(12), _loader(1))
    assert model.validated_after == [4, 6, 10, 12]


@pytest.mark.parametrize(("accumulate_grad_batches", "expected"), [(2, [4, 6]), (4, [6])])
def test_accumulation_counts_step_calls(tmp_path, accumulate_grad_batches, expected):
    """`accumulate_grad_batches` counts step calls, and the epoch's last call closes its window."""

    class RecordsOptimizerSteps(TwoBatchesPerStep):
        def __init__(self):
            super().__init__()
            self.consumed_at_optimizer_step = []

        def on_before_optimizer_step(self, optimizer):
            self.consumed_at_optimizer_step.append(len(self.consumed))

    model = RecordsOptimizerSteps()
    trainer = quiet_trainer(tmp_path, accumulate_grad_batches=accumulate_grad_batches)
    trainer.fit(model, _loader(6))

    assert model.consumed_at_optimizer_step == expected
    assert trainer.global_step == len(expected)


@pytest.mark.parametrize("automatic_optimization", [True, False])
def test_a_call_cut_short_by_the_end_of_the_data_warns_and_trains_none_of_its_batches(tmp_path, automatic_optimization):
    class ThreeBatchesPerStep(BoringModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = automatic_optimization

        def training_step(self, dataloader_iter):
            losses = []
            for _ in range(3):
                loss = self.step(next(dataloader_iter)[0])
                if not automatic_optimization:
                    self.manual_backward(loss)  # as a pipeline schedule runs each micro-batch's backward
                losses.append(loss)
            if not automatic_optimization:
                self.optimizers().step()
                self.optimizers().zero_grad()
            return torch.stack(losses).mean()

    from lightning.pytorch.utilities.warnings import CutShortCallWarning

    model = ThreeBatchesPerStep()
    trainer = quiet_trainer(tmp_path)
    # 8 batches: two whole calls, then one the data cuts short after two batches
    with pytest.warns(CutShortCallWarning, match="ran out of data after 2 of its batches"):
        trainer.fit(model, _loader(8))

    assert trainer.global_step == 2
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == 8
    if not automatic_optimization:
        # the backward the call ran on its two batches is discarded
        assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_a_step_declining_the_batches_left_ends_the_data(tmp_path):
    class TakesThreeOrNone(BoringModel):
        calls = 0

        def training_step(self, dataloader_iter):
            self.calls += 1
            if not dataloader_iter.has_batches(3):
                return None
            losses = [self.step(next(dataloader_iter)[0]) for _ in range(3)]
            return torch.stack(losses).mean()

    model = TakesThreeOrNone()
    trainer = quiet_trainer(tmp_path)
    with pytest.warns(UserWarning, match=r"the 2 batch\(es\) left are not trained"):
        trainer.fit(model, _loader(8))
    assert model.calls == 3
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == 6


def test_self_log_needs_no_batch_size(tmp_path):
    class LogsWithoutBatchSize(TwoBatchesPerStep):
        def training_step(self, dataloader_iter):
            loss = super().training_step(dataloader_iter)
            self.log("samples", 4.0, on_step=False, on_epoch=True, reduce_fx="sum")
            return loss

    trainer = quiet_trainer(tmp_path)
    trainer.fit(LogsWithoutBatchSize(), _loader(4))
    assert trainer.callback_metrics["samples"] == 8
