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
from unittest.mock import Mock

from torch.utils.data import DataLoader

from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.demos.boring_classes import RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


def test_throughput_monitor_counts_every_batch_a_dataloader_iter_step_took(tmp_path):
    logger = Mock()
    logger.save_dir = tmp_path
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch.size(0))
    trainer = quiet_trainer(tmp_path, log_every_n_steps=1, callbacks=[monitor], logger=logger)
    trainer.fit(TwoBatchesPerStep(), DataLoader(RandomDataset(32, 16), batch_size=2))

    last = logger.log_metrics.call_args_list[-1].kwargs["metrics"]
    assert (last["train/batches"], last["train/samples"]) == (8, 16)
