"""``callback``: ``training_step(self, dataloader_iter)`` on a stock Trainer, through Lightning's public API only.

User code::

    from prototypes.callback import DataloaderIterCallback

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # transfer hooks applied, on self.device
            loss = self.model(batch).mean()
            if not dataloader_iter.done:  # exact, for sized and unsized loaders
                extra, _, _ = next(dataloader_iter)  # a step may take 0, 1 or more batches
                loss = loss + self.model(extra).mean()
            self.log("loss", loss, batch_size=len(batch))  # batch_size= still needed, as upstream
            return loss

    trainer = Trainer(max_epochs=1, callbacks=[DataloaderIterCallback()])
    trainer.fit(Model(), train_dataloaders=loader)

``IMPLEMENTATIONS["callback"].trainer(**kwargs)`` builds exactly that Trainer: a stock ``pytorch_lightning.Trainer``
with the callback appended to the user's callbacks. No mixin, no subclass of anything but ``Callback``.

How it works. A callback cannot reach the training dataloader before Lightning iterates it (a loader passed to
``fit`` is only visible through ``trainer.train_dataloader`` once the fit loop has called ``iter()`` on it), so it
cannot substitute a loader of its own. Instead it keeps Lightning's own ``dataloader_iter`` flavour, which Lightning
selects because the step declares that parameter, and at ``setup`` shadows the user's ``training_step`` on the module
instance with a wrapper of the same signature. Each call, the wrapper hands the user's step a fresh
:class:`StepIterator` over Lightning's iterator that

- applies ``precision_plugin.convert_input`` and the module's ``on_before_batch_transfer`` /
  ``transfer_batch_to_device`` / ``on_after_batch_transfer`` (through ``strategy.batch_to_device``), as the regular
  flavour does;
- numbers batches itself (``batch_idx`` from 0 per epoch; the count is callback state, so it survives a resume);
- knows whether a batch remains, so ``done`` is exact and the step is never entered on an exhausted iterator: for a
  sized loader by counting against ``trainer.num_training_batches`` (fetching ahead there could only hurt: Lightning
  ends the epoch once its iterator has handed out the last batch, consumed or not), for an unsized one by holding
  one batch back (fetched when ``done`` is asked, and at the start and end of every step);
- refuses use after its step returned, and turns a stray ``StopIteration`` (one not caused by running out of data)
  into an error instead of a silently shortened epoch.

What stays Lightning's and is out of a callback's reach: the loop's batch progress counts step calls (progress
counters and ``val_check_interval`` count steps, not batches), the batch/batch_idx that ``on_train_batch_start`` /
``on_train_batch_end`` receive come from the fetcher's private cache, and ``self.log`` refuses to run without
``batch_size=`` in a ``dataloader_iter`` step. See ``rfc/designs/callback.md``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_warn

from prototypes.common import DATALOADER_ITER, Design, takes_dataloader_iter

Item = tuple[Any, int, int]  # (batch, batch_idx, dataloader_idx), what ``next(dataloader_iter)`` returns


class BatchFeed:
    """The training epoch as the callback sees it: Lightning's iterator, our counts, the look-ahead.

    ``consumed``, ``steps`` and the look-ahead are checkpointed with the callback's state, so a resumed run
    numbers batches on from where it stopped and re-delivers a batch that was fetched ahead but not consumed.
    """

    def __init__(self) -> None:
        self.consumed = 0  # batches handed to steps this epoch: the next batch_idx
        self.steps = 0  # step calls this epoch
        self.lookahead: Item | None = None  # fetched from Lightning's iterator (raw), not yet handed to a step
        self._source: Iterator[Item] | None = None
        self._exhausted = False
        self._trainer: pl.Trainer | None = None
        self._module: pl.LightningModule | None = None

    def start_epoch(self) -> None:
        self.consumed = self.steps = 0
        self.lookahead = None

    def begin_step(self, source: Iterator[Item], trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Called at every step call with the iterator Lightning passed; Lightning makes a new one each epoch."""
        self.steps += 1
        self._trainer, self._module = trainer, pl_module
        if source is not self._source:
            self._source, self._exhausted = source, False

    def detach(self) -> None:
        self._source = self._trainer = self._module = None

    def has_next(self) -> bool:
        """Whether another batch remains this epoch; for an unsized loader this fetches it (the look-ahead)."""
        if self.lookahead is not None:
            return True
        if self._exhausted or self._source.done:
            return False
        total = self._trainer.num_training_batches  # batches this epoch after limits; inf when unsized
        if not math.isinf(total):
            # Counting is exact for a sized loader, and fetching ahead there would be harmful: Lightning's
            # iterator turns ``done`` on when it hands out the last batch, which ends the epoch after this step
            # even if the step never consumed that batch.
            return self.consumed < total
        try:  # unsized: only fetching tells whether another batch exists
            self.lookahead = next(self._source)
        except StopIteration:
            self._exhausted = True
            return False
        return True

    def next(self) -> Item:
        if self.lookahead is not None:
            item, self.lookahead = self.lookahead, None
        else:
            try:
                item = next(self._source)
            except StopIteration:
                self._exhausted = True
                raise
        batch, _, dataloader_idx = item
        batch_idx, self.consumed = self.consumed, self.consumed + 1
        return self._to_device(batch, dataloader_idx), batch_idx, dataloader_idx

    def _to_device(self, batch: Any, dataloader_idx: int) -> Any:
        # The regular flavour's sequence (training_epoch_loop.advance), through each object's public method.
        batch = self._trainer.precision_plugin.convert_input(batch)
        batch = self._module.on_before_batch_transfer(batch, dataloader_idx)
        return self._trainer.strategy.batch_to_device(batch, dataloader_idx=dataloader_idx)


