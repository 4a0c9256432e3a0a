"""Lightning's loops with the prefetching fetcher installed: what this design changes beyond
``prototypes.lightning_changes``."""


from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.loops.evaluation_loop import _EvaluationLoop
from pytorch_lightning.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.prediction_loop import _PredictionLoop
from pytorch_lightning.loops.progress import _BatchProgress, _Progress
from pytorch_lightning.profilers import PassThroughProfiler, Profiler
from pytorch_lightning.trainer import call

from prototypes.common import refuse_mixed_step_signature, takes_dataloader_iter
from prototypes.lightning_changes import (
    BatchCountingEpochLoop,
    BatchCountingFitLoop,
    ManualOptimizationSeesStopIteration,
    PredictionWriterSeesStepCalls,
    StockProfilerActions,
    drain,
    evaluation_drain_call,
    supply_log_batch_size,
)
from prototypes.prefetcher.fetcher import _PrefetchingIterFetcher, _StepIterator


# [RFC 1]
class _CountsConsumed:
    """Progress in batches consumed, however many a step call takes (mixed into Lightning's progress classes).

    Lightning's loops increment ready and started before each step call and processed and completed after it. With
    the prefetching fetcher, ``count_consumed()`` counts ready and started per batch handed out, and the loop's calls
    only bring processed and completed up to that count; otherwise this is Lightning's class. ``counts_consumed`` is
    not a dataclass field: a checkpoint holds exactly the fields stock Lightning's class has.
    """

    counts_consumed = False
    total: Any
    current: Any

    def count_consumed(self) -> None:
        super().increment_ready()  # type: ignore[misc]
        super().increment_started()  # type: ignore[misc]

    def increment_ready(self) -> None:
        if not self.counts_consumed:
            super().increment_ready()  # type: ignore[misc]

    def increment_started(self) -> None:
        if not self.counts_consumed:
            super().increment_started()  # type: ignore[misc]

    def increment_processed(self) -> None:
        if not self.counts_consumed:
            return super().increment_processed()  # type: ignore[misc]
        self.total.processed, self.current.processed = self.total.started, self.current.started

    def increment_completed(self) -> None:
        if not self.counts_consumed:
            return super().increment_completed()  # type: ignore[misc]
        self.total.completed, self.current.completed = self.total.processed, self.current.processed


class _ConsumedBatchProgress(_CountsConsumed, _BatchProgress):
    """The training and evaluation loops' ``_BatchProgress``, counting consumed batches."""


class _ConsumedProgress(_CountsConsumed, _Progress):
    """The prediction loop's ``_Progress`` (it has no ``is_last_batch`` field), counting consumed batches."""


# [RFC 5]
class _StepCallAutomaticOptimization(_AutomaticOptimization):
    """Lightning's automatic optimisation; with the prefetching fetcher, accumulation windows count step calls."""

    def __init__(self, trainer: pl.Trainer) -> None:
        super().__init__(trainer)
        self.window_loss: torch.Tensor | None = None  # a loss of the open accumulation window: backward ran, no step

    def run(self, optimizer: torch.optim.Optimizer, batch_idx: int, kwargs: Any) -> Any:
        fetcher = self.trainer.fit_loop.prefetching
        if fetcher is None:
            return super().run(optimizer, batch_idx, kwargs)
        trainer = self.trainer
        # Why accumulate_grad_batches first: without accumulation no call leaves a window open, and asking the loop
        # and the strategy is a chain of calls on every batch
        accumulating = (trainer.accumulate_grad_batches > 1 and not trainer.strategy.handles_gradient_accumulation
                        and trainer.fit_loop._should_accumulate())
        try:
            outputs = self._drain_call(optimizer, batch_idx, kwargs) if fetcher.draining else super().run(
                optimizer, batch_idx, kwargs
            )
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
            fetcher.end_step_call()
        if self.window_loss is not None and fetcher.done:
            # Why: Lightning steps on the epoch's final batch even mid-window, deciding before the step runs; only
            # now is it known that this call took the last batch. The closure returns the loss already computed:
            # mixed-precision plugins skip the step when it returns None.
            self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch = True
            loss, self.window_loss = self.window_loss, None
            self._optimizer_step(batch_idx, lambda: loss)
        return outputs

    def _drain_call(self, optimizer: torch.optim.Optimizer, batch_idx: int, kwargs: Any) -> dict:
        """A drain call (C17), a window of its own: the step runs first, and only a call that computed a loss
        reaches the optimizer. Why: Lightning enters the `optimizer_step` hook (which a user may override) before
        the step runs, so a drain call that only sees the end would run it and leave that trace."""
        closure = self._make_closure(kwargs, optimizer, batch_idx)
        closure()
        result = closure.consume_result()
        if result.loss is None:
            return {}
        self._optimizer_step(batch_idx, lambda: result.loss)  # the mixed-precision plugins read the closure's loss
        return result.asdict()

    def _make_zero_grad_fn(self, batch_idx: int, optimizer: torch.optim.Optimizer) -> Callable[[], None] | None:
        fetcher = self.trainer.fit_loop.prefetching
        if fetcher is None or self._skip_backward:
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
        fetcher = self.trainer.fit_loop.prefetching
        if fetcher is None:
            return super().run(kwargs)
        try:
            return super().run(kwargs)
        except StopIteration:
            fetcher.step_stopped()  # the end of the data ends the call; any other StopIteration is an error
            return {}
        finally:
            fetcher.end_step_call()


