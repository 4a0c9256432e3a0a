"""C15 Evaluation steps: ``validation_step``, ``test_step`` and ``predict_step`` taking ``dataloader_iter``.

In ``trainer.validate``, ``trainer.test``, ``trainer.predict``, the sanity check and validation during ``fit`` (the
``stage`` parameter), the evaluation step's iterator satisfies C2 (``(batch, batch_idx, dataloader_idx)``,
``batch_idx`` from 0), C3 (each batch exactly once, in order, whatever the step's ``next()`` pattern), C5 (the step
is never entered on an exhausted iterator, ``done`` is True exactly once the last batch is handed out, a
StopIteration from ``next()`` in the step ends the run cleanly and the next run starts afresh at ``batch_idx`` 0)
and progress counts batches: at the run's epoch end the running loop's ``batch_progress.current.completed``
(``trainer.validate_loop``, ``trainer.test_loop``, ``trainer.predict_loop``, or during ``fit`` and its sanity check
``trainer.fit_loop.epoch_loop.val_loop``) equals the batches consumed. ``num_sanity_val_steps=n`` means n batches.

Multiple dataloaders: one step call, one dataloader. Lightning 2.6 (``loops/evaluation_loop.py``) wraps the
loaders in a sequential ``CombinedLoader`` and hands the step one iterator over all of them: a step that takes
several batches can receive the last batch of loader 0 and the first of loader 1 in one call, ``done`` is True
only after the last loader's last batch, and the hooks, ``self.log``'s per-dataloader metrics
(``.../dataloader_idx_N``) and the loop's per-dataloader bookkeeping then hold a single ``dataloader_idx`` for a
call that used two. The suite's stance is that the step is called per dataloader, as the regular flavour is:
each step call's iterator hands out the batches of one dataloader, ``done`` turns True after that dataloader's last
batch, a StopIteration from ``next()`` ends that dataloader's part of the run (the next dataloader starts with a new
step call), and ``batch_idx`` counts from 0 within each dataloader. It is observable (which ``dataloader_idx``
values one call received, ``done`` at each loader's end) and costs a pipelining step nothing it could use: the next
loader's batches may differ in structure and belong to other metrics. The tests that hold under either stance (each
loader's sequence exactly once with its ``dataloader_idx``, progress across loaders) are separate from those that
enforce it (no call spans two loaders, ``done`` at each loader's end).
"""

from __future__ import annotations

import pytest

from tests.conformance.evaluation import STAGES, EvalIterModule, only_runs, run_stage, triples
from tests.conformance.harness import KINDS, assert_same_batches, make_loader, split_by_pattern

pytestmark = [pytest.mark.clause("C15"), pytest.mark.timeout(30)]


# --------------------------------------------------------------------------------------------------- one dataloader
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_next_returns_each_batch_once_in_order_with_its_index(design, stage, kind):
    # 0, 1 or 3 batches per call over 7 batches: empty calls, several batches per call, the last call cut short
    runs = only_runs(run_stage(design, stage, EvalIterModule((0, 1, 3)), make_loader(kind)), stage)
    for number, run in enumerate(runs):
        assert_same_batches(run.received, triples(make_loader(kind)), f"{stage} run {number}: (ids, batch_idx, dl)")


@pytest.mark.parametrize("stage", ["validate", "fit"])
def test_workers_unsized_loader_each_batch_once(design, stage):
    loader = make_loader("unsized", num_workers=2)
    runs = only_runs(run_stage(design, stage, EvalIterModule((2,)), loader), stage)
    for number, run in enumerate(runs):
        assert_same_batches(run.received, triples(make_loader("unsized", num_workers=2)), f"{stage} run {number}")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_step_never_entered_when_no_batch_remains(design, stage, kind):
    # 16 items = 8 batches, 2 per call: every call has both its batches
    runs = only_runs(run_stage(design, stage, EvalIterModule((2,)), make_loader(kind, n_items=16)), stage)
    for number, run in enumerate(runs):
        sizes = [len(step) for step in run.steps]
        assert sizes == [2] * 4, (
            f"{stage} run {number}: batches per step call {sizes}; a trailing 0 means the step was entered on an"
            " exhausted iterator"
        )


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_done_is_true_exactly_once_the_last_batch_is_handed_out(design, stage, kind):
    runs = only_runs(run_stage(design, stage, EvalIterModule((2,)), make_loader(kind, n_items=16)), stage)
    for number, run in enumerate(runs):
        assert run.done_after_next == [False] * 7 + [True], (
            f"{stage} run {number}: done after each next() (batch_idx 0..7): {run.done_after_next}"
        )


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_stop_iteration_in_step_ends_the_run_cleanly(design, stage, kind):
    # 7 batches, 3 per call: the third call receives batch 6, then next() raises StopIteration
    runs = only_runs(run_stage(design, stage, EvalIterModule((3,)), make_loader(kind)), stage)
    for number, run in enumerate(runs):
        assert_same_batches(run.received, triples(make_loader(kind)), f"{stage} run {number}")
        assert run.completed is not None, f"{stage} run {number}: the epoch-end hook never ran"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_completed_progress_equals_batches_consumed(design, stage, kind):
    # 3 per call over 7 batches: 3, 3, then 1 in a call cut short by StopIteration
    runs = only_runs(run_stage(design, stage, EvalIterModule((3,)), make_loader(kind)), stage)
    for number, run in enumerate(runs):
        consumed = len(run.received)
        assert run.completed == consumed, (
            f"{stage} run {number}: batch_progress.current.completed is {run.completed} after {consumed} batches"
            f" in {len(run.steps)} step calls"
        )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [2, 3])
