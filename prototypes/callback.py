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

        def validation_step(self, dataloader_iter):  # also test_step and predict_step: one dataloader per call
            batch, batch_idx, dataloader_idx = next(dataloader_iter)
            ...

    trainer = Trainer(max_epochs=1, callbacks=[DataloaderIterCallback()])
    trainer.fit(Model(), train_dataloaders=loader)

``DESIGNS["callback"].trainer(**kwargs)`` builds exactly that Trainer: a stock ``pytorch_lightning.Trainer``
with the callback appended to the user's callbacks. No mixin, no subclass of anything but ``Callback``.

How it works. A callback cannot reach the training dataloader before Lightning iterates it (a loader passed to
``fit`` is only visible through ``trainer.train_dataloader`` once the fit loop has called ``iter()`` on it), so it
cannot substitute a loader of its own. Instead it keeps Lightning's own ``dataloader_iter`` flavour, which Lightning
selects because the step declares that parameter, and at ``setup`` shadows each of the user's steps that takes
``dataloader_iter`` (``training_step``, ``validation_step``, ``test_step``, ``predict_step``) on the module instance
with a wrapper of the same signature. Each call, the wrapper hands the user's step a fresh :class:`FeedStepIterator`
over Lightning's iterator that

- applies ``precision_plugin.convert_input`` and the module's ``on_before_batch_transfer`` /
  ``transfer_batch_to_device`` / ``on_after_batch_transfer`` (``prototypes.common.BatchTransfer``), as the regular
  flavour does;
- numbers batches itself (``batch_idx`` from 0 per epoch and per dataloader; the training count is callback state,
  so it survives a resume);
- knows whether a batch remains, so ``done`` is exact and the step is never entered on an exhausted iterator: for a
  sized loader by counting against the trainer's public batch counts (``num_training_batches``,
  ``num_val_batches``, ...; fetching ahead there could only hurt: Lightning ends the run once its iterator has handed
  out the last batch, consumed or not), for an unsized one by holding one batch back (fetched when ``done`` is
  asked, and at the start and end of every step);
- serves one dataloader per evaluation step call: Lightning hands evaluation steps one iterator over all their
  dataloaders, and the wrapper ends a call's iterator at its dataloader's last batch;
- refuses use after its step returned, and turns a stray ``StopIteration`` (one not caused by running out of data)
  into an error instead of a silently shortened epoch.

Misuse and DDP. A step signature with both ``dataloader_iter`` and a batch is refused at ``setup``; a training step
that keeps consuming nothing is stopped with an error (after many empty calls, or at the end of a sized epoch whose
step calls ran out before its batches did). Under DDP the ranks vote at every step call on whether all of them have
another batch; when one has not, every rank ends the epoch after the same call (ranks with data left read and drop
the rest of their shard, the only public way to make Lightning end an epoch without another loop iteration).

