"""Lightning's loops with the prefetching fetcher installed: what this design changes beyond
``prototypes.lightning_changes``."""


from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.evaluation_loop import _EvaluationLoop
from pytorch_lightning.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.prediction_loop import _PredictionLoop
from pytorch_lightning.loops.progress import _BatchProgress
from pytorch_lightning.profilers import PassThroughProfiler, Profiler

from prototypes.common import refuse_mixed_step_signature, takes_dataloader_iter
from prototypes.lightning_changes import (
    BatchCountingEpochLoop,
    BatchCountingFitLoop,
    ManualOptimizationSeesStopIteration,
    StockProfilerActions,
    supply_log_batch_size,
)
from prototypes.prefetcher.fetcher import _PrefetchingIterFetcher, _StepIterator


@dataclass
class _ConsumedBatchProgress(_BatchProgress):
    """Batch progress in batches consumed, however many a step call takes.

    Lightning's epoch loop increments ready and started before each step call and processed and completed after
    it. With the prefetching fetcher, ``count_consumed()`` counts ready and started per batch handed out, and the
    loop's calls only bring processed and completed up to that count; otherwise this is ``_BatchProgress``.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self.counts_consumed = False

    def count_consumed(self) -> None:
        super().increment_ready()
        super().increment_started()

    def increment_ready(self) -> None:
        if not self.counts_consumed:
            super().increment_ready()

    def increment_started(self) -> None:
        if not self.counts_consumed:
            super().increment_started()

    def increment_processed(self) -> None:
        if not self.counts_consumed:
            return super().increment_processed()
        self.total.processed, self.current.processed = self.total.started, self.current.started

    def increment_completed(self) -> None:
        if not self.counts_consumed:
            return super().increment_completed()
        self.total.completed, self.current.completed = self.total.processed, self.current.processed


class _StepCallAutomaticOptimization(_AutomaticOptimization):
    """Lightning's automatic optimisation; with the prefetching fetcher, accumulation windows count step calls."""

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self.window_loss: torch.Tensor | None = None  # a loss of the open accumulation window: backward ran, no step

    def run(self, optimizer: torch.optim.Optimizer, batch_idx: int, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop._data_fetcher
        if not isinstance(fetcher, _PrefetchingIterFetcher):
            return super().run(optimizer, batch_idx, kwargs)
        strategy_accumulates = self.trainer.strategy.handles_gradient_accumulation
        accumulating = not strategy_accumulates and self.trainer.fit_loop._should_accumulate()
        try:
            outputs = super().run(optimizer, batch_idx, kwargs)
        except StopIteration:
            fetcher.step_stopped()
            # Why: the step's next() found the end of the data, aborting the closure (and with it the optimizer
            # step, if this call was to take one): no backward ran, earlier calls' gradients are still pending.
            # Returning lets Lightning's loop finish the call as usual (end hooks, batch counts).
            outputs = {}
        else:
            if not accumulating:
                self.window_loss = None
            elif outputs.get("loss") is not None:
                self.window_loss = outputs["loss"]
        finally:
            fetcher.close_step()  # the step returned: its dataloader_iter hands out nothing more
        if self.window_loss is not None and fetcher.done:
            # Why: Lightning steps on the epoch's final batch even mid-window, deciding before the step runs; only
            # now is it known that this call took the last batch. The closure returns the loss already computed:
            # mixed-precision plugins skip the step when it returns None.
            self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
            loss, self.window_loss = self.window_loss, None
            self._optimizer_step(batch_idx, lambda: loss)
        return outputs

    def _make_zero_grad_fn(self, batch_idx: int, optimizer: torch.optim.Optimizer) -> Callable[[], None] | None:
        fetcher = self.trainer.fit_loop._data_fetcher
        if not isinstance(fetcher, _PrefetchingIterFetcher) or self._skip_backward:
            return super()._make_zero_grad_fn(batch_idx, optimizer)
        # Why: Lightning zeroes when batch_idx % accumulate_grad_batches == 0; a step call here may consume any
        # number of batches, so the window starts at every accumulate_grad_batches-th step call.
        # A drain call is a window of its own: the epoch's last batch closed the previous one.
        if (fetcher.step_calls - 1) % self.trainer.accumulate_grad_batches != 0 and not fetcher.draining:
            return None

        def zero_grad_fn() -> None:
            self._on_before_zero_grad(optimizer)
            self._optimizer_zero_grad(batch_idx, optimizer)

        return zero_grad_fn


class _StepCallManualOptimization(ManualOptimizationSeesStopIteration):
    def run(self, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop._data_fetcher
        if not isinstance(fetcher, _PrefetchingIterFetcher):
            return super().run(kwargs)
        try:
            return super().run(kwargs)
        except StopIteration:
            fetcher.step_stopped()  # the end of the data ends the call; any other StopIteration is an error
            return {}
        finally:
            fetcher.close_step()  # the step returned: its dataloader_iter hands out nothing more


class _PrefetchingEpochLoop(BatchCountingEpochLoop):
    """Lightning's training epoch loop with the shared changes, active while the prefetching fetcher is installed."""

    def __init__(self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1, **_: Any) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self.batch_progress = _ConsumedBatchProgress()
        self.automatic_optimization = _StepCallAutomaticOptimization(trainer)
        self.manual_optimization = _StepCallManualOptimization(trainer)

    def _prefetching(self, data_fetcher: Any = None) -> _PrefetchingIterFetcher | None:
        fetcher = data_fetcher if data_fetcher is not None else self.trainer.fit_loop._data_fetcher
        return fetcher if isinstance(fetcher, _PrefetchingIterFetcher) else None

    def _steps_pull_batches(self) -> bool:
        return self._prefetching() is not None

    def _step_calls_this_epoch(self) -> int:
        return self._prefetching().step_calls

    def _consumed_by_last_call(self) -> int:
        return self._prefetching().consumed_in_step

    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        super().on_run_start(data_fetcher)
        self.automatic_optimization.window_loss = None  # the new epoch's first step call zeroes the gradients

    def advance(self, data_fetcher: _DataFetcher) -> None:
        super().advance(data_fetcher)
        fetcher = self._prefetching(data_fetcher)
        if fetcher is None:
            return
        self._drain_if_the_data_ended(fetcher.cut_short)

    @contextlib.contextmanager
    def _draining(self) -> Iterator[None]:
        fetcher = self._prefetching()
        fetcher.draining = True
        try:
            yield
        finally:
            fetcher.draining = False

    def _run_drain_call(self) -> tuple[bool, Any]:
        trainer, fetcher = self.trainer, self._prefetching()
        kwargs = OrderedDict(any=fetcher.start_step_call())
        with trainer.profiler.profile("run_training_batch"):
            if trainer.lightning_module.automatic_optimization:
                outputs = self.automatic_optimization.run(trainer.optimizers[0], fetcher._batch_idx, kwargs)
            else:
                outputs = self.manual_optimization.run(kwargs)
        return fetcher.cut_short, outputs


# the profiler actions of a batch's transfer, as Lightning names them (`[<kind>]<class>.<hook>`)
_TRANSFER_ACTIONS = (
    ".on_before_batch_transfer", ".transfer_batch_to_device", ".on_after_batch_transfer", ".batch_to_device"
)


@dataclass
class _Options:
    """The design's options and the CUDA side stream, shared by one trainer's loops."""

    depth: int | str  # or "auto" (queue.AUTO)
    transfer_ahead: bool
    copy_stream: Any = None
    transfer_actions_lock: threading.RLock = field(default_factory=threading.RLock)
    profiler_calls_lock: threading.Lock = field(default_factory=threading.Lock)

    def serialise_profiler_calls(self, profiler: Profiler) -> None:
        """Makes the profiler safe for the prefetch threads and the main thread at once, on this instance.

        Why: Lightning's profilers expect one calling thread. Here prefetch threads record the transfer hooks (the
        training epoch's and a validation run's thread at once) while the main thread records Lightning's actions,
        among them the same transfer hooks for a regular validation step. Each ``start`` and ``stop`` call takes one
        lock (AdvancedProfiler's ``start`` iterates its per-action profiles, which a first action from another
        thread would add to mid-iteration), and a transfer action holds a second lock from its start to its stop
        (SimpleProfiler refuses to start an action that is running). The main thread waits for a prefetch thread
        only when both transfer a batch at once.
        """
        if isinstance(profiler, PassThroughProfiler):
            return
        start, stop = profiler.start, profiler.stop

        def serialised_start(action: str) -> None:
            if action.endswith(_TRANSFER_ACTIONS):
                self.transfer_actions_lock.acquire()
            with self.profiler_calls_lock:
                start(action)

        def serialised_stop(action: str) -> None:
            try:
                with self.profiler_calls_lock:
                    stop(action)
            finally:
                if action.endswith(_TRANSFER_ACTIONS):
                    self.transfer_actions_lock.release()

        profiler.start, profiler.stop = serialised_start, serialised_stop

    def side_stream(self, trainer: pl.Trainer) -> Any:
        device = trainer.strategy.root_device
        if self.copy_stream is None and device.type == "cuda" and self.depth and self.transfer_ahead:
            # Why once per run: a new stream per epoch strands the caching allocator's per-stream blocks (timm #2781)
            self.copy_stream = torch.cuda.Stream(device)
        return self.copy_stream


class _InstallsPrefetchingFetcher:
    """What every loop of the design changes: the fetcher installed for a step taking ``dataloader_iter``."""

    trainer: pl.Trainer
    options: _Options
    step_name: str
    counted_progress: _ConsumedBatchProgress  # the batch progress that counts consumed batches

    @property
    def _data_fetcher(self) -> _DataFetcher | None:
        return self.__dict__["_data_fetcher"]

    @_data_fetcher.setter
    def _data_fetcher(self, fetcher: _DataFetcher | None) -> None:
        # Why a setter: the loops assign Lightning's choice (`_select_data_fetcher`) and use it. The fit loop assigns
        # it before setup/iter, so the replacement starts the loader itself; the evaluation loops assign it set up
        # and iterated, so the replacement adopts its loader iterator. Either way the workers start once.
        if type(fetcher) is _DataLoaderIterDataFetcher:
            refuse_mixed_step_signature(getattr(self.trainer.lightning_module, self.step_name), self.step_name)
            started, fetcher = fetcher, _PrefetchingIterFetcher(self)
            if started.iterator is not None:
                fetcher.adopt(started)
        self.__dict__["_data_fetcher"] = fetcher
        if fetcher is not None:
            self.counted_progress.counts_consumed = isinstance(fetcher, _PrefetchingIterFetcher)

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        self.options.copy_stream = None


class _PrefetchingEvaluationSteps(_InstallsPrefetchingFetcher):
    """The evaluation and prediction loops: Lightning's, with the design's fetcher and one call per dataloader."""

    def __init__(self, *args: Any, options: _Options, **kwargs: Any) -> None:
        self.options = options
        super().__init__(*args, **kwargs)
        self.batch_progress = self.counted_progress = _ConsumedBatchProgress()

    def run(self) -> Any:
        if not takes_dataloader_iter(getattr(self.trainer.lightning_module, self.step_name)):
            return super().run()  # type: ignore[misc]
        # Why shadow the strategy's step on the instance: Lightning calls the step through it, the one frame between
        # the user's step and the loop, which ends the whole run (every dataloader) at a StopIteration.
        strategy = self.trainer.strategy
        # Why keep a shadow already there: a run inside this run (the batch-size finder's trials, started from
        # on_validation_start) must leave the step shadowed for the rest of the outer run.
        outer_run_shadows = self.step_name in vars(strategy)
        if not outer_run_shadows:
            setattr(strategy, self.step_name, functools.partial(_step_call, getattr(strategy, self.step_name)))
        try:
            return super().run()  # type: ignore[misc]
        finally:
            if not outer_run_shadows:
                delattr(strategy, self.step_name)
            if isinstance(self._data_fetcher, _PrefetchingIterFetcher):
                self._data_fetcher.stop()  # Why: the prefetch thread must not outlive the evaluation run


def _step_call(step: Callable[..., Any], dataloader_iter: Any, *args: Any, **kwargs: Any) -> Any:
    """An evaluation step call: the StopIteration at the end of its dataloader ends the call (returning None)."""
    if not isinstance(dataloader_iter, _StepIterator):
        return step(dataloader_iter, *args, **kwargs)
    fetcher = dataloader_iter._fetcher
    try:
        return step(dataloader_iter, *args, **kwargs)
    except StopIteration:
        fetcher.step_stopped()
        return None
    finally:
        fetcher.close_step()


class _PrefetchingEvaluationLoop(StockProfilerActions, _PrefetchingEvaluationSteps, _EvaluationLoop):
    @property
    def step_name(self) -> str:
        return "test_step" if self.trainer.testing else "validation_step"


class _PrefetchingPredictionLoop(StockProfilerActions, _PrefetchingEvaluationSteps, _PredictionLoop):
    step_name = "predict_step"

    def _predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int, dataloader_iter: Any) -> None:
        super()._predict_step(batch, batch_idx, dataloader_idx, dataloader_iter)
        fetcher = self._data_fetcher
        if isinstance(fetcher, _PrefetchingIterFetcher) and fetcher.cut_short and self.return_predictions:
            # Why: a call ended by StopIteration returned no prediction; Lightning stored its None
            self._predictions[fetcher._dataloader_idx].pop()


class _PrefetchingFitLoop(_InstallsPrefetchingFetcher, BatchCountingFitLoop):
    """Lightning's fit loop; the one change is which fetcher ``setup_data`` installs for the training step."""

    step_name = "training_step"

    def __init__(self, trainer: pl.Trainer, *, options: _Options, **kwargs: Any) -> None:
        self.options = options
        super().__init__(trainer, **kwargs)

    @property
    def counted_progress(self) -> _ConsumedBatchProgress:
        return self.epoch_loop.batch_progress

    def run(self) -> None:
        module = self.trainer.lightning_module
        if not takes_dataloader_iter(module.training_step):
            return super().run()
        undo = supply_log_batch_size(module, self._step_batch_size)
        try:
            super().run()
        finally:
            undo()

    def _step_batch_size(self) -> int | None:
        fetcher = self._data_fetcher
        return fetcher.step_batch_size() if isinstance(fetcher, _PrefetchingIterFetcher) else None

    def advance(self) -> None:
        try:
            super().advance()
        finally:
            # Why: the prefetch thread must not outlive the epoch, whether it ended, stopped early or raised.
            if isinstance(self._data_fetcher, _PrefetchingIterFetcher):
                self._data_fetcher.stop()

    def consumed_loader_states(self) -> list[dict] | None:
        fetcher = self._data_fetcher
        return fetcher.loader_states if isinstance(fetcher, _PrefetchingIterFetcher) else None
