"""The objects Lightning's loops look attributes up on many times per batch keep CPython's fast attribute layout under
every design, in both flavours: the training and evaluation loops, their progress objects and fetchers, the
automatic optimisation and the strategy (after an evaluation run, for the rest of the fit).

Why a test: CPython (3.11 on) stores an object's attributes inline, where lookups are specialised and fast, until
something reads the object's ``__dict__`` (``vars()``, ``obj.__dict__[...]``, ``functools.cached_property``) or it
holds more than 29 of them; from then on it keeps a real dict and every lookup on the object is slower. Nothing in a
profile names that cost, yet a loop subclass that lost the layout made a regular module measurably slower in S3. The
check reads the layout through public API: an object with a real dict reports that dict as its referent, an object
with inline values reports the values.
"""

from __future__ import annotations

import functools
import gc
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from prototypes import DESIGNS, runnable_designs

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython" or sys.version_info < (3, 11),
    reason="inline attribute values are a CPython 3.11+ layout",
)


def keeps_a_real_dict(obj: Any) -> bool:
    """Whether CPython holds ``obj``'s attributes in a real dict rather than inline (without touching ``__dict__``)."""
    referents = gc.get_referents(obj)
    return len(referents) <= 2 and any(type(r) is dict for r in referents)


class _Regular(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).sum()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.layer(batch[0])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Pulling(_Regular):
    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:  # type: ignore[override]
        batch, _batch_idx, _dataloader_idx = next(dataloader_iter)
        return self.layer(batch[0]).sum()

    def validation_step(self, dataloader_iter: Iterator) -> None:  # type: ignore[override]
        batch, _batch_idx, _dataloader_idx = next(dataloader_iter)
        self.layer(batch[0])


class _LayoutsMidEpoch(pl.Callback):
    """Reads the layout of the per-batch objects at the end of the second validation batch of the first epoch and at
    the end of the third training batch of the second (after that validation run)."""

    def __init__(self) -> None:
        self.real_dicts: dict[str, bool] = {}

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        loop = trainer.fit_loop.epoch_loop.val_loop
        if trainer.current_epoch != 0 or loop.batch_progress.current.completed != 1:  # counted after this hook
            return
        objects = {"validation loop": loop, "validation batch progress": loop.batch_progress,
                   "validation data fetcher": loop._data_fetcher, "strategy in validation": trainer.strategy}
        self.real_dicts.update({name: keeps_a_real_dict(obj) for name, obj in objects.items()})

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.current_epoch != 1 or trainer.fit_loop.epoch_loop.batch_progress.current.completed != 2:
            return
        fit, epoch = trainer.fit_loop, trainer.fit_loop.epoch_loop
        objects = {"fit loop": fit, "epoch loop": epoch, "batch progress": epoch.batch_progress,
                   "automatic optimisation": epoch.automatic_optimization, "data fetcher": fit._data_fetcher,
                   "strategy": trainer.strategy}
        self.real_dicts.update({name: keeps_a_real_dict(obj) for name, obj in objects.items()})


def test_the_check_sees_a_real_dict() -> None:
    class Plain:
        def __init__(self) -> None:
            self.a, self.b, self.c = 1, [2], "3"

    inline, read = Plain(), Plain()
    vars(read)
    assert not keeps_a_real_dict(inline)
    assert keeps_a_real_dict(read)


def _layouts(design: str, module_type: type, root: str) -> dict[str, bool]:
    """Whether each per-batch object of a fit under ``design`` keeps a real dict (``_LayoutsMidEpoch``)."""
    layouts = _LayoutsMidEpoch()
    trainer = DESIGNS[design].trainer(
        max_epochs=2, limit_train_batches=6, limit_val_batches=3, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[layouts],
        default_root_dir=root,
    )
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flavour's experimental notice and the few-workers hint
        trainer.fit(module_type(), train_dataloaders=data, val_dataloaders=data)
    assert len(layouts.real_dicts) == 10, f"a batch's end was never seen: {sorted(layouts.real_dicts)}"
    return layouts.real_dicts


@functools.cache
def _stock_layouts(module_type: type) -> dict[str, bool]:
    with tempfile.TemporaryDirectory() as root:
        return _layouts("upstream", module_type, root)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module_type", [_Regular, _Pulling], ids=["regular", "dataloader_iter"])
@pytest.mark.parametrize("design", sorted(runnable_designs()))
def test_per_batch_objects_keep_inline_attributes(design: str, module_type: type, tmp_path) -> None:
    """Every object keeps the layout stock Lightning's keeps (its evaluation loop, with more than 29 attributes, has a
    real dict already)."""
    stock, layouts = _stock_layouts(module_type), _layouts(design, module_type, str(tmp_path))
    lost = [name for name, real_dict in layouts.items() if real_dict and not stock[name]]
    assert not lost, f"lost the inline attribute layout: {lost}"
    assert not all(stock.values()), "stock Lightning kept no object inline: the check reads nothing"
