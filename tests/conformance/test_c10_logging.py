"""C10 Logging: ``self.log`` in the step works without ``batch_size=``, inferred from what the step consumed."""

import pytest

from tests.conformance.harness import KINDS, IterStepModule, make_loader, make_trainer

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


@pytest.mark.parametrize("kind", KINDS)
def test_epoch_mean_is_weighted_by_items_consumed(design, kind):
    # 15 items in batches of 2 and a last batch of 1; steps take 1, 2, 1, 2, ... batches: unequal step sizes.
    module = IterStepModule((1, 2), log_metrics=True)
    trainer = make_trainer(design)
    trainer.fit(module, make_loader(kind, n_items=15))
    logged = [step for step in module.record.steps if len(step) == (1, 2)[module.record.steps.index(step) % 2]]
    values = [sum(sum(batch) for batch, _, _ in step) for step in logged]
    weights = [sum(len(batch) for batch, _, _ in step) for step in logged]
    expected = sum(v * w for v, w in zip(values, weights)) / sum(weights)
    assert float(trainer.callback_metrics["step_ids_sum_epoch"]) == pytest.approx(expected)