class StepIterator(Iterator[Item]):
    """What one ``training_step`` call receives as ``dataloader_iter``; closed when that call returns."""

    def __init__(self, feed: BatchFeed) -> None:
        self._feed: BatchFeed | None = feed

    def __next__(self) -> Item:
        return self._open_feed().next()

    @property
    def done(self) -> bool:
        """True once the last batch of the epoch has been handed out."""
        return not self._open_feed().has_next()

    def close(self) -> None:
        self._feed = None

    def _open_feed(self) -> BatchFeed:
        if self._feed is None:
            raise RuntimeError(
                "dataloader_iter was used after the training_step it was passed to returned. Each step gets its own "
                "iterator; fetch every batch the step needs inside the step (keep batches, not the iterator)."
            )
        return self._feed


class DataloaderIterCallback(Callback):
    """Gives a ``training_step(self, dataloader_iter)`` a tracking iterator, on a stock Trainer."""

    def __init__(self) -> None:
        self.feed = BatchFeed()
        self._installed_step: Callable | None = None  # the wrapper this callback put on the module

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or not takes_dataloader_iter(pl_module.training_step):
            return  # the regular flavour (C1) is left entirely to Lightning
        if "training_step" in vars(pl_module):
            raise RuntimeError(
                f"{type(pl_module).__name__}.training_step is already replaced on this instance (by another "
                "wrapper); DataloaderIterCallback wraps the class's own step. Remove the instance attribute."
            )
        self.feed.start_epoch()
        self._installed_step = self._wrap_step(trainer, pl_module, pl_module.training_step)
        pl_module.training_step = self._installed_step

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._unwrap_step(pl_module)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning skips the teardown hooks when fit raises; unwrap here so the module can be fitted again.
        self._unwrap_step(pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Not called when a run resumes mid-epoch, so restored counts carry on.
        self.feed.start_epoch()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = trainer.num_training_batches
        cut_by_step_count = self.feed.steps >= total > self.feed.consumed
        if self._installed_step is not None and cut_by_step_count and not _max_steps_reached(trainer):
            rank_zero_warn(
                f"The training epoch ended after {self.feed.steps} step calls with only {self.feed.consumed} of "
                f"{total} batches consumed: Lightning ends an epoch after num_training_batches step calls, and "
                "steps that consume no batch use them up. The remaining batches were not trained on. Consume at "
                "least one batch per step, or pass a loader without __len__ (an IterableDataset)."
            )

    def state_dict(self) -> dict[str, Any]:
        return {"consumed": self.feed.consumed, "steps": self.feed.steps, "lookahead": self.feed.lookahead}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.feed.consumed, self.feed.steps = state_dict["consumed"], state_dict["steps"]
        # Lightning's checkpointed loader state counts this batch as delivered: hand it out first.
        self.feed.lookahead = state_dict["lookahead"]

    def _unwrap_step(self, pl_module: pl.LightningModule) -> None:
        if self._installed_step is not None and vars(pl_module).get("training_step") is self._installed_step:
            del pl_module.training_step  # the class's method shows through again
        self._installed_step = None
        self.feed.detach()

    def _wrap_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule, user_step: Callable) -> Callable:
        feed = self.feed

        # ``wraps`` keeps the user's signature visible (``__wrapped__``): Lightning keeps choosing its
        # dataloader_iter flavour and passes its iterator as the one positional argument.
        @functools.wraps(user_step)
        def training_step(dataloader_iter: Iterator[Item]) -> Any:
            feed.begin_step(dataloader_iter, trainer, pl_module)
            if not feed.has_next():  # Lightning could not tell the epoch was over: end it, the step not entered
                raise StopIteration
            step_iter = StepIterator(feed)
            try:
                output = user_step(step_iter)
            except StopIteration as stop:
                if feed.has_next():
                    raise RuntimeError(
                        "training_step raised StopIteration while batches remain; Lightning would end the epoch "
                        "silently. Let StopIteration come only from next(dataloader_iter), or check "
                        "dataloader_iter.done before calling next()."
                    ) from stop
                raise  # out of data inside the step: Lightning ends the epoch, as in its own flavour
            finally:
                step_iter.close()
            # Resolve the look-ahead now: right after the step Lightning reads its iterator's ``done`` into
            # is_last_batch, which ends the epoch and triggers end-of-epoch validation.
            feed.has_next()
            return output

        return training_step


def _max_steps_reached(trainer: pl.Trainer) -> bool:
    return 0 <= trainer.max_steps <= trainer.global_step


def _trainer_with_callback(trainer_kwargs: dict[str, Any]) -> pl.Trainer:
    callbacks = trainer_kwargs.get("callbacks") or []
    callbacks = [callbacks] if isinstance(callbacks, Callback) else list(callbacks)
    if not any(isinstance(c, DataloaderIterCallback) for c in callbacks):
        callbacks.append(DataloaderIterCallback())
    return pl.Trainer(**{**trainer_kwargs, "callbacks": callbacks})


DESIGN = Design(
    name="callback",
    summary=f"public API only: a Callback wraps the step and Lightning's {DATALOADER_ITER} on a stock Trainer",
    make_trainer=_trainer_with_callback,
)