class _PrefetchingEpochLoop(BatchCountingEpochLoop):
    """Lightning's training epoch loop with the shared changes, active while the prefetching fetcher is installed."""

    def __init__(self, trainer: pl.Trainer, min_steps: int | None = None, max_steps: int = -1, **_: Any) -> None:
        super().__init__(trainer, min_steps=min_steps, max_steps=max_steps)
        self.batch_progress = _ConsumedBatchProgress()
        self.automatic_optimization = _StepCallAutomaticOptimization(trainer)
        self.manual_optimization = _StepCallManualOptimization(trainer)

    def _prefetching(self) -> _PrefetchingIterFetcher | None:
        return self.trainer.fit_loop.prefetching

    def _steps_pull_batches(self) -> bool:
        return self.trainer.fit_loop.prefetching is not None

    def _step_calls_this_epoch(self) -> int:
        return self.trainer.fit_loop.prefetching.step_calls

    def _consumed_by_last_call(self) -> int:
        return self.trainer.fit_loop.prefetching.consumed_in_step

    def on_run_start(self, data_fetcher: _DataFetcher) -> None:
        super().on_run_start(data_fetcher)
        self.automatic_optimization.window_loss = None  # the new epoch's first step call zeroes the gradients

    def advance(self, data_fetcher: _DataFetcher) -> None:
        super().advance(data_fetcher)
        fetcher = self._prefetching()
        if fetcher is None:
            return
        self._drain_if_the_data_ended(fetcher.cut_short)

    @contextlib.contextmanager
    def _draining(self) -> Iterator[None]:
        fetcher = self._prefetching()
        consumed, fetcher.draining = fetcher.consumed_in_step, True
        try:
            yield
        finally:
            # the validation interval looks at the batches of the call that took the last one, not a drain call's
            fetcher.consumed_in_step, fetcher.draining = consumed, False

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


