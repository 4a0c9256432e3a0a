"""The data fetcher: the seam Lightning's loops see. It hands batches to one step call at a time and counts what the
step consumed, delegating to the pieces that run each on one thread.

The prefetcher's pieces and the thread each runs on:

- ``producer.BatchProducer`` (the step's thread; the prefetch thread where one runs): reads the loader, applies
  limits and the resume offset, snapshots the loader state per batch, transfers. It knows no loop.
- ``step_calls.EpochStepCalls`` (the loop's thread): the record of one loop over the data's step calls: the peeked
  head, the ranks' vote, the running call, batches taken between calls, drain calls.
- This module (the loop's thread), one fetcher in three parts: ``_PrefetchingIterFetcher``, Lightning's fetcher
  protocol (``iter``/``next``/``done``, ``setup``, ``reset``, ``teardown``) and ``consumed_loader_states`` for
  checkpoints; ``_StepCallHandOut``, the step's iterator and the step calls: ``consume()`` (a batch handed out),
  ``step_stopped()``, ``end_step_call()``, ``backward_ended()``, ``data_ended_after_call()``,
  ``step_batches()`` for ``self.log``;
  ``_LoaderIteratorLifecycle``, the loader iterator under a loop over the data: ``adopt()`` for an evaluation loop's
  started fetcher, the producer, ``stop()``. The loops read and drive the running call through ``calls``.
  It is built from what it needs: the trainer, the step's name, the batch progress it counts consumed batches in,
  the evaluation loops' drain calls and the drain rule; it imports no loop.
- ``threaded.ThreadedIterFetcher``: the same fetcher with the opt-in prefetch thread (``prefetch_thread``) between
  the producer and the hand-out; it overrides the four methods that reach the producer (``_start_producing``,
  ``_next_produced``, ``take_ahead``, ``_stop_producing``) and ``consume``, nothing else.
"""


from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loops.fetchers import _DataFetcher, _DataLoaderIterDataFetcher
from typing_extensions import override

from prototypes.common import STOP_ITERATION_WITH_BATCHES_LEFT, BatchTransfer, StepIterator, warn_declined
from prototypes.lightning_changes import CountsConsumed
from prototypes.prefetcher.producer import BatchProducer, LoaderExhausted, Produced
from prototypes.prefetcher.step_calls import EpochStepCalls
from prototypes.ranks import VoteInGradients, end_of_data_vote_needed
from prototypes.step_calls import PULLED_AHEAD


class FetcherStepIterator(StepIterator):
    """The ``dataloader_iter`` handed to every step call over one dataloader (in training: of the epoch): its batches,
    consumed from the fetcher. Closed when the loop over that dataloader ends."""

    def __init__(self, fetcher: _PrefetchingIterFetcher, dataloader_idx: int) -> None:
        super().__init__(fetcher.hook_name)
        self._fetcher = fetcher
        self.dataloader_idx = dataloader_idx
        # Why bound here rather than a method calling it: one Python frame less on every next()
        self._take = functools.partial(fetcher.consume, dataloader_idx)

    @property
    def fetched(self) -> int:
        """The batches handed out so far in this loop over the data, as Lightning's iterator told."""
        return self._fetcher.fetched

    @property
    def length(self) -> int | None:
        """The data's length as Lightning counts it (None where unsized), as Lightning's iterator told."""
        return self._fetcher.length

    @override
    def _has_next(self) -> bool:
        return not self._fetcher.done_for(self.dataloader_idx, vote=False)

    @override
    def _available(self, count: int) -> int:
        fetcher = self._fetcher
        calls = fetcher.calls
        with calls.lock:
            available = calls.available(count, self.dataloader_idx, fetcher.take_ahead)
            if available < count and calls.call.open:
                calls.call.fewer_left = available
        return available


