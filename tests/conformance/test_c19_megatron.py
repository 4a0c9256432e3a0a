"""C19 Real pipelines: megatron-core's own micro-batching schedule, as NeMo calls it, trains every batch once.

The flavour's other named user: one optimizer step over ``k`` micro-batches, each pulled by
``forward_step_func(data_iterator, model)`` inside megatron-core 0.16.1's ``forward_backward_no_pipelining`` (what
``get_forward_backward_func()`` returns for a pipeline-parallel size of 1), from a NeMo-style ``training_step(self,
dataloader_iter)`` with manual optimisation, and the same schedule with ``forward_only=True`` in ``validation_step``.
Each epoch must train the loader's batches once, in order, with one optimizer step per ``k`` of them; validation
after each epoch must see its loader's batches once; the final weights and the validation losses must equal those
of the same schedule driven by a plain loop over the same batches. The epochs are whole global batches for every
``k``: the step call that finds the data exhausted pulls nothing (StopIteration at its first micro-batch).
"""

from __future__ import annotations

import math
import warnings
from itertools import pairwise

import pytest
import torch

from tests.conformance.harness import QUIET, cut_short_reports, loader_sequence, make_loader, make_trainer
from tests.conformance.harness.expectations import CUT_SHORT_WARNING
from tests.conformance.megatron_client import (
    EPOCHS,
    MICRO_BATCHES,
    TRAIN_ITEMS,
    VAL_ITEMS,
    MegatronParallelState,
    NeMoStyleModule,
    PlainLoopRun,
    plain_loop,
)

pytestmark = [
    pytest.mark.clause("C19"),
    # megatron-core's own notices on the CPU, not under test: a TransformerConfig default it deprecates, and the
    # fallback from Apex's fused norm
    pytest.mark.filterwarnings("ignore:full scope is deprecated:UserWarning"),
    pytest.mark.filterwarnings("ignore:Apex is not installed:UserWarning"),
]


@pytest.fixture(scope="module", autouse=True)
def megatron_parallel_state():
    state = MegatronParallelState()
    yield
    state.close()


@pytest.fixture(scope="module")
def plain_loop_runs():
    """The plain loop's run per micro-batch count and loader kind: one run each, shared by the designs."""
    runs: dict[tuple[int, str], PlainLoopRun] = {}

    def run(micro_batches: int, kind: str, initial: dict[str, torch.Tensor]) -> PlainLoopRun:
        if (micro_batches, kind) not in runs:
            runs[micro_batches, kind] = plain_loop(micro_batches, initial, make_loader(kind, TRAIN_ITEMS),
                                                   make_loader(kind, VAL_ITEMS))
        return runs[micro_batches, kind]

    return run


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("micro_batches", [pytest.param(k, id=f"k{k}") for k in MICRO_BATCHES])
def test_megatron_schedule_trains_every_micro_batch_once_per_epoch(design, plain_loop_runs, micro_batches, kind):
    module = NeMoStyleModule(micro_batches)
    trainer = make_trainer(design, **{**QUIET, "max_epochs": EPOCHS})
    trainer.fit(module, make_loader(kind, TRAIN_ITEMS), make_loader(kind, VAL_ITEMS))
    sequence = loader_sequence(make_loader(kind, TRAIN_ITEMS))
    val_sequence = loader_sequence(make_loader(kind, VAL_ITEMS))
    reference = plain_loop_runs(micro_batches, kind, module.initial)
    steps_per_epoch = len(sequence) // micro_batches
    assert reference.trained == [sequence] * EPOCHS, "the plain loop itself does not train every batch once"
    assert reference.steps == [steps_per_epoch] * EPOCHS, "the plain loop itself does not step once per global batch"
    assert reference.validated == [val_sequence] * EPOCHS, "the plain loop itself does not validate every batch once"
    assert module.trained == reference.trained, (
        f"micro-batches trained per epoch {module.trained}; the plain loop over the same batches trains {sequence}"
        " every epoch"
    )
    steps = [end - start for start, end in pairwise([0, *module.global_steps])]
    assert steps == reference.steps, (
        f"global_step grew by {steps} per epoch: one optimizer step per {micro_batches} micro-batches is"
        f" {reference.steps}"
    )
    assert module.validated == reference.validated, (
        f"micro-batches validated per validation run {module.validated}; expected {val_sequence} after each epoch"
    )
    # the same losses: the same batches through the same model, trained alike between the runs
    torch.testing.assert_close(module.validation_losses, reference.validation_losses)
    for name, value in module.model.named_parameters():
        torch.testing.assert_close(value.detach(), reference.weights[name], msg=lambda m, name=name: (
            f"{name} differs from the same schedule driven by a plain loop:\n{m}"
        ))


