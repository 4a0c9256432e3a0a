"""C19 Real pipelines on two ranks: megatron-core's own 1F1B pipeline-parallel schedule, as NeMo calls it.

``forward_backward_pipelining_without_interleaving`` (what ``get_forward_backward_func()`` returns for a
pipeline-parallel size of 2) over two gloo ranks, one stage each, both pulling the same batches, under C16's
deadlines (``tests/conformance/megatron_pipeline.py``). No step call, drain calls included, may leave a stage
blocked while another raises: the step looks ahead before it starts the schedule (``has_batches(k)``) and does not
start a call the data would cut short. Each stage must pull the same micro-batches per epoch as the plain loop (whole
global batches: the stages never pair different micro-batches), step as often, end with the same weights, and the
micro-batches left over (an epoch that is not a multiple of ``k``) are reported (``expected_leftover_warnings``).

Every design runs the grid (``k`` in 2, 3; 12 and 13 batches; sized and unsized) on one process group of two stages,
the runs one after another.
"""

from __future__ import annotations

import pytest
import torch

from tests.conformance.ddp import TEST_TIMEOUT_S, launch, require_all_reported, summary
from tests.conformance.megatron_pipeline import MEGATRON_PIPELINE, fit_stage

pytestmark = [
    pytest.mark.clause("C19"),
    pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning"),
]

# (micro-batches per call, batches per epoch, sized)
RUNS = [(k, n, sized) for k in (2, 3) for n in (12, 13) for sized in (1, 0)]
_RESULTS: dict[str, dict] = {}


def expected_leftover_warnings(micro_batches: int, epoch_batches: int, epochs: int) -> int:
    """How many warnings about micro-batches left untrained a fit gives: one per epoch that is not a multiple of
    ``micro_batches`` (the rule for a call the data would cut short, in one place to follow the specification)."""
    return epochs if epoch_batches % micro_batches else 0


def stage_outcomes(design, run: tuple[int, int, int]) -> tuple[dict, list[dict]]:
    """Every run of the design on one process group of two stages (launched once per design, the runs one after
    another), and this run's stages."""
    if design.id not in _RESULTS:
        _RESULTS[design.id] = launch(design, [[(MEGATRON_PIPELINE, r) for r in RUNS]], fit=fit_stage)
    result = _RESULTS[design.id][MEGATRON_PIPELINE, run]
    stages = require_all_reported(result)
    failed = [rank for rank, stage in enumerate(stages) if stage["error"] is not None]
    assert not failed, f"stage(s) {failed} raised:\n" + summary(result)
    return result, stages


@pytest.mark.timeout(TEST_TIMEOUT_S)
@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"k{r[0]}-{r[1]}batches-{'sized' if r[2] else 'unsized'}")
def test_megatron_pipeline_schedule_on_two_stages_matches_the_plain_loop(design, run):
    micro_batches, epoch_batches, _ = run
    result, stages = stage_outcomes(design, run)
    for rank, stage in enumerate(stages):
        reference = stage["reference"]
        whole = epoch_batches // micro_batches * micro_batches
        assert all(len(epoch) == whole for epoch in reference["trained"]), "the plain loop trains whole calls only"
        assert stage["trained"] == reference["trained"], (
            f"stage {rank}: micro-batches pulled per epoch {stage['trained']}; the plain loop over the same batches"
            f" pulls {reference['trained']}:\n" + summary(result)
        )
        steps = [end - start for start, end in zip([0, *stage["global_steps"]], stage["global_steps"], strict=False)]
        assert steps == reference["steps"], (
            f"stage {rank}: global_step grew by {steps} per epoch, the plain loop steps {reference['steps']}"
        )
        for name, value in stage["weights"].items():
            torch.testing.assert_close(torch.tensor(value), torch.tensor(reference["weights"][name]),
                                       msg=lambda m, rank=rank, name=name: (
                f"stage {rank}: {name} differs from the same schedule driven by a plain loop:\n{m}"
            ))
        leftover = [text for text in stage["warnings"] if "are not trained" in text]
        expected = expected_leftover_warnings(micro_batches, epoch_batches, len(reference["steps"]))
        assert len(leftover) == expected, (
            f"stage {rank}: {len(leftover)} warnings about the micro-batches left untrained, expected {expected}:"
            f" {leftover}"
        )
    assert stages[0]["trained"] == stages[1]["trained"], "the stages pulled different micro-batches"