class _Options:
    """The design's options, shared by one trainer's loops, and what they hold per run: the CUDA side stream and the
    locks that serialise the profiler while a prefetch thread records on it.

    Why ``__reduce__`` ([RFC 16]): Lightning and its users copy a Trainer (``strategy="ddp_spawn"`` pickles it into each rank,
    ``copy.deepcopy`` of a loop), and locks and streams cannot be pickled; a copy gets new ones, built from the options.
    """

    def __init__(self, depth: int | str, transfer_ahead: bool) -> None:
        self.depth = depth  # or "auto" (queue.AUTO)
        self.transfer_ahead = transfer_ahead
        self.copy_stream: Any = None
        self.transfer_actions_lock = threading.RLock()
        self.profiler_calls_lock = threading.Lock()
        self._threads_recording = 0  # prefetch threads now recording on the trainer's profiler

    def __reduce__(self) -> tuple:
        return type(self), (self.depth, self.transfer_ahead)

    def thread_records_on(self, profiler: Profiler) -> None:
        """A prefetch thread starts recording on ``profiler``: its calls are serialised until the last one stops.

        Why: Lightning's profilers expect one calling thread. Here prefetch threads record the transfer hooks (the
        training epoch's and a validation run's thread at once) while the main thread records Lightning's actions,
        among them the same transfer hooks for a regular validation step. Each ``start`` and ``stop`` call takes one
        lock (AdvancedProfiler's ``start`` iterates its per-action profiles, which a first action from another
        thread would add to mid-iteration), and a transfer action holds a second lock from its start to its stop
        (SimpleProfiler refuses to start an action that is running). The main thread waits for a prefetch thread
        only when both transfer a batch at once. Why only while a thread runs: the profiler is the user's; outside
        those runs (a regular module's, or before and after ``fit``) it is left exactly as Lightning made it.
        """
        if isinstance(profiler, PassThroughProfiler):
            return
        if self._threads_recording == 0:
            for name in ("start", "stop"):
                setattr(profiler, name, _SerialisedProfilerCall(self, profiler, name))
        self._threads_recording += 1

    def thread_stopped_recording(self, profiler: Profiler) -> None:
        """The counterpart of ``thread_records_on``, once that thread has exited."""
        if isinstance(profiler, PassThroughProfiler):
            return
        self._threads_recording -= 1
        if self._threads_recording == 0:
            for name in ("start", "stop"):
                serialised = vars(profiler).pop(name)
                if serialised.replaced is not None:
                    setattr(profiler, name, serialised.replaced)

    def side_stream(self, trainer: pl.Trainer) -> Any:
        device = trainer.strategy.root_device
        if self.copy_stream is None and device.type == "cuda" and self.depth and self.transfer_ahead:
            # Why once per run: a new stream per epoch strands the caching allocator's per-stream blocks (timm #2781)
            self.copy_stream = torch.cuda.Stream(device)
        return self.copy_stream


# [RFC 16]
class _SerialisedProfilerCall:
    """The profiler's ``start`` or ``stop`` under the options' locks (``_Options.thread_records_on``).

    An object rather than a closure, so that a Trainer copied while a prefetch thread runs (a callback that deep-copies
    it) still pickles; the copy's calls take its own options' new locks.
    """

    def __init__(self, options: _Options, profiler: Profiler, name: str) -> None:
        self.options, self.name = options, name
        self.replaced = vars(profiler).get(name)  # the instance's own attribute, if it had one, restored afterwards
        self.unwrapped = self.replaced or functools.partial(getattr(type(profiler), name), profiler)

    def __call__(self, action: str) -> None:
        transfer, options = action.endswith(_TRANSFER_ACTIONS), self.options
        if self.name == "start":
            if transfer:
                options.transfer_actions_lock.acquire()
            with options.profiler_calls_lock:
                self.unwrapped(action)
            return
        try:
            with options.profiler_calls_lock:
                self.unwrapped(action)
        finally:
            if transfer:
                options.transfer_actions_lock.release()


class _InstallsPrefetchingFetcher:
    """What every loop of the design changes: the fetcher installed for a step taking ``dataloader_iter``."""

    trainer: pl.Trainer
    options: _Options
    step_name: str
    _drain_dataloader: Callable[[int], None] | None = None  # the drain calls at a dataloader's end, where drained
    prefetching: _PrefetchingIterFetcher | None = None
    """The installed fetcher if it is the design's (the step takes ``dataloader_iter``), else None.

    Why an attribute set with the fetcher: the loops ask on every batch, several times (Lightning calls
    ``_accumulated_batches_reached`` six times per batch); a type check there would be per-batch work that a regular
    module, which runs Lightning's own fetcher and path (C1), pays for nothing. The fetcher changes only in the
    setter below."""

    @property
    def counted_progress(self) -> _CountsConsumed:
        """The batch progress that counts consumed batches. Why a property: Lightning saves every progress object a
        loop holds as an attribute, and a checkpoint must hold what stock Lightning's loops hold (C1)."""
        return self.batch_progress  # type: ignore[attr-defined]

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
            fetcher.drain_dataloader = self._drain_dataloader
        self.__dict__["_data_fetcher"] = fetcher
        self.prefetching = fetcher if isinstance(fetcher, _PrefetchingIterFetcher) else None
        if fetcher is not None:
            self.counted_progress.counts_consumed = self.prefetching is not None

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        self.options.copy_stream = None


