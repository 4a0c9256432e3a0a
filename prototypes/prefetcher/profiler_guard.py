"""The profiler guard: serialises the trainer's profiler while a prefetch thread records the transfer hooks on it.
No loop or fetcher in here."""

from __future__ import annotations

import functools
from typing import Any, Protocol

from pytorch_lightning.profilers import PassThroughProfiler, Profiler

# the profiler actions of a batch's transfer, as Lightning names them (`[<kind>]<class>.<hook>`)
_TRANSFER_ACTIONS = (
    ".on_before_batch_transfer", ".transfer_batch_to_device", ".on_after_batch_transfer", ".batch_to_device"
)


class _Locks(Protocol):
    """The run's two profiler locks (``options.RunResources`` holds them, so that a copied Trainer gets new ones)."""

    transfer_actions_lock: Any  # a threading.RLock: held from a transfer action's start to its stop
    profiler_calls_lock: Any  # a threading.Lock: held for each start and stop call


class ProfilerGuard:
    """Wraps the profiler's ``start`` and ``stop`` in the run's locks while any prefetch thread records on it.

    Why: Lightning's profilers expect one calling thread. Here prefetch threads record the transfer hooks (the
    training epoch's and a validation run's thread at once) while the main thread records Lightning's actions, among
    them the same transfer hooks for a regular validation step. Each ``start`` and ``stop`` call takes one lock
    (AdvancedProfiler's ``start`` iterates its per-action profiles, which a first action from another thread would
    add to mid-iteration), and a transfer action holds a second lock from its start to its stop (SimpleProfiler
    refuses to start an action that is running). The main thread waits for a prefetch thread only when both transfer
    a batch at once. Why only while a thread runs: the profiler is the user's; outside those runs (a regular
    module's, or before and after ``fit``) it is left exactly as Lightning made it.
    """

    def __init__(self, resources: _Locks) -> None:
        self.resources = resources
        self._threads_recording = 0  # prefetch threads now recording on the trainer's profiler

    def thread_records_on(self, profiler: Profiler) -> None:
        """A prefetch thread starts recording on ``profiler``: its calls are serialised until the last one stops."""
        if isinstance(profiler, PassThroughProfiler):
            return
        if self._threads_recording == 0:
            for name in ("start", "stop"):
                setattr(profiler, name, _SerialisedProfilerCall(self.resources, profiler, name))
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


class _SerialisedProfilerCall:
    """The profiler's ``start`` or ``stop`` under the run's locks (``ProfilerGuard``).

    An object rather than a closure, so that a Trainer copied while a prefetch thread runs (a callback that deep-copies
    it) still pickles; the copy's calls take its own run resources' new locks.
    """

    def __init__(self, resources: _Locks, profiler: Profiler, name: str) -> None:
        self.resources, self.name = resources, name
        self.replaced = vars(profiler).get(name)  # the instance's own attribute, if it had one, restored afterwards
        self.unwrapped = self.replaced or functools.partial(getattr(type(profiler), name), profiler)

    def __call__(self, action: str) -> None:
        transfer, resources = action.endswith(_TRANSFER_ACTIONS), self.resources
        if self.name == "start":
            if transfer:
                resources.transfer_actions_lock.acquire()
            with resources.profiler_calls_lock:
                self.unwrapped(action)
            return
        try:
            with resources.profiler_calls_lock:
                self.unwrapped(action)
        finally:
            if transfer:
                resources.transfer_actions_lock.release()
