"""The objects Lightning's loops look attributes up on many times per batch keep CPython's fast attribute layout under
every design, in both flavours.

Why a test: CPython (3.11 on) stores an object's attributes inline, where lookups are specialised and fast, until
something reads the object's ``__dict__`` (``vars()``, ``obj.__dict__[...]``, ``functools.cached_property``) or it
holds more than 29 of them; from then on it keeps a real dict and every lookup on the object is slower. Nothing in a
profile names that cost, yet a loop subclass that lost the layout made a regular module measurably slower in S3. The
check reads the layout through public API: an object with a real dict reports that dict as its referent, an object
with inline values reports the values.
"""

from __future__ import annotations

import gc
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from prototypes import IMPLEMENTATIONS

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

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Pulling(_Regular):
    def training_step(self, dataloader_iter: Iterator) -> torch.Tensor:  # type: ignore[override]
        batch, _batch_idx, _dataloader_idx = next(dataloader_iter)
        return self.layer(batch[0]).sum()


class _LayoutsMidEpoch(pl.Callback):
    """Reads the layout of the per-batch objects at the end of the third batch."""

    def __init__(self) -> None:
        self.real_dicts: dict[str, bool] = {}

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.fit_loop.epoch_loop.batch_progress.current.completed != 2:  # counted after this hook
            return
        fit, epoch = trainer.fit_loop, trainer.fit_loop.epoch_loop
        objects = {"fit loop": fit, "epoch loop": epoch, "batch progress": epoch.batch_progress,
                   "automatic optimisation": epoch.automatic_optimization, "data fetcher": fit._data_fetcher}
        self.real_dicts = {name: keeps_a_real_dict(obj) for name, obj in objects.items()}


def test_the_check_sees_a_real_dict() -> None:
    class Plain:
        def __init__(self) -> None:
            self.a, self.b, self.c = 1, [2], "3"

    inline, read = Plain(), Plain()
    vars(read)
    assert not keeps_a_real_dict(inline)
    assert keeps_a_real_dict(read)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("module_type", [_Regular, _Pulling], ids=["regular", "dataloader_iter"])
@pytest.mark.parametrize("design", sorted(IMPLEMENTATIONS))
def test_per_batch_objects_keep_inline_attributes(design: str, module_type: type, tmp_path) -> None:
    layouts = _LayoutsMidEpoch()
    trainer = IMPLEMENTATIONS[design].trainer(
        max_epochs=1, limit_train_batches=6, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[layouts], default_root_dir=tmp_path,
    )
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the flavour's experimental notice and the few-workers hint
        trainer.fit(module_type(), train_dataloaders=data)
    assert layouts.real_dicts, "the third batch's end was never seen"
    assert not any(layouts.real_dicts.values()), f"lost the inline attribute layout: {layouts.real_dicts}"
