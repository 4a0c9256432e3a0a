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
import torch
from torch.utils.data import DataLoader

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset


def test_self_log_infers_the_batch_size_from_the_batches_the_step_consumed(tmp_path):
    class LogsWithoutBatchSize(BoringModel):
        def training_step(self, dataloader_iter):
            losses = []
            for _ in range(2):
                batch, _, _ = next(dataloader_iter)
                losses.append(self.step(batch))
            loss = torch.stack(losses).mean()
            self.log("consumed", float(len(batch)) * 2, on_step=False, on_epoch=True, reduce_fx="sum")
            return loss

    trainer = Trainer(
        default_root_dir=tmp_path,
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(LogsWithoutBatchSize(), DataLoader(RandomDataset(32, 8), batch_size=2))

    assert trainer.callback_metrics["consumed"] == 8