class _StepCallHandOut:
    """The fetcher's hand-out to the step calls (the loop's thread; ``consume`` and ``done_for`` also on a pipeline's
    own loading thread, under the record's lock): an iterator per dataloader, a batch at a time, recorded in the
    running call. A mixin of ``_PrefetchingIterFetcher``: Lightning's loops see one fetcher."""

    def start_step_call(self, drain: bool = False) -> FetcherStepIterator:
        """The iterator for a new step call (``drain``: a drain call, which finds no batch left): the one of the
        current dataloader, made when the loop reaches it (C14 a)."""
        calls = self.calls
        with calls.lock:
            iterator = self._step_iterator
            if iterator is None or iterator.dataloader_idx != self._dataloader_idx:
                self._close_iterator()  # the loop over the previous dataloader ended
                iterator = self._step_iterator = FetcherStepIterator(self, self._dataloader_idx)
            calls.start_call(drain)
        return iterator

    def end_step_call(self) -> None:
        """The step call returned; its iterator stays valid until the loop over its dataloader ends. A call that
        declined the batches left (``StepCall.declined``) ends the data. Idempotent: under DDP ``backward_ended``
        closes the call first, and ``data_ended_after_call`` closes it again."""
        call = self.calls.call
        if call.open and call.fewer_left is not None and call.declined:  # only where `has_batches` answered False
            warn_declined(self.hook_name, self.calls.drop_rest())
        call.open = False

    def before_synced_backward(self) -> None:
        """The step call returned a loss, and its backward is about to all-reduce the gradients under DDP: the call
        ends here, and the ranks' vote after it (or after a drain call) rides in that all-reduce
        (``VoteInGradients``). ``backward_ended`` then finds it started."""
        calls = self.calls
        if calls.ranks_vote:
            self.end_step_call()
            if calls.call.drain:
                calls.carry_vote_after_drain_call(calls.carrier)
            else:
                calls.start_vote(calls.carrier)

    def backward_ended(self) -> None:
        """The step call returned and its backward ended (a ``next()`` until the next call counts toward that one):
        the ranks' vote between the calls starts here, so that it travels while the optimizer steps
        (``data_ended_after_call`` reads it). Without a vote (one rank) nothing: the regular path's cost per batch."""
        if self.calls.ranks_vote:
            self.end_step_call()
            self.calls.start_vote()

    def data_ended_after_call(self) -> bool:
        """Whether the returned step call took the data's last batch. Why after closing the call: between two calls
        ``done`` is the ranks' vote (C16)."""
        self.end_step_call()
        # `done` without its fast path, which never holds here: the step has just taken the peeked batch
        return self.calls.peek_on_every_rank() is None

    def done_for(self, dataloader_idx: int, vote: bool = True) -> bool:
        """No batch of ``dataloader_idx`` is left: an iterator never spans two dataloaders (C15). ``vote``: the ranks
        may vote on the end here (only the loop's thread asks with it)."""
        calls = self.calls
        with calls.lock:  # Why: the peek may take from the queue
            return calls.head_of(dataloader_idx, calls.peek_on_every_rank() if vote else calls.peek()) is None

    def consume(self, dataloader_idx: int) -> tuple[Any, int, int]:
        """Hand the next batch to the step: counted, and recorded in the running call (``EpochStepCalls.hand_out``)."""
        calls = self.calls
        with calls.lock:
            head = calls.hand_out(dataloader_idx)
            self.fetched += 1
            if calls.call.open:
                self._batch, self._batch_idx, self._dataloader_idx = head.batch, head.batch_idx, head.dataloader_idx
            self.progress.count_consumed()
        return head.batch, head.batch_idx, head.dataloader_idx

    def step_stopped(self) -> None:
        """The step call raised StopIteration: at its dataloader's end that ends the call; elsewhere it is an error."""
        if self._step_iterator is not None and not self._step_iterator.done:
            raise RuntimeError(STOP_ITERATION_WITH_BATCHES_LEFT.format(step=self.hook_name)) from None
        self.calls.call.cut_short = True

    def _close_iterator(self) -> None:
        if self._step_iterator is not None:
            self._step_iterator.close()
            self._step_iterator = None

    def step_batches(self) -> list[Any]:
        """What ``self.log``'s batch size counts: the batches the current step call consumed, or before its first
        next() the batch it will get (a drain call gets none)."""
        call = self.calls.call
        if call.batches or call.drain or self._batch is None:
            return call.batches
        return [self._batch]


class _LoaderIteratorLifecycle:
    """The loader iterator's lifecycle under the fetcher (the loop's thread): a loop over the data begins on a fresh
    or adopted iterator with its producer, takes the batches it produces, and stops it. A mixin of
    ``_PrefetchingIterFetcher``: Lightning's loops see one fetcher."""

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
        """A loop over the data starts: its producer and a new record of the step calls."""
        trainer = self.trainer
        producer = BatchProducer(
            self.iterator, self._combined_loader, self.length, lambda: self.fetched, self._producer_transfer()
        )
        self.calls = EpochStepCalls(
            trainer, self.hook_name, self._take, exhausted=self._exhausted,
            ranks_vote=end_of_data_vote_needed(trainer),
            consumed_loader_states=producer.loader_states(),
            take_ahead=self.take_ahead if self.drain_dataloader is None else None,  # training accumulates windows
            drain_rule=self.drain_rule,
            carrier=VoteInGradients.install(trainer) if self.drain_dataloader is None else None,  # training's
        )
        self._start_producing(producer)
        return self

    def _producer_transfer(self) -> Callable[[Any, int], Any] | None:
        """The batch transfer the producer runs (the transfer hooks, as Lightning's regular flavour runs them)."""
        return BatchTransfer(self.trainer)

    def _start_producing(self, producer: BatchProducer) -> None:
        self._producer = producer

    def _next_produced(self) -> Produced:
        """The next batch, ready for the step on this thread; raises ``LoaderExhausted`` at the end of the data."""
        return self._producer()

    def take_ahead(self) -> Produced | None:
        """The next batch for a look-ahead of k (``EpochStepCalls.available``)."""
        return self._take()

    def _take(self) -> Produced | None:
        """The next batch from the producer, ready for the step on this thread; None at the end of the data."""
        if self._producer is None:
            raise RuntimeError("the epoch's loading has stopped; no more batches are handed out in this epoch")
        # Why not profile a take known to find the end: the `*_next` action records one fetch per batch (C1)
        profiled = self.length is None or self.fetched < self.length
        if profiled:
            self._start_profiler()
        try:
            return self._next_produced()
        except LoaderExhausted as end:
            self.calls.loader_ended(end.loader_states)
            return None
        finally:
            if profiled:
                self._stop_profiler()

    def stop(self) -> None:
        """Stop producing (idempotent): batches produced but not consumed are dropped. The loop over the data ended:
        the step's iterator hands out nothing more (C14 a)."""
        self._close_iterator()
        self.calls.end()
        self._stop_producing()

    def _stop_producing(self) -> None:
        # Why drop it: it holds the run's hooks and profiler wrappers, which a Trainer pickled after fit (C1) must not
        # carry
        self._producer = None


