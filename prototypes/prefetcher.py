"""``prefetcher``: Lightning 2.6's loops with a data fetcher that keeps batches in flight and counts consumed batches.

User code::

    class Model(LightningModule):
        def training_step(self, dataloader_iter):
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # already on self.device
            loss = self.model(batch).mean()
            self.log("loss", loss)  # batch_size inferred from the batch the step received
            return loss

        def validation_step(self, dataloader_iter):  # also test_step, predict_step: one call, one dataloader
            batch, batch_idx, dataloader_idx = next(dataloader_iter)  # StopIteration at this dataloader's end

    trainer = IMPLEMENTATIONS["prefetcher"].trainer(max_epochs=1)                   # depth=2
    trainer = IMPLEMENTATIONS["prefetcher"].variant(depth=4).trainer(max_epochs=1)  # or 0 = no background work
    trainer.fit(Model(), train_dataloaders=loader)

Options: ``depth`` (default 2) is the most batches produced ahead of the step; ``0`` produces each batch on the
main thread when it is needed. ``transfer_ahead`` (default True) runs the batch-transfer hooks in the background
with the loading; ``False`` leaves them on the main thread, applied as a batch is taken from the queue.

One background thread per epoch (and per evaluation run) loads batches and applies the transfer hooks; on CUDA it
also pins them and copies them on a side stream created once per fit. The step's ``dataloader_iter`` draws from that queue; batch progress,
``batch_idx``, ``done``, the hooks' batch and the loader state a checkpoint records all follow the batches the step
consumed, never the ones merely prefetched. Evaluation steps get the same fetcher; a step call's iterator ends
(``done``, then StopIteration) at its dataloader's last batch and the next dataloader starts a new call. The regular
flavour keeps Lightning's own fetcher. After the step call that took the epoch's last batch, drain calls (``done``
True on entry) let a pipelining step train the batches it holds (clause C17).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.data import sized_len
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.loops.evaluation_loop import _EvaluationLoop
from pytorch_lightning.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher
from pytorch_lightning.loops.optimization.automatic import _AutomaticOptimization
from pytorch_lightning.loops.prediction_loop import _PredictionLoop
from pytorch_lightning.loops.progress import _BatchProgress
from pytorch_lightning.profilers import PassThroughProfiler, Profiler
from pytorch_lightning.utilities.data import extract_batch_size

from prototypes.common import (
    ITERATOR_USED_AFTER_ITS_STEP,
    STOP_ITERATION_WITH_BATCHES_LEFT,
    Design,
    NoProgressGuard,
    every_rank_has_a_batch,
    refuse_mixed_step_signature,
    takes_dataloader_iter,
)
from prototypes.lightning_changes import (
    BatchCountingEpochLoop,
    BatchCountingFitLoop,
    ManualOptimizationSeesStopIteration,
    StockProfilerActions,
    drain,
    epoch_stopped_early,
    install_loops,
    loader_states,
    supply_log_batch_size,
)

_POLL_S = 0.1  # how often a blocked producer or consumer re-checks that the other side is still there


# ------------------------------------------------------------------------------------------------ the queue
class _Failure(NamedTuple):
    error: BaseException


class Prefetcher:
    """Runs ``produce()`` ahead of the consumer on one thread, at most ``depth`` results not yet released.

    Modelled on torchdata.nodes ``Prefetcher``: a semaphore bounds what is in flight, and a StopIteration or an
    exception raised by ``produce()`` travels through the queue and is raised from ``get()`` (the same object, so
    its type and traceback are the original ones). ``release()`` frees one slot once the consumer is done with a
    result. ``depth=0`` starts no thread: ``get()`` calls ``produce()`` itself. ``shutdown()`` is idempotent and
    returns once the thread has exited; a ``produce()`` call already running is allowed to finish.
    """

    def __init__(self, produce: Callable[[], Any], depth: int, name: str = "prefetcher") -> None:
        if not isinstance(depth, int) or depth < 0:
            raise ValueError(f"prefetch depth must be an int >= 0 (0 = no background work), got {depth!r}")
        self._produce = produce
        self._slots = threading.BoundedSemaphore(depth) if depth else None
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._finished = False  # the consumer has seen the end or a failure: nothing more will come
        self._thread = threading.Thread(target=self._run, name=name, daemon=True) if depth else None

    def start(self) -> None:
        if self._thread is not None and self._thread.ident is None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Why a timeout: a consumer that stopped early never releases, so the wait must notice shutdown.
            if not self._slots.acquire(timeout=_POLL_S):
                continue
            try:
                self._results.put(self._produce())
            except BaseException as error:  # StopIteration included: the consumer re-raises whatever ended us
                self._results.put(_Failure(error))
                return

    def get(self) -> Any:
        """The next result; raises what ``produce()`` raised (StopIteration at the end), then keeps raising it."""
        if self._finished:
            raise StopIteration
        if self._thread is None:
            try:
                return self._produce()
            except BaseException:
                self._finished = True
                raise
        self.start()
        while True:
            try:
                result = self._results.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._results.empty():
                    raise RuntimeError("the prefetch thread was shut down; this iterator is closed") from None
        if isinstance(result, _Failure):
            self._finished = True
            raise result.error
        return result

    def release(self) -> None:
        """The consumer is done with one result: the producer may make another."""
        if self._thread is not None:
            self._slots.release()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


# ------------------------------------------------------------------------------------------------ the fetcher
class _Produced(NamedTuple):
    batch: Any
    batch_idx: int
    dataloader_idx: int
    loader_states: list[dict] | None  # the loaders' state right after this batch: what a checkpoint records
    ready: torch.cuda.Event | None  # recorded on the side stream after the copies of this batch


class _LoaderExhausted(StopIteration):
    """The epoch's data ended; carries the loaders' state after their end, or None when a limit cut them short."""

    def __init__(self, loader_states: list[dict] | None) -> None:
        super().__init__()
        self.loader_states = loader_states


class _StepIterator(Iterator):
    """The ``dataloader_iter`` handed to one step call: the batches of one dataloader; closed once the call is over."""

    def __init__(self, fetcher: _PrefetchingIterFetcher, dataloader_idx: int) -> None:
        self._fetcher = fetcher
        self.dataloader_idx = dataloader_idx
        self._open = True
        self.saw_end = False  # next() was called with no batch left: the step knows the data ended

    def __next__(self) -> tuple[Any, int, int]:
        if not self._open:
            raise RuntimeError(ITERATOR_USED_AFTER_ITS_STEP.format(step=self._fetcher.hook_name))
        try:
            return self._fetcher.consume(self.dataloader_idx)
        except StopIteration:
            self.saw_end = True
            raise

    @property
    def done(self) -> bool:
        """True once the last batch of this dataloader (in training: of the epoch) has been handed out."""
        return self._fetcher.done_for(self.dataloader_idx)

    def close(self) -> None:
        self._open = False


class _PrefetchingIterFetcher(_DataLoaderIterDataFetcher):
    """Keeps up to ``depth`` batches in flight and hands them to the step through a ``_StepIterator``.

    Lightning's loop reads ``_batch``/``_batch_idx`` before the step (for ``on_train_batch_start``) and after it (for
    ``on_train_batch_end``), and ``done`` for ``is_last_batch``: here they describe the next batch to be consumed
    (peeked, not consumed), then the last batch consumed. ``fetched`` counts consumed batches.
    """

    def __init__(self, loop: _InstallsPrefetchingFetcher) -> None:
        super().__init__()
        self.trainer = loop.trainer
        self.options = loop.options
        self.hook_name = loop.step_name
        self.progress = loop.counted_progress
        self.depth = loop.options.depth
        self.transfer_ahead = loop.options.transfer_ahead
        self.copy_stream = loop.options.side_stream(self.trainer)  # None off CUDA / without background transfer
        self.prefetcher: Prefetcher | None = None
        self.step_calls = 0  # step calls this epoch: what gradient accumulation counts
        self.consumed_in_step = 0
        self.cut_short = False  # the current step call ended in the StopIteration of its dataloader's end
        self.step_saw_end = False  # the last step call was cut short or called next() past the last batch
        self.draining = False  # the epoch's data ended and the step is called for the batches it holds (C17)
        self.no_progress = NoProgressGuard(self.hook_name)
        self.step_batches: list[Any] = []  # what the current step call consumed: `self.log` infers batch_size from it
        self.loader_states: list[dict] | None = None  # state matching the consumed batches
        self._head: _Produced | None = None  # the peeked next batch, already taken from the queue
        self._agreed_head: _Produced | None = None  # the head every rank has a batch for
        self._ended_on_every_rank = False
        self._step_iterator: _StepIterator | None = None

    # ---- `done` is computed on demand: reading it may wait for the next batch (unsized loaders)
    @property
    def done(self) -> bool:
        return self._peek_on_every_rank() is None

    @done.setter
    def done(self, exhausted: bool) -> None:  # Lightning's reset() declares an empty loader exhausted
        self._exhausted = exhausted

    def __iter__(self) -> _PrefetchingIterFetcher:
        self.stop()
        _DataFetcher.__iter__(self)  # a fresh loader iterator (workers start here, as in stock Lightning)
        return self._begin()

    def adopt(self, started: _DataFetcher) -> _PrefetchingIterFetcher:
        """Take over the loader iterator of Lightning's fetcher, which the evaluation loops set up and iterate
        before installing it (``_EvaluationLoop.reset``). Why: iterating again would start the workers twice."""
        self.stop()
        self.setup(started.combined_loader)
        self.iterator = started.iterator
        self.reset()
        self.fetched, self._start_profiler, self._stop_profiler = (
            started.fetched, started._start_profiler, started._stop_profiler
        )
        return self._begin()

    def _begin(self) -> _PrefetchingIterFetcher:
        self._produced: int | None = None  # batches taken from the loader this epoch, on the producing thread
        self._resumed_at = 0
        self.loader_states = loader_states(self._combined_loader)
        self.prefetcher = Prefetcher(self._produce, self.depth, name=f"prefetcher-{self.hook_name}")
        return self

    def __next__(self) -> _StepIterator:
        """Called by the epoch loop before each step: the batch hooks see the batch the step will get first."""
        head = self._peek_on_every_rank()
        if head is None:
            raise StopIteration
        if self.step_calls:
            self.no_progress.step_returned(self.consumed_in_step)  # of the previous call
        self._batch, self._batch_idx, self._dataloader_idx = head.batch, head.batch_idx, head.dataloader_idx
        return self.start_step_call()

    def start_step_call(self) -> _StepIterator:
        """A new step call's iterator; called directly for a drain call, which finds no batch left."""
        self.close_step()
        self.step_calls += 1
        self.consumed_in_step = 0
        self.cut_short = False
        self.step_batches = []
        self._step_iterator = _StepIterator(self, self._dataloader_idx)
        return self._step_iterator

    def done_for(self, dataloader_idx: int) -> bool:
        """No batch of ``dataloader_idx`` is left: a step call's iterator never spans two dataloaders (C15)."""
        head = self._peek_on_every_rank()
        return head is None or head.dataloader_idx != dataloader_idx

    def consume(self, dataloader_idx: int) -> tuple[Any, int, int]:
        """Hand the next batch to the step: counted, its loader state becomes the one a checkpoint records."""
        if self.done_for(dataloader_idx):
            raise StopIteration
        head, self._head = self._head, None
        self.prefetcher.release()
        self.fetched += 1
        self.consumed_in_step += 1
        self.loader_states = head.loader_states
        self._batch, self._batch_idx, self._dataloader_idx = head.batch, head.batch_idx, head.dataloader_idx
        self.step_batches.append(head.batch)
        self.progress.count_consumed()
        return head.batch, head.batch_idx, head.dataloader_idx

    def step_stopped(self) -> None:
        """The step call raised StopIteration: at its dataloader's end that ends the call; elsewhere it is an error."""
        if self._step_iterator is not None and not self._step_iterator.done:
            raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step=self.hook_name)) from None
        self.cut_short = True

    def close_step(self) -> None:
        if self._step_iterator is not None:
            self._step_iterator.close()
            self.step_saw_end = self.cut_short or self._step_iterator.saw_end
            self._step_iterator = None

    def step_batch_size(self) -> int:
        """Samples the current step call consumed (before its first next(): the batch it will get)."""
        batches = self.step_batches or ([self._batch] if self._batch is not None else [])
        return sum(extract_batch_size(batch) for batch in batches) if batches else 1

    def _peek_on_every_rank(self) -> _Produced | None:
        """The next batch, or None once this rank's data or (under DDP) any rank's data has ended.

        Why: a rank that stopped alone would leave its peers blocked in the step's gradient all-reduce (Accelerate
        #2258). The ranks vote once per batch (when it first becomes the next one) and once at the end, so every
        rank votes the same number of times whoever reads ``done`` how often; all end the epoch together, dropping
        what longer shards still hold.
        """
        if self._ended_on_every_rank:
            return None
        head = self._peek()
        if head is not None and head is self._agreed_head:
            return head
        if every_rank_has_a_batch(self.trainer, head is not None):
            self._agreed_head = head
            return head
        self._head, self._exhausted, self._ended_on_every_rank = None, True, True
        return None

    def _peek(self) -> _Produced | None:
        if self._head is None and not self._exhausted:
            self._head = self._take()
        return self._head

    def _take(self) -> _Produced | None:
        if self.prefetcher is None:
            raise RuntimeError("the epoch's prefetching has stopped; no more batches are handed out in this epoch")
        # Why not profile a take known to find the end: the `*_next` action records one fetch per batch (C1)
        profiled = self.length is None or self.fetched < self.length
        if profiled:
            self._start_profiler()
        try:
            produced = self.prefetcher.get()
        except _LoaderExhausted as end:
            self._exhausted = True
            if end.loader_states is not None:  # Why: nothing unconsumed is left: resume from the exhausted state
                self.loader_states = end.loader_states
            return None
        finally:
            if profiled:
                self._stop_profiler()
        if produced.ready is not None:
            # Why (sync point): the compute stream must not read the batch before the side stream's copies finish,
            # and the allocator must not hand these buffers back to the side stream while the step still uses them.
            compute_stream = torch.cuda.current_stream(self.copy_stream.device)
            compute_stream.wait_event(produced.ready)
            for tensor in _cuda_tensors(produced.batch):
                tensor.record_stream(compute_stream)
        if not self.transfer_ahead:
            produced = produced._replace(batch=self._transfer(produced.batch, produced.dataloader_idx))
        return produced

    def _produce(self) -> _Produced:
        """Load one batch and (optionally) transfer it; runs on the prefetch thread unless depth is 0."""
        if self._produced is None:  # the first call: after a resume the loader continues at the restored batch
            self._produced = self._resumed_at = self.fetched
        if self.length is not None and self._produced >= self.length and self._limited():
            # Why not read on: the combined loader does not stop at a `limit_*_batches`, and a limit must bound
            # what is read (a streaming source consumes what is read), not only what is trained
            raise _LoaderExhausted(None)
        try:
            # Past Lightning's length of an unlimited loader this finds its end: a loader that ended yields the state
            # that makes a resumed run start the next epoch rather than an empty rest of this one.
            batch, loader_batch_idx, dataloader_idx = next(self.iterator)
        except StopIteration:
            raise _LoaderExhausted(loader_states(self._combined_loader)) from None
        self._produced += 1
        # Why add: the combined loader counts from 0 again after a resume (and for each evaluation dataloader)
        batch_idx = self._resumed_at + loader_batch_idx
        if self.length is not None and self._produced > self.length:
            raise _LoaderExhausted(None)  # a loader yielding more than its length says: Lightning stops at its length
        states = loader_states(self._combined_loader)  # snapshot on the thread that drives the loader: consistent
        ready = None
        if self.transfer_ahead and self.copy_stream is not None:
            # Why set the device: a new thread starts on device 0, whatever device this rank trains on.
            with torch.cuda.device(self.copy_stream.device), torch.cuda.stream(self.copy_stream):
                batch = self._transfer(batch, dataloader_idx, pin=True)
                ready = self.copy_stream.record_event()
        elif self.transfer_ahead:
            batch = self._transfer(batch, dataloader_idx)
        return _Produced(batch, batch_idx, dataloader_idx, states, ready)

    def _transfer(self, batch: Any, dataloader_idx: int, pin: bool = False) -> Any:
        """What Lightning's regular flavour does to a batch before the step, calling the hooks directly.

        Why not ``trainer._call_lightning_module_hook``: it sets ``module._current_fx_name``, which the main thread's
        ``self.log`` reads. The user's hooks must be thread-safe. They are profiled under the regular flavour's
        action names (:meth:`_Options.profiled`), on the thread that runs them.
        """
        trainer = self.trainer
        selector = trainer._data_connector._datahook_selector
        profiled = functools.partial(self.options.profiled, trainer)

        def hook(name: str) -> Callable[..., Any]:
            instance = selector.get_instance(name)
            kind = "LightningModule" if isinstance(instance, pl.LightningModule) else "LightningDataModule"
            return profiled(f"[{kind}]{type(instance).__name__}.{name}")(getattr(instance, name))

        batch = trainer.precision_plugin.convert_input(batch)
        batch = hook("on_before_batch_transfer")(batch, dataloader_idx)
        if pin:  # Why: a copy from pageable memory is synchronous even with non_blocking=True (apex #304)
            batch = apply_to_collection(batch, torch.Tensor, _pinned)

        @profiled(f"[Strategy]{type(trainer.strategy).__name__}.batch_to_device")
        def batch_to_device(batch: Any) -> Any:
            batch = hook("transfer_batch_to_device")(batch, trainer.strategy.root_device, dataloader_idx)
            return hook("on_after_batch_transfer")(batch, dataloader_idx)

        return batch_to_device(batch)

    def _limited(self) -> bool:
        """Whether a ``limit_*_batches`` cuts any loader short of its length."""
        loader = self._combined_loader
        limits = loader.limits or []
        return any(limit < (sized_len(dl) or float("inf")) for dl, limit in zip(loader.flattened, limits))


    def stop(self) -> None:
        """Stop producing (idempotent): the thread exits; batches produced but not consumed are dropped."""
        self.close_step()
        if self.prefetcher is not None:
            self.prefetcher.shutdown()
            self.prefetcher = None
        self._head = None

    def reset(self) -> None:
        super().reset()
        self.step_calls = self.consumed_in_step = 0
        self.no_progress = NoProgressGuard(self.hook_name)
        self._agreed_head, self._ended_on_every_rank = None, False

    def teardown(self) -> None:
        self.stop()  # before Lightning resets the loaders: the thread may be inside next() on them
        super().teardown()


