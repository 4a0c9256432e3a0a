"""C10 Logging: ``self.log`` in the step works without ``batch_size=``, inferred from what the step consumed."""

import pytest

from tests.conformance.harness import KINDS, IterStepModule, make_loader, make_trainer, uneven_loader

pytestmark = pytest.mark.clause("C10")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,)], ids=str)
def test_log_without_batch_size_reaches_callback_metrics(design, kind, pattern):
    module = IterStepModule(pattern, log_metrics=True)
    trainer = make_trainer(design)
    trainer.fit(module, make_loader(kind, n_items=16))
    assert {"step_ids_sum_step", "step_ids_sum_epoch"} <= set(trainer.callback_metrics)
    last_step = module.record.steps[-1]
    assert float(trainer.callback_metrics["step_ids_sum_step"]) == sum(sum(batch) for batch, _, _ in last_step)


# Batches of different sizes, taken 1, 2, 1, 2, 1 per step call: the steps consume 1, 5, 4, 3 and 3 samples in 1, 2,
# 1, 2 and 1 batches, so weighting by samples, by batches and by step calls all give different epoch means.
UNEVEN_BATCHES = (1, 3, 2, 4, 1, 2, 3)


@pytest.mark.parametrize("kind", KINDS)
def test_epoch_mean_is_weighted_by_items_consumed(design, kind):
    module = IterStepModule((1, 2), log_metrics=True)
    trainer = make_trainer(design)
    trainer.fit(module, uneven_loader(kind, UNEVEN_BATCHES))
    steps = module.record.steps
    assert [len(step) for step in steps] == [1, 2, 1, 2, 1], "the steps did not take the batches the pattern asks for"
    values = [sum(sum(batch) for batch, _, _ in step) for step in steps]
    samples = [sum(len(batch) for batch, _, _ in step) for step in steps]
    expected = sum(v * w for v, w in zip(values, samples, strict=True)) / sum(samples)
    assert float(trainer.callback_metrics["step_ids_sum_epoch"]) == pytest.approx(expected)
