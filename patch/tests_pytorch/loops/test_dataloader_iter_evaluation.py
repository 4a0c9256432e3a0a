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
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset


class ReadsItsDataloaderToTheEnd(BoringModel):
    def __init__(self):
        super().__init__()
        self.calls = []

    def validation_step(self, dataloader_iter):
        taken = [dataloader_idx for _, _, dataloader_idx in dataloader_iter]
        self.calls.append(taken)


def test_each_evaluation_dataloader_gets_an_iterator_of_its_own(tmp_path):
    model = ReadsItsDataloaderToTheEnd()
    trainer = Trainer(default_root_dir=tmp_path, logger=False, enable_progress_bar=False, enable_model_summary=False)
    loaders = [DataLoader(RandomDataset(32, 4), batch_size=2), DataLoader(RandomDataset(32, 6), batch_size=2)]
    trainer.validate(model, loaders)

    # a call that found its dataloader's iterator exhausted (a drain call, which takes nothing) is left out
    assert [taken for taken in model.calls if taken] == [[0, 0], [1, 1, 1]]


def test_a_pipelining_predict_step_predicts_the_batch_it_holds_at_the_end_of_its_dataloader(tmp_path):
    class PipeliningPredictions(BoringModel):
        held = None

        def predict_step(self, dataloader_iter):
            if self.held is None:
                self.held = next(dataloader_iter)
            _, batch_idx, _ = self.held
            try:
                self.held = next(dataloader_iter)
            except StopIteration:
                self.held = None
            return batch_idx

    trainer = Trainer(default_root_dir=tmp_path, logger=False, enable_progress_bar=False, enable_model_summary=False)
    predictions = trainer.predict(PipeliningPredictions(), DataLoader(RandomDataset(32, 8), batch_size=2))

    assert predictions == [0, 1, 2, 3]
