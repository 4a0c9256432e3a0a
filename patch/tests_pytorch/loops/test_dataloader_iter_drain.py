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
from tests_pytorch.helpers.dataloader_iter import quiet_trainer


class PipeliningModel(BoringModel):
    """Takes batch ``i + 1`` before it trains batch ``i``, as a data pipeline overlapping its loading does."""

    def __init__(self, drain=True):
        super().__init__()
        self.drain_dataloader_iter = drain
        self.held = None
        self.trained = []

    def training_step(self, dataloader_iter):
        if self.held is None:
            # after the end of the data, with nothing held, this raises `StopIteration`: the loop stops calling
            self.held = next(dataloader_iter)
        batch, batch_idx, _ = self.held
        self.held = next(dataloader_iter, None)
        self.trained.append(batch_idx)
        return self.step(batch)

    def validation_step(self, dataloader_iter):
        return self.training_step(dataloader_iter)


@pytest.mark.parametrize("max_epochs", [1, 2])
def test_a_pipelining_step_that_asks_trains_the_batch_it_holds_at_the_end_of_the_data(tmp_path, max_epochs):
    model = PipeliningModel()
    trainer = quiet_trainer(tmp_path, max_epochs=max_epochs)
    trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))

    assert model.trained == [0, 1, 2, 3] * max_epochs
    assert trainer.global_step == 4 * max_epochs


def test_a_pipelining_validation_step_that_asks_evaluates_the_batch_it_holds_at_each_dataloaders_end(tmp_path):
    model = PipeliningModel()
    loaders = [DataLoader(RandomDataset(32, 6), batch_size=2), DataLoader(RandomDataset(32, 4), batch_size=2)]
    quiet_trainer(tmp_path, limit_val_batches=1.0).validate(model, loaders, verbose=False)
    assert model.trained == [0, 1, 2, 0, 1]


def test_without_asking_the_step_is_not_called_again_and_the_held_batch_is_reported(tmp_path):
    model = PipeliningModel(drain=False)
    trainer = quiet_trainer(tmp_path)
    with pytest.warns(UserWarning, match=r"may still hold them.*`self.drain_dataloader_iter = True`"):
        trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))
    assert model.trained == [0, 1, 2]


def test_a_step_that_returns_none_after_the_end_while_holding_a_batch_is_reported(tmp_path):
    class GuardsTheEnd(PipeliningModel):
        def training_step(self, dataloader_iter):
            if dataloader_iter.done:
                return None
            return super().training_step(dataloader_iter)

    model = GuardsTheEnd()
    with pytest.warns(UserWarning, match="return an output from each call after the end of the data"):
        quiet_trainer(tmp_path).fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))
    assert model.trained == [0, 1, 2]


def test_a_drain_that_never_ends_is_an_error(tmp_path):
    class AlwaysReturnsALoss(PipeliningModel):
        def training_step(self, dataloader_iter):
            if dataloader_iter.done:
                return self.step(torch.ones(2, 32))
            return super().training_step(dataloader_iter)

    with pytest.raises(RuntimeError, match="called 100 times after the end of its data"):
        quiet_trainer(tmp_path).fit(AlwaysReturnsALoss(), DataLoader(RandomDataset(32, 8), batch_size=2))


def test_a_pipelining_predict_step_that_asks_predicts_the_batch_it_holds(tmp_path):
    model = PipeliningModel()
    model.predict_step = model.training_step
    predictions = quiet_trainer(tmp_path).predict(model, DataLoader(RandomDataset(32, 8), batch_size=2))
    assert model.trained == [0, 1, 2, 3]
    assert len(predictions) == 4


def test_a_pipelining_step_under_manual_optimization_that_asks_trains_the_batch_it_holds(tmp_path):
    class ManualPipelining(PipeliningModel):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, dataloader_iter):
            loss = super().training_step(dataloader_iter)
            optimizer = self.optimizers()
            optimizer.zero_grad()
            self.manual_backward(loss)
            optimizer.step()
            return loss

    model = ManualPipelining()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))
    assert model.trained == [0, 1, 2, 3]
    assert trainer.global_step == 4