def test_num_sanity_val_steps_counts_batches(design, kind, n):
    module = EvalIterModule((2,))
    runs = only_runs(run_stage(design, "sanity", module, make_loader(kind), num_sanity_val_steps=n), "sanity")
    assert_same_batches(runs[0].received, triples(make_loader(kind))[:n], f"sanity check, num_sanity_val_steps={n}")
    assert runs[0].completed == n, f"sanity check: batch_progress.current.completed {runs[0].completed}, expected {n}"


# ------------------------------------------------------------------------------------------------ several dataloaders
def _two_loaders(kind: str):
    return [make_loader(kind, n_items=14), make_loader(kind, n_items=10)]  # 7 and 5 batches


def _triples_of_both(kind: str) -> list[tuple]:
    first, second = _two_loaders(kind)
    return triples(first, 0) + triples(second, 1)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_multiple_dataloaders_each_sequence_once_with_its_dataloader_idx(design, stage, kind):
    runs = only_runs(run_stage(design, stage, EvalIterModule((3,)), _two_loaders(kind)), stage)
    for number, run in enumerate(runs):
        assert_same_batches(run.received, _triples_of_both(kind), f"{stage} run {number}: (ids, batch_idx, dl)")


@pytest.mark.parametrize("stage", STAGES)
def test_multiple_dataloaders_one_step_call_one_dataloader(design, stage):
    # 3 per call over 7 and 5 batches: per dataloader the calls take 3, 3, 1 (cut short) and 3, 2 (cut short)
    runs = only_runs(run_stage(design, stage, EvalIterModule((3,)), _two_loaders("sized")), stage)
    for number, run in enumerate(runs):
        for call, step in enumerate(run.steps):
            assert len({b[2] for b in step}) <= 1, (
                f"{stage} run {number}: step call {call} received batches of two dataloaders: {step}"
            )
        expected = [len(group) for n in (7, 5) for group in split_by_pattern(range(n), (3,))]
        assert [len(step) for step in run.steps] == expected, f"{stage} run {number}: batches per step call"


@pytest.mark.parametrize("stage", STAGES)
def test_multiple_dataloaders_done_at_the_end_of_each(design, stage):
    runs = only_runs(run_stage(design, stage, EvalIterModule((1,)), _two_loaders("sized")), stage)
    for number, run in enumerate(runs):
        expected = [False] * 6 + [True] + [False] * 4 + [True]
        assert run.done_after_next == expected, (
            f"{stage} run {number}: done after each next() (loader 0: batch_idx 0..6, loader 1: 0..4):"
            f" {run.done_after_next}"
        )


@pytest.mark.parametrize("stage", STAGES)
def test_multiple_dataloaders_progress_counts_batches(design, stage):
    runs = only_runs(run_stage(design, stage, EvalIterModule((3,)), _two_loaders("sized")), stage)
    for number, run in enumerate(runs):
        assert len(run.received) == 12, f"{stage} run {number}: received {len(run.received)} batches of 12"
        assert run.completed == 12, (
            f"{stage} run {number}: batch_progress.current.completed is {run.completed} after 12 batches in"
            f" {len(run.steps)} step calls"
        )


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("pattern", [(1,), (2,)], ids=str)
def test_batch_hooks_get_the_first_and_last_batch_of_their_step_call(design, stage, pattern):
    # As C8 for training: the start hook sees the batch the call receives first, the end hook the last it received.
    runs = only_runs(run_stage(design, stage, EvalIterModule(pattern), make_loader("sized", n_items=16)), stage)
    for number, run in enumerate(runs):
        expected = [
            hook for step in run.steps if step
            for hook in (("start", step[0][0], step[0][1]), ("end", step[-1][0], step[-1][1]))
        ]
        assert run.hooks == expected, f"{stage} run {number}: batch hooks {run.hooks}, expected {expected}"