# ------------------------------------------------------------------------------------------------ the loops
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
        # Why here, before the epoch-end validation of `on_advance_end`: batches a pipelining step still holds
        # belong to this epoch's training (C17)
        data_ended = self.batch_progress.is_last_batch and not epoch_stopped_early(self.trainer)
        if every_rank_has_a_batch(self.trainer, data_ended and not fetcher.step_saw_end):
            self._drain_held_batches(fetcher)

    def _drain_held_batches(self, fetcher: _PrefetchingIterFetcher) -> None:
        fetcher.draining = True
        try:
            drain(self.trainer, functools.partial(self._drain_call, fetcher))
        finally:
            fetcher.draining = False

    def _drain_call(self, fetcher: _PrefetchingIterFetcher) -> bool:
        """One drain call: no batch, so no batch hooks; logging and optimisation as for any step call."""
        trainer = self.trainer
        kwargs = OrderedDict(any=fetcher.start_step_call())
        steps_before = trainer.global_step
        trainer._logger_connector.on_batch_start(None)
        with trainer.profiler.profile("run_training_batch"):
            if trainer.lightning_module.automatic_optimization:
                self.automatic_optimization.run(trainer.optimizers[0], fetcher._batch_idx, kwargs)
            else:
                self.manual_optimization.run(kwargs)
        trainer._logger_connector.on_batch_end()
        if trainer.global_step > steps_before:  # a call that only saw the end stepped no optimizer
            self.update_lr_schedulers("step", update_plateau_schedulers=False)
        trainer._logger_connector.update_train_step_metrics()
        return fetcher.step_saw_end