# [RFC 7]
class _PrefetchingEvaluationSteps(_InstallsPrefetchingFetcher):
    """The evaluation and prediction loops: Lightning's, with the design's fetcher and one call per dataloader."""

    def __init__(self, *args: Any, options: _Options, **kwargs: Any) -> None:
        self.options = options
        super().__init__(*args, **kwargs)
        # the counting twin of the class Lightning's loop chose (prediction keeps a `_Progress`, without is_last_batch)
        counting = _ConsumedBatchProgress if isinstance(self.batch_progress, _BatchProgress) else _ConsumedProgress
        self.batch_progress = counting()

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
            setattr(strategy, self.step_name, functools.partial(_step_call, self, getattr(strategy, self.step_name)))
        try:
            return super().run()  # type: ignore[misc]
        finally:
            if not outer_run_shadows:
                delattr(strategy, self.step_name)
            if isinstance(self._data_fetcher, _PrefetchingIterFetcher):
                self._data_fetcher.stop()  # Why: the prefetch thread must not outlive the evaluation run

    def _on_step_returned(self, output: Any, dataloader_idx: int, consumed: list[int], cut_short: bool) -> None:
        """After each step call, before its batch-end hooks; ``consumed``: the ``batch_idx`` of each batch it took."""


def _step_call(
    loop: _PrefetchingEvaluationSteps, step: Callable[..., Any], dataloader_iter: Any, *args: Any, **kwargs: Any
) -> Any:
    """An evaluation step call: the StopIteration at the end of its dataloader ends the call (returning None)."""
    if not isinstance(dataloader_iter, _StepIterator):
        return step(dataloader_iter, *args, **kwargs)
    fetcher = dataloader_iter._fetcher
    try:
        output = step(dataloader_iter, *args, **kwargs)
    except StopIteration:
        fetcher.step_stopped()
        output = None
    finally:
        fetcher.end_step_call()
    loop._on_step_returned(output, dataloader_iter.dataloader_idx, fetcher.step_batch_indices, fetcher.cut_short)
    return output


class _PrefetchingEvaluationLoop(StockProfilerActions, _PrefetchingEvaluationSteps, _EvaluationLoop):
    @property
    def step_name(self) -> str:
        return "test_step" if self.trainer.testing else "validation_step"

    def _drain_dataloader(self, dataloader_idx: int) -> None:
        """The drain calls at the end of a dataloader's batches (C17 for evaluation), before the loop moves on."""
        fetcher = self._data_fetcher

        def run_call() -> tuple[bool, Any]:
            # through the strategy, whose step ``run`` shadows with ``_step_call``: the call ends as any call does
            output = call._call_strategy_hook(self.trainer, self.step_name, fetcher.start_step_call())
            return fetcher.cut_short, output

        drain(self.trainer, functools.partial(evaluation_drain_call, self, dataloader_idx, run_call), self.step_name)


class _PrefetchingPredictionLoop(
    StockProfilerActions, PredictionWriterSeesStepCalls, _PrefetchingEvaluationSteps, _PredictionLoop
):
    step_name = "predict_step"

    def _predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int, dataloader_iter: Any) -> None:
        super()._predict_step(batch, batch_idx, dataloader_idx, dataloader_iter)
        fetcher = self.prefetching
        if fetcher is not None and fetcher.cut_short and self.return_predictions:
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
        return self.epoch_loop.batch_progress  # type: ignore[return-value]

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
        return self.prefetching.step_batch_size() if self.prefetching is not None else None

    def advance(self) -> None:
        try:
            super().advance()
        finally:
            # Why: the prefetch thread must not outlive the epoch, whether it ended, stopped early or raised.
            if self.prefetching is not None:
                self.prefetching.stop()

    def consumed_loader_states(self) -> list[dict] | None:
        return self.prefetching.loader_states if self.prefetching is not None else None
