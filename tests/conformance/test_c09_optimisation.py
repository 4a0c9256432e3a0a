"""C9 Optimisation: final weights equal a plain PyTorch loop over the same batches."""

import pytest
import torch

from tests.conformance.harness import (
    KINDS,
    IterStepModule,
    loader_sequence,
    make_loader,
    make_trainer,
    reference_weights,
    split_by_pattern,
)

pytestmark = pytest.mark.clause("C9")


def _check(design, pattern, n_items, module_kwargs=(), kind="sized", accumulate=1, clip=None):
    module = IterStepModule(pattern, **dict(module_kwargs))
    trainer = make_trainer(design, accumulate_grad_batches=accumulate, gradient_clip_val=clip)
    trainer.fit(module, make_loader(kind, n_items=n_items))
    groups = split_by_pattern(loader_sequence(make_loader(kind, n_items=n_items)), pattern)
    complete = [len(group) == pattern[k % len(pattern)] for k, group in enumerate(groups)]
    expected = reference_weights(module, groups, complete=complete, accumulate=accumulate, clip_norm=clip)
    for name, value in module.layer.state_dict().items():
        torch.testing.assert_close(value, expected[name], msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pattern", [(1,), (2,), (1, 2), (3,)], ids=str)
def test_automatic_optimisation_matches_plain_loop(design, kind, pattern):
    _check(design, pattern, n_items=14, kind=kind)


def test_gradient_clipping_matches_plain_loop(design):
    _check(design, (2,), n_items=16, clip=0.05)


@pytest.mark.parametrize("accumulate", [2, 3])
@pytest.mark.parametrize("pattern", [(1,), (2,), (0, 1, 3)], ids=str)
def test_accumulation_counts_step_calls(design, accumulate, pattern):
    # 8 batches: every step call is complete, so the last one closes the accumulation window; a call that
    # consumes nothing still counts as one of the k calls of a window
    _check(design, pattern, n_items=16, accumulate=accumulate)


@pytest.mark.parametrize("pattern", [(1,), (2,)], ids=str)
def test_manual_optimisation_matches_plain_loop(design, pattern):
    _check(design, pattern, n_items=16, module_kwargs={"automatic": False})