CUT_ITEMS = 26  # 13 batches: with 2 or 3 micro-batches per call the epoch's last call cannot have all of them
CUT_MICRO_BATCHES = [pytest.param(k, id=f"k{k}") for k in (2, 3)]


def fit_13_batches(design, module, kind):
    trainer = make_trainer(design, **{**QUIET, "max_epochs": EPOCHS, "limit_val_batches": 0})
    trainer.fit(module, make_loader(kind, CUT_ITEMS))
    return trainer


def assert_weights_equal(module, reference) -> None:
    for name, value in module.model.named_parameters():
        torch.testing.assert_close(value.detach(), reference.weights[name], msg=lambda m, name=name: (
            f"{name} differs from the same schedule driven by a plain loop:\n{m}"
        ))


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("micro_batches", CUT_MICRO_BATCHES)
def test_megatron_call_cut_short_is_counted_discarded_and_reported(design, micro_batches, kind):
    """The epoch's last call runs its micro-batches forward and backward, then the schedule's next pull ends the
    data: they are counted, not stepped, their gradients reach no later step (the step zeroes only after stepping,
    so only the loop can discard them), and the user is told once per fit."""
    module = NeMoStyleModule(micro_batches, zero_grad_first=False)
    reported, trainer = cut_short_reports(lambda: fit_13_batches(design, module, kind))
    sequence = loader_sequence(make_loader(kind, CUT_ITEMS))
    left = len(sequence) % micro_batches
    assert len(reported) == 1 and f"after {left} of its batches" in reported[0], reported
    assert module.trained == [sequence] * EPOCHS, "the schedule pulls every micro-batch, the last call's too"
    assert trainer.fit_loop.epoch_loop.batch_progress.total.completed == EPOCHS * len(sequence), (
        "the batches of a call cut short are counted"
    )
    assert trainer.global_step == EPOCHS * (len(sequence) // micro_batches), "a call cut short steps no optimizer"
    reference = plain_loop(micro_batches, module.initial, make_loader(kind, CUT_ITEMS), None)
    assert_weights_equal(module, reference)


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("micro_batches", CUT_MICRO_BATCHES)
def test_megatron_step_that_looks_ahead_trains_the_last_call_whole(design, micro_batches, kind):
    """With ``dataloader_iter.has_batches(k)`` the step sizes the epoch's last call to the micro-batches left: no
    call is cut short, every micro-batch is stepped, nothing is reported."""
    module = NeMoStyleModule(micro_batches, look_ahead=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = fit_13_batches(design, module, kind)
    assert not [w for w in caught if w.category.__name__ == CUT_SHORT_WARNING], "no call was cut short"
    sequence = loader_sequence(make_loader(kind, CUT_ITEMS))
    assert module.trained == [sequence] * EPOCHS
    assert trainer.global_step == EPOCHS * math.ceil(len(sequence) / micro_batches)
    reference = plain_loop(micro_batches, module.initial, make_loader(kind, CUT_ITEMS), None, train_partial=True)
    assert_weights_equal(module, reference)
