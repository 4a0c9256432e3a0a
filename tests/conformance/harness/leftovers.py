"""What a run leaves running: the threads and child processes alive before and after it (C12, C13)."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Running:
    """The threads and child processes alive at one moment."""

    threads: frozenset
    children: frozenset

    @classmethod
    def now(cls) -> Running:
        return cls(
            frozenset(t for t in threading.enumerate() if t.is_alive()),
            frozenset(p.pid for p in psutil.Process().children(recursive=True)),
        )


# multiprocessing's queue feeders and torch's pin-memory thread, by the names they are created with (a thread that
# is finishing has already dropped its target)
_DATALOADER_THREAD_NAMES = ("QueueFeederThread", "(_pin_memory_loop)")


def _dataloader_machinery(thread: threading.Thread) -> bool:
    """A thread of torch's DataLoader machinery, which torch stops asynchronously, as it does its worker processes."""
    return thread.name.endswith(_DATALOADER_THREAD_NAMES)


def assert_nothing_left(before: Running, grace_s: float = 10.0) -> None:
    """Nothing started since ``before`` is still alive; call it as soon as ``fit``/``validate``/... returned.

    The design's own threads get no grace: one still alive when the run returns may be inside ``next()`` on a loader
    Lightning is tearing down. DataLoader worker processes and the DataLoader's own threads get ``grace_s`` to exit.
    """
    own = sorted(t.name for t in Running.now().threads - before.threads if not _dataloader_machinery(t))
    if own:
        raise AssertionError(f"threads still running when the run returned (a design joins its threads first): {own}")
    deadline = time.monotonic() + grace_s
    while True:
        gc.collect()  # DataLoader workers shut down when their iterator is collected; reference cycles delay that
        now = Running.now()
        threads, children = now.threads - before.threads, now.children - before.children
        if not threads and not children:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"left running after the run: threads {sorted(t.name for t in threads)}, child pids {sorted(children)}"
            )
        time.sleep(0.05)
