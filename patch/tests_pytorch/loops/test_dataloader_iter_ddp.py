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
import time
import warnings
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning.pytorch import Callback
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer
from tests_pytorch.helpers.runif import RunIf


class FewerItemsOnRankOne(IterableDataset):
    """Eight items on rank 0 and four on rank 1: an unevenly sharded stream."""

    def __iter__(self):
        items = 8 if torch.distributed.get_rank() == 0 else 4
        return iter(torch.randn(items, 32))


class LogsTheBatchesTaken(TwoBatchesPerStep):
    def training_step(self, dataloader_iter):
        loss = super().training_step(dataloader_iter)
        self.log("taken", float(len(self.consumed)), batch_size=2)
        return loss


class CountsCollectives(Callback):
    """Counts, with the PyTorch profiler, the collectives of the training epoch, and logs the count."""

    def on_train_epoch_start(self, trainer, pl_module):
        self.profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        self.profiler.__enter__()

    def on_train_epoch_end(self, trainer, pl_module):
        self.profiler.__exit__(None, None, None)
        collectives = sum(event.name.startswith("c10d::") for event in self.profiler.events())
        pl_module.log("collectives", float(collectives))


class CountsWarnings(Callback):
    """Counts the warnings of the training epoch that say ``text``, and logs the count."""

    def __init__(self, text):
        self.text = text

    def on_train_epoch_start(self, trainer, pl_module):
        self.catcher = warnings.catch_warnings(record=True)
        self.caught = self.catcher.__enter__()
        warnings.simplefilter("always")

    def on_train_epoch_end(self, trainer, pl_module):
        self.catcher.__exit__(None, None, None)
        pl_module.log("warned", float(sum(self.text in str(caught.message) for caught in self.caught)))


class OneBatchPerStep(BoringModel):
    def training_step(self, dataloader_iter):
        return self.step(next(dataloader_iter)[0])


def _ddp_trainer(tmp_path, **kwargs):
    # a rank that went on alone would wait for its peer until the process group's timeout
    strategy = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=30))
    return quiet_trainer(tmp_path, accelerator="cpu", devices=2, strategy=strategy, **kwargs)


@RunIf(skip_windows=True)
def test_ranks_stop_at_the_same_step_call_when_one_rank_runs_out_of_data(tmp_path):
    """Rank 1 has batches for one call of two, so rank 0 stops after one call too, with its last two batches left."""
    trainer = _ddp_trainer(tmp_path, callbacks=[CountsWarnings("rank 0: the data of another rank ended")])
    trainer.fit(LogsTheBatchesTaken(), DataLoader(FewerItemsOnRankOne(), batch_size=2))

    assert trainer.state.finished
    assert trainer.callback_metrics["taken"] == 2
    assert trainer.callback_metrics["warned"] == 1


@RunIf(skip_windows=True)
def test_a_step_call_makes_the_collectives_of_a_regular_batch(tmp_path):
    """Before each regular batch rank 0 broadcasts its SIGTERM flag; after each call of a step taking
    `dataloader_iter` the ranks agree in one all-reduce whether the data has ended, which carries that flag, and once
    more before the first call."""
    counted = {}
    for model in (BoringModel(), OneBatchPerStep()):
        trainer = _ddp_trainer(tmp_path, callbacks=[CountsCollectives()])
        trainer.fit(model, DataLoader(torch.randn(16, 32), batch_size=2))
        counted[type(model).__name__] = trainer.callback_metrics["collectives"]

    assert counted["OneBatchPerStep"] == counted["BoringModel"] + 1


class RankOneStaysInItsSecondCall(BoringModel):
    """Rank 1's second call does not return in time, as a pipeline stage waiting for an activation its peer, out of
    batches, never sends. No gradients are synchronized, so the ranks meet only in the loop's agreement."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, dataloader_iter):
        _, batch_idx, _ = next(dataloader_iter)
        if torch.distributed.get_rank() == 1 and batch_idx == 1:
            time.sleep(20)


@RunIf(skip_windows=True)
def test_ranks_that_cannot_agree_name_the_fix(tmp_path):
    strategy = DDPStrategy(start_method="spawn", timeout=timedelta(seconds=5))
    trainer = quiet_trainer(tmp_path, accelerator="cpu", devices=2, strategy=strategy)
    with pytest.raises(Exception, match=r"waited in vain(.|\n)*has_batches"):
        trainer.fit(RankOneStaysInItsSecondCall(), DataLoader(torch.randn(16, 32), batch_size=2))
