"""C19 Real pipelines under DDP: a Megatron-style pipeline-parallel step over two ranks (C16's launcher).

Stage 0 pulls every micro-batch; stage 1 only receives activations and never calls ``next()``. No step call, drain
calls included, may leave a stage blocked in a send, a receive or the loop's vote, and every micro-batch is
trained once: the stages end with the weights of the same two-layer model trained serially.
"""

from __future__ import annotations

import pytest
import torch

from tests.conformance.ddp import PIPELINE_PARALLEL, TEST_TIMEOUT_S, finished_on_every_rank, received_batches
from tests.conformance.harness import BATCH_SIZE, assert_same_batches
from tests.conformance.pipeline_parallel import FIRST, LAST, MICRO_BATCHES, PIPELINE_ITEMS, reference_pipeline_weights

pytestmark = pytest.mark.clause("C19")


@pytest.mark.timeout(TEST_TIMEOUT_S)
def test_pipeline_parallel_step_trains_every_micro_batch_once_without_blocking(design):
    outcomes = finished_on_every_rank(PIPELINE_PARALLEL, (MICRO_BATCHES,), design)
    sequence = [tuple(range(i, i + BATCH_SIZE)) for i in range(0, PIPELINE_ITEMS, BATCH_SIZE)]
    assert_same_batches(received_batches(outcomes[FIRST]), sequence, what="micro-batches stage 0 pulled")
    assert not received_batches(outcomes[LAST]), "stage 1 pulled batches; only stage 0 calls next()"
    expected = reference_pipeline_weights(outcomes[FIRST]["stage_initial"], sequence)
    for rank, prefix in ((FIRST, "first."), (LAST, "layer.")):
        for name, value in outcomes[rank]["stage_weights"].items():
            if name.startswith(prefix):
                torch.testing.assert_close(torch.tensor(value), expected[name], msg=lambda m, rank=rank, name=name: (
                    f"stage {rank}: {name} differs from the two-layer model trained serially:\n{m}"
                ))
