"""The prefetch thread: runs a producer ahead of its consumer, a bounded number of results in flight (after
torchdata.nodes' ``Prefetcher``); no Lightning in here."""

from __future__ import annotations

import contextlib
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
# measured on a 2-core machine); below this the hand-off would eat what the overlap saves.
AUTO_MIN_OVERLAP_S = 0.001


class _Failure(NamedTuple):
    error: BaseException


class _OverlapProbe:
    """``depth="auto"`` (after tf.data's AUTOTUNE): times the first ``AUTO_PROBE_BATCHES`` results, how long
    ``produce()`` takes on the thread and how long the consumer works between two ``get()`` calls. The thread can
    hide at most the smaller of the two per batch; it pays when that is at least ``AUTO_MIN_OVERLAP_S``. Written by
    both threads while ``PrefetchThread`` decides, then dropped."""

    def __init__(self) -> None:
        self.produce_s: list[float] = []  # seconds per produce() on the thread
        self.consume_s: list[float] = []  # seconds per consumer turn between get() calls
        self.returned_at: float | None = None

    def thread_pays(self) -> bool | None:
        """Time the consumer's turn since the last result; None until enough turns were timed, then the decision."""
        if self.returned_at is not None:
            self.consume_s.append(time.perf_counter() - self.returned_at)
        enough = min(len(self.produce_s), len(self.consume_s)) >= AUTO_PROBE_BATCHES
        if not enough:
            return None
        hidden = min(statistics.median(self.produce_s), statistics.median(self.consume_s))
        return hidden >= AUTO_MIN_OVERLAP_S


class _ThreadLifecycle:
    """Starting and stopping ``PrefetchThread``'s thread, from the consumer's thread. A mixin of ``PrefetchThread``,
    whose state it shares: the thread, its stop flag and its slots."""

    @property
    def threaded(self) -> bool:
        """Whether results come from the background thread (False for depth 0 and once "auto" dropped it)."""
        return self._thread is not None

    def start(self) -> None:
        if self._thread is not None and self._thread.ident is None:
            self._thread.start()

    def _stop_thread(self) -> None:
        """Stop the thread; what it produced stays in the queue and is handed out first, so results keep their order."""
        self._stop.set()
        if self._thread.is_alive():
            # every slot free (ValueError): the thread is not waiting for one
            with contextlib.suppress(ValueError):
                self._slots.release()  # wake a thread waiting for a slot, so it sees the stop at once
            self._thread.join()
        self._thread = None

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()


class PrefetchThread(_ThreadLifecycle):
    """Runs ``produce()`` ahead of the consumer on one thread, at most ``depth`` results not yet released.

    Modelled on torchdata.nodes ``Prefetcher``: a semaphore bounds what is in flight, and a StopIteration or an
    exception raised by ``produce()`` travels through the queue and is raised from ``get()`` (the same object, so
    its type and traceback are the original ones). ``release()`` frees one slot once the consumer is done with a
    result. ``depth=0`` starts no thread: ``get()`` calls ``produce()`` itself. ``shutdown()`` is idempotent and
    returns once the thread has exited; a ``produce()`` call already running is allowed to finish.

    ``depth="auto"`` starts at ``AUTO_DEPTH`` and decides once (``_OverlapProbe``); when the thread does not pay it
    stops the thread, hands out what the thread already produced, and produces the rest on the caller's thread, as
    ``depth=0`` does. ``threaded`` says which way it went.
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
        self._probe = _OverlapProbe() if auto else None  # "auto", until decided

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
                if (probe := self._probe) is not None:  # Why a local: the consumer drops the probe once it decided
                    probe.produce_s.append(time.perf_counter() - started)
                self._results.put(result)
            except BaseException as error:  # StopIteration included: the consumer re-raises whatever ended us
                self._results.put(_Failure(error))
                return

    def get(self) -> Any:
        """The next result; raises what ``produce()`` raised (StopIteration at the end), then keeps raising it."""
        if self._finished:
            raise StopIteration
        if self._probe is not None:
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
        if self._probe is not None:
            self._probe.returned_at = time.perf_counter()
        return result

    def _next_from_thread(self) -> Any:
        while True:
            try:
                return self._results.get(timeout=_POLL_S)
            except queue.Empty:
                if not self._thread.is_alive() and self._results.empty():
                    raise RuntimeError("the prefetch thread was shut down; this iterator is closed") from None

    def _measure_the_consumer(self) -> None:
        """"auto": time the consumer's turn and, once the probe decided, keep the thread or stop it."""
        pays = self._probe.thread_pays()
        if pays is None:
            return
        self._probe = None
        if not pays:
            self._stop_thread()

    def release(self) -> None:
        """The consumer is done with one result: the producer may make another."""
        if self._thread is not None:
            self._slots.release()

