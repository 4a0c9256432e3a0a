"""C1 Selection: ``dataloader_iter`` by name selects the flavour; the regular flavour is stock Lightning's."""

import pytest
import torch

from tests.conformance.harness import (
    LOADER_CASES,
    IterStepModule,
    RegularStepModule,
    make_loader,
    make_trainer,
    stock_trainer,
)

pytestmark = pytest.mark.clause("C1")


def test_parameter_named_dataloader_iter_receives_an_iterator(design):
    seen = []

    class Probe(IterStepModule):
        def training_step(self, dataloader_iter):
            seen.append(dataloader_iter)
            return super().training_step(dataloader_iter)

    make_trainer(design).fit(Probe(), make_loader())
    assert seen, "the step was never called"
    assert all(hasattr(it, "__next__") and not isinstance(it, (list, tuple, torch.Tensor)) for it in seen), seen[0]


def _observe(trainer, module, loader, val_loader=None):
    trainer.fit(module, train_dataloaders=loader, val_dataloaders=val_loader)
    progress = trainer.fit_loop.epoch_loop.batch_progress
    return dict(
        events=module.record.events,
        validations=module.record.validations,
        global_step=trainer.global_step,
        completed=progress.total.completed,
        weights={k: v.clone() for k, v in module.layer.state_dict().items()},
    )


def _assert_same_as_stock(design, make_module, loader_args, with_val=False, **trainer_kwargs):
    runs = {}
    for label, trainer in (
        ("design", make_trainer(design, **trainer_kwargs)),
        ("stock", stock_trainer(**trainer_kwargs)),
    ):
        val = make_loader(**loader_args) if with_val else None
        runs[label] = _observe(trainer, make_module(), make_loader(**loader_args), val)
    ours, stock = runs["design"], runs["stock"]
    assert ours["events"] == stock["events"], "hook calls / batches differ from stock Lightning"
    assert ours["validations"] == stock["validations"]
    assert ours["global_step"] == stock["global_step"]
    assert ours["completed"] == stock["completed"]
    for name in stock["weights"]:
        assert torch.equal(ours["weights"][name], stock["weights"][name]), f"final {name} differs from stock"


@pytest.mark.parametrize("kind,workers", LOADER_CASES)
def test_regular_flavour_trains_as_stock(design, kind, workers):
    _assert_same_as_stock(design, RegularStepModule, dict(kind=kind, num_workers=workers), max_epochs=2)


@pytest.mark.parametrize(
    "trainer_kwargs",
    [
        pytest.param(dict(accumulate_grad_batches=3), id="accumulate3"),
        pytest.param(dict(limit_train_batches=3, max_epochs=2), id="limit3"),
        pytest.param(dict(max_steps=5, max_epochs=3), id="max_steps5"),
        pytest.param(dict(gradient_clip_val=0.05), id="clip"),
    ],
)
def test_regular_flavour_with_trainer_options_as_stock(design, trainer_kwargs):
    _assert_same_as_stock(design, RegularStepModule, dict(kind="sized"), **trainer_kwargs)


def test_regular_flavour_validation_interval_as_stock(design):
    _assert_same_as_stock(
        design, RegularStepModule, dict(kind="sized", n_items=16), with_val=True, val_check_interval=3,
        limit_val_batches=1,
    )


def test_regular_flavour_manual_optimisation_as_stock(design):
    _assert_same_as_stock(design, lambda: RegularStepModule(automatic=False), dict(kind="sized"))


def _fetch_records(trainer_fn, module, **loaders) -> dict[str, int]:
    """How often each profiled fetch action (``[<loop>].<stage>_next``) was recorded by a SimpleProfiler."""
    from pytorch_lightning.profilers import SimpleProfiler

    profiler = SimpleProfiler()
    trainer_fn(profiler)(module, **loaders)
    return {action: len(times) for action, times in profiler.recorded_durations.items() if action.endswith("_next")}


@pytest.mark.parametrize("kind", ["sized", "unsized"])
@pytest.mark.parametrize("flavour", [RegularStepModule, IterStepModule], ids=["regular", "dataloader_iter"])
def test_profiler_records_fetches_under_stock_action_names(design, flavour, kind):
    # Profiler reports are read by users and parsed by scripts: the fetch actions keep stock Lightning's names, with
    # one record per batch handed out (an unsized loader may add the fetch that found its end, as stock does).
    def fit(design_or_stock):
        return lambda profiler: design_or_stock(profiler=profiler).fit

    loaders = dict(train_dataloaders=make_loader(kind, n_items=8))
    ours = _fetch_records(fit(lambda **kw: make_trainer(design, **kw)), flavour(), **loaders)
    stock = _fetch_records(fit(stock_trainer), flavour(), **dict(train_dataloaders=make_loader(kind, n_items=8)))
    assert set(ours) == set(stock), f"profiled fetch actions {sorted(ours)}, stock Lightning records {sorted(stock)}"
    handed_out = 4
    assert all(handed_out <= count <= handed_out + (kind == "unsized") for count in ours.values()), (
        f"{ours}: expected one record per batch handed out ({handed_out})"
    )
