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
from torch.utils.data import DataLoader

from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.utilities.warnings import CutShortCallWarning
from tests_pytorch.helpers.dataloader_iter import quiet_trainer


def test_a_call_cut_short_by_the_end_of_the_data_warns_and_steps_no_optimizer(tmp_path):
    class ThreeBatchesPerStep(BoringModel):
        def training_step(self, dataloader_iter):
            losses = [self.step(next(dataloader_iter)[0]) for _ in range(3)]
            return torch.stack(losses).mean()

    trainer = quiet_trainer(tmp_path)
    with pytest.warns(CutShortCallWarning):
        trainer.fit(ThreeBatchesPerStep(), DataLoader(RandomDataset(32, 16), batch_size=2))

    # 8 batches: two whole calls, then one the data cut short after two batches
    assert trainer.global_step == 2
