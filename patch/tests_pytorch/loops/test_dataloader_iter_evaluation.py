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
from tests_pytorch.helpers.dataloader_iter import quiet_trainer


class ReadsItsDataloaderToTheEnd(BoringModel):
    def __init__(self):
        super().__init__()
        self.calls = []
        self.transferred = 0

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.transferred += 1
        return batch

    def validation_step(self, dataloader_iter):
        self.calls.append([(batch_idx, dataloader_idx) for _, batch_idx, dataloader_idx in dataloader_iter])


def test_each_evaluation_dataloader_gets_an_iterator_of_its_own(tmp_path):
    model = ReadsItsDataloaderToTheEnd()
    trainer = quiet_trainer(tmp_path, limit_val_batches=1.0)
    loaders = [DataLoader(RandomDataset(32, 4), batch_size=2), DataLoader(RandomDataset(32, 6), batch_size=2)]
    trainer.validate(model, loaders, verbose=False)

    assert model.calls == [[(0, 0), (1, 0)], [(0, 1), (1, 1), (2, 1)]]
    assert trainer.validate_loop.batch_progress.total.completed == 5
    assert model.transferred == 5


def test_prediction_counts_the_batches_the_step_took(tmp_path):
    class PredictsTwoBatches(BoringModel):
        def predict_step(self, dataloader_iter):
            return [batch_idx for _, batch_idx, _ in (next(dataloader_iter), next(dataloader_iter))]

    trainer = quiet_trainer(tmp_path)
    predictions = trainer.predict(PredictsTwoBatches(), DataLoader(RandomDataset(32, 8), batch_size=2))

    assert predictions == [[0, 1], [2, 3]]
    assert trainer.predict_loop.batch_progress.total.completed == 4


def test_a_validation_call_that_runs_out_ends_its_dataloader_only(tmp_path):
    class TakesTwo(BoringModel):
        def __init__(self):
            super().__init__()
            self.taken = []

        def validation_step(self, dataloader_iter):
            for _ in range(2):
                self.taken.append(next(dataloader_iter)[1:])

    model = TakesTwo()
    loaders = [DataLoader(RandomDataset(32, 6), batch_size=2), DataLoader(RandomDataset(32, 4), batch_size=2)]
    trainer = quiet_trainer(tmp_path, limit_val_batches=1.0)
    trainer.validate(model, loaders, verbose=False)

    # the first dataloader's 3 batches: the second call takes one and runs out; the second dataloader goes on
    assert model.taken == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1)]
    assert trainer.validate_loop.batch_progress.total.completed == 5


def test_a_prediction_call_that_runs_out_ends_its_dataloader(tmp_path):
    class PredictsTwo(BoringModel):
        def predict_step(self, dataloader_iter):
            return [next(dataloader_iter)[1] for _ in range(2)]

    trainer = quiet_trainer(tmp_path)
    predictions = trainer.predict(PredictsTwo(), DataLoader(RandomDataset(32, 6), batch_size=2))

    assert predictions == [[0, 1], None]
    assert trainer.predict_loop.batch_progress.total.completed == 3
