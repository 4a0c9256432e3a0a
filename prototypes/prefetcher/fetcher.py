"""The data fetcher: keeps batches in flight on a :class:`~prototypes.prefetcher.queue.Prefetcher` and hands them
to one step call at a time, counting what the step consumed.

The prefetcher's three modules and what crosses between them:

- ``queue.Prefetcher`` owns the background thread and the bound on batches in flight. It knows nothing of
  Lightning: the fetcher gives it a ``produce()`` callable and takes results with ``get()`` / ``release()``.
- This module's fetcher owns the loader iterator, the batch peeked ahead, the loader state of the consumed batches
  and the record of the running step call (:class:`StepCall`). It is built from what it needs: the trainer, the
  design's :class:`~prototypes.prefetcher.options.Options`, the step's name and the batch progress it counts consumed
  batches in (``lightning_changes.CountsConsumed``); it imports no loop.
- ``loops`` installs the fetcher and runs the step calls. What the loops use of a fetcher is its public interface:
  Lightning's fetcher protocol (``iter``/``next``/``done``, ``setup``, ``reset``, ``teardown``), ``adopt()`` for
  an evaluation loop's started fetcher, ``call`` (the running or last step call, read-only to the loops),
  ``start_drain_call()`` and ``drain_calls()`` for drain calls, ``step_stopped()``, ``end_step_call()`` and
  ``data_ended_after_call()`` around a step, ``step_batches()`` for ``self.log``, ``loader_states`` for
  checkpoints, and ``stop()``.
"""


from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pytorch_lightning as pl
import torch
from lightning_fabric.utilities.data import sized_len
from lightning_utilities.core.apply_func import apply_to_collection
from pytorch_lightning.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher

from prototypes.common import (
    STOP_ITERATION_WITH_BATCHES_LEFT,
    BatchTransfer,
    NoProgressGuard,
    StepIterator,
    end_of_data_vote_needed,
    every_rank_has_a_batch,
)
from prototypes.lightning_changes import CountsConsumed, loader_state_reader
from prototypes.prefetcher.options import Options
from prototypes.prefetcher.queue import Prefetcher


@dataclass
class StepCall:
    """One step call as the fetcher saw it. The fetcher writes it; the loops only read it.

    ``index`` counts the epoch's step calls up to this one, drain calls included (gradient accumulation counts step
    calls). ``batches`` and ``batch_indices`` are what the call consumed, in order; ``cut_short``: the call ended in
    the StopIteration of its dataloader's end; ``drain``: a drain call (C17), which finds no batch left; ``open``: the
    call is running (a batch taken while none is open counts toward the next call).
    """

    index: int = 0
    drain: bool = False
    batches: list[Any] = field(default_factory=list)
    batch_indices: list[int] = field(default_factory=list)
    cut_short: bool = False
    open: bool = False

    @property
    def consumed(self) -> int:
        return len(self.batch_indices)


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


class _StepIterator(StepIterator):
    """The ``dataloader_iter`` handed to every step call over one dataloader (in training: of the epoch): its batches,
    consumed from the fetcher. Closed when the loop over that dataloader ends."""

    def __init__(self, fetcher: _PrefetchingIterFetcher, dataloader_idx: int) -> None:
        super().__init__(fetcher.hook_name)
        self._fetcher = fetcher
        self.dataloader_idx = dataloader_idx
        # Why bound here rather than a method calling it: one Python frame less on every next()
        self._take = functools.partial(fetcher.consume, dataloader_idx)

    def _has_next(self) -> bool:
        return not self._fetcher.done_for(self.dataloader_idx, vote=False)


