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
from unittest import mock

import torch
from torch.utils.data import DataLoader

from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.loops import evaluation_loop, fit_loop
from lightning.pytorch.loops.fetchers import _DataFetcherWrapper, _DataLoaderIterDataFetcher
from tests_pytorch.helpers.dataloader_iter import quiet_trainer


class ChecksItsIterator(BoringModel):
    def __init__(self):
        super().__init__()
        self.iterators = []

    def training_step(self, dataloader_iter):
        self.iterators.append(dataloader_iter)
        return self.step(torch.cat([next(dataloader_iter)[0], next(dataloader_iter)[0]]))

    def validation_step(self, dataloader_iter):
        self.iterators.append(dataloader_iter)
        next(dataloader_iter)


def test_the_iterator_is_a_data_fetcher_wrapper(tmp_path):
    """Code that checks ``isinstance(dataloader_iter, _DataFetcherWrapper)`` keeps working: the iterator with
    ``has_batches`` is still one."""
    model = ChecksItsIterator()
    quiet_trainer(tmp_path, limit_val_batches=2).fit(model, DataLoader(RandomDataset(32, 8), batch_size=2))
    assert model.iterators
    assert all(isinstance(iterator, _DataFetcherWrapper) for iterator in model.iterators)
    assert all(hasattr(iterator, "has_batches") for iterator in model.iterators)


def test_a_loop_given_a_fetcher_built_without_arguments_trains_and_validates(tmp_path):
    """A strategy may replace the loops' ``_select_data_fetcher`` with one that returns
    ``_DataLoaderIterDataFetcher()``, built without arguments: its loops count the batches a call takes."""

    def select(trainer, stage):
        return _DataLoaderIterDataFetcher()

    model = ChecksItsIterator()
    with mock.patch.object(fit_loop, "_select_data_fetcher", select), mock.patch.object(
        evaluation_loop, "_select_data_fetcher", select
    ):
        trainer = quiet_trainer(tmp_path, limit_val_batches=2)
        trainer.fit(model, DataLoader(RandomDataset(32, 8), batch_size=2), DataLoader(RandomDataset(32, 4), batch_size=2))

    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == 4
