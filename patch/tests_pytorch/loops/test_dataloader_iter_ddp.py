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
from datetime import timedelta

import torch
from torch.utils.data import DataLoader, IterableDataset

from lightning.pytorch import Callback
from lightning.pytorch.strategies import DDPStrategy
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer
from tests_pytorch.helpers.runif import RunIf


class FewerItemsOnRankOne(IterableDataset):
    """Eight items on rank 0 and four on rank 1: an unevenly sharded stream."""

    def __iter__(self):
        items = 8 if torch.distributed.get_rank() == 0 else 4
        return iter(torch.randn(items, 32))


class LogsTheBatchesConsumed(TwoBatchesPerStep):
    def training_step(self, dataloader_iter):
        loss = super().training_step(dataloader_iter)
        self.log("consumed", float(len(self.consumed)), batch_size=2)
        return loss


class CountsCollectivesBesideTheGradients(Callback):
    """Counts the collectives of the training epoch on integer tensors (the ranks' vote, the SIGTERM broadcast), not
    those of DDP's floating-point gradient buckets, and logs the count at the epoch's end."""

    def on_train_epoch_start(self, trainer, pl_module):
        self.collectives = 0
        self.originals = {name: getattr(torch.distributed, name) for name in ("all_reduce", "broadcast")}
        for name, collective in self.originals.items():
            setattr(torch.distributed, name, self._counting(collective))

    def _counting(self, collective):
        def counted(tensor, *args, **kwargs):
            self.collectives += not tensor.is_floating_point()
            return collective(tensor, *args, **kwargs)

        return counted

    def on_train_epoch_end(self, trainer, pl_module):
        for name, collective in self.originals.items():
            setattr(torch.distributed, name, collective)
        pl_module.log("collectives", float(self.collectives))


@RunIf(skip_windows=True)
def test_a_step_call_meets_its_peers_only_in_the_gradient_all_reduce(tmp_path):
    """The ranks' vote between two step calls rides in the gradient all-reduce of the call's backward, where a regular
    batch also meets its peers in the SIGTERM broadcast before it: over four calls the ranks make one collective of
    their own, the vote before the first call, which no backward precedes."""
    trainer = quiet_trainer(
        tmp_path,
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(start_method="spawn", timeout=timedelta(seconds=30)),
        callbacks=[CountsCollectivesBesideTheGradients()],
    )
    trainer.fit(TwoBatchesPerStep(), DataLoader(torch.randn(32, 32), batch_size=2))

    assert trainer.callback_metrics["collectives"] == 1


@RunIf(skip_windows=True)
def test_ranks_stop_at_the_same_step_call_when_one_rank_runs_out_of_data(tmp_path):
    """Under DDP every step call ends in a gradient all-reduce, so the ranks agree on the end of data before each call:
    rank 1 has batches for one call of two, so rank 0 stops after one call too, with its last two batches left."""
    trainer = quiet_trainer(
        tmp_path,
        accelerator="cpu",
        devices=2,
        # a rank that went on alone would wait for its peer until the process group's timeout
        strategy=DDPStrategy(start_method="spawn", timeout=timedelta(seconds=30)),
    )
    trainer.fit(LogsTheBatchesConsumed(), DataLoader(FewerItemsOnRankOne(), batch_size=2))

    assert trainer.state.finished
    assert trainer.callback_metrics["consumed"] == 2