class _PrefetchingIterFetcher(_StepCallHandOut, _LoaderIteratorLifecycle, _DataLoaderIterDataFetcher):
    """Looks one batch ahead and hands the batches to the step through a ``FetcherStepIterator``.

    Lightning's loop reads ``_batch``/``_batch_idx`` before the step (for ``on_train_batch_start``) and after it (for
    ``on_train_batch_end``), and ``done`` for ``is_last_batch``: here they describe the next batch to be consumed
    (peeked, not consumed), then the last batch consumed. ``fetched`` counts consumed batches, and so does
    ``progress`` (``count_consumed()``). ``drain_dataloader``: the evaluation loops' drain calls at the end of a
    dataloader (C17); None in training, which drains in its loop. ``drain_rule``: when the loop makes drain calls
    (``step_calls.DRAIN_RULES``).
    """

    def __init__(
        self, trainer: pl.Trainer, hook_name: str, progress: CountsConsumed,
        drain_dataloader: Callable[[int], None] | None = None, drain_rule: str = PULLED_AHEAD,
    ) -> None:
        super().__init__()
        self.trainer, self.hook_name, self.progress = trainer, hook_name, progress
        self.drain_dataloader, self.drain_rule = drain_dataloader, drain_rule
        self._producer: BatchProducer | None = None  # per loop over the data (``_begin``)
        self.calls = EpochStepCalls(trainer, hook_name, self._take)  # replaced per loop over the data
        self._step_iterator: FetcherStepIterator | None = None

    @property
    def consumed_loader_states(self) -> list[dict] | None:
        """The loaders' state as of the batches consumed: what a checkpoint records."""
        return self.calls.consumed_loader_states

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
    @override
    def done(self) -> bool:
        # Why a fast path: the loop asks three times per call, mostly with the next batch peeked and no vote due; the
        # answer is then "not done" without the lock
        calls = self.calls
        if calls.head is not None and not (calls.ranks_vote and calls.vote_pending()):
            return False
        return calls.peek_on_every_rank() is None

    @done.setter
    def done(self, exhausted: bool) -> None:
        # Lightning's reset() declares an empty loader exhausted; the loop over the data starts from that (``_begin``)
        self._exhausted = exhausted

    @override
    def __iter__(self) -> _PrefetchingIterFetcher:
        self.stop()
        _DataFetcher.__iter__(self)  # a fresh loader iterator (workers start here, as in stock Lightning)
        return self._begin()

    @override
    def __next__(self) -> FetcherStepIterator:
        """Called by the epoch loop before each step: the batch hooks see the batch the step will get first. At the
        end of an evaluation dataloader, first the loop's drain calls (``drain_dataloader``)."""
        calls = self.calls
        head = calls.head
        # Why `done`'s fast path: the previous call's end of data peeked the head already, and mostly no vote is due
        if head is None or (calls.ranks_vote and calls.vote_pending()):
            head = calls.peek_on_every_rank()
        ended = self._step_iterator
        if ended is not None and head is not None and head.dataloader_idx == ended.dataloader_idx:
            ended = None
        if ended is not None and self.drain_dataloader is not None:
            # Why here, not after the step that took the last batch: a pipeline's own thread may take it between
            # the calls, after any earlier check; this is the last point before the loop moves on
            if calls.drains_here():
                self.drain_dataloader(ended.dataloader_idx)
                head = calls.peek_on_every_rank()
            self._close_iterator()  # the loop over that dataloader ended (C14 a)
            calls.new_dataloader()
        if head is None:
            raise StopIteration
        if calls.call.index:
            calls.no_progress.step_returned(len(calls.call.batch_indices))  # what the previous call consumed
        self._batch, self._batch_idx, self._dataloader_idx = head.batch, head.batch_idx, head.dataloader_idx
        return self.start_step_call()

    @override
    def teardown(self) -> None:
        self.stop()  # before Lightning resets the loaders: a prefetch thread may be inside next() on them
        super().teardown()

