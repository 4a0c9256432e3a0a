"""The prefetch thread: runs a producer ahead of its consumer, a bounded number of results in flight (after
torchdata.nodes' ``Prefetcher``); no Lightning in here."""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple

_POLL_S = 0.1  # how often a blocked producer or consumer re-checks that the other side is still there

AUTO = "auto"  # the depth that decides for itself whether the thread pays (see PrefetchThread)
AUTO_DEPTH = 2  # what "auto" runs at while it measures, and keeps when the thread pays
AUTO_PROBE_BATCHES = 8  # batches measured before deciding, once per PrefetchThread (one per epoch)
# The thread saves at most min(produce, consume) per batch and costs a queue hand-off (about 0.3-0.4 ms per batch
# on the 2-core benchmark machine, S3); below this the hand-off would eat what the overlap saves.
AUTO_MIN_OVERLAP_S = 0.001


class _Failure(NamedTuple):
    error: BaseException


class PrefetchThread:
    """Runs ``produce()`` ahead of the consumer on one thread, at most ``depth`` results not yet released.

    Modelled on torchdata.nodes ``Prefetcher``: a semaphore bounds what is in flight, and a StopIteration or an
    exception raised by ``produce()`` travels through the queue and is raised from ``get()`` (the same object, so
    its type and traceback are the original ones). ``release()`` frees one slot once the consumer is done with a
    result. ``depth=0`` starts no thread: ``get()`` calls ``produce()`` itself. ``shutdown()`` is idempotent and
    returns once the thread has exited; a ``produce()`` call already running is allowed to finish.

    ``depth="auto"`` (after tf.data's AUTOTUNE) starts at ``AUTO_DEPTH`` and times the first
    ``AUTO_PROBE_BATCHES`` results: how long ``produce()`` takes on the thread and how long the consumer works
    between two ``get()`` calls. The thread can hide at most the smaller of the two per batch; when that is under
    ``AUTO_MIN_OVERLAP_S`` it stops the thread, hands out what the thread already produced, and produces the rest
    on the caller's thread, as ``depth=0`` does. ``threaded`` says which way it went.
    """

    def __init__(self, produce: Callable[[], Any], depth: int | str, name: str = "prefetcher") -> None:
        auto = depth == AUTO
        if not auto and (not isinstance(depth, int) or isinstance(depth, bool) or depth < 0):
            raise ValueError(f"prefetch depth must be an int >= 0 (0 = no background work) or {AUTO!r}, got {depth!r}")
        depth = AUTO_DEPTH if auto else depth
        self._produce = produce
        self._slots = threading.BoundedSemaphore(depth) if depth else None
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._stop = threading.Event()
        self._finished = False  # the consumer has seen the end or a failure: nothing more will come
        self._thread = threading.Thread(target=self._run, name=name, daemon=True) if depth else None
        # "auto": seconds per produce() on the thread and per consumer turn between get() calls, until decided
        self._deciding = auto
        self._produce_s: list[float] = []
        self._consume_s: list[float] = []
        self._returned_at: float | None = None

    @property
    def threaded(self) -> bool:
        """Whether results come from the background thread (False for depth 0 and once "auto" dropped it)."""
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None and self._thread.ident is None:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # Why a timeout: a consumer that stopped early never releases, so the wait must notice shutdown.
            if not self._slots.acquire(timeout=_POLL_S):
                continue
            if self._stop.is_set():
                return
            try:
                started = time.perf_counter()
                result = self._produce()
                if self._deciding:
                    self._produce_s.append(time.perf_counter() - started)
                self._results.put(result)
            except BaseException as error:  # StopIteration included: the consumer re-raises whatever ended us
                self._results.put(_Failure(error))
                return

    def get(self) -> Any:
        """The next result; raises what ``produce()`` raised (StopIteration at the end), then keeps raising it."""
        if self._finished:
            raise StopIteration
        if self._deciding:
            self._measure_the_consumer()
        if self._thread is None and self._results.empty():
            try:
                return self._produce()
            except BaseException:
                self._finished = True
                raise
        if self._thread is None:  # what a stopped "auto" thread produced comes first
            result = self._results.get_nowait()
        else:
            self.start()
            result = self._next_from_thread()
        if isinstance(result, _Failure):
            self._finished = True
            raise result.error
        if self._deciding:
            self._returned_at = time.perf_counter()
        return result

    def _next_from_thread(self) -> Any:
        while True:
            try:
                return self._results.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._results.empty():
                    raise RuntimeError("the prefetch thread was shut down; this iterator is closed") from None

    def _measure_the_consumer(self) -> None:
        """"auto": time the consumer's turn since the last result and decide once enough turns were timed."""
        if self._returned_at is not None:
            self._consume_s.append(time.perf_counter() - self._returned_at)
        enough = min(len(self._produce_s), len(self._consume_s)) >= AUTO_PROBE_BATCHES
        if not enough:
            return
        self._deciding = False
        hidden = min(statistics.median(self._produce_s), statistics.median(self._consume_s))
        if hidden < AUTO_MIN_OVERLAP_S:
            self._stop_thread()

    def _stop_thread(self) -> None:
        """Stop the thread; what it produced stays in the queue and is handed out first, so results keep their order."""
        self._stop.set()
        if self._thread.is_alive():
            try:
                self._slots.release()  # wake a thread waiting for a slot, so it sees the stop at once
            except ValueError:  # every slot is free: the thread is not waiting for one
                pass
            self._thread.join()
        self._thread = None

    def release(self) -> None:
        """The consumer is done with one result: the producer may make another."""
        if self._thread is not None:
            self._slots.release()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