# the profiler actions of a batch's transfer, as Lightning names them (`[<kind>]<class>.<hook>`)
_TRANSFER_ACTIONS = (
    ".on_before_batch_transfer", ".transfer_batch_to_device", ".on_after_batch_transfer", ".batch_to_device"
)


@dataclass
class _Options:
    """The design's options and the CUDA side stream, shared by one trainer's loops."""

    depth: int
    transfer_ahead: bool
    copy_stream: Any = None
    transfer_actions_lock: threading.RLock = field(default_factory=threading.RLock)
    profiler_calls_lock: threading.Lock = field(default_factory=threading.Lock)

    @staticmethod
    def profiled(trainer: pl.Trainer, action: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Wraps a function so each call is recorded as ``action`` by the trainer's profiler, as Lightning records
        the hooks it calls itself."""

        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            if isinstance(trainer.profiler, PassThroughProfiler):
                return function

            @functools.wraps(function)
            def call(*args: Any) -> Any:
                with trainer.profiler.profile(action):
                    return function(*args)

            return call

        return wrap

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


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory() if tensor.device.type == "cpu" and not tensor.is_pinned() else tensor


def _cuda_tensors(batch: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, lambda t: tensors.append(t) if t.is_cuda else None)
    return tensors


def _make_trainer(trainer_kwargs: dict[str, Any], depth: int = 2, transfer_ahead: bool = True) -> pl.Trainer:
    if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
        raise ValueError(f"prefetcher: `depth` must be an int >= 0 (0 = no background work), got {depth!r}")
    trainer, options = pl.Trainer(**trainer_kwargs), _Options(depth, transfer_ahead)
    options.serialise_profiler_calls(trainer.profiler)
    return install_loops(
        trainer,
        fit_loop=_PrefetchingFitLoop,
        epoch_loop=_PrefetchingEpochLoop,
        evaluation_loop=_PrefetchingEvaluationLoop,
        prediction_loop=_PrefetchingPredictionLoop,
        options=options,
    )


DESIGN = Design(
    name="prefetcher",
    summary="Lightning's loops with a fetcher that prefetches `depth` batches on a thread and counts consumed ones",
    make_trainer=_make_trainer,
    options={"depth": 2},
    suite_variants=({"depth": 0}, {"depth": 1}, {"depth": 4}),
    prefetch_depth_option="depth",
    promised_s1_efficiency={"L=C": 0.8, "L=0.5C": 0.5, "L=2C": 0.5},
    promised_s4_efficiency_at_depth={4: 0.5, 8: 0.5},
)
