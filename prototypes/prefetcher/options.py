"""The prefetcher's options and what one trainer's loops and fetchers share per run: the CUDA side stream and the
locks that serialise the profiler while a prefetch thread records on it. No loop or fetcher in here."""

from __future__ import annotations

import functools
import threading
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.profilers import PassThroughProfiler, Profiler

# the profiler actions of a batch's transfer, as Lightning names them (`[<kind>]<class>.<hook>`)
_TRANSFER_ACTIONS = (
    ".on_before_batch_transfer", ".transfer_batch_to_device", ".on_after_batch_transfer", ".batch_to_device"
)


class Options:
    """The design's options, shared by one trainer's loops, and what they hold per run: the CUDA side stream and the
    locks that serialise the profiler while a prefetch thread records on it.

    Why ``__reduce__`` ([RFC 16]): Lightning and its users copy a Trainer (``strategy="ddp_spawn"`` pickles it into
    each rank, ``copy.deepcopy`` of a loop), and locks and streams cannot be pickled; a copy gets new ones, built from
    the options.
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


class _SerialisedProfilerCall:
    """The profiler's ``start`` or ``stop`` under the options' locks (``Options.thread_records_on``).

    An object rather than a closure, so that a Trainer copied while a prefetch thread runs (a callback that deep-copies
    it) still pickles; the copy's calls take its own options' new locks.
    """

    def __init__(self, options: Options, profiler: Profiler, name: str) -> None:
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