What stays Lightning's and is out of a callback's reach: the loops' batch progress counts step calls (progress
counters and ``val_check_interval`` count steps, not batches), the batch/batch_idx that the batch hooks receive come
from the fetcher's private cache, and ``self.log`` refuses to run without ``batch_size=`` in a ``dataloader_iter``
step. See ``rfc/designs/callback.md``.
"""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_warn

from prototypes.common import (
    DATALOADER_ITER,
    ITERATOR_USED_AFTER_ITS_STEP,
    STOP_ITERATION_WITH_BATCHES_LEFT,
    BatchTransfer,
    Design,
    StepItem,
    StepIterator,
    refuse_mixed_step_signature,
    takes_dataloader_iter,
)
from prototypes.ranks import every_rank_has_a_batch
from prototypes.step_calls import NoProgressGuard

# The steps each ``trainer.<stage>()`` may call with ``dataloader_iter`` (``setup``'s ``stage`` argument).
STEP_HOOKS = {
    "fit": ("training_step", "validation_step"),
    "validate": ("validation_step",),
    "test": ("test_step",),
    "predict": ("predict_step",),
}


def _training_batches(trainer: pl.Trainer) -> Sequence[float]:
    return [trainer.num_training_batches]  # after limits; inf when unsized


def _evaluation_batches(trainer: pl.Trainer) -> Sequence[float]:
    """Per dataloader, the batches the running evaluation hands out (limits applied; inf when unsized)."""
    if trainer.sanity_checking:
        return trainer.num_sanity_val_batches
    if trainer.validating:
        return trainer.num_val_batches
    if trainer.testing:
        return trainer.num_test_batches
    return trainer.num_predict_batches


class _FeedReading:
    """How a feed reads Lightning's iterator for the step calls: whether the call's dataloader has another batch, the
    next one (transfer applied, numbered), and the rest dropped. A mixin of ``BatchFeed``, whose counts it moves."""

    def has_next(self) -> bool:
        """Whether the current dataloader has another batch; for an unsized one this fetches it (the look-ahead)."""
        if self.lookahead is None and not self._exhausted and not self._source.done:
            total = self._batch_counts(self._trainer)[self.dataloader_idx]
            if not math.isinf(total):
                # Counting is exact for a sized loader, and fetching ahead there would be harmful: Lightning's
                # iterator turns ``done`` on when it hands out the last batch, which ends the run after this step
                # even if the step never consumed that batch.
                return self.consumed < total
            self._fetch_ahead()  # unsized: only fetching tells whether another batch exists
        return self.lookahead is not None and self.lookahead[2] == self.dataloader_idx

    def enter_step(self) -> bool:
        """Whether a step call starting now has a batch: in the current dataloader, or else in the next one with
        batches, which the call then serves."""
        while not self.has_next():
            if self.lookahead is not None:  # unsized: the look-ahead already belongs to a later dataloader
                self.dataloader_idx = self.lookahead[2]
            else:
                counts = self._batch_counts(self._trainer)
                later = [i for i in range(self.dataloader_idx + 1, len(counts)) if counts[i] > 0]
                if not later or self._exhausted or self._source.done:
                    return False
                self.dataloader_idx = later[0]
            self.consumed = 0
        return True

    def next(self) -> StepItem:
        if not self.has_next():
            raise StopIteration  # the end of this call's dataloader, or of the data
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
        return self._transfer(batch, dataloader_idx), batch_idx, dataloader_idx

    def drop_rest(self) -> int:
        """Read and drop what remains of Lightning's iterator, so Lightning ends the epoch after this step call
        (its iterator's ``done`` is the only public lever for that); returns the number of batches dropped."""
        dropped = int(self.lookahead is not None)
        self.lookahead = None
        while not self._exhausted and not self._source.done:
            try:
                next(self._source)
                dropped += 1
            except StopIteration:
                self._exhausted = True
        return dropped

    def _fetch_ahead(self) -> None:
        try:
            self.lookahead = next(self._source)
        except StopIteration:
            self._exhausted = True


class BatchFeed(_FeedReading):
    """One epoch (or evaluation run) as the callback sees it: Lightning's iterator, our counts, the look-ahead.

    ``consumed``, ``steps`` and the look-ahead of the training feed are checkpointed with the callback's state, so
    a resumed run numbers batches on from where it stopped and re-delivers a batch that was fetched ahead but not
    consumed. ``dataloader_idx`` is the dataloader the current step call serves; ``consumed`` counts within it.
    """

    def __init__(self, batch_counts: Callable[[pl.Trainer], Sequence[float]]) -> None:
        self.consumed = 0  # batches of the current dataloader handed to steps: the next batch_idx
        self.steps = 0  # step calls this epoch
        self.dataloader_idx = 0
        self.lookahead: StepItem | None = None  # fetched from Lightning's iterator (raw), not yet handed to a step
        self.restored = False  # the counts come from a checkpoint: the next iterator continues them
        self._batch_counts = batch_counts
        self._source: Iterator[StepItem] | None = None
        self._exhausted = False
        self._trainer: pl.Trainer | None = None
        self._module: pl.LightningModule | None = None
        self._transfer: BatchTransfer | None = None  # for the current source: its hooks resolved once

    def start_epoch(self) -> None:
        self.consumed = self.steps = self.dataloader_idx = 0
        self.lookahead = None
        self.restored = False

    def begin_step(self, source: Iterator[StepItem], trainer: pl.Trainer, pl_module: pl.LightningModule) -> bool:
        """Called at every step call with the iterator Lightning passed; True for the first call over ``source``
        (Lightning makes a new one each epoch and each evaluation run), which counts from 0 unless the counts were
        just restored from a checkpoint (a run resumed mid-epoch carries on).

        Why here and not (only) in the epoch-start hooks: Lightning also runs loops without calling the callbacks
        (the batch-size finder's trials empty ``trainer.callbacks``), while the wrapped steps stay installed.
        """
        self._trainer, self._module = trainer, pl_module
        new_source = source is not self._source
        if new_source:
            if not self.restored:
                self.start_epoch()
            self._source, self._exhausted, self.restored = source, False, False
            self._transfer = BatchTransfer(trainer)
        self.steps += 1
        return new_source

    def detach(self) -> None:
        self._source = self._trainer = self._module = self._transfer = None


class FeedStepIterator(StepIterator):
    """What one step call receives as ``dataloader_iter``: the feed's batches; closed when that call returns."""

    closed_message = ITERATOR_USED_AFTER_ITS_STEP  # closed when its call returns: stricter than the contract

    def __init__(self, feed: BatchFeed, hook_name: str) -> None:
        super().__init__(hook_name)
        self._feed = feed

    def _take(self) -> StepItem:
        return self._feed.next()

    def _has_next(self) -> bool:
        return self._feed.has_next()


class DataloaderIterCallback(Callback):
    """Gives steps that take ``dataloader_iter`` a tracking iterator, on a stock Trainer."""

    def __init__(self) -> None:
        self.feed = BatchFeed(_training_batches)
        self.eval_feed = BatchFeed(_evaluation_batches)  # the running validation/test/predict run
        self._installed: dict[str, Callable] = {}  # hook name -> the wrapper this callback put on the module
        self._guard = NoProgressGuard()  # the training step's, one per fit (the epoch-end check reads it too)
        self._flavour_training = False  # the last fit's training step took dataloader_iter: checkpoints need the feed

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # only steps that take dataloader_iter: the regular flavour (C1) is left entirely to Lightning
        hooks = [name for name in STEP_HOOKS[stage] if takes_dataloader_iter(getattr(pl_module, name))]
        for name in hooks:  # every check before the first wrapper, so a refused run leaves the module untouched
            refuse_mixed_step_signature(getattr(pl_module, name), name)
            if name in vars(pl_module):
                raise RuntimeError(
                    f"{type(pl_module).__name__}.{name} is already replaced on this instance (by another wrapper); "
                    f"DataloaderIterCallback wraps the class's own step. Remove the instance attribute."
                )
        self.feed.start_epoch()
        self._guard = NoProgressGuard()
        if stage == "fit":
            self._flavour_training = "training_step" in hooks
        for name in hooks:
            training = name == "training_step"
            # An evaluation loop ends only when Lightning's iterator is exhausted, so an evaluation step that never
            # consumes would be called forever, sized loader or not.
            feed, guard = (self.feed, self._guard) if training else (self.eval_feed, NoProgressGuard(name))
            wrapper = _feeding_step(trainer, pl_module, name, feed, guard)
            setattr(pl_module, name, wrapper)  # the user's own step on the user's own instance (see the unit tests)
            self._installed[name] = wrapper

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._unwrap_steps(pl_module)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning skips the teardown hooks when a run raises; unwrap here so the module can be run again.
        self._unwrap_steps(pl_module)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Not called when a run resumes mid-epoch, so restored counts carry on; a run resumed at an epoch's start
        # counts from 0. (Evaluation counts restart with each new iterator: see ``BatchFeed.begin_step``.)
        self.feed.start_epoch()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        total = trainer.num_training_batches
        cut_by_step_count = self.feed.steps >= total > self.feed.consumed
        if "training_step" not in self._installed or not cut_by_step_count or _max_steps_reached(trainer):
            return
        lost = (
            f"The training epoch ended after {self.feed.steps} step calls with only {self.feed.consumed} of {total} "
            "batches consumed: Lightning ends an epoch after num_training_batches step calls, and steps that consume "
            "no batch use them up, so the remaining batches are never trained on."
        )
        fix = (
            "Call next(dataloader_iter) at least once per step, or pass a loader without __len__ (an IterableDataset)."
        )
        if self._guard.empty_calls:
            # The epoch ended while the step had stopped consuming (C14): it would idle on the pending batches in
            # every epoch; the callback cannot keep a sized epoch going past num_training_batches calls, so it stops.
            raise RuntimeError(f"{lost} The last {self._guard.empty_calls} step calls consumed no batch. {fix}")
        # The last call consumed: the step's pattern only falls short of one batch per call on average.
        rank_zero_warn(f"{lost} {fix}")

    def state_dict(self) -> dict[str, Any]:
        if not self._flavour_training:
            return {}  # Lightning then writes no entry: a regular module's checkpoint is stock Lightning's (C1)
        return {"consumed": self.feed.consumed, "steps": self.feed.steps, "lookahead": self.feed.lookahead}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.feed.consumed, self.feed.steps, self.feed.restored = state_dict["consumed"], state_dict["steps"], True
        # Lightning's checkpointed loader state counts this batch as delivered: hand it out first.
        self.feed.lookahead = state_dict["lookahead"]

    def _unwrap_steps(self, pl_module: pl.LightningModule) -> None:
        for name, wrapper in self._installed.items():
            if vars(pl_module).get(name) is wrapper:
                delattr(pl_module, name)  # the class's method shows through again
        self._installed = {}
        self.feed.detach()
        self.eval_feed.detach()


def _feeding_step(
    trainer: pl.Trainer, pl_module: pl.LightningModule, name: str, feed: BatchFeed, guard: NoProgressGuard
) -> Callable:
    """The wrapper ``DataloaderIterCallback`` puts on the module in place of its step ``name``: every call hands the
    user's step a ``FeedStepIterator`` over ``feed``, and ``guard`` stops a step that keeps consuming nothing."""
    user_step, training = getattr(pl_module, name), name == "training_step"

    def agree_on_next(has_batch: bool) -> bool:
        """The ranks' vote (training only): may every rank start another step call? A rank with batches left
        when another has none drops them, so that every rank's epoch ends after this call."""
        if not training:
            return has_batch  # evaluation steps run no collective of their own; uneven shards are left as is
        if every_rank_has_a_batch(trainer, has_batch):
            return True
        if has_batch and (dropped := feed.drop_rest()):
            warnings.warn(
                f"rank {trainer.global_rank}: another rank ran out of training data, so this rank ends the epoch "
                f"after the same step call and drops the {dropped} batch(es) it had left (DDP needs every rank in "
                "every step's collectives). Shard the data evenly across ranks to train on all of it.",
                stacklevel=2,
            )
        return False

    # ``wraps`` keeps the user's signature visible (``__wrapped__``): Lightning keeps choosing its
    # dataloader_iter flavour and passes its iterator as the one positional argument.
    @functools.wraps(user_step)
    def step(dataloader_iter: Iterator[StepItem]) -> Any:
        first_call = feed.begin_step(dataloader_iter, trainer, pl_module)
        has_batch = feed.enter_step()
        if first_call:  # no vote at the end of an earlier call covers this one
            has_batch = agree_on_next(has_batch)
        if not has_batch:  # Lightning could not tell the data was over: end the run, the step not entered
            raise StopIteration
        consumed_before = feed.consumed
        step_iter = FeedStepIterator(feed, name)
        try:
            output = user_step(step_iter)
        except StopIteration as stop:
            if feed.has_next():
                raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step=name)) from stop
            if not training and feed.enter_step():
                return None  # the end of this dataloader: the next step call serves the next one
            agree_on_next(False)  # out of data inside the step: keep the ranks' votes in step
            raise  # Lightning ends the epoch (the run), as in its own flavour
        finally:
            step_iter.close()
        guard.step_returned(feed.consumed - consumed_before)
        if training:
            # Resolve the look-ahead now: right after the step Lightning reads its iterator's ``done`` into
            # is_last_batch, which ends the epoch and triggers end-of-epoch validation.
            agree_on_next(feed.has_next() and feed.steps < trainer.num_training_batches)
        else:
            feed.has_next()
        return output

    return step


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
    summary=f"public API only: a Callback wraps the steps and Lightning's {DATALOADER_ITER} on a stock Trainer",
    make_trainer=_trainer_with_callback,
)
