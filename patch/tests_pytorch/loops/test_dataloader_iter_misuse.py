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


def _fit(tmp_path, model, batches=4):
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, DataLoader(RandomDataset(32, 2 * batches), batch_size=2))
    return trainer


def test_a_step_taking_a_batch_and_dataloader_iter_is_refused_naming_both_ways(tmp_path):
    class BatchAndIterator(BoringModel):
        def training_step(self, batch, dataloader_iter):
            return self.step(batch)

    both_ways = r"training_step\(self, batch, batch_idx\).*training_step\(self, dataloader_iter\)"
    with pytest.raises(TypeError, match=both_ways):
        _fit(tmp_path, BatchAndIterator())


def test_a_stop_iteration_the_step_raises_itself_is_an_error(tmp_path):
    class RaisesItsOwn(BoringModel):
        def training_step(self, dataloader_iter):
            batch, batch_idx, _ = next(dataloader_iter)
            if batch_idx == 1:
                next(iter([]))
            return self.step(batch)

    with pytest.raises(RuntimeError, match="raised StopIteration although dataloader_iter still has batches"):
        _fit(tmp_path, RaisesItsOwn())
