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
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tests_pytorch.helpers.dataloader_iter import quiet_trainer


def _fit(tmp_path, model, batches=4):
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, DataLoader(RandomDataset(32, 2 * batches), batch_size=2))
    return trainer


class BatchAndIterator(BoringModel):
    def training_step(self, batch, dataloader_iter):
        raise AssertionError("never called")


class IteratorAndBatchIndex(BoringModel):
    def training_step(self, dataloader_iter, batch_idx):
        raise AssertionError("never called")


@pytest.mark.parametrize(("model_class", "other"), [(BatchAndIterator, "batch"), (IteratorAndBatchIndex, "batch_idx")])
def test_a_step_taking_a_batch_and_dataloader_iter_is_refused(tmp_path, model_class, other):
    with pytest.raises(MisconfigurationException, match=f"takes `dataloader_iter` and also `{other}`"):
        _fit(tmp_path, model_class())


def test_a_stop_iteration_the_step_raises_itself_is_an_error(tmp_path):
    class RaisesItsOwn(BoringModel):
        def training_step(self, dataloader_iter):
            batch, batch_idx, _ = next(dataloader_iter)
            if batch_idx == 1:
                next(iter([]))
            return self.step(batch)

    with pytest.raises(RuntimeError, match="raised `StopIteration` while `dataloader_iter` had batches left"):
        _fit(tmp_path, RaisesItsOwn())


def test_the_iterator_of_an_ended_loop_cannot_be_used(tmp_path):
    class KeepsTheIterator(BoringModel):
        def training_step(self, dataloader_iter):
            self.kept = dataloader_iter
            return self.step(next(dataloader_iter)[0])

    model = KeepsTheIterator()
    _fit(tmp_path, model)
    with pytest.raises(RuntimeError, match="after the loop over its dataloader ended"):
        next(model.kept)


def test_a_step_that_never_takes_a_batch_is_an_error(tmp_path):
    class TakesNothing(BoringModel):
        def training_step(self, dataloader_iter):
            return None

    with pytest.raises(RuntimeError, match="took no batch in 100 calls in a row"):
        _fit(tmp_path, TakesNothing())
