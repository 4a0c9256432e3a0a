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

from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from tests_pytorch.helpers.dataloader_iter import quiet_trainer


class PipeliningModel(BoringModel):
    """Takes batch ``i + 1`` before it trains batch ``i``, as a data pipeline overlapping its loading does."""

    def __init__(self):
        super().__init__()
        self.held = None
        self.trained = []

    def training_step(self, dataloader_iter):
        if self.held is None:
            self.held = next(dataloader_iter)
        batch, batch_idx, _ = self.held
        try:
            self.held = next(dataloader_iter)
        except StopIteration:
            self.held = None
        self.trained.append(batch_idx)
        return self.step(batch)


@pytest.mark.parametrize("max_epochs", [1, 2])
def test_a_pipelining_step_trains_the_batch_it_holds_at_the_end_of_the_data(tmp_path, max_epochs):
    model = PipeliningModel()
    trainer = quiet_trainer(tmp_path, max_epochs=max_epochs)
    trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))

    assert model.trained == [0, 1, 2, 3] * max_epochs
    assert trainer.global_step == 4 * max_epochs
