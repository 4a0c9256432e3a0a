"""A bounded background producer (after torchdata.nodes ``Prefetcher``); no Lightning in here."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

_POLL_S = 0.1  # how often a blocked producer or consumer re-checks that the other side is still there


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
