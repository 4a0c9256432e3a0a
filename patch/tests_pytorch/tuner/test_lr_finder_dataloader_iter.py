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

from lightning.pytorch import seed_everything
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.tuner.tuning import Tuner
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


class WithLearningRate:
    lr = 0.01

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class TwoBatchesPerStepWithLearningRate(WithLearningRate, TwoBatchesPerStep):
    pass


class BoringModelWithLearningRate(WithLearningRate, BoringModel):
    pass


def test_lr_find_with_accumulation_and_several_batches_per_step_call(tmp_path):
    """A step taking two batches of 2 per call is tuned as a regular step taking one batch of 4: one learning rate and
    one loss recorded per optimizer step, an accumulation window counting step calls."""
    num_training, accumulate_grad_batches = 20, 2
    results = []
    for model, batch_size in ((TwoBatchesPerStepWithLearningRate, 2), (BoringModelWithLearningRate, 4)):
        seed_everything(1)
        model = model()
        trainer = quiet_trainer(tmp_path, max_epochs=2, accumulate_grad_batches=accumulate_grad_batches)
        num_samples = 4 * num_training * accumulate_grad_batches
        lr_finder = Tuner(trainer).lr_find(
            model,
            train_dataloaders=DataLoader(RandomDataset(32, num_samples), batch_size=batch_size),
            num_training=num_training,
            early_stop_threshold=None,
        )
        results.append((lr_finder.results["lr"], lr_finder.results["loss"], model.lr))

    (lrs, losses, lr), (regular_lrs, regular_losses, regular_lr) = results
    assert len(lrs) == num_training
    assert lrs == pytest.approx(regular_lrs)
    assert losses == pytest.approx(regular_losses, rel=1e-5)
    assert lr == pytest.approx(regular_lr)
