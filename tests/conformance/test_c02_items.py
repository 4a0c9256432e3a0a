"""C2 Items: ``next(dataloader_iter)`` returns ``(batch, batch_idx, dataloader_idx)``; ``batch_idx`` counts from 0."""

import pytest

from tests.conformance.harness import KINDS, IterStepModule, loader_sequence, make_loader, make_trainer

pytestmark = pytest.mark.clause("C2")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,), (1, 3)], ids=str)
def test_next_returns_batch_index_and_dataloader_index(design, kind, pattern):
    module = IterStepModule(pattern)
    make_trainer(design).fit(module, make_loader(kind))
    received = [b for step in module.record.steps for b in step]
    expected = [(batch, index, 0) for index, batch in enumerate(loader_sequence(make_loader(kind)))]
    assert received == expected


@pytest.mark.parametrize("kind", KINDS)
def test_batch_idx_restarts_from_zero_each_epoch(design, kind):
    module = IterStepModule((2, 1))
    make_trainer(design, max_epochs=3).fit(module, make_loader(kind))
    epochs = module.record.received_in_epochs()
    assert len(epochs) == 3
    for number, epoch in enumerate(epochs):
        assert [index for _, index in epoch] == list(range(len(epoch))), f"epoch {number}"
