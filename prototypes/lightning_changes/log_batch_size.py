"""``self.log``'s batch size, inferred from the batches the running step call consumed."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities.data import extract_batch_size
from pytorch_lightning.utilities.exceptions import MisconfigurationException


# ----------------------------------------------------------------------- [RFC 1] self.log's batch size
def supply_log_batch_size(
    module: pl.LightningModule, step_batches: Callable[[], list[Any] | None]
) -> Callable[[], None]:
    """Shadow ``module.log`` so that in training ``batch_size`` defaults to the samples in ``step_batches()``;
    returns the undo.

    ``step_batches()`` is the loop's answer for the running step call: the batches it consumed so far, or, before its
    first ``next()``, the batch it will get (none in a drain call); None when the loop cannot tell. The size is their
    samples summed, 1 (Lightning's fallback) for no batch, and None when a batch's size cannot be inferred: then the
    guard's own error asks for ``batch_size=``. Why on the instance: ``LightningModule.log`` refuses the flavour
    without ``batch_size=`` (a guard for stock Lightning, which cannot know it). The loop knows; Lightning proper
    would drop the guard and infer the size in the loop.
    """

    def log(*args: Any, **kwargs: Any) -> None:
        bound = _LOG_SIGNATURE.bind(module, *args, **kwargs)
        if bound.arguments.get("batch_size") is None and module.trainer.training:
            bound.arguments["batch_size"] = samples_in(step_batches())
        return pl.LightningModule.log(*bound.args, **bound.kwargs)

    module.log = log
    return lambda: module.__dict__.pop("log", None)


def samples_in(batches: list[Any] | None) -> int | None:
    """The samples in ``batches`` (1 if there are none, Lightning's fallback); None if a size cannot be inferred."""
    if batches is None:
        return None
    try:
        return sum(extract_batch_size(batch) for batch in batches) or 1
    except MisconfigurationException:
        return None


_LOG_SIGNATURE = inspect.signature(pl.LightningModule.log)
