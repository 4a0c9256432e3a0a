"""The prefetcher's options, and what one trainer's loops and fetchers share per run: the CUDA copy stream and the
locks of the profiler guard (``profiler_guard``). No loop or fetcher in here."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import pytorch_lightning as pl
import torch

from prototypes.prefetcher.prefetch_thread import AUTO
from prototypes.prefetcher.profiler_guard import ProfilerGuard
from prototypes.step_calls import DRAIN_RULES, PULLED_AHEAD


@dataclass(frozen=True)
class Options:
    """The fetcher's options, as the user chose them: ``depth``, the most batches produced ahead of the step (0: none,
    on the step's thread; ``"auto"``: the thread decides per epoch whether it pays, ``PrefetchThread``),
    ``transfer_ahead``, whether the transfer hooks run with the loading rather than as a batch is handed out, and
    ``drain``, when the loop makes drain calls (``step_calls.DRAIN_RULES``): the RFC's drain decision compares
    the rules with unmodified clients, and what ships is the default."""

    depth: int | str = 0
    transfer_ahead: bool = True
    drain: str = PULLED_AHEAD

    def __post_init__(self) -> None:
        depth = self.depth
        if depth != AUTO and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
            raise ValueError(f"prefetcher: `depth` must be an int >= 0 (0 = no background work) or {AUTO!r} (decide"
                             f" per epoch), got {depth!r}")
        if self.drain not in DRAIN_RULES:
            raise ValueError(f"prefetcher: `drain` must be one of {DRAIN_RULES}, got {self.drain!r}")


class RunResources:
    """What one trainer's loops and fetchers share per run: the CUDA copy stream and the two locks that serialise the
    profiler while a prefetch thread records on it (``profiler_guard`` uses them).

    Why ``__reduce__`` ([RFC 1]): Lightning and its users copy a Trainer (``strategy="ddp_spawn"`` pickles it into
    each rank, ``copy.deepcopy`` of a loop), and locks and streams cannot be pickled; a copy gets new ones, built from
    the options.
    """

    def __init__(self, options: Options) -> None:
        self.options = options
        self.copy_stream: Any = None  # made by the first fetcher that needs it (``copy_stream_for``), once per run
        self.transfer_actions_lock = threading.RLock()
        self.profiler_calls_lock = threading.Lock()
        self.profiler_guard = ProfilerGuard(self)

    def __reduce__(self) -> tuple:
        return type(self), (self.options,)

    def copy_stream_for(self, trainer: pl.Trainer) -> Any:
        """The run's CUDA side stream for background copies, made on first use (on the loop's thread); None off CUDA,
        without a thread or without background transfer."""
        device, options = trainer.strategy.root_device, self.options
        if self.copy_stream is None and device.type == "cuda" and options.depth and options.transfer_ahead:
            # Why once per run: a new stream per epoch strands the caching allocator's per-stream blocks (timm #2781)
            self.copy_stream = torch.cuda.Stream(device)
        return self.copy_stream

    def end_run(self) -> None:
        """The run ended (the loops' teardown): the next run makes its own stream."""
        self.copy_stream = None
