"""C8 Hooks: once per step call in Lightning's order, with the batch the step actually receives."""

import pytest

from tests.conformance.harness import (
    KINDS,
    IterStepModule,
    loader_sequence,
    make_loader,
    make_trainer,
    split_by_pattern,
)

pytestmark = pytest.mark.clause("C8")

PATTERNS = [(2,), (1, 3)]  # both divide the 8 batches of 16 items evenly


def _run(design, kind, pattern):
    module = IterStepModule(pattern)
    make_trainer(design).fit(module, make_loader(kind, n_items=16))
    return module


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_batch_hooks_once_per_step_call_in_order(design, kind, pattern):
    module = _run(design, kind, pattern)
    expected = ["on_train_epoch_start"]
    for group in split_by_pattern(range(8), pattern):
        expected += ["on_train_batch_start", "training_step", *["next"] * len(group), "on_train_batch_end"]
    # a drain call (C17) receives no batch, so no batch hooks run around it
    observed = [name for name in module.record.hook_names() if name != "drain_call"]
    assert observed == expected + ["on_train_epoch_end"]


def _per_step(module, hook):
    return [(e[1], e[2]) for e in module.record.events if e[0] == hook]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_start_hook_gets_the_first_batch_the_step_receives(design, kind, pattern):
    module = _run(design, kind, pattern)
    assert _per_step(module, "on_train_batch_start") == [(step[0][0], step[0][1]) for step in module.record.steps]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_end_hook_gets_the_last_batch_the_step_received(design, kind, pattern):
    module = _run(design, kind, pattern)
    assert _per_step(module, "on_train_batch_end") == [(step[-1][0], step[-1][1]) for step in module.record.steps]


@pytest.mark.parametrize("kind", KINDS)
def test_minus_one_from_start_hook_ends_epoch_without_consuming(design, kind):
    module = IterStepModule((2,), stop_epoch_at_step=2)  # the third step call of the run returns -1
    make_trainer(design, max_epochs=2).fit(module, make_loader(kind, n_items=16))
    sequence = loader_sequence(make_loader(kind, n_items=16))
    first, second = module.record.received_in_epochs()
    assert [batch for batch, _ in first] == sequence[:4]
    assert module.record.epoch_ends[0]["completed"] == 4
    assert [batch for batch, _ in second] == sequence
