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
from torch.utils.data import DataLoader

from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


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


def test_batch_progress_counts_the_batches_the_step_consumed(tmp_path):
    model = RecordsTheCalls()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))

    assert model.consumed == [0, 1, 2, 3]
    assert trainer.global_step == 2
    total = trainer.fit_loop.epoch_loop.batch_progress.total
    assert total.ready == total.started == total.processed == total.completed == 4
    # the hook sees the batch each call gets first
    assert model.batch_start_indices == [0, 2]


def test_batches_pass_the_transfer_hooks(tmp_path):
    model = RecordsTheCalls()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))

    assert model.transferred == 4


def test_done_and_has_batches_are_exact_before_the_step_reads(tmp_path):
    class RecordsTheEnd(BoringModel):
        def __init__(self):
            super().__init__()
            self.done_before, self.has_two_before, self.done_after = [], [], []
            self.fetched_and_length = []

        def training_step(self, dataloader_iter):
            self.done_before.append(dataloader_iter.done)
            self.has_two_before.append(dataloader_iter.has_batches(2))
            batch, _, _ = next(dataloader_iter)
            self.done_after.append(dataloader_iter.done)
            self.fetched_and_length.append((dataloader_iter.fetched, dataloader_iter.length))
            return self.step(batch)

    model = RecordsTheEnd()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, DataLoader(RandomDataset(32, 6), batch_size=2))

    assert model.done_before == [False, False, False]
    assert model.has_two_before == [True, True, False]
    assert model.done_after == [False, False, True]
    # what the iterator told before: the batches handed out so far and the loader's length
    assert model.fetched_and_length == [(1, 3), (2, 3), (3, 3)]