class _PrefetchingIterFetcher(_DataLoaderIterDataFetcher):
    """Keeps up to ``options.depth`` batches in flight and hands them to the step through a ``_StepIterator``.

    Lightning's loop reads ``_batch``/``_batch_idx`` before the step (for ``on_train_batch_start``) and after it (for
    ``on_train_batch_end``), and ``done`` for ``is_last_batch``: here they describe the next batch to be consumed
    (peeked, not consumed), then the last batch consumed. ``fetched`` counts consumed batches, and so does
    ``progress`` (``count_consumed()``).
    """

    # the evaluation loops' drain calls at the end of a dataloader (C17); None in training, which drains in its loop.
    # Why on the class: an instance attribute fewer for the training fetcher (see the end of __init__)
    drain_dataloader: Callable[[int], None] | None = None

    def __init__(self, trainer: pl.Trainer, options: Options, hook_name: str, progress: CountsConsumed) -> None:
        super().__init__()
        self.trainer = trainer
        self.options = options
        self.hook_name = hook_name
        self.progress = progress
        options.side_stream(trainer)  # made here, on the loop's thread; None off CUDA / without background transfer
        self.prefetcher: Prefetcher | None = None
        self.call = StepCall()  # the running step call, or the last one
        self.no_progress = NoProgressGuard(self.hook_name)
        self._loader_states: list[dict] | None = None  # state matching the consumed batches
        # the batches and their batch_idx a pipeline's thread took between two calls: they count toward the next
        self._taken_between_calls: list[tuple[Any, int]] = []
        # Why a lock: a pipeline's own loading thread (TorchRec's DataLoadingThread) may call next() on the iterator
        # while the loop's thread peeks for the end of data between calls; both move the head
        self._lock = threading.RLock()
        self._head: _Produced | None = None  # the peeked next batch, already taken from the queue
        self._voted_before_call: int | None = None  # the step call the ranks last agreed to start
        # whether the ranks vote on the end of data: decided per epoch (_begin), off once they agreed it ended
        self._ranks_vote = True
        self._step_iterator: _StepIterator | None = None
        self._transfer_path: BatchTransfer | None = None  # per loop over the data (``_begin``)
        self._produced: int | None = None  # batches taken from the loader this epoch, on the producing thread
        self._resumed_at = 0  # the batch count the loader resumed at (after a checkpoint)
        self._read_loader_states = loader_state_reader(None)  # no loader until the loop over the data (``_begin``)
        # Why no more attributes (29 at most, with Lightning's): past that CPython keeps a real dict for the instance,
        # and every attribute lookup on the fetcher, many per batch, gets slower

    @property
    def loader_states(self) -> list[dict] | None:
        """The loaders' state as of the batches consumed: what a checkpoint records."""
        return self._loader_states

    @property
    def batch_idx(self) -> int:
        """The ``batch_idx`` of the next batch to be consumed before a step call, of the last one consumed after it."""
        return self._batch_idx

    @property
    def dataloader_idx(self) -> int:
        """The dataloader of the next batch to be consumed before a step call, of the last one consumed after it."""
        return self._dataloader_idx

    # ---- `done` is computed on demand: reading it may wait for the next batch (unsized loaders)
    @property
    def done(self) -> bool:
        # Why a fast path: the loop asks three times per call, mostly with the next batch peeked and no vote due; the
        # answer is then "not done" without the lock
        if self._head is not None and not (self._ranks_vote and self._vote_due()):
            return False
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
        self._produced, self._resumed_at = None, 0
        self._read_loader_states = loader_state_reader(self._combined_loader)
        self._ranks_vote = end_of_data_vote_needed(self.trainer, self._combined_loader.flattened)
        self._loader_states = self._read_loader_states()
        self._transfer_path = BatchTransfer(self.trainer)
        self.prefetcher = Prefetcher(self._produce, self.options.depth, name=f"prefetcher-{self.hook_name}")
        if self._thread_records_on_profiler:
            self.options.thread_records_on(self.trainer.profiler)
        return self

    def __next__(self) -> _StepIterator:
        """Called by the epoch loop before each step: the batch hooks see the batch the step will get first. At the
        end of an evaluation dataloader, first the loop's drain calls (``drain_dataloader``)."""
        head = self._peek_on_every_rank()
        ended = self._step_iterator
        if ended is not None and head is not None and head.dataloader_idx == ended.dataloader_idx:
            ended = None
        if ended is not None and self.drain_dataloader is not None and not self.call.cut_short:
            # Why here, not after the step that took the last batch: a pipeline's own thread may take it between
            # the calls, after any earlier check; this is the last point before the loop moves on
            self.drain_dataloader(ended.dataloader_idx)
            self._close_iterator()  # the loop over that dataloader ended (C14 a)
            head = self._peek_on_every_rank()
        if head is None:
            raise StopIteration
        if self.call.index:
            self.no_progress.step_returned(len(self.call.batch_indices))  # what the previous call consumed
        self._batch, self._batch_idx, self._dataloader_idx = head.batch, head.batch_idx, head.dataloader_idx
        return self._start_step_call()

    @property
    def _thread_records_on_profiler(self) -> bool:
        """Whether this fetcher's prefetch thread may record the transfer hooks on the profiler."""
        return bool(self.options.depth) and self.options.transfer_ahead

    def _start_step_call(self, drain: bool = False) -> _StepIterator:
        """The iterator for a new step call: the one of the current dataloader, made when the loop reaches it (C14 a).
        Batches a pipeline's thread took since the previous call count toward this one."""
        with self._lock:
            iterator = self._step_iterator
            if iterator is None or iterator.dataloader_idx != self._dataloader_idx:
                self._close_iterator()  # the loop over the previous dataloader ended
                iterator = self._step_iterator = _StepIterator(self, self._dataloader_idx)
            self.call = StepCall(self.call.index + 1, drain, open=True)
            if self._taken_between_calls:  # a pipeline's thread took batches since the previous call
                for batch, batch_idx in self._taken_between_calls:
                    self.call.batches.append(batch)
                    self.call.batch_indices.append(batch_idx)
                self._taken_between_calls = []
        return iterator

    def start_drain_call(self) -> _StepIterator:
        """A drain call's iterator (inside ``drain_calls()``): it finds no batch left."""
        return self._start_step_call(drain=True)

    @contextlib.contextmanager
    def drain_calls(self) -> Iterator[None]:
        """While the loop makes drain calls (C17). Afterwards ``call`` is again the call that took the epoch's last
        batch: the validation interval and a checkpoint look at its batches, not a drain call's."""
        last = self.call
        try:
            yield
        finally:
            index = self.call.index
            self.call = last
            self.call.index = index  # the drain calls were step calls too

    def end_step_call(self) -> None:
        """The step call returned; its iterator stays valid until the loop over its dataloader ends."""
        self.call.open = False

    def data_ended_after_call(self) -> bool:
        """The step call returned (a ``next()`` until the next call counts toward that one): whether the data ended.
        Why after closing the call: between two calls ``done`` is the ranks' vote (C16)."""
        self.end_step_call()
        return self.done

    def done_for(self, dataloader_idx: int, vote: bool = True) -> bool:
        """No batch of ``dataloader_idx`` is left: an iterator never spans two dataloaders (C15). ``vote``: the ranks
        may vote on the end here (only the loop's thread asks with it)."""
        with self._lock:  # Why: the peek may take from the queue
            return self._head_of(dataloader_idx, self._peek_on_every_rank() if vote else self._peek()) is None

    @staticmethod
    def _head_of(dataloader_idx: int, head: _Produced | None) -> _Produced | None:
        """``head`` if it is a batch of ``dataloader_idx``: an iterator never spans two dataloaders (C15)."""
        return head if head is not None and head.dataloader_idx == dataloader_idx else None

    def consume(self, dataloader_idx: int) -> tuple[Any, int, int]:
        """Hand the next batch to the step: counted, its loader state becomes the one a checkpoint records. Between
        step calls (a pipeline's thread pulling ahead) it counts toward the next call."""
        with self._lock:
            head = self._head_of(dataloader_idx, self._peek())
            if head is None:
                raise StopIteration
            self._head = None
            self.prefetcher.release()
            self.fetched += 1
            self._loader_states = head.loader_states
            if self.call.open:
                self._batch, self._batch_idx, self._dataloader_idx = head.batch, head.batch_idx, head.dataloader_idx
                self.call.batches.append(head.batch)
                self.call.batch_indices.append(head.batch_idx)
            else:
                self._taken_between_calls.append((head.batch, head.batch_idx))
            self.progress.count_consumed()
        return head.batch, head.batch_idx, head.dataloader_idx

    def step_stopped(self) -> None:
        """The step call raised StopIteration: at its dataloader's end that ends the call; elsewhere it is an error."""
        if self._step_iterator is not None and not self._step_iterator.done:
            raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step=self.hook_name)) from None
        self.call.cut_short = True

    def _close_iterator(self) -> None:
        if self._step_iterator is not None:
            self._step_iterator.close()
            self._step_iterator = None

    def step_batches(self) -> list[Any]:
        """What ``self.log``'s batch size counts: the batches the current step call consumed, or before its first
        next() the batch it will get (a drain call gets none)."""
        if self.call.batches or self.call.drain or self._batch is None:
            return self.call.batches
        return [self._batch]

    def _peek_on_every_rank(self) -> _Produced | None:
        """The next batch, or None once this rank's data or (under DDP) any rank's data has ended.

        Why: a rank that stopped alone would leave its peers blocked in the step's gradient all-reduce (Accelerate
        #2258). The ranks vote once between two step calls (whoever asks first: ``done`` or the next call), so all
        end the epoch at the same call, dropping what longer shards still hold. Why not inside a call: a step need
        not pull on every rank (a Megatron-style pipeline stage after the first only receives activations), and a
        vote it does not join would block the ranks that pull. Loaders that give every rank the same number of
        batches need no vote.
        """
        with self._lock:
            head = self._peek()
            if not (self._ranks_vote and self._vote_due()):
                return head
            self._voted_before_call = self.call.index
            if every_rank_has_a_batch(self.trainer, head is not None):
                return head
            # Why stop voting: every rank ended at this call; a rank asking again must not wait for a vote
            self._head, self._exhausted, self._ranks_vote = None, True, False
            return None

    def _vote_due(self) -> bool:
        """Where the ranks vote at all (``_ranks_vote``: loaders that can end unevenly, ``end_of_data_vote_needed``),
        whether they vote now: between two calls, once per call. Why the callers check ``_ranks_vote`` first: it is
        off for most runs, and they ask on every batch."""
        return not self.call.open and self._voted_before_call != self.call.index

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
                self._loader_states = end.loader_states
            return None
        finally:
            if profiled:
                self._stop_profiler()
        if produced.ready is not None:
            # Why (sync point): the compute stream must not read the batch before the side stream's copies finish,
            # and the allocator must not hand these buffers back to the side stream while the step still uses them.
            compute_stream = torch.cuda.current_stream(self.options.copy_stream.device)
            compute_stream.wait_event(produced.ready)
            for tensor in _cuda_tensors(produced.batch):
                tensor.record_stream(compute_stream)
        if not self.options.transfer_ahead:
            produced = produced._replace(batch=self._transfer(produced.batch, produced.dataloader_idx))
        return produced

    def _produce(self) -> _Produced:
        """Load one batch and (optionally) transfer it; on the prefetch thread unless depth is 0 (or "auto" dropped
        it)."""
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
            raise _LoaderExhausted(self._read_loader_states()) from None
        self._produced += 1
        # Why add: the combined loader counts from 0 again after a resume (and for each evaluation dataloader)
        batch_idx = self._resumed_at + loader_batch_idx
        if self.length is not None and self._produced > self.length:
            raise _LoaderExhausted(None)  # a loader yielding more than its length says: Lightning stops at its length
        states = self._read_loader_states()  # snapshot on the thread that drives the loader: consistent
        ready, copy_stream = None, self.options.copy_stream
        if self.options.transfer_ahead and copy_stream is not None:
            # Why set the device: a new thread starts on device 0, whatever device this rank trains on.
            with torch.cuda.device(copy_stream.device), torch.cuda.stream(copy_stream):
                batch = self._transfer(batch, dataloader_idx, pin=True)
                ready = copy_stream.record_event()
        elif self.options.transfer_ahead:
            batch = self._transfer(batch, dataloader_idx)
        return _Produced(batch, batch_idx, dataloader_idx, states, ready)

    def _transfer(self, batch: Any, dataloader_idx: int, pin: bool = False) -> Any:
        """The regular flavour's transfer path, possibly on the prefetch thread: the user's hooks must be thread-safe.

        Why pin: a copy from pageable memory is synchronous even with ``non_blocking=True`` (apex #304).
        """
        pinning = functools.partial(apply_to_collection, dtype=torch.Tensor, function=_pinned) if pin else None
        return self._transfer_path(batch, dataloader_idx, pin=pinning)

    def _limited(self) -> bool:
        """Whether a ``limit_*_batches`` cuts any loader short of its length."""
        loader = self._combined_loader
        limits = loader.limits or []
        return any(limit < (sized_len(dl) or float("inf")) for dl, limit in zip(loader.flattened, limits, strict=False))


    def stop(self) -> None:
        """Stop producing (idempotent): the thread exits; batches produced but not consumed are dropped. The loop over
        the data ended: the step's iterator hands out nothing more (C14 a)."""
        self._close_iterator()
        self.call.open, self._taken_between_calls = False, []
        if self.prefetcher is not None:
            self.prefetcher.shutdown()
            self.prefetcher = None
            if self._thread_records_on_profiler:  # the thread has exited
                self.options.thread_stopped_recording(self.trainer.profiler)
        self._head = None
        # Why: it holds the run's hooks and profiler wrappers, which a Trainer pickled after fit (C1) must not carry
        self._transfer_path = None

    def reset(self) -> None:
        super().reset()
        self.call = StepCall()
        self.no_progress = NoProgressGuard(self.hook_name)
        self._voted_before_call = None

    def teardown(self) -> None:
        self.stop()  # before Lightning resets the loaders: the thread may be inside next() on them
        super().teardown()



def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory() if tensor.device.type == "cpu" and not tensor.is_pinned() else tensor


def _cuda_tensors(batch: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, lambda t: tensors.append(t) if t.is_cuda else None)
    return tensors
