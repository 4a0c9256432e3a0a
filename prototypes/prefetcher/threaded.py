"""The opt-in prefetch thread under the fetcher: ``ThreadedIterFetcher`` runs the producer on a ``PrefetchThread``
up to ``depth`` batches ahead of the step, with the transfer hooks on that thread (``transfer_ahead``) or as a batch
is handed out, and on CUDA the copies on a side stream. ``fetcher_for`` builds the fetcher the options ask for: the
plain one when they ask for no thread (what ships).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import pytorch_lightning as pl
import torch
from lightning_utilities.core.apply_func import apply_to_collection
from typing_extensions import override

from prototypes.common import BatchTransfer
from prototypes.lightning_changes import CountsConsumed
from prototypes.prefetcher.fetcher import _PrefetchingIterFetcher
from prototypes.prefetcher.options import RunResources
from prototypes.prefetcher.prefetch_thread import PrefetchThread
from prototypes.prefetcher.producer import BatchProducer, Produced


def fetcher_for(
    trainer: pl.Trainer, resources: RunResources, hook_name: str, progress: CountsConsumed,
    drain_dataloader: Callable[[int], None] | None = None,
) -> _PrefetchingIterFetcher:
    """The fetcher the run's options ask for: with a prefetch thread, or without (depth 0, transfer with loading)."""
    options = resources.options
    if not options.depth and options.transfer_ahead:
        return _PrefetchingIterFetcher(trainer, hook_name, progress, drain_dataloader, options.drain)
    return ThreadedIterFetcher(trainer, resources, hook_name, progress, drain_dataloader)


class _OnCopyStream(NamedTuple):
    """A batch the producer copied on the side stream, with the event recorded after its copies."""

    batch: Any
    ready: torch.cuda.Event


class ThreadedIterFetcher(_PrefetchingIterFetcher):
    """``_PrefetchingIterFetcher`` with ``options.depth`` batches produced ahead of the step on a prefetch thread."""

    def __init__(
        self, trainer: pl.Trainer, resources: RunResources, hook_name: str, progress: CountsConsumed,
        drain_dataloader: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(trainer, hook_name, progress, drain_dataloader, resources.options.drain)
        self.options, self.resources = resources.options, resources
        resources.copy_stream_for(trainer)  # made here, on the loop's thread
        self.prefetch_thread: PrefetchThread | None = None  # per loop over the data (``_start_producing``)
        self._transfer_path: BatchTransfer | None = None  # the transfer on this thread, when not ahead
        self._released_ahead = 0  # batches held for a look-ahead of k whose slot was given back already

    @override
    def _producer_transfer(self) -> Callable[[Any, int], Any] | None:
        transfer = BatchTransfer(self.trainer)
        if not self.options.transfer_ahead:
            self._transfer_path = transfer
            return None
        copy_stream = self.resources.copy_stream
        if copy_stream is None:
            return transfer

        def on_copy_stream(batch: Any, dataloader_idx: int) -> _OnCopyStream:
            # Why set the device: a new thread starts on device 0, whatever device this rank trains on.
            with torch.cuda.device(copy_stream.device), torch.cuda.stream(copy_stream):
                batch = transfer(batch, dataloader_idx, pin=_PIN)
                return _OnCopyStream(batch, copy_stream.record_event())

        return on_copy_stream

    @override
    def _start_producing(self, producer: BatchProducer) -> None:
        super()._start_producing(producer)
        self.prefetch_thread = PrefetchThread(producer, self.options.depth, name=f"prefetcher-{self.hook_name}")
        self._released_ahead = 0
        if self._thread_records_on_profiler:
            self.resources.profiler_guard.thread_records_on(self.trainer.profiler)

    @property
    def _thread_records_on_profiler(self) -> bool:
        """Whether this fetcher's prefetch thread may record the transfer hooks on the profiler."""
        return bool(self.options.depth) and self.options.transfer_ahead

    @override
    def _next_produced(self) -> Produced:
        produced = self.prefetch_thread.get()
        if isinstance(produced.batch, _OnCopyStream):
            batch, ready = produced.batch
            # Why (sync point): the compute stream must not read the batch before the side stream's copies finish,
            # and the allocator must not hand these buffers back to the side stream while the step still uses them.
            compute_stream = torch.cuda.current_stream(self.resources.copy_stream.device)
            compute_stream.wait_event(ready)
            for tensor in _cuda_tensors(batch):
                tensor.record_stream(compute_stream)
            produced = produced._replace(batch=batch)
        if self._transfer_path is not None:  # the transfer hooks run here, as the batch is handed out
            produced = produced._replace(batch=self._transfer_path(produced.batch, produced.dataloader_idx))
        return produced

    @override
    def take_ahead(self) -> Produced | None:
        """The next batch for a look-ahead of k, its producer slot given back at once. Why: a thread of depth below k
        would otherwise wait for a slot while the look-ahead waits for it."""
        produced = super().take_ahead()
        if produced is not None:
            self.prefetch_thread.release()
            self._released_ahead += 1
        return produced

    @override
    def consume(self, dataloader_idx: int) -> tuple[Any, int, int]:
        with self.calls.lock:
            item = super().consume(dataloader_idx)
            if self._released_ahead:  # a look-ahead of k gave this batch's slot back already
                self._released_ahead -= 1
            else:
                self.prefetch_thread.release()
        return item

    @override
    def _stop_producing(self) -> None:
        if self.prefetch_thread is not None:
            self.prefetch_thread.shutdown()
            self.prefetch_thread = None
            if self._thread_records_on_profiler:  # the thread has exited
                self.resources.profiler_guard.thread_stopped_recording(self.trainer.profiler)
        super()._stop_producing()
        self._transfer_path = None


def _cuda_tensors(batch: Any) -> list[torch.Tensor]:
    tensors: list[torch.Tensor] = []
    apply_to_collection(batch, torch.Tensor, lambda t: tensors.append(t) if t.is_cuda else None)
    return tensors


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.pin_memory() if tensor.device.type == "cpu" and not tensor.is_pinned() else tensor


# Why pin before a copy on the side stream: a copy from pageable memory is synchronous even with
# ``non_blocking=True`` (apex #304). The transfer hooks run here, possibly on the prefetch thread: they must be
# thread-safe.
_PIN = functools.partial(apply_to_collection, dtype=torch.Tensor, function=_pinned)
