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
"""What the tests of a ``training_step(self, dataloader_iter)`` share: a step taking two batches per call, and a quiet
Trainer."""

import torch

from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel


class TwoBatchesPerStep(BoringModel):
    """Takes two batches in every training step call and records their indices in ``consumed``."""

    def __init__(self):
        super().__init__()
        self.consumed = []

    def training_step(self, dataloader_iter):
        losses = []
        for _ in range(2):
            batch, batch_idx, _ = next(dataloader_iter)
            self.consumed.append(batch_idx)
            losses.append(self.step(batch))
        return torch.stack(losses).mean()


def quiet_trainer(tmp_path, **kwargs):
    """A Trainer of one epoch without validation, logger, checkpoints, progress bar or summary, unless ``kwargs``
    say otherwise."""
    defaults = {
        "default_root_dir": tmp_path,
        "max_epochs": 1,
        "limit_val_batches": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return Trainer(**{**defaults, **kwargs})
