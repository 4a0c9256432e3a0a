"""``batch_processor``: the training epoch loop owns the iterator it hands to the step (after PR #8807).

User code::

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # on self.device, transfer hooks applied
            loss = self.model(batch).mean()
            if not dataloader_iter.done:  # exact: True once the epoch's last batch was handed out
                extra, _, _ = next(dataloader_iter)  # a step may take 0, 1 or more batches
                loss = loss + self.model(extra).mean()
            self.log("loss", loss)  # batch size: the samples this step consumed
            return loss  # automatic optimisation, accumulation and clipping work as usual

    trainer = IMPLEMENTATIONS["batch_processor"].trainer(max_epochs=1, accumulate_grad_batches=2)
    trainer.fit(Model(), train_dataloaders=loader)

``trainer()`` builds a stock Trainer and installs :class:`IteratorTrainingEpochLoop` as
``trainer.fit_loop.epoch_loop``. For a module whose ``training_step`` has no ``dataloader_iter`` parameter
every overridden method defers to Lightning's ``_TrainingEpochLoop``. Otherwise the loop keeps the epoch's
batches one ahead of the step (:class:`LookAhead`) and gives each step call a fresh :class:`StepIterator`:

- each ``next()`` hands out a batch that went through Lightning's regular transfer path and counts it in
  ``batch_progress``; ``self.log`` without ``batch_size=`` weighs by the samples the step consumed;
- the batch held back tells the loop whether another remains (so the step is never entered on an exhausted
  iterator, and ``done`` and ``is_last_batch`` are exact) and is the batch ``on_train_batch_start`` receives;
- with automatic optimisation the step runs before ``optimizer.step``, which then gets the computed loss: only
  after the step does the loop know whether it took the epoch's last batch; accumulation counts step calls;
- validation runs at the first step boundary at which the consumed batches reach a multiple of
  ``val_check_batch``;
- a ``StopIteration`` from ``next()`` inside a step ends the epoch like running out between steps does.

Coupling to Lightning 2.6's private API, all of it here: ``_TrainingEpochLoop`` (subclassed; the restart and
SIGTERM preamble of its ``advance`` is repeated), ``_DataFetcher.__next__`` and ``done`` (the plain, profiled
fetch that ``_DataLoaderIterDataFetcher`` wraps), ``_AutomaticOptimization._make_closure`` and
``_optimizer_step``, ``LightningModule._on_before_batch_transfer``, ``trainer._logger_connector`` and
``trainer.call``'s hook dispatch. Lightning's guard in ``LightningModule.log`` (``batch_size=`` required when the
step takes ``dataloader_iter``) is met by an instance-level ``log`` on the module for the duration of fit.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.fetchers import _DataFetcher
from pytorch_lightning.loops.training_epoch_loop import _TrainingEpochLoop
from pytorch_lightning.trainer import call
from pytorch_lightning.utilities.data import extract_batch_size
from pytorch_lightning.utilities.exceptions import MisconfigurationException

from prototypes.common import Design, takes_dataloader_iter

Item = tuple[Any, int, int]  # (batch, batch_idx, dataloader_idx), as Lightning's combined loader yields it

USED_AFTER_STEP = (
    "dataloader_iter was used after the training_step that received it returned. The loop counts, transfers"
    " and checkpoints batches per step call, so call next(dataloader_iter) only inside the step that received"
    " it; to use a batch in a later step, keep the batch, not the iterator."
)
STOP_WITH_BATCHES_LEFT = (
    "training_step raised StopIteration although dataloader_iter still has batches, so it did not come from"
    " dataloader_iter; ending the epoch here would silently skip the remaining batches. Catch StopIteration from"
    " your own iterators inside training_step."
)


class LookAhead:
    """The epoch's batches, fetched one ahead of the step so the loop knows whether another remains.

    ``fetch`` returns the next raw ``(batch, batch_idx, dataloader_idx)`` or raises ``StopIteration``; it is
    never called again after that. ``transfer`` moves a batch to the device; it runs once per batch, when the
    batch is first needed (handed out or shown to ``on_train_batch_start``), not when it is fetched, so a
    step that pipelines its own work decides when the copy happens.
    """

    def __init__(self, fetch: Callable[[], Item], transfer: Callable[[Any], Any]) -> None:
        self._fetch = fetch
        self._transfer = transfer
        self._head: Item | None = None
        self._head_transferred = False
        self._fetch_error: Exception | None = None
        self.exhausted = False
        self._fetch_head()

    def _fetch_head(self) -> None:
        try:
            self._head = self._fetch()
        except StopIteration:
            self._head, self.exhausted = None, True
        except Exception as error:
            # the failure belongs to the batch being looked ahead at, not to the one being handed out now:
            # raise it when that batch is asked for, with its original type and traceback
            self._head, self._fetch_error = None, error
        self._head_transferred = False

    def peek(self) -> Item:
        """The next batch, transferred, without taking it; ``StopIteration`` when none remains."""
        if self._fetch_error is not None:
            raise self._fetch_error
        if self._head is None:
            raise StopIteration
        if not self._head_transferred:
            batch, batch_idx, dataloader_idx = self._head
            self._head = (self._transfer(batch), batch_idx, dataloader_idx)
            self._head_transferred = True
        return self._head

    def take(self) -> Item:
        """The next batch, transferred; fetches the one after it so ``exhausted`` is exact afterwards."""
        item = self.peek()
        self._fetch_head()
        return item


class StepIterator(Iterator):
    """What ``training_step(self, dataloader_iter)`` receives: valid for one step call only.

    ``next()`` returns ``(batch, batch_idx, dataloader_idx)``; ``done`` is True once the epoch's last batch
    was handed out. After the step returns, the loop closes the iterator and ``next()`` raises a
    ``RuntimeError`` naming the fix (a batch taken then would belong to no step).
    """

    def __init__(self, hand_out: Callable[[], Item], batches: LookAhead) -> None:
        self._hand_out = hand_out
        self._batches = batches
        self._closed = False

    def __next__(self) -> Item:
        if self._closed:
            raise RuntimeError(USED_AFTER_STEP)
        return self._hand_out()

    @property
    def done(self) -> bool:
        return self._batches.exhausted

    def close(self) -> None:
        self._closed = True


class IteratorTrainingEpochLoop(_TrainingEpochLoop):
    """Lightning's training epoch loop, processing batches itself when ``training_step`` pulls them.

    Progress, limits, ``max_steps``, validation intervals, checkpoints and the progress bar count batches;
    ``accumulate_grad_batches`` and the optimizer hooks' ``batch_idx`` count step calls.
    """

    def __init__(self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self._steps_pull_batches = False
        self._batches: LookAhead | None = None
        self._step_calls = 0  # this epoch's step calls, the unit of gradient accumulation
        self._window_open = False  # gradients accumulated since the last optimizer step
        self._window_loss: Any = None
        self._last_step_consumed = 0
        self._last_handed_out: tuple[Any, int] = (None, -1)
        self._step_batches: list[Any] = []  # what the running step consumed, for `self.log`'s batch size
        self._module_with_supplied_log: pl.LightningModule | None = None

    def run(self, data_fetcher: _DataFetcher) -> None:
        self._steps_pull_batches = takes_dataloader_iter(self.trainer.lightning_module.training_step)
        if self._steps_pull_batches:
            self._supply_log_batch_size()
        super().run(data_fetcher)

    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        super().on_run_start(data_fetcher)
        if not self._steps_pull_batches:
            return
        self._step_calls = self._last_step_consumed = 0
        self._window_open, self._window_loss = False, None
        self._last_handed_out = (None, -1)
        self._batches = LookAhead(partial(self._fetch, data_fetcher), self._transfer)
        # an unsized loader that is empty this epoch ends it before any step call
        self.batch_progress.is_last_batch = self._batches.exhausted

    @staticmethod
    def _fetch(data_fetcher: _DataFetcher) -> Item:
        # the combined loader does not stop at `limit_train_batches`; the fetcher's `done` counts against it
        if data_fetcher.done:
            raise StopIteration
        # the plain profiled fetch; Lightning's `_DataLoaderIterDataFetcher.__next__` hands out its own wrapper
        return _DataFetcher.__next__(data_fetcher)

    def _transfer(self, batch: Any) -> Any:
        # the regular flavour's transfer path, hooks included (Lightning's training loop uses dataloader_idx=0)
        trainer = self.trainer
        batch = trainer.precision_plugin.convert_input(batch)
        batch = trainer.lightning_module._on_before_batch_transfer(batch, dataloader_idx=0)
        return call._call_strategy_hook(trainer, "batch_to_device", batch, dataloader_idx=0)

    def _hand_out(self) -> Item:
        assert self._batches is not None
        batch, batch_idx, dataloader_idx = self._batches.take()
        self.batch_progress.increment_ready()
        self.batch_progress.increment_started()
        self.batch_progress.is_last_batch = self._batches.exhausted
        self._last_handed_out = (batch, batch_idx)
        self._step_batches.append(batch)
        return batch, batch_idx, dataloader_idx

    def _step_batch_size(self) -> int | None:
        """Samples the running step consumed (1 if none, Lightning's fallback); None if a size cannot be inferred."""
        try:
            return sum(extract_batch_size(batch) for batch in self._step_batches) or 1
        except MisconfigurationException:
            return None

    def _supply_log_batch_size(self) -> None:
        # `LightningModule.log` refuses a call without `batch_size=` while training whenever the step takes
        # `dataloader_iter` (a guard for Lightning's own flavour, which cannot know it). This loop knows, so
        # the module's `log` fills it in for the duration of fit; a Lightning-side version of this design
        # would drop the guard instead. When a size cannot be inferred, the guard's error still asks for it.
        module = self.trainer.lightning_module
        if self._module_with_supplied_log is module:  # `run` is called once per epoch
            return
        trainer, log = self.trainer, module.log

        def log_with_step_batch_size(name: str, value: Any, *args: Any, batch_size: int | None = None, **kwargs: Any):
            if batch_size is None and trainer.training:  # validation during fit infers its own
                batch_size = self._step_batch_size()
            log(name, value, *args, batch_size=batch_size, **kwargs)

        module.log = log_with_step_batch_size
        self._module_with_supplied_log = module

    def teardown(self) -> None:
        # Lightning tears down after every fit, failed ones included
        if self._module_with_supplied_log is not None:
            del self._module_with_supplied_log.log
            self._module_with_supplied_log = None
        super().teardown()

    def advance(self, data_fetcher: _DataFetcher) -> None:
        if not self._steps_pull_batches:
            return super().advance(data_fetcher)
        assert self._batches is not None
        # restart and SIGTERM handling, as in `_TrainingEpochLoop.advance`
        if self.restarting and self._should_check_val_fx(data_fetcher):
            if self.val_loop.restarted_mid_evaluation:
                return
            if self.restarted_on_last:
                self._skip_next_val = True
                return
            self.val_loop.increment_progress_to_evaluation_end()
        self.val_loop.restarting = False
        if torch.distributed.is_available() and torch.distributed.is_initialized() and self.trainer.world_size > 1:
            self._broadcast_sigterm_tensor()

        trainer = self.trainer
        batch, batch_idx, _ = self._batches.peek()  # `done` was False, so a batch (or its fetch error) is there
        trainer._logger_connector.on_batch_start(batch)
        self._step_batches = []
        call._call_callback_hooks(trainer, "on_train_batch_start", batch, batch_idx)
        response = call._call_lightning_module_hook(trainer, "on_train_batch_start", batch, batch_idx)
        call._call_strategy_hook(trainer, "on_train_batch_start", batch, batch_idx)
        if response == -1:
            self.batch_progress.is_last_batch = True
            raise StopIteration  # how `_TrainingEpochLoop.run` is told to end the epoch; nothing was consumed

        batch_output = self._run_step()

        self.batch_progress.is_last_batch = self._batches.exhausted
        for _ in range(self._last_step_consumed):
            self.batch_progress.increment_processed()
        self.update_lr_schedulers("step", update_plateau_schedulers=False)
        if self._num_ready_batches_reached():
            self.update_lr_schedulers("epoch", update_plateau_schedulers=False)

        batch, batch_idx = self._last_handed_out
        call._call_callback_hooks(trainer, "on_train_batch_end", batch_output, batch, batch_idx)
        call._call_lightning_module_hook(trainer, "on_train_batch_end", batch_output, batch, batch_idx)
        trainer._logger_connector.on_batch_end()
        for _ in range(self._last_step_consumed):
            self.batch_progress.increment_completed()
        trainer._logger_connector.update_train_step_metrics()

    def _run_step(self) -> Any:
        """One step call; returns its output, or None when a StopIteration from ``dataloader_iter`` cut it short."""
        assert self._batches is not None
        trainer = self.trainer
        self._step_calls += 1
        consumed_before = self.batch_progress.current.ready
        dataloader_iter = StepIterator(self._hand_out, self._batches)
        kwargs = OrderedDict(dataloader_iter=dataloader_iter)
        try:
            with trainer.profiler.profile("run_training_batch"):
                if trainer.lightning_module.automatic_optimization:
                    return self._run_automatic(kwargs)
                return self.manual_optimization.run(kwargs)
        except StopIteration:
            if not self._batches.exhausted:
                raise RuntimeError(STOP_WITH_BATCHES_LEFT) from None
            # no backward and no optimizer step for the cut-short call; earlier calls of its accumulation
            # window still get their step, as Lightning steps on an epoch's final batch
            if self._window_open:
                self._step_optimizer()
            return None
        finally:
            dataloader_iter.close()
            self._last_step_consumed = self.batch_progress.current.ready - consumed_before

    def _run_automatic(self, kwargs: OrderedDict) -> dict:
        # Lightning calls `optimizer.step(closure)` and runs the step inside it, deciding beforehand whether to
        # step. Here the step runs first: only once it returns does the loop know whether it took the epoch's
        # last batch (which closes the accumulation window), and a call cut short by StopIteration must not
        # reach `optimizer.step` at all. Backward and zero_grad stay inside Lightning's closure.
        closure = self.automatic_optimization._make_closure(kwargs, self.trainer.optimizers[0], self._step_calls - 1)
        # Lightning would wrap an accumulating call in `_block_parallel_sync_behavior` (no DDP gradient sync).
        # Whether this call closes its window is known only after it ran, so every backward syncs: one
        # all-reduce per step call rather than per window, but never a window stepped on unsynced gradients.
        closure()
        result = closure.consume_result()
        self._window_open, self._window_loss = True, result.loss
        if self.trainer.strategy.handles_gradient_accumulation or not self._should_accumulate():
            self._step_optimizer()
        return {} if result.loss is None else result.asdict()

    def _step_optimizer(self) -> None:
        loss, evaluated = self._window_loss, []

        def computed_loss() -> Any:
            # the closure's loss was computed already; mixed-precision plugins skip the step if it is None
            if evaluated:
                raise RuntimeError(
                    "the optimizer evaluated its closure more than once (as LBFGS does); with"
                    " training_step(self, dataloader_iter) each evaluation would need new batches. Use manual"
                    " optimisation (self.automatic_optimization = False) and call optimizer.step(closure) yourself."
                )
            evaluated.append(True)
            return loss

        # optimizer hooks get the step-call index, as zero_grad does: accumulation counts step calls
        self.automatic_optimization._optimizer_step(self._step_calls - 1, computed_loss)
        self._window_open, self._window_loss = False, None

    def _accumulated_batches_reached(self) -> bool:
        if not self._steps_pull_batches:
            return super()._accumulated_batches_reached()
        return self._step_calls % self.trainer.accumulate_grad_batches == 0

    def _should_check_val_fx(self, data_fetcher: _DataFetcher) -> bool:
        if not self._steps_pull_batches:
            return super()._should_check_val_fx(data_fetcher)
        trainer = self.trainer
        if not self._should_check_val_epoch():
            return False
        if trainer.should_stop and trainer.fit_loop._can_stop_early:
            return True
        if trainer._val_check_time_interval is not None:
            return time.monotonic() - trainer._last_val_time >= trainer._val_check_time_interval
        every = trainer.val_check_batch
        if every == float("inf"):  # an unsized loader (without a limit): validate once it ran out
            return self.batch_progress.is_last_batch
        progress = self.batch_progress.total if trainer.check_val_every_n_epoch is None else self.batch_progress.current
        # a step may consume several batches: validate when this step's batches crossed a multiple
        consumed = progress.ready
        return consumed // every > (consumed - self._last_step_consumed) // every


def _trainer_with_iterator_loop(trainer_kwargs: dict[str, Any]) -> pl.Trainer:
    trainer = pl.Trainer(**trainer_kwargs)
    stock = trainer.fit_loop.epoch_loop
    trainer.fit_loop.epoch_loop = IteratorTrainingEpochLoop(trainer, stock.min_steps, stock.max_steps)
    return trainer


DESIGN = Design(
    name="batch_processor",
    summary="the training epoch loop hands the step a look-ahead iterator; each next() transfers and counts a batch",
    make_trainer=_trainer_with_iterator_loop,
)
