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

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer

StatefulDataLoader = pytest.importorskip("torchdata.stateful_dataloader").StatefulDataLoader


class FailsAtCall(TwoBatchesPerStep):
    def __init__(self, fail_at_call=None):
        super().__init__()
        self.fail_at_call = fail_at_call
        self.calls = 0

    def training_step(self, dataloader_iter):
        self.calls += 1
        if self.calls == self.fail_at_call:
            raise RuntimeError("crash")
        return super().training_step(dataloader_iter)


def test_resuming_mid_epoch_gets_exactly_the_batches_not_taken(tmp_path):
    """The checkpoint records the loader's state as of the batches the step took, not the one fetched ahead."""
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    model = FailsAtCall(fail_at_call=3)
    trainer = quiet_trainer(tmp_path, callbacks=[checkpoint], enable_checkpointing=True)
    with pytest.raises(RuntimeError, match="crash"):
        trainer.fit(model, StatefulDataLoader(RandomDataset(32, 12), batch_size=2))
    assert model.consumed == [0, 1, 2, 3]

    resumed = TwoBatchesPerStep()
    trainer = quiet_trainer(tmp_path)
    trainer.fit(
        resumed, StatefulDataLoader(RandomDataset(32, 12), batch_size=2), ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt")
    )

    assert resumed.consumed == [4, 5]
    assert trainer.global_step == 3
    assert trainer.fit_loop.epoch_loop.batch_progress.current.completed == 6
