"""C6 Progress counts batches: batch progress, ``is_last_batch`` and the bar count batches; global_step steps."""

import pytest
from pytorch_lightning.callbacks import TQDMProgressBar

from tests.conformance.harness import KINDS, IterStepModule, loader_sequence, make_loader, make_trainer

pytestmark = pytest.mark.clause("C6")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,), (1, 2), (3,)], ids=str)
def test_completed_progress_equals_batches_consumed(design, kind, pattern):
    module = IterStepModule(pattern)
    make_trainer(design, max_epochs=2).fit(module, make_loader(kind))
    n = len(loader_sequence(make_loader(kind)))
    assert [end["consumed"] for end in module.record.epoch_ends] == [n, n]
    assert [end["completed"] for end in module.record.epoch_ends] == [n, n]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(2,), (1, 2)], ids=str)
def test_is_last_batch_at_epoch_end(design, kind, pattern):
    module = IterStepModule(pattern)
    make_trainer(design).fit(module, make_loader(kind, n_items=16))
    assert module.record.epoch_ends[0]["is_last_batch"] is True


@pytest.mark.parametrize("pattern", [(2,), (1, 2)], ids=str)
def test_progress_bar_counts_batches(design, pattern):
    module = IterStepModule(pattern)
    # TQDM's bar named, as Lightning's default is Rich's wherever rich is installed (import-linter brings it)
    trainer = make_trainer(design, enable_progress_bar=True, callbacks=[TQDMProgressBar()])
    trainer.fit(module, make_loader("sized", n_items=16))
    assert module.record.epoch_ends[0]["bar_n"] == 8


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(2,), (0, 1, 2)], ids=str)
def test_global_step_counts_optimizer_steps(design, kind, pattern):
    module = IterStepModule(pattern)
    trainer = make_trainer(design, max_epochs=2)
    trainer.fit(module, make_loader(kind, n_items=16))
    assert trainer.global_step == module.optimizer_steps_taken() > 0
