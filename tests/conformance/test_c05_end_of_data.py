"""C5 End of data: no step on an exhausted iterator, exact ``done``, StopIteration in a step ends the epoch."""

import pytest
import torch

from tests.conformance.harness import (
    KINDS,
    IterStepModule,
    cut_short_reports,
    loader_sequence,
    make_loader,
    make_trainer,
    reference_weights,
    split_by_pattern,
)

pytestmark = pytest.mark.clause("C5")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,), (1, 3)], ids=str)
def test_step_never_entered_when_no_batch_remains(design, kind, pattern):
    # 16 items = 8 batches: each pattern divides them evenly, so every step call has all its batches.
    module = IterStepModule(pattern)
    make_trainer(design).fit(module, make_loader(kind, n_items=16))
    sizes = [len(step) for step in module.record.steps]
    assert sizes == [len(group) for group in split_by_pattern(range(8), pattern)], (
        f"batches per step call {sizes}: a trailing 0 means the step was entered on an exhausted iterator"
    )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,)], ids=str)
def test_done_is_true_exactly_once_the_last_batch_is_handed_out(design, kind, pattern):
    module = IterStepModule(pattern)
    make_trainer(design).fit(module, make_loader(kind))
    n = len(loader_sequence(make_loader(kind)))
    assert module.record.done_after_next == [False] * (n - 1) + [True]


def _cut_short_run(design, kind, **trainer_kwargs):
    # 7 batches, 3 per step: the third step call receives batch 6, then next() raises StopIteration.
    module = IterStepModule((3,))
    trainer = make_trainer(design, **trainer_kwargs)
    trainer.fit(module, make_loader(kind, n_items=14))
    return module, trainer


@pytest.mark.parametrize("kind", KINDS)
def test_stop_iteration_in_step_runs_epoch_end_and_restarts_at_zero(design, kind):
    module, _ = _cut_short_run(design, kind, max_epochs=2)
    names = module.record.hook_names()
    assert names.count("on_train_epoch_end") == 2
    expected = [(batch, index) for index, batch in enumerate(loader_sequence(make_loader(kind, n_items=14)))]
    assert module.record.received_in_epochs() == [expected, expected]


@pytest.mark.parametrize("kind", KINDS)
def test_stop_iteration_in_step_counts_its_consumed_batches(design, kind):
    module, trainer = _cut_short_run(design, kind)
    assert module.record.epoch_ends[0]["consumed"] == 7
    assert module.record.epoch_ends[0]["completed"] == 7, "progress must count the cut-short step's batch"


@pytest.mark.parametrize("kind", KINDS)
def test_stop_iteration_in_step_takes_no_optimizer_step(design, kind):
    module, trainer = _cut_short_run(design, kind)
    assert module.optimizer_steps_taken() == 2
    assert trainer.global_step == 2
    groups = [[batch for batch, _, _ in step] for step in module.record.steps]
    expected = reference_weights(module, groups, complete=[True, True, False])
    for name, value in module.layer.state_dict().items():
        torch.testing.assert_close(value, expected[name])


@pytest.mark.parametrize("kind", KINDS)
def test_call_cut_short_is_reported_once_per_fit(design, kind):
    # two epochs of 7 batches, 3 per call: each epoch's third call is cut short after 1 batch; one warning per fit
    reported, _ = cut_short_reports(lambda: _cut_short_run(design, kind, max_epochs=2))
    assert len(reported) == 1 and "after 1 of its batches" in reported[0], reported
