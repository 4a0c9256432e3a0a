"""C19 Real pipelines on two ranks: TorchRec's ``TrainPipelineSparseDist`` and ``EvalPipelineSparseDist`` over tables
sharded across two gloo ranks by ``DistributedModelParallel``, each rank compared with the same pipelines driven by
a plain loop. The launch (one per design, both loader kinds at once, C16's launcher and deadlines) and the
strategy that keeps Lightning from wrapping DMP a second time are in ``torchrec_ranks.py``.
"""

from __future__ import annotations

import pytest
import torch

from tests.conformance.ddp import last_output
from tests.conformance.torchrec_ranks import KINDS, RANK_EPOCHS, RANKS_TEST_TIMEOUT_S, expected_batches, ranks_outcome

pytestmark = [
    pytest.mark.clause("C19"),
    pytest.mark.timeout(RANKS_TEST_TIMEOUT_S),
]


def _summary(run: dict) -> str:
    lines = []
    for rank, outcome in enumerate(run["ranks"]):
        if rank in run["hung"]:
            lines.append(f"  rank {rank}: still running after {run['deadline_s']} s (killed); its stack:\n"
                         + run["hung"][rank])
        elif outcome is None:
            lines.append(f"  rank {rank}: reported nothing (process exit code {run['exitcodes'][rank]})")
            lines += last_output(run, rank)
        else:
            error = outcome["error"] or outcome.get("plain_loop_error")
            what = "finished" if error is None else f"raised {error['type']}: {error['message'][:300]}"
            lines.append(f"  rank {rank}: {what}; batches trained per epoch {[len(e) for e in outcome['trained']]},"
                         f" evaluated per validation run {[len(r) for r in outcome['validated']]},"
                         f" global_step {outcome['global_step']}")
    return "\n".join(lines)


def _finished_ranks(design, kind: str) -> list[dict]:
    run = ranks_outcome(design, kind)
    if run["hung"] or any(outcome is None for outcome in run["ranks"]):
        pytest.fail("a rank did not finish:\n" + _summary(run), pytrace=False)
    failed = [rank for rank, outcome in enumerate(run["ranks"])
              if outcome["error"] is not None or "plain_loop_error" in outcome]
    assert not failed, f"rank(s) {failed} raised:\n" + _summary(run)
    return run["ranks"]


def _record_counts(record_property, design, kind: str, counted: str, plain: str, key: str) -> None:
    """The RFC's real-pipelines table: each rank's counts, whatever the outcome."""
    outcomes = [o or {} for o in ranks_outcome(design, kind)["ranks"]]
    record_property(counted, [[len(e) for e in o.get(key, [])] for o in outcomes])
    record_property(plain, [[len(e) for e in o.get("plain_loop", {}).get(key, [])] for o in outcomes])


def _each_rank_as_the_plain_loop(design, kind: str, key: str, what: str):
    """``(rank, outcome, plain loop's outcome)`` per rank, once each rank's ``key`` (batches trained per epoch or
    evaluated per run) are the plain loop's, and the plain loop's are the loaders' batches once each."""
    for rank, outcome in enumerate(_finished_ranks(design, kind)):
        trained, validated = expected_batches(kind, rank)
        sequence = validated if key == "validated" else trained
        reference = outcome["plain_loop"]
        assert reference[key] == [sequence] * RANK_EPOCHS, f"rank {rank}: the plain loop itself does not {what}"
        assert outcome[key] == reference[key], (
            f"rank {rank}: sample ids per epoch or run {outcome[key]}; the same pipeline driven by a plain loop over"
            f" the same batches does {sequence} in each"
        )
        yield rank, outcome, reference


@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_trains_its_batches_once_per_epoch(design, record_property, kind):
    _record_counts(record_property, design, kind, "batches_trained_per_epoch", "plain_loop_batches_per_epoch",
                   "trained")
    for rank, outcome, reference in _each_rank_as_the_plain_loop(design, kind, "trained", "train every batch once"):
        steps = sum(len(epoch) for epoch in reference["trained"])
        assert outcome["global_step"] == steps, (
            f"rank {rank}: global_step {outcome['global_step']}, expected {steps}: the pipeline steps"
            " `self.optimizers()` once per batch trained"
        )
        for name, value in outcome["weights"].items():
            torch.testing.assert_close(torch.tensor(value), torch.tensor(reference["weights"][name]),
                                       msg=lambda m, rank=rank, name=name: (
                                           f"rank {rank}: {name} differs from the plain loop's:\n{m}"))


@pytest.mark.parametrize("kind", KINDS)
def test_each_rank_evaluates_both_validation_loaders_once_per_run(design, record_property, kind):
    _record_counts(record_property, design, kind, "batches_evaluated_per_run", "plain_loop_batches_per_run",
                   "validated")
    for _, outcome, reference in _each_rank_as_the_plain_loop(design, kind, "validated",
                                                              "evaluate both loaders' batches once"):
        torch.testing.assert_close(outcome["losses"], reference["losses"])
