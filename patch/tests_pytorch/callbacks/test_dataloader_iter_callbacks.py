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
from torch.utils.data import DataLoader

from lightning.pytorch.callbacks import BasePredictionWriter, ThroughputMonitor
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


def test_throughput_monitor_counts_every_batch_of_a_call(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=len)
    trainer = quiet_trainer(tmp_path, callbacks=[monitor])
    trainer.fit(TwoBatchesPerStep(), DataLoader(RandomDataset(32, 12), batch_size=2))

    assert monitor._batches["train"] == 6
    assert monitor._samples["train"] == 12


class KeepsWhatItIsGiven(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch_and_epoch")
        self.batch_indices = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batch_indices.append(batch_indices)

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch_batch_indices = batch_indices


@pytest.mark.parametrize("batches_per_call", [1, 2])
def test_prediction_writer_gets_the_indices_of_every_batch_of_a_call(tmp_path, batches_per_call):
    class PredictsSeveralBatches(BoringModel):
        def predict_step(self, dataloader_iter):
            return [next(dataloader_iter)[0].sum() for _ in range(batches_per_call)]

    writer = KeepsWhatItIsGiven()
    trainer = quiet_trainer(tmp_path, callbacks=[writer])
    trainer.predict(PredictsSeveralBatches(), DataLoader(RandomDataset(32, 8), batch_size=2))

    expected = [list(range(i, i + 2 * batches_per_call)) for i in range(0, 8, 2 * batches_per_call)]
    assert writer.batch_indices == expected
    assert writer.epoch_batch_indices == [expected]
