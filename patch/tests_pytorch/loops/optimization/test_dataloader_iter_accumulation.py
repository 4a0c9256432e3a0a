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

from lightning.pytorch.demos.boring_classes import RandomDataset
from tests_pytorch.helpers.dataloader_iter import TwoBatchesPerStep, quiet_trainer


class RecordsOptimizerSteps(TwoBatchesPerStep):
    """Records how many batches the step calls had consumed at each optimizer step."""

    def __init__(self):
        super().__init__()
        self.consumed_at_optimizer_step = []

    def on_before_optimizer_step(self, optimizer):
        self.consumed_at_optimizer_step.append(len(self.consumed))


@pytest.mark.parametrize(("accumulate_grad_batches", "expected"), [(2, [4, 6]), (4, [6])])
def test_accumulation_counts_step_calls_and_the_last_call_closes_the_window(
    tmp_path, accumulate_grad_batches, expected
):
    """With a step taking two batches per call, `accumulate_grad_batches` counts step calls, the optimizer steps after
    the call that closes the window, and the epoch's last call closes the window it is in."""
    model = RecordsOptimizerSteps()
    trainer = quiet_trainer(tmp_path, accumulate_grad_batches=accumulate_grad_batches)
    # 6 batches: three calls of two
    trainer.fit(model, DataLoader(RandomDataset(32, 12), batch_size=2))

    assert model.consumed == list(range(6))
    assert model.consumed_at_optimizer_step == expected
    assert trainer.global_step == len(expected)
