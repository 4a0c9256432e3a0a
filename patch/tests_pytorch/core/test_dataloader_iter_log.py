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

from lightning.pytorch.demos.boring_classes import RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


def test_self_log_infers_the_batch_size_from_the_batches_the_step_consumed(tmp_path):
    class LogsWithoutBatchSize(TwoBatchesPerStep):
        def training_step(self, dataloader_iter):
            loss = super().training_step(dataloader_iter)
            self.log("samples", 4.0, on_step=False, on_epoch=True, reduce_fx="sum")
            return loss

    trainer = quiet_trainer(tmp_path)
    trainer.fit(LogsWithoutBatchSize(), DataLoader(RandomDataset(32, 8), batch_size=2))

    assert trainer.callback_metrics["samples"] == 8
