"""C3 Exactly once, in order: whatever the step's ``next()`` pattern, it receives the loader's sequence."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conformance.harness import (
    KINDS,
    LOADER_CASES,
    IterStepModule,
    assert_same_batches,
    loader_sequence,
    make_loader,
    make_trainer,
)

pytestmark = pytest.mark.clause("C3")

# 0..3 next() calls per step, varying step to step; at least one call somewhere, or no step would ever progress.
patterns = st.lists(st.integers(0, 3), min_size=1, max_size=6).filter(any)


@pytest.mark.parametrize("kind,workers", LOADER_CASES)
@given(pattern=patterns, n_items=st.integers(1, 15))
def test_any_next_pattern_receives_the_loader_sequence(design, kind, workers, pattern, n_items):
    module = IterStepModule(pattern)
    make_trainer(design).fit(module, make_loader(kind, n_items, workers))
    assert_same_batches(module.record.received, loader_sequence(make_loader(kind, n_items, workers)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,), (3,), (0, 1), (0, 2, 1, 3)], ids=str)
def test_fixed_patterns_receive_the_loader_sequence_every_epoch(design, kind, pattern):
    module = IterStepModule(pattern)
    make_trainer(design, max_epochs=2).fit(module, make_loader(kind))
    expected = loader_sequence(make_loader(kind))
    epochs = module.record.received_in_epochs()
    assert len(epochs) == 2
    for epoch in epochs:
        assert_same_batches([batch for batch, _ in epoch], expected)
