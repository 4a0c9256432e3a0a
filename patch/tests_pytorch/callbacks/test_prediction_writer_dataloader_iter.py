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

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset


class RecordsWrites(BasePredictionWriter):
    def __init__(self):
        super().__init__(write_interval="batch")
        self.batch_indices = []

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batch_indices.append(batch_indices)


def test_a_prediction_writer_gets_the_indices_of_every_batch_a_call_consumed(tmp_path):
    class TwoBatchesPerCall(BoringModel):
        def predict_step(self, dataloader_iter):
            outputs = []
            for _ in range(2):
                batch, _, _ = next(dataloader_iter)
                outputs.append(self(batch))
            return outputs

    writer = RecordsWrites()
    trainer = Trainer(default_root_dir=tmp_path, callbacks=[writer], logger=False, enable_progress_bar=False)
    trainer.predict(TwoBatchesPerCall(), DataLoader(RandomDataset(32, 8), batch_size=2), return_predictions=False)

    assert writer.batch_indices == [[0, 1, 2, 3], [4, 5, 6, 7]]
